"""measure → calibrate → profile → run charges what the profile says; each device its own curves."""
import json

import numpy as np
import pandas as pd
import pytest

from groupfel.cost_models import get_profile, read_profiles
from groupfel.cost_models.whatif import Scenario, sweep
from groupfel.emulator.config import parse_config
from groupfel.experiments.cli import main
from groupfel.experiments.runner import run_experiment


def _config(tmp_path, **over):
    d = {"name": "tiny", "seed": 0, "output_dir": str(tmp_path),
         "data": {"dataset": "digits", "min_samples": 8, "max_samples": 20},
         "topology": {"edges": 2, "clients_per_edge": 5},
         "train": {"model": "mlp", "rounds": 2, "group_rounds": 2, "local_epochs": 2, "eval_every": 1},
         "arms": [{"name": "a", "grouping": {"policy": "rg", "min_group_size": 5},
                   "sampling": {"policy": "random", "groups_per_round": 2}}]}
    d.update(over)
    return parse_config(d)


def _run(tmp_path, **over):
    run_experiment(_config(tmp_path, **over), tmp_path / "run", progress=False)
    arm = tmp_path / "run" / "a"
    return pd.read_parquet(arm / "ledger.parquet"), pd.read_csv(arm / "results.csv"), \
        json.loads((arm / "manifest.json").read_text())


def _check_overheads(ledger, overhead):
    """Every group-operation charge is O_g(|g|) of its group's size."""
    sizes = ledger[ledger.component == "training"].groupby(["round", "group", "group_round"])["client"].nunique()
    ops = ledger[ledger.component != "training"]
    assert len(ops)
    for row in ops.itertuples():
        assert row.amount == pytest.approx(float(overhead(sizes[row.round, row.group, row.group_round])))


def test_measure_calibrate_run_round_trip(tmp_path):
    sa, tr = tmp_path / "sa.csv", tmp_path / "tr.csv"
    assert main(["measure", "secagg", "--sizes", "2..6", "--params", "64", "--repeats", "2", "--out", str(sa)]) == 0
    assert main(["measure", "training", "--sizes", "8..40:8", "--model", "mlp", "--repeats", "2",
                 "--device", "local", "--out", str(tr)]) == 0
    assert sa.read_text().startswith("# groupfel measure: secagg\n# cpu: ")
    assert main(["calibrate", str(sa), str(tr), "--out", str(tmp_path / "cal"), "--task", "mine"]) == 0
    profile = tmp_path / "cal" / "profile.csv"
    assert (tmp_path / "cal" / "fit-local-secagg.png").stat().st_size > 0
    prof = read_profiles(profile)["local/mine"]
    ledger, results, manifest = _run(
        tmp_path, topology={"edges": 2, "clients_per_edge": 5, "devices": {"local": 1.0}},
        cost={"task": "mine", "training": "sgd", "group_operations": ["secagg"], "profiles_file": str(profile)})
    # each charge is the calibrated curve's value: E·H(n_i) for training, O_g(|g|) for secagg
    n_samples = ledger[ledger.component == "training"]
    from groupfel.emulator.world import build_world  # the same world the run used: client sample counts
    world = build_world(_config(tmp_path, topology={"edges": 2, "clients_per_edge": 5, "devices": {"local": 1.0}},
                                cost={"task": "mine", "training": "sgd", "group_operations": ["secagg"],
                                      "profiles_file": str(profile)}))
    n_i = world.topology.n_samples[n_samples["client"].to_numpy()]
    np.testing.assert_allclose(n_samples["amount"], 2 * prof.training["sgd"](n_i))
    _check_overheads(ledger, prof.group_overhead["secagg"])
    assert manifest["total_cost_eq5"] == pytest.approx(ledger["amount"].sum())
    assert "round_time_s" in results and results["round_time_s"].iloc[-1] > 0
    np.testing.assert_allclose(results["sim_time_s"].diff().iloc[1:], results["round_time_s"].iloc[1:])


def test_heterogeneous_devices_each_pay_their_own_curve_with_faults(tmp_path):
    ledger, results, manifest = _run(
        tmp_path, topology={"edges": 2, "clients_per_edge": 5, "devices": {"raspberry-pi-4": 0.7, "gpu-server": 0.3}},
        cost={"task": "cifar10-resnet", "training": "sgd", "group_operations": ["backdoor-distance"]},
        faults={"dropout": 0.2, "straggler": {"distribution": "pareto", "shape": 2.0}})
    assert set(ledger.device.astype(str)) == {"raspberry-pi-4", "gpu-server"}
    world_cfg = _config(tmp_path, topology={"edges": 2, "clients_per_edge": 5,
                                            "devices": {"raspberry-pi-4": 0.7, "gpu-server": 0.3}},
                        cost={"task": "cifar10-resnet", "training": "sgd", "group_operations": ["backdoor-distance"]})
    from groupfel.emulator.world import build_world
    n_all = build_world(world_cfg).topology.n_samples
    for dev in ("raspberry-pi-4", "gpu-server"):
        prof = get_profile(f"{dev}/cifar10-resnet")
        rows = ledger[(ledger.device == dev) & (ledger.component == "training")]
        np.testing.assert_allclose(rows["amount"], 2 * prof.training["sgd"](n_all[rows["client"].to_numpy()]))
        ops = ledger[(ledger.device == dev) & (ledger.component == "backdoor-distance") & (ledger.amount > 0)]
        np.testing.assert_allclose(ops["amount"], prof.group_overhead["backdoor-distance"](5))
    # dropouts: some group-operation charges are zero (left before them); the ledger still balances
    assert (ledger[ledger.component == "backdoor-distance"]["amount"] == 0).any()
    assert manifest["total_cost_eq5"] == pytest.approx(ledger["amount"].sum())
    assert results["cost"].iloc[-1] == pytest.approx(ledger["amount"].sum())


def test_whatif_matches_brute_force_and_is_fast():
    o = lambda s: 0.01 * s**2 + 0.5   # noqa: E731
    h = lambda n: 0.07 * n + 0.1       # noqa: E731
    sc = Scenario(clients=23, samples_mean=10, rounds=50, group_rounds=2, local_epochs=3, groups_per_round=2)
    df = sweep([4], o, h, sc).iloc[0]
    # 23 clients in groups of 4: 5 groups (3 of size 5); each round 2 groups; the sum per round
    n = sc.sample_counts()
    assert df["groups"] == 5 and df["groups_per_round"] == 2
    # every client-level term: mean over rounds of K Σ (O(|g|) + E·H(n_i)) of the sampled clients
    per_client_train = 2 * 3 * h(n)
    assert df["training_per_round"] == pytest.approx(2 / 5 * per_client_train.sum(), rel=0.25)
    big = sweep(list(range(2, 41, 2)), o, h, Scenario(clients=100_000, rounds=100))
    assert big["operations_share"].is_monotonic_increasing
