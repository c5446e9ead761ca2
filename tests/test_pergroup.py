"""Per-group (cross-silo) mode: IPR/RSD, equality with global mode, IFCA, FedCLAR, resume, errors."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.io import read_checkpoint
from groupfel.emulator.compute import LocalSpec, run_group_rounds
from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.emulator.arm import ArmState
from groupfel.emulator.rounds.common import FORWARD_FRACTION, LocalData
from groupfel.emulator.rounds.per_group import PerGroupRounds, ipr_rsd, local_reference
from groupfel.emulator.federation import Group
from groupfel.emulator.driver import CHECKPOINT, plan_arm, run_arm
from groupfel.emulator.world import build_world
from groupfel.experiments.runner import run_experiment
from groupfel.policies import groupings
from groupfel.policies.hcct import group_utility, hcct_partition
from groupfel.policies.pergroup import FedClar, Ifca


def _pergroup(tiny_dict, arms, clients=6, **data):
    tiny_dict["mode"] = "per-group"
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": clients}
    tiny_dict["data"].update(data)
    tiny_dict["train"]["rounds"] = 3
    tiny_dict["arms"] = arms
    return tiny_dict


def test_ipr_and_rsd_on_a_hand_case():
    # gains 0.1, -0.1, 0, 0.1: two of four strictly positive; population SD of the gains
    ipr, rsd = ipr_rsd(np.array([0.8, 0.6, 0.9, 0.5]), np.array([0.7, 0.7, 0.9, 0.4]))
    assert ipr == 0.5
    assert rsd == pytest.approx(np.sqrt(((0.075**2) * 2 + 0.125**2 + 0.025**2) / 4))


def test_pergroup_global_equals_global_mode_with_one_group(tiny_dict, tmp_path):
    tiny_dict["data"]["test_fraction"] = 0.2
    tiny_dict["topology"] = {"edges": 1, "clients_per_edge": 6}
    tiny_dict["train"]["rounds"] = 3
    tiny_dict["arms"] = [{"name": "one", "grouping": {"policy": "global"},
                          "sampling": {"policy": "random", "groups_per_round": 1}, "aggregation": "biased"}]
    g_cfg = parse_config(tiny_dict)
    g_world = build_world(g_cfg)
    g_rows = run_arm(g_world, plan_arm(g_world, 0), tmp_path / "global" / "one")

    tiny_dict["mode"] = "per-group"
    tiny_dict["arms"] = [{"name": "one", "grouping": {"policy": "global"}}]
    p_world = build_world(parse_config(tiny_dict))
    p_rows = run_arm(p_world, plan_arm(p_world, 0), tmp_path / "pergroup" / "one")

    for col in ("round", "cost", "training_cost", "sim_time_s", "round_time_s"):
        assert list(p_rows[col]) == list(g_rows[col])
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "global" / "one" / "ledger.parquet"),
                                  pd.read_parquet(tmp_path / "pergroup" / "one" / "ledger.parquet"), check_exact=True)
    final = torch.load(tmp_path / "pergroup" / "one" / "models.pt", weights_only=True)["models"]
    assert final.shape[0] == 1
    assert p_world.engine.evaluate(final[0])[0] == g_rows["accuracy"].iloc[-1]


def test_pergroup_rows_and_local_policy_matches_its_own_reference(tiny_dict, tmp_path):
    cfg = parse_config(_pergroup(tiny_dict, [{"name": "local", "grouping": {"policy": "local"}},
                                             {"name": "global", "grouping": {"policy": "global"}},
                                             {"name": "sampled", "grouping": {"policy": "rg", "min_group_size": 2},
                                              "sampling": {"policy": "random", "groups_per_round": 1}}]))
    run_experiment(cfg, tmp_path / "run", progress=False)
    # with `sampling` set, only the sampled group trains each round (one group of 2 clients)
    ledger = pd.read_parquet(tmp_path / "run" / "sampled" / "ledger.parquet")
    assert (ledger.groupby("round")["group"].nunique() == 1).all()
    assert (ledger.groupby(["round", "group_round", "component"])["client"].nunique() == 2).all()
    sampled = pd.read_csv(tmp_path / "run" / "sampled" / "results.csv")
    assert list(sampled["groups_sampled"]) == [0, 1, 1, 1]
    local = pd.read_csv(tmp_path / "run" / "local" / "results.csv")
    glob = pd.read_csv(tmp_path / "run" / "global" / "results.csv")
    # independent training is the reference itself: no client gains or loses
    assert (local["ipr"] == 0).all() and (local["rsd"] == 0).all()
    assert np.allclose(local["accuracy"], local["local_accuracy_reference"])
    for df in (local, glob):
        assert list(df["round"]) == [0, 1, 2, 3]
        assert np.allclose(df["local_error_mean"], 1 - df["accuracy"])
        assert (df["local_error_min"] <= df["local_error_mean"]).all()
        assert (df["local_error_mean"] <= df["local_error_max"]).all()
        assert df["cost"].is_monotonic_increasing
    assert (tmp_path / "run" / "local-reference-seed3.pt").exists()
    manifest = json.loads((tmp_path / "run" / "global" / "manifest.json").read_text())
    assert manifest["mode"] == "per-group" and manifest["grouping"]["n_groups"] == 1


class Killed(Exception):
    pass


def _kill_after_round_2_and_resume(run, cfg, full, arm_dir):
    """Run arm 0 of ``cfg`` with ``run`` into ``arm_dir``, kill it after round 2, resume it in a
    fresh world: the table must equal ``full``."""
    def kill(t, cost, acc):
        if t == 2:
            raise Killed
    world = build_world(cfg)
    with pytest.raises(Killed):
        run(world, plan_arm(world, 0), arm_dir, kill)
    world = build_world(cfg)
    pd.testing.assert_frame_equal(full, run(world, plan_arm(world, 0), arm_dir), check_exact=True)


def test_killed_pergroup_run_resumes_to_the_same_table(tiny_dict, tmp_path):
    cfg = parse_config(_pergroup(tiny_dict, [{"name": "hcct", "grouping": {"policy": "hcct", "alpha": 1.0}}]))
    world = build_world(cfg)
    plan = plan_arm(world, 0)
    full = run_arm(world, plan, tmp_path / "a" / "hcct")
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b" / "hcct")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / "hcct" / "ledger.parquet"),
                                  pd.read_parquet(tmp_path / "b" / "hcct" / "ledger.parquet"), check_exact=True)


def _two_concepts(tiny_dict, arms):
    """Two client types whose labels disagree everywhere (a reversed permutation)."""
    return parse_config(_pergroup(tiny_dict, arms, clients=6, partition="concept-shift", min_samples=60,
                                  max_samples=60, types=[{"clients": 3, "permutation": list(range(10))},
                                                         {"clients": 3, "permutation": list(range(9, -1, -1))}]))


def _fedclar_global(tiny_dict, grouping, **train):
    """:func:`_two_concepts` in global mode with one FedCLAR arm (``grouping``) sampling one group a round."""
    d = _two_concepts(tiny_dict, [{"name": "fedclar", "grouping": grouping,
                                   "sampling": {"policy": "random", "groups_per_round": 1}}]).model_dump()
    d.update(mode="global")
    d["data"]["test_fraction"] = None
    d["train"].update(train)
    return parse_config(d)


def _run_recording(world, arm_dir):
    """Arm 0 run into ``arm_dir``: its table, each round's (global model, cluster models) from the
    checkpoint, and its clusters."""
    seen = {}

    def record(t, cost, acc):
        blob = read_checkpoint(arm_dir / CHECKPOINT)
        seen[t] = (blob["weights"], blob["cluster_models"])
    full = run_arm(world, plan_arm(world, 0), arm_dir, record)
    return full, seen, json.loads((arm_dir / "clusters.json").read_text())["clusters"]


def test_ifca_picks_the_lowest_loss_model_on_two_obvious_clusters(tiny_dict, tmp_path):
    assert list(Ifca.assign(np.array([[0.1, 2.0], [3.0, 0.2], [1.0, 1.0]]))) == [0, 1, 0]
    cfg = _two_concepts(tiny_dict, [{"name": "ifca", "grouping": {"policy": "ifca", "n_clusters": 2}}])
    world = build_world(cfg)
    plan = plan_arm(world, 0)
    x0 = world.engine.initial_weights(0)
    # model 0 learned type 0's labelling, model 1 type 1's
    models = torch.stack([world.engine.train(x0, [0], 20, [1])[0], world.engine.train(x0, [3], 20, [1])[0]])
    state = ArmState(models=models, model_edge=[0, 0], assign=np.array([1, 1, 1, 0, 0, 0]))
    rounds = PerGroupRounds(world, plan, tmp_path, state)
    rounds.before_round(0)                       # "every-round" regrouping: the clients re-join by loss
    env = rounds.env
    assert list(state.assign) == [0, 0, 0, 1, 1, 1]
    # each client evaluated both models: 2 · H_i(n_i) / 3, charged as training
    ledger = state.ledger.frame()
    expected = 2 * FORWARD_FRACTION * world.cost.training_cost(["raspberry-pi-4"] * 6, world.topology.n_samples, 1)
    assert np.allclose(ledger.sort_values("client")["amount"], expected)
    assert (ledger["group"] == -1).all() and env.now > 0


def test_ifca_shared_init_starts_every_cluster_at_the_initial_model_and_ties_go_to_cluster_0(tiny_dict, tmp_path):
    """The HCCT authors' IFCA (``init = "shared"``): every cluster model is x_0, so every client's
    losses tie and it joins cluster 0; with ``"random"`` the models differ."""
    cfg = _two_concepts(tiny_dict, [{"name": "ifca", "grouping": {"policy": "ifca", "n_clusters": 3,
                                                                  "init": "shared"}}])
    world = build_world(cfg)
    rounds = PerGroupRounds(world, plan_arm(world, 0), tmp_path, ArmState())
    rounds.start(True)
    x0 = world.engine.initial_weights(cfg.seed)
    assert all(torch.equal(m, x0) for m in rounds.state.models)
    rounds.before_round(0)
    assert list(rounds.state.assign) == [0] * 6
    with pytest.raises(ValueError, match="init must be one of random, shared"):
        Ifca(init="same")


def test_fedclar_clusters_updates_after_its_round(tiny_dict, tmp_path):
    up = np.array([[1.0, 0.0, 0.1], [0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.1, 1.0, 0.1], [1.0, 0.05, 0.0]])
    assert [c.tolist() for c in FedClar(cluster_round=1, threshold=0.5).cluster(up)] == [[0, 1, 4], [2, 3]]

    cfg = _two_concepts(tiny_dict, [{"name": "fedclar", "grouping": {"policy": "fedclar", "min_group_size": 2,
                                                                     "cluster_round": 2, "threshold": 0.9}}])
    world = build_world(cfg)
    run_arm(world, plan_arm(world, 0), tmp_path / "fedclar")
    manifest = json.loads((tmp_path / "fedclar" / "manifest.json").read_text())
    assert [g["size"] for g in manifest["grouping"]["groups"]] == [2, 2, 2]          # random groups first
    final = sorted(sorted(g["clients"]) for g in manifest["final_grouping"]["groups"])
    assert final == [[0, 1, 2], [3, 4, 5]]                                           # then by concept
    ledger = pd.read_parquet(tmp_path / "fedclar" / "ledger.parquet")
    # the probe epoch opens round 3, the first after cluster_round = 2 (rounds count from 1)
    assert set(ledger.loc[ledger["group"] == -1, "round"]) == {3}


def test_pergroup_only_policies_and_options_are_rejected_elsewhere(tiny_dict, tmp_path):
    d = dict(tiny_dict, arms=[{"name": "i", "grouping": {"policy": "ifca"}}])
    with pytest.raises(InputError, match=r"arms\[0\]\.grouping\.policy: 'ifca' needs mode = \"per-group\""):
        run_experiment(parse_config(d), tmp_path / "a", progress=False)
    d = _pergroup(tiny_dict, [{"name": "r", "grouping": {"policy": "rg", "min_group_size": 2}, "regroup_every": 2}])
    with pytest.raises(InputError, match=r"arms\[0\]\.regroup_every: per-group mode"):
        run_experiment(parse_config(d), tmp_path / "b", progress=False)
    d["arms"][0].pop("regroup_every")
    d["data"]["test_fraction"] = 0.0
    with pytest.raises(InputError, match=r"^data\.test_fraction: per-group mode"):
        run_experiment(parse_config(d), tmp_path / "c", progress=False)
    assert not any((tmp_path / x).exists() for x in "abc")
    assert {"local", "global", "ifca", "fedclar"} <= set(groupings)


def test_fedclar_in_global_mode_clusters_once_and_resumes_with_its_clusters(tiny_dict, tmp_path):
    cfg = _fedclar_global(tiny_dict, {"policy": "fedclar", "min_group_size": 2, "cluster_round": 1, "threshold": 0.9})
    world = build_world(cfg)
    plan = plan_arm(world, 0)
    full = run_arm(world, plan, tmp_path / "a")
    clusters = json.loads((tmp_path / "a" / "clusters.json").read_text())
    assert clusters["round"] == 1 and len(clusters["clusters"]) >= 2
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    assert set(ledger.loc[ledger["group"] == -1, "round"]) == {2}   # opens round 2 (rounds count from 1)
    # from then on the sampled group is one of the clusters
    members = {tuple(c["clients"]) for c in clusters["clusters"]}
    later = ledger[(ledger["round"] >= 2) & (ledger["group"] >= 0) & (ledger["group_round"] == 0)]
    assert {tuple(sorted(g["client"].unique())) for _, g in later.groupby("round")} <= members
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


def test_local_reference_is_cached_per_seed_and_config(tiny_dict, tmp_path):
    cfg = parse_config(_pergroup(tiny_dict, [{"name": "local", "grouping": {"policy": "local"}}]))
    world = build_world(cfg)
    data = LocalData(world, world.local_test)
    first = local_reference(world, tmp_path, data)
    path = tmp_path / "local-reference-seed3.pt"
    assert first.shape == (4, 6) and path.exists()
    stamp = path.stat().st_mtime_ns
    assert torch.equal(local_reference(world, tmp_path, data), first) and path.stat().st_mtime_ns == stamp
    tiny_dict["train"]["lr"] = 0.2                   # another config: the cache is not reused
    world = build_world(parse_config(tiny_dict))
    assert not torch.equal(local_reference(world, tmp_path, LocalData(world, world.local_test)), first)


def test_per_group_seeds_train_every_group_as_a_single_seed_run_does(tiny_dict, tmp_path):
    """A multi-seed (or resumed) run re-reads its config from JSON: an arm that sets no
    sampling must still train every group every round, so `local` equals its reference."""
    d = _pergroup(tiny_dict, [{"name": "local", "grouping": {"policy": "local"}}])
    single = run_experiment(parse_config(d), tmp_path / "single", progress=False)
    d.pop("seed")
    d["seeds"] = [3]
    run_experiment(parse_config(d), tmp_path / "multi", progress=False, jobs=1)
    multi = pd.read_csv(tmp_path / "multi" / "runs.csv")
    one = pd.read_csv(tmp_path / "single" / "local" / "results.csv")
    assert (multi["ipr"] == 0).all() and (multi["rsd"] == 0).all()
    assert np.allclose(multi["local_error_mean"], one["local_error_mean"]) and len(single) == 1


def test_fedclar_in_global_mode_trains_one_model_per_cluster(tiny_dict, tmp_path):
    """After cluster_round each cluster keeps its own model, trained only by its members, and the
    evaluated global model is the sample-weighted mean of every cluster's model. Two concepts with
    reversed labels, one cluster sampled a round."""
    cfg = _fedclar_global(tiny_dict, {"policy": "fedclar", "min_group_size": 2, "cluster_round": 1, "threshold": 0.9},
                          rounds=4, eval_every=1)
    world = build_world(cfg)
    full, seen, clusters = _run_recording(world, tmp_path / "a")
    assert sorted(sorted(c["clients"]) for c in clusters) == [[0, 1, 2], [3, 4, 5]]   # by concept
    assert seen[1][1] is None                                      # one global model before clustering
    x1, (x2, m2) = seen[1][0], seen[2]
    assert m2.shape == (2, world.engine.n_params)
    changed = [g for g in range(2) if not torch.equal(m2[g], x1)]
    assert len(changed) == 1                                       # the sampled cluster trained; the other kept x_1
    g = changed[0]
    tc = cfg.train
    spec = LocalSpec(cfg.seed, tc.group_rounds, tc.local_epochs, tc.lr * tc.lr_decay ** 1, cfg.faults)
    members = np.array(clusters[g]["clients"])
    group = Group(0, members, world.topology.n_samples[members], 0.0)
    by_hand = run_group_rounds(world.engine, {g: x1}, {g: group}, 1, spec)[g]
    assert torch.equal(m2[g], by_hand)                             # what that cluster trained from x_1
    n = np.array([world.topology.n_samples[c["clients"]].sum() for c in clusters], dtype=float)
    for t in (2, 3, 4):
        x, m = seen[t]
        torch.testing.assert_close(x, torch.as_tensor(n / n.sum(), dtype=torch.float64).float() @ m, atol=1e-6, rtol=0)
    assert not torch.equal(seen[4][1][0], seen[4][1][1])
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


def _partition(assign) -> list[tuple[int, ...]]:
    return sorted(tuple(np.flatnonzero(np.asarray(assign) == m).tolist()) for m in np.unique(assign))


@pytest.mark.parametrize("restart", ["singletons", "merge"])
def test_hcct_alg1_starts_alone_and_repartitions_every_epoch_from_the_training_gradients(tiny_dict, tmp_path,
                                                                                          restart):
    """HCCT Alg. 1: t = 0 singletons; at every epoch t ≥ 1 Alg. 2 re-partitions on the gradients
    the clients uploaded in the last epoch (no probe, nothing extra charged): from singletons
    (Alg. 2 line 2), or merging the current groups (``restart = "merge"``)."""
    grouping = {"policy": "hcct", "alpha": 10.0, "restart": restart}
    d = _two_concepts(tiny_dict, [{"name": "hcct", "grouping": grouping}]).model_dump()
    d["train"].update(rounds=4, eval_every=1, group_rounds=1)      # HCCT: one local update an epoch
    cfg = parse_config(d)
    world = build_world(cfg)
    seen = {}

    def record(t, cost, acc):
        blob = read_checkpoint(tmp_path / "a" / CHECKPOINT)
        seen[t] = (blob["assign"].numpy(), blob["gradients"], blob["models"])
    full = run_arm(world, plan_arm(world, 0), tmp_path / "a", record)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert [g["size"] for g in manifest["grouping"]["groups"]] == [1] * 6         # t = 0: every client alone
    assert manifest["grouping"]["gradient_probe_training_cost"] == 0 and manifest["regroupings"] == 3
    assert _partition(seen[1][0]) == [(c,) for c in range(6)]
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    assert (ledger["group"] >= 0).all()                                         # no probe was charged
    for t in (1, 2, 3):
        before, after = _partition(seen[t][0]), _partition(seen[t + 1][0])
        # the partition of round t + 1 is Alg. 2 on round t's uploads, from singletons or round t's groups
        grads = seen[t][1].numpy().astype(np.float64)
        start = None if restart == "singletons" else before
        assert after == sorted(tuple(g) for g in hcct_partition(grads, world.topology.n_samples, 10.0, start))
        if restart == "merge":
            assert all(sum(set(g) <= set(h) for h in after) == 1 for g in before)   # groups only merge
    assert _partition(seen[2][0]) == [(0, 1, 2), (3, 4, 5)]                      # by concept after one epoch
    # the gradients are the round's updates: a client alone in round 1 uploaded x_0 − its model
    lr = cfg.train.lr
    x0 = world.engine.initial_weights(cfg.seed)
    torch.testing.assert_close(seen[1][1], (x0 - seen[1][2][seen[1][0]]) / lr)
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")   # after the first merge
    pd.testing.assert_frame_equal(ledger, pd.read_parquet(tmp_path / "b" / "ledger.parquet"), check_exact=True)


def test_hcct_alg1_charges_a_probe_to_clients_without_an_upload(tiny_dict, tmp_path):
    cfg = parse_config(_pergroup(tiny_dict, [{"name": "hcct", "grouping": {"policy": "hcct", "alpha": 1.0},
                                              "sampling": {"policy": "random", "groups_per_round": 2}}]))
    world = build_world(cfg)
    run_arm(world, plan_arm(world, 0), tmp_path / "a")
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    trained_first = set(ledger.loc[(ledger["round"] == 1) & (ledger["group"] >= 0), "client"])
    probed = ledger[ledger["group"] == -1]
    assert len(trained_first) == 2                                              # two singletons sampled
    assert set(probed.loc[probed["round"] == 2, "client"]) == set(range(6)) - trained_first
    assert probed["component"].eq("training").all()
    # each probe is one epoch of training, priced as such
    topo = world.topology
    r2 = probed[probed["round"] == 2].sort_values("client")
    clients = r2["client"].to_numpy()
    np.testing.assert_allclose(r2["amount"], world.cost.training_cost([topo.client_device[c] for c in clients],
                                                                       topo.n_samples[clients], 1))


def test_hcct_once_partitions_once_from_a_charged_probe(tiny_dict, tmp_path):
    cfg = parse_config(_pergroup(tiny_dict, [{"name": "hcct", "grouping": {"policy": "hcct", "alpha": 1.0,
                                                                           "schedule": "once"}}]))
    world = build_world(cfg)
    run_arm(world, plan_arm(world, 0), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["grouping"]["gradient_probe_training_cost"] > 0 and manifest["regroupings"] == 0
    assert sorted(map(sorted, (g["clients"] for g in manifest["grouping"]["groups"]))) == \
        sorted(map(sorted, (g["clients"] for g in manifest["final_grouping"]["groups"])))


def test_hcct_alg1_is_refused_in_global_mode(tiny_dict, tmp_path):
    tiny_dict["arms"] = [{"name": "hcct", "grouping": {"policy": "hcct", "schedule": "alg1"},
                          "sampling": {"policy": "random", "groups_per_round": 2}}]
    with pytest.raises(InputError, match=r'arms\[0\]\.grouping\.schedule: "alg1" \(HCCT Alg\. 1\) runs in per-group'):
        run_experiment(parse_config(tiny_dict), tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()


def test_hcct_manifest_records_the_final_groups_utility(tiny_dict, tmp_path):
    """HCCT Fig. 5's utility: Σ over the final groups of group_utility on the last uploads."""
    cfg = _two_concepts(tiny_dict, [{"name": "hcct", "grouping": {"policy": "hcct", "alpha": 10.0}}])
    world = build_world(cfg)
    last = {}

    def record(t, cost, acc):
        blob = read_checkpoint(tmp_path / "a" / CHECKPOINT)
        last.update(assign=blob["assign"].numpy(), grads=blob["gradients"].numpy().astype(np.float64))
    run_arm(world, plan_arm(world, 0), tmp_path / "a", record)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    sizes = world.topology.n_samples
    by_hand = sum(group_utility(last["grads"], sizes, np.flatnonzero(last["assign"] == m), 10.0)
                  for m in np.unique(last["assign"]))
    assert manifest["final_grouping"]["objective"] == pytest.approx(by_hand)


