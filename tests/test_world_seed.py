"""``world_seed``: every seed of a run shares one world (data, devices and links, FedCollab's
discriminator distances) while training, sampling and grouping follow each seed."""
import numpy as np
import pandas as pd
import pytest

from groupfel.emulator.config import parse_config
from groupfel.emulator.network import build_network
from groupfel.emulator.world import place_data
from groupfel.errors import InputError
from groupfel.experiments.runner import run_experiment
from groupfel.topologies import load_dataset


def _per_group(tiny_dict, **top):
    tiny_dict.update(mode="per-group", topology={"edges": 2, "clients_per_edge": 4},
                     **top)
    tiny_dict["data"].update(partition="label-shift", min_samples=20, max_samples=40, test_fraction=0.25)
    return tiny_dict


def _placed(d):
    return place_data(parse_config(d), load_dataset("digits"))


def _same_world(a, b) -> bool:
    return (all(np.array_equal(x, y) for x, y in zip(a.topology.client_samples, b.topology.client_samples))
            and all(np.array_equal(x, y) for x, y in zip(a.local_test, b.local_test))
            and a.topology.client_device == b.topology.client_device)


def test_a_world_seed_keeps_one_world_across_seeds(tiny_dict):
    base = _per_group(tiny_dict)
    seed0 = _placed({**base, "seed": 0})
    assert not _same_world(seed0, _placed({**base, "seed": 3}))              # each seed its own world
    assert _same_world(seed0, _placed({**base, "seed": 3, "world_seed": 0}))
    assert _same_world(_placed({**base, "seed": 0, "world_seed": 3}), _placed({**base, "seed": 3}))


def test_a_world_seed_keeps_the_clients_links(tiny_dict):
    tiny_dict["topology"].update(edge_access_mbps=4.0, heterogeneity={"bandwidth_sigma": 0.5, "slowdown_sigma": 0.5})

    def links(**top):
        net = build_network(parse_config({**tiny_dict, **top}), 12, None, ("secagg",))
        return net.clients.manifest()

    assert links(seed=0) != links(seed=5)
    assert links(seed=0) == links(seed=5, world_seed=0)


def test_seeds_in_one_world_share_discriminator_distances_and_train_apart(tiny_dict, tmp_path):
    d = _per_group(tiny_dict, seeds=[0, 3], world_seed=0)
    d["train"]["rounds"] = 2
    d["arms"] = [{"name": "fc", "grouping": {"policy": "fedcollab", "distance": "discriminator",
                                              "min_group_size": 2, "discriminator_rounds": 5}}]
    d["output_dir"] = str(tmp_path)
    run_experiment(parse_config(d))
    run = tmp_path / d["name"]
    D0, D3 = (pd.read_csv(run / f"seed-{s}" / "fc" / "distances.csv") for s in (0, 3))
    assert D0.equals(D3)
    runs = pd.read_csv(run / "runs.csv")
    curve = {s: runs[runs.seed == s].loss.tolist() for s in (0, 3)}
    assert curve[0] != curve[3]                                               # training follows the seed
    run_experiment(parse_config({**d, "world_seed": None, "name": "plain"}))
    plain = pd.read_csv(tmp_path / "plain" / "runs.csv")
    assert plain[plain.seed == 0].loss.tolist() == curve[0]                   # world_seed = seed: no change
    assert plain[plain.seed == 3].loss.tolist() != curve[3]                   # seed 3's own world


def test_world_seed_is_checked_like_a_seed(tiny_dict):
    with pytest.raises(InputError, match="world_seed"):
        parse_config({**tiny_dict, "world_seed": -1})
