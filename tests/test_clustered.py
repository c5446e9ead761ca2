"""The clustered-FL baselines of FedCollab's Table 2: FedCluster (CFL), FeSEM and KMeans, each on a
hand-computed case from its paper's definition and end to end on two concepts, with a resume."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.config import parse_config
from groupfel.emulator.arm import ArmState
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.errors import InputError
from groupfel.emulator.rounds.per_group import PerGroupRounds
from groupfel.emulator.world import build_world
from groupfel.experiments.runner import run_experiment
from groupfel.policies.clustered import FeSEM, FedCluster, KMeansGrouping, bipartition

from tests.test_pergroup import _kill_after_round_2_and_resume, _two_concepts

CONCEPTS = [[0, 1, 2], [3, 4, 5]]   # _two_concepts: clients 0-2 keep the labels, 3-5 reverse them


def _run(tmp_path, tiny_dict, grouping):
    cfg = _two_concepts(tiny_dict, [{"name": "arm", "grouping": grouping}])
    world = build_world(cfg)
    full = run_arm(world, plan_arm(world, 0), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    final = sorted(sorted(g["clients"]) for g in manifest["final_grouping"]["groups"])
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    return cfg, world, full, final, ledger


# unit vectors a, b, c, d at 0°, 36.87°, 90°, 126.87°: cos(a,b) = 0.8, cos(b,c) = 0.6, cos(c,d) = 0.8,
# cos(a,c) = 0, cos(b,d) = 0, cos(a,d) = −0.6
A, B, C, D = [1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]


def test_fedcluster_bipartition_and_split_criterion_by_hand():
    updates = np.array([A, B, C, D])
    # Sattler Eq. 31: the largest cross similarity of {a,b}|{c,d} is cos(b,c) = 0.6; every other
    # bipartition separates a pair at 0.8 ({a}|{b,c,d}: a-b; {a,b,c}|{d}: c-d; {a,c}|{b,d}: a-b ...)
    assert [p.tolist() for p in bipartition(updates)] == [[0, 1], [2, 3]]
    # Eq. 29, equal sizes: mean = ¼(a+b+c+d) = (0.3, 0.6), norm √0.45 = 0.6708; Eq. 30: max norm 1
    assert [p.tolist() for p in FedCluster(eps1=0.7, eps2=0.9).split(updates, np.ones(4))] == [[0, 1], [2, 3]]
    assert [p.tolist() for p in FedCluster(eps1=0.6, eps2=0.9).split(updates, np.ones(4))] == [[0, 1, 2, 3]]
    assert [p.tolist() for p in FedCluster(eps1=0.7, eps2=1.0).split(updates, np.ones(4))] == [[0, 1, 2, 3]]
    # sample-weighted (the paper's Eq. 29): sizes 3, 1, 1, 3 give (3a+b+c+3d)/8 = (0.25, 0.5), norm
    # √0.3125 = 0.559 < 0.6, so the same eps1 = 0.6 now splits
    assert len(FedCluster(eps1=0.6, eps2=0.9).split(updates, np.array([3, 1, 1, 3]))) == 2
    # a part below min_group_size (3 of 4 clients can't make two parts of 3): no split
    assert len(FedCluster(eps1=0.7, eps2=0.9, min_group_size=3).split(updates, np.ones(4))) == 1


def _largest_cross_similarity(sim: np.ndarray, first: np.ndarray) -> float:
    second = np.setdiff1d(np.arange(len(sim)), first)
    return float(sim[np.ix_(first, second)].max())


def test_single_linkage_is_eq_31_exactly_and_complete_linkage_is_not_always():
    """Sattler Eq. 31 by brute force over every bipartition of 7 random updates: single linkage
    reaches the minimum of the largest cross-part cosine similarity in every case, complete
    linkage (the authors' code) misses it in some."""
    import itertools
    from groupfel.policies.clustered import cosine_similarity

    missed = 0
    for seed in range(60):
        updates = np.random.default_rng(seed).normal(size=(7, 5))
        sim = cosine_similarity(updates)
        best = min(_largest_cross_similarity(sim, np.array((0,) + rest))
                   for k in range(0, 6) for rest in itertools.combinations(range(1, 7), k))
        assert _largest_cross_similarity(sim, bipartition(updates, "single")[0]) == pytest.approx(best, abs=1e-12)
        missed += _largest_cross_similarity(sim, bipartition(updates, "complete")[0]) > best + 1e-12
    assert missed > 0
    assert FedCluster(linkage="single").linkage == "single"
    with pytest.raises(ValueError, match="linkage must be one of complete, single"):
        FedCluster(linkage="average")


def test_fedcluster_splits_two_concepts_during_fl_and_resumes(tiny_dict, tmp_path):
    # on this tiny task round 1's updates have norms ≈ 0.2 and a sample-weighted mean norm ≈ 0.13
    cfg, world, full, final, ledger = _run(tmp_path, tiny_dict, {"policy": "fedcluster", "eps1": 0.18, "eps2": 0.15})
    assert final == CONCEPTS
    assert (ledger["group"] >= 0).all()          # CFL uses the uploaded updates: no extra client work
    # the split happens before round 2 (rounds count from 1): round 1 trains one group, round 2 two
    trained = ledger[ledger["group_round"] == 0].groupby("round")["group"].nunique()
    assert trained.loc[1] == 1 and trained.loc[2] == 2
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


def test_fesem_e_step_by_hand():
    # local models (0,0), (3,4), (1,1); centres (0,1), (3,3): L2 distances by hand
    dist = np.array([[1.0, np.sqrt(18)], [np.sqrt(18), 1.0], [1.0, np.sqrt(8)]])
    assert FeSEM.assign(dist).tolist() == [0, 1, 0]


def test_fesem_e_step_in_the_loop_joins_the_nearest_centre_uncharged(tiny_dict, tmp_path):
    cfg = _two_concepts(tiny_dict, [{"name": "fesem", "grouping": {"policy": "fesem", "n_clusters": 2}}])
    world = build_world(cfg)
    x0 = world.engine.initial_weights(0)
    ones = torch.ones_like(x0)
    # centres x0 and x0 + 0.1; local models x0 + 0.04 (distance 0.04√P vs 0.06√P: centre 0) and
    # x0 + 0.06 (0.06√P vs 0.04√P: centre 1)
    local = torch.stack([x0 + (0.04 if c % 2 else 0.06) * ones for c in range(6)])
    state = ArmState(models=torch.stack([x0, x0 + 0.1 * ones]), model_edge=[0, 0], assign=np.zeros(6, dtype=int),
                     gradients=local, uploaded=np.ones(6, dtype=bool))
    rounds = PerGroupRounds(world, plan_arm(world, 0), tmp_path, state)
    rounds.before_round(1)
    assert state.assign.tolist() == [1, 0, 1, 0, 1, 0]
    assert state.ledger.frame().empty            # the edge computes distances; clients do nothing


def test_fesem_separates_two_concepts_with_seeded_centres_and_resumes(tiny_dict, tmp_path):
    cfg, world, full, final, ledger = _run(tmp_path, tiny_dict, {"policy": "fesem", "n_clusters": 2,
                                                                 "init": "clients"})
    assert final == CONCEPTS
    # the first local models: one probe epoch each, charged as training (group −1) in round 1 (the
    # ledger counts rounds from 1)
    probe = ledger[ledger["group"] == -1].sort_values("client")
    assert set(probe["round"]) == {1} and list(probe["client"]) == list(range(6))
    expected = world.cost.training_cost([world.topology.client_device[c] for c in range(6)],
                                        world.topology.n_samples, 1)
    assert np.allclose(probe["amount"], expected)
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


def test_kmeans_clusters_by_hand():
    # 1-D points 0, 1, 10, 11, 0.5: k = 2 puts {0, 1, 0.5} (mean 0.5) and {10, 11} (mean 10.5)
    parts = KMeansGrouping(n_clusters=2).cluster(np.array([[0.0], [1.0], [10.0], [11.0], [0.5]]))
    assert [p.tolist() for p in parts] == [[0, 1, 4], [2, 3]]
    assert [p.tolist() for p in KMeansGrouping(n_clusters=3).cluster(np.array([[0.0], [5.0]]))] == [[0], [1]]


def test_kmeans_clusters_local_models_before_fl_and_resumes(tiny_dict, tmp_path):
    cfg, world, full, final, ledger = _run(tmp_path, tiny_dict, {"policy": "kmeans", "n_clusters": 2,
                                                                 "local_epochs": 3})
    assert final == CONCEPTS
    probe = ledger[ledger["group"] == -1].sort_values("client")
    assert set(probe["round"]) == {1}            # before FL: the local training opens round 1
    expected = world.cost.training_cost([world.topology.client_device[c] for c in range(6)],
                                        world.topology.n_samples, 3)
    assert np.allclose(probe["amount"], expected)
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


@pytest.mark.parametrize("grouping, message", [
    ({"policy": "fedcluster", "eps1": -1.0}, r"arms\[0\]\.grouping.*eps1"),
    ({"policy": "fesem", "init": "kmeans"}, r"arms\[0\]\.grouping.*init"),
    ({"policy": "kmeans", "local_epochs": 0}, r"arms\[0\]\.grouping.*local_epochs"),
])
def test_bad_parameters_are_refused_before_anything_runs(tiny_dict, tmp_path, grouping, message):
    with pytest.raises(InputError, match=message):
        run_experiment(_two_concepts(tiny_dict, [{"name": "x", "grouping": grouping}]), tmp_path / "x",
                       progress=False)
    assert not (tmp_path / "x").exists()


def test_clustered_baselines_need_per_group_mode(tiny_dict, tmp_path):
    for policy in ("fedcluster", "fesem", "kmeans"):
        d = dict(tiny_dict, arms=[{"name": "x", "grouping": {"policy": policy}}])
        with pytest.raises(InputError, match=f"'{policy}' needs mode = \"per-group\""):
            run_experiment(parse_config(d), tmp_path / policy, progress=False)