def test_without_the_local_reference_the_run_is_the_same_less_its_columns(tiny_dict, tmp_path):
    """train.local_reference = false trains no client alone: ipr, rsd and the reference column are
    empty, every other number and the ledger equal those of a run that trained it, and no reference
    file is written."""
    d = _pergroup(tiny_dict, [{"name": "rg", "grouping": {"policy": "rg", "min_group_size": 2}}])
    run_experiment(parse_config(d), tmp_path / "with", progress=False)
    d["train"]["local_reference"] = False
    run_experiment(parse_config(d), tmp_path / "without", progress=False)
    with_, without = (pd.read_csv(tmp_path / r / "rg" / "results.csv") for r in ("with", "without"))
    empty = ["ipr", "rsd", "local_accuracy_reference"]
    assert with_[empty].notna().all().all() and without[empty].isna().all().all()
    pd.testing.assert_frame_equal(with_.drop(columns=empty), without.drop(columns=empty), check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "with" / "rg" / "ledger.parquet"),
                                  pd.read_parquet(tmp_path / "without" / "rg" / "ledger.parquet"), check_exact=True)
    assert list(tmp_path.glob("with/local-reference-*.pt")) and not list(tmp_path.glob("without/local-reference-*"))


def _authors_fedclar(classifiers, th, min_group_size):
    """A transcription of the Group-FEL authors' ``__FedCLAR_clustering`` (Jiyao17/fl-grouping
    utils/fedclar.py): each model a dict of its classifier's weight and bias, merged as their
    ``_merge_model_sds`` merges state dicts; their "too few clusters" exception returns None."""
    import copy

    def _sim_mat(model_sds):
        weights = [sd['fc.weight'].flatten() for sd in model_sds]
        biases = [sd['fc.bias'].flatten() for sd in model_sds]
        classifiers = [np.concatenate((weights[i], biases[i])) for i in range(len(weights))]
        sim_mat = np.zeros((len(model_sds), len(model_sds)))
        for i in range(len(model_sds)):
            for j in range(len(model_sds)):
                sim_mat[i][j] = np.dot(classifiers[i], classifiers[j]) / (np.linalg.norm(classifiers[i])
                                                                          * np.linalg.norm(classifiers[j]))
        return sim_mat

    def _merge_model_sds(state_dicts, weights):
        avg_state_dict = copy.deepcopy(state_dicts[0])
        for key in avg_state_dict.keys():
            avg_state_dict[key] = avg_state_dict[key] * weights[0]
        for key in avg_state_dict.keys():
            for i in range(1, len(state_dicts)):
                avg_state_dict[key] += state_dicts[i][key] * weights[i]
        return avg_state_dict

    clusters = [[c] for c in range(len(classifiers))]
    model_sds = [{'fc.weight': row[:-3].reshape(-1, 2), 'fc.bias': row[-3:]} for row in classifiers]
    while True:
        sim_mat = _sim_mat(model_sds)
        for i in range(len(clusters)):
            sim_mat[i][i] = -1
        min_index = np.argmax(sim_mat)
        i, j = min_index // len(clusters), min_index % len(clusters)
        max_len = max(len(cluster) for cluster in clusters)
        if len(clusters) < 2:
            return None
        if sim_mat[i, j] >= th and max_len <= min_group_size * 2:
            if i > j:
                i, j = j, i
            cluster_i = clusters.pop(i)
            cluster_j = clusters.pop(j - 1)
            model_sd_i = model_sds.pop(i)
            model_sd_j = model_sds.pop(j - 1)
            total_num = len(cluster_i) + len(cluster_j)
            weights = [len(cluster_i) / total_num, len(cluster_j) / total_num]
            clusters.append(cluster_i + cluster_j)
            model_sds.append(_merge_model_sds([model_sd_i, model_sd_j], weights))
        else:
            return [cluster for cluster in clusters if len(cluster) > 1]


