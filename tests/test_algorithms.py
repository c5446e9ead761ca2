"""Algorithms and client state in whole runs: resume, cost defaults, engines agree."""
import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.io import read_checkpoint
from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.emulator.driver import CHECKPOINT, plan_arm, plan_arms, run_arm
from groupfel.emulator.training import BatchedEngine, TorchEngine
from groupfel.emulator.eq5 import build_cost_model
from groupfel.emulator.world import build_world


class Killed(Exception):
    pass


def _scaffold_dict(tiny_dict):
    tiny_dict["arms"] = tiny_dict["arms"][:1]
    tiny_dict["train"].update(engine="batched", workers=2, algorithm="scaffold", momentum=0.9, weight_decay=1e-3,
                              client_state="persistent", lr_decay=0.95, eval_every=2, rounds=6)
    tiny_dict["faults"] = {"dropout": 0.2}
    del tiny_dict["cost"]["training"], tiny_dict["cost"]["group_operations"]
    return tiny_dict


def test_persistent_client_state_and_variates_survive_resume_bitwise(tiny_dict, tmp_path):
    config = parse_config(_scaffold_dict(tiny_dict))
    world = build_world(config)
    plan = plan_arm(world, 0)
    full = run_arm(world, plan, tmp_path / "full")
    seen = {}

    def kill_after_round_4(t, cost, acc):
        if t == 4:
            blob = read_checkpoint(tmp_path / "killed" / CHECKPOINT)
            seen.update(blob)
            raise Killed
    with pytest.raises(Killed):
        run_arm(world, plan, tmp_path / "killed", kill_after_round_4)
    # the checkpoint holds every client's variate and momentum buffer, as plain tensors
    variates, control = seen["algorithm"]["clients"]["variates"], seen["algorithm"]["server"]["control"]
    assert all(type(v) is torch.Tensor for v in (variates, control, seen["momentum"]))
    n, p = world.topology.n_clients, world.engine.n_params
    assert variates.shape == seen["momentum"].shape == (n, p)
    assert seen["momentum"].abs().sum() > 0 and control.abs().sum() > 0
    resumed = run_arm(build_world(config), plan_arm(build_world(config), 0), tmp_path / "killed")
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)


def test_persistent_momentum_changes_the_run(tiny_dict, tmp_path):
    tiny_dict["arms"] = tiny_dict["arms"][:1]
    tiny_dict["train"].update(momentum=0.9, rounds=3)
    fresh = run_arm(w := build_world(parse_config(tiny_dict)), plan_arm(w, 0), tmp_path / "fresh")
    tiny_dict["train"]["client_state"] = "persistent"
    kept = run_arm(w := build_world(parse_config(tiny_dict)), plan_arm(w, 0), tmp_path / "kept")
    assert fresh["loss"].iloc[0] == kept["loss"].iloc[0] and fresh["loss"].iloc[-1] != kept["loss"].iloc[-1]


def test_batched_and_sequential_runs_agree(tiny_dict, tmp_path):
    tiny_dict["arms"] = tiny_dict["arms"][:1]
    tiny_dict["train"].update(rounds=3, algorithm="fedprox", mu=0.01, momentum=0.5, engine="sequential")
    seq = run_arm(w := build_world(parse_config(tiny_dict)), plan_arm(w, 0), tmp_path / "seq")
    assert type(w.engine) is TorchEngine          # one client after another
    tiny_dict["train"].update(engine="batched", workers=2)
    bat = run_arm(w := build_world(parse_config(tiny_dict)), plan_arm(w, 0), tmp_path / "bat")
    assert type(w.engine) is BatchedEngine        # a whole group round per call, over 2 processes
    np.testing.assert_allclose(seq["loss"], bat["loss"], rtol=1e-5)
    pd.testing.assert_series_equal(seq["cost"], bat["cost"])


@pytest.mark.parametrize("algorithm,training,ops", [
    ("fedavg", "sgd", ("secagg",)), ("fedprox", "fedprox", ("secagg",)),
    ("scaffold", "scaffold", ("scaffold-secagg",))])
def test_cost_defaults_follow_the_algorithm(tiny_dict, algorithm, training, ops):
    del tiny_dict["cost"]["training"], tiny_dict["cost"]["group_operations"]
    tiny_dict["train"]["algorithm"] = algorithm
    cost = build_cost_model(parse_config(tiny_dict))
    assert cost.training_method == training and cost.operations == ops
    tiny_dict["cost"]["training"] = "sgd"          # still settable
    assert build_cost_model(parse_config(tiny_dict)).training_method == "sgd"


def test_mu_without_fedprox_is_refused(tiny_dict):
    tiny_dict["train"]["mu"] = 0.1
    with pytest.raises(InputError, match="^train.mu: mu is FedProx's proximal weight and 'fedavg' has no mu"):
        build_world(parse_config(tiny_dict))


def test_per_group_mode_refuses_client_state_it_does_not_keep(tiny_dict):
    tiny_dict["mode"] = "per-group"
    tiny_dict["train"].update(momentum=0.9, client_state="persistent")
    with pytest.raises(InputError, match="per-group mode runs with fresh client state"):
        parse_config(tiny_dict)


def test_an_algorithm_runs_only_in_the_modes_it_declares(tiny_dict):
    tiny_dict["mode"] = "per-group"
    tiny_dict["train"]["algorithm"] = "scaffold"
    world = build_world(parse_config(tiny_dict))
    with pytest.raises(InputError, match='^train.algorithm: \'scaffold\' runs in mode = "global" only'):
        plan_arms(world)


def test_scaffold_server_variate_is_the_mean_of_every_clients_variate(tiny_dict, tmp_path):
    """SCAFFOLD Alg. 1's server step keeps c = Σ_i (n_i/n) c_i over all N clients, sampled or not:
    2 of 4 groups a round, 30 % dropouts, K = 2, and a resume; checked after every round."""
    tiny_dict["arms"] = tiny_dict["arms"][1:]                 # random groups of 3, 2 of the 4 a round
    tiny_dict["train"].update(algorithm="scaffold", rounds=5, eval_every=1)
    tiny_dict["faults"] = {"dropout": 0.3}
    config = parse_config(tiny_dict)
    world = build_world(config)
    share = torch.as_tensor(world.topology.n_samples / world.topology.n_samples.sum(), dtype=torch.float64)
    checked, untouched = [], []

    def check(arm_dir, kill_at=None):
        def on_round(t, cost, acc):
            blob = read_checkpoint(arm_dir / CHECKPOINT)
            v, c = blob["algorithm"]["clients"]["variates"], blob["algorithm"]["server"]["control"]
            assert c.abs().max() > 0
            torch.testing.assert_close(c.double(), share @ v.double(), atol=1e-6, rtol=0)
            untouched.append(int((v.abs().sum(1) == 0).sum()))
            checked.append(t)
            if t == kill_at:
                raise Killed
        return on_round

    full = run_arm(world, plan_arm(world, 0), tmp_path / "full", check(tmp_path / "full"))
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "killed", check(tmp_path / "killed", kill_at=2))
    resumed = run_arm(w := build_world(config), plan_arm(w, 0), tmp_path / "killed", check(tmp_path / "killed"))
    assert checked == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert untouched[0] > 0                # partial participation: after round 1 some c_i are still 0
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