def test_fedclar_authors_merge_is_the_authors_loop():
    # by hand: 0 and 1 nearly parallel merge first, then 2 joins them (its similarity to their
    # mean 0.9990); 3 points elsewhere and is left out
    rows = np.array([[1.0, 0.0, 0.0], [1.0, 0.01, 0.0], [1.0, 0.05, 0.0], [0.0, 0.0, 1.0]])
    found = FedClar(min_group_size=2, merge="authors", similarity=0.995).cluster(rows)
    assert [c.tolist() for c in found] == [[2, 0, 1]]
    # the cap reads the largest cluster before a merge: with MinGS 1 a pair may still merge into 3
    assert [c.tolist() for c in FedClar(min_group_size=1, merge="authors", similarity=0.9).cluster(rows)] == [[2, 0, 1]]
    assert FedClar(min_group_size=2, merge="authors", similarity=0.99999).cluster(rows) == []
    # a zero layer's similarity is undefined: NaN is numpy's first maximum and fails the threshold,
    # so their merging stops there, and ours
    zero = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.001, 0.0], [0.0, 1.0, 0.0]])
    with np.errstate(invalid="ignore", divide="ignore"):
        theirs = _authors_fedclar(zero.astype(np.float32), 0.995, 2)
    assert FedClar(min_group_size=2, merge="authors").cluster(zero) == [] == theirs
    gen = np.random.default_rng(0)
    merged = 0
    for case in range(300):
        n, mings = int(gen.integers(1, 16)), int(gen.integers(1, 5))
        # models of one start after a short probe: a common direction plus each client's drift
        rows = gen.normal(size=9) + gen.normal(scale=gen.choice([0.02, 0.1, 0.3]), size=(n, 9))
        th = float(gen.choice([0.9, 0.99, 0.995, 0.999]))
        ours = FedClar(min_group_size=mings, merge="authors", similarity=th).cluster(rows)
        theirs = _authors_fedclar(rows.astype(np.float32), th, mings)   # their state dicts are float32
        if theirs is None:   # everything merged (or one client): theirs raises, ours keeps what merged
            assert [sorted(c.tolist()) for c in ours] == ([list(range(n))] if n > 1 else []), case
        else:   # the same clusters, in the same merge order: ties break alike
            assert [c.tolist() for c in ours] == theirs, case
        merged += sum(len(c) for c in ours)
    assert merged > 300   # the cases do merge


def test_fedclar_authors_merge_in_global_mode_clusters_the_probed_last_layers(tiny_dict, tmp_path):
    from groupfel.emulator.membership import last_layer, probe_models

    grouping = {"policy": "fedclar", "min_group_size": 1, "cluster_round": 1, "merge": "authors",
                "similarity": 0.99, "probe_epochs": 2}
    cfg = _fedclar_global(tiny_dict, grouping)
    world = build_world(cfg)
    full, seen, clusters = _run_recording(world, tmp_path / "a")
    # by hand: every client probed 2 epochs from x_1; the authors' merge of their last layers
    probed = probe_models(world, np.arange(6), seen[1][0].expand(6, -1), 1, 0, 2)
    assert last_layer(world).stop == world.engine.n_params               # the classifier, weight and bias
    by_hand = FedClar(**{k: v for k, v in grouping.items() if k != "policy"}).cluster(
        probed[:, last_layer(world)].numpy().astype(np.float64))
    assert [c["clients"] for c in clusters] == [c.tolist() for c in by_hand]
    out = sorted(set(range(6)) - {c for cl in clusters for c in cl["clients"]})
    assert all(len(c["clients"]) >= 2 for c in clusters) and out   # the unmerged clients are left out
    ledger = pd.read_parquet(tmp_path / "a" / "ledger.parquet")
    later = ledger[(ledger["round"] >= 2) & (ledger["group"] >= 0)]
    assert not set(later["client"]) & set(out)                     # and never train again
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


def test_fedclar_authors_merge_that_merges_nothing_says_which_field(tiny_dict, tmp_path):
    grouping = {"policy": "fedclar", "min_group_size": 1, "cluster_round": 1, "merge": "authors",
                "similarity": 1.0}
    world = build_world(_fedclar_global(tiny_dict, grouping))
    says = r"^arms\[0\]\.grouping\.similarity: no two clients .* reached 1\.0 at round 1"
    with pytest.raises(InputError, match=says):
        run_arm(world, plan_arm(world, 0), tmp_path / "a")


def test_fedclar_probed_start_is_the_members_mean_probed_model_and_survives_a_resume(tiny_dict, tmp_path):
    """``cluster_start = "probed"``: each cluster starts from its members' mean probed model, as the
    authors' pairwise member-weighted merges give; the starts are saved with the clusters, so a run
    killed between them and that round's checkpoint starts its clusters from the same models."""
    from groupfel.emulator.membership import CLUSTER_STARTS, cluster_groups, probe_models

    grouping = {"policy": "fedclar", "min_group_size": 1, "cluster_round": 1, "merge": "authors",
                "similarity": 0.99, "probe_epochs": 2, "cluster_start": "probed"}
    cfg = _fedclar_global(tiny_dict, grouping, rounds=4, eval_every=1)
    world = build_world(cfg)
    policy = plan_arm(world, 0).grouping
    x = world.engine.initial_weights(0)
    groups, _, starts = cluster_groups(world, policy, x, 1, tmp_path / "c")
    probed = probe_models(world, np.arange(6), x.expand(6, -1), 1, 0, 2)
    assert len(groups) >= 1 and len(starts) == len(groups) and (tmp_path / "c" / CLUSTER_STARTS).is_file()
    for g, start in zip(groups, starts):
        assert torch.equal(start, probed[g.clients].mean(dim=0))
    again, _, starts_again = cluster_groups(world, policy, x, 1, tmp_path / "c")   # as after such a kill
    assert [g.clients.tolist() for g in again] == [g.clients.tolist() for g in groups]
    assert torch.equal(starts_again, starts)
    current = FedClar(**{k: v for k, v in grouping.items() if k not in ("policy", "cluster_start")})
    assert cluster_groups(world, current, x, 1, tmp_path / "d")[2] is None       # the default: from x_t

    # in a run: the clusters not sampled in the round after clustering still hold their starts
    full, seen, clusters = _run_recording(world, tmp_path / "a")
    assert len(clusters) >= 2
    probed = probe_models(world, np.arange(6), seen[1][0].expand(6, -1), 1, 0, 2)
    means = [probed[c["clients"]].mean(dim=0) for c in clusters]
    kept = [g for g in range(len(clusters)) if torch.equal(seen[2][1][g], means[g])]
    assert len(kept) == len(clusters) - 1                                  # all but the one sampled
    assert not any(torch.equal(means[g], seen[1][0]) for g in kept)        # not the global model
    _kill_after_round_2_and_resume(run_arm, cfg, full, tmp_path / "b")


def test_fedclar_probed_start_in_per_group_mode(tiny_dict, tmp_path):
    """Per-group mode: the clusters start from their members' mean probed model, not from their
    group models' mean."""
    from groupfel.emulator.membership import probe_models

    grouping = {"policy": "fedclar", "min_group_size": 1, "cluster_round": 1, "merge": "authors",
                "similarity": 0.5, "probe_epochs": 2, "cluster_start": "probed"}
    cfg = _two_concepts(tiny_dict, [{"name": "fedclar", "grouping": grouping}])
    world = build_world(cfg)
    plan = plan_arm(world, 0)
    x0 = world.engine.initial_weights(0)
    models = torch.stack([world.engine.train(x0, [c], 1, [7])[0] for c in (0, 2, 4)])   # three group models
    state = ArmState(models=models, model_edge=[0, 0, 0], assign=np.array([0, 0, 1, 1, 2, 2]))
    rounds = PerGroupRounds(world, plan, tmp_path, state)
    rounds.before_round(1)
    probed = probe_models(world, np.arange(6), models[[0, 0, 1, 1, 2, 2]], 1, 0, 2)
    found = [np.flatnonzero(state.assign == k) for k in range(len(state.models))]
    assert found and all(len(f) >= 2 for f in found)
    for k, members in enumerate(found):
        assert torch.equal(state.models[k], probed[members].mean(dim=0))
