"""Whole runs: outputs, Eq. 5 against the ledger, determinism, resume, CLI errors."""
import json

import numpy as np
import pandas as pd
import pytest

from emulator.config import parse_config
from emulator.errors import InputError
from emulator.runner import plan_arm, run_arm
from emulator.world import build_world
from experiments.cli import main
from experiments.runner import run_experiment


def test_run_writes_tables_plot_and_manifest(tiny_config, tmp_path):
    summary = run_experiment(tiny_config, tmp_path / "run", progress=False)
    assert list(summary["arm"]) == ["covg-esrcov", "rg-random"]
    for arm in summary["arm"]:
        d = tmp_path / "run" / arm
        csv = pd.read_csv(d / "results.csv")
        assert csv.equals(pd.read_parquet(d / "results.parquet"))
        assert list(csv["round"]) == list(range(7))
        assert csv["cost"].is_monotonic_increasing and csv["sim_time_s"].is_monotonic_increasing
        assert csv["accuracy"].between(0, 1).all()
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["complete"] and manifest["config"]["seed"] == 3
        assert manifest["grouping"]["size_min"] >= 3
        assert sum(g["size"] for g in manifest["grouping"]["groups"]) == 12
        assert not (d / "checkpoint.pt").exists()
    assert (tmp_path / "run" / "accuracy_vs_cost.png").stat().st_size > 5000


def test_ledger_matches_eq5_closed_form(tiny_config, tmp_path):
    run_experiment(tiny_config, tmp_path / "run", progress=False)
    world = build_world(tiny_config)
    K, E = tiny_config.train.group_rounds, tiny_config.train.local_epochs
    profile = world.cost.profiles["raspberry-pi-4"]
    H, O = profile.training["sgd"], profile.group_overhead["secagg"]
    n = world.topology.n_samples
    for arm in ("covg-esrcov", "rg-random"):
        ledger = pd.read_parquet(tmp_path / "run" / arm / "ledger.parquet")
        manifest = json.loads((tmp_path / "run" / arm / "manifest.json").read_text())
        groups = manifest["grouping"]["groups"]
        expected = 0.0
        for (_, g), _rows in ledger.groupby(["round", "group"]):     # Eq. 5: Σ_t Σ_{g∈S_t} K Σ_i (O + E·H)
            members = np.array(groups[g]["clients"])
            expected += K * sum(O(len(members)) + E * H(n[i]) for i in members)
        assert ledger["amount"].sum() == pytest.approx(expected, rel=1e-12)
        final = pd.read_csv(tmp_path / "run" / arm / "results.csv")["cost"].iloc[-1]
        assert final == pytest.approx(expected, rel=1e-12)


def test_same_seed_same_tables(tiny_config, tmp_path):
    run_experiment(tiny_config, tmp_path / "a", progress=False)
    run_experiment(tiny_config, tmp_path / "b", progress=False)
    for arm in ("covg-esrcov", "rg-random"):
        a = pd.read_csv(tmp_path / "a" / arm / "results.csv")
        b = pd.read_csv(tmp_path / "b" / arm / "results.csv")
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / arm / "ledger.parquet"),
                                      pd.read_parquet(tmp_path / "b" / arm / "ledger.parquet"), check_exact=True)


def test_other_seed_other_numbers(tiny_dict, tmp_path):
    run_experiment(parse_config(tiny_dict), tmp_path / "a", progress=False)
    tiny_dict["seed"] = 4
    run_experiment(parse_config(tiny_dict), tmp_path / "b", progress=False)
    a = pd.read_csv(tmp_path / "a" / "rg-random" / "results.csv")
    b = pd.read_csv(tmp_path / "b" / "rg-random" / "results.csv")
    assert not a["accuracy"].equals(b["accuracy"])


class Killed(Exception):
    pass


def test_killed_run_resumes_to_the_same_table(tiny_dict, tmp_path):
    tiny_dict["train"]["eval_every"] = 2
    tiny_dict["arms"][0]["regroup_every"] = 3
    config = parse_config(tiny_dict)
    world = build_world(config)
    plan = plan_arm(world, 0)
    full = run_arm(world, plan, tmp_path / "full")

    def kill_after_round_4(t, cost, acc):
        if t == 5:
            raise Killed
    with pytest.raises(Killed):
        run_arm(world, plan, tmp_path / "killed", kill_after_round_4)
    assert (tmp_path / "killed" / "checkpoint.pt").exists()
    resumed = run_arm(build_world(config), plan_arm(build_world(config), 0), tmp_path / "killed")
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "full" / "ledger.parquet"),
                                  pd.read_parquet(tmp_path / "killed" / "ledger.parquet"), check_exact=True)


def test_cli_resume_of_a_finished_run_changes_nothing(tiny_config, tmp_path, capsys):
    run_experiment(tiny_config, tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "rg-random" / "results.csv").read_text()
    assert main(["run", "--resume", str(tmp_path / "run"), "--quiet"]) == 0
    assert "rg-random" in capsys.readouterr().out
    assert (tmp_path / "run" / "rg-random" / "results.csv").read_text() == before


def test_budget_stops_before_exceeding(tiny_dict, tmp_path):
    tiny_dict["train"].update(rounds=None, budget=400.0)
    summary = run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    assert (summary["cost"] <= 400.0).all() and (summary["stop"] == "budget").all()
    assert (summary["cost"] > 250.0).all()  # one more round would have crossed the budget


def test_budget_holds_with_dropouts_and_recovery(tiny_dict, tmp_path):
    tiny_dict["train"].update(rounds=None, budget=400.0)
    tiny_dict["faults"] = {"dropout": 0.3}
    summary = run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    assert (summary["cost"] <= 400.0).all() and (summary["stop"] == "budget").all()
    ledger = pd.read_parquet(tmp_path / "run" / "rg-random" / "ledger.parquet")
    assert (ledger["component"] == "secagg-recovery").any()


def _write_toml(path, text):
    path.write_text(text)
    return str(path)


BASE = """
name = "x"
output_dir = "{out}"
[topology]
edges = 2
clients_per_edge = 6
[data]
min_samples = 8
max_samples = 20
[train]
model = "mlp"
rounds = 1
[[arms]]
name = "a"
grouping = {{ policy = "covg", min_group_size = {mings} }}
sampling = {{ policy = "esrcov", groups_per_round = 1 }}
"""


@pytest.mark.parametrize("edit, field", [
    (lambda s: s + "\n[extra]\nfoo = 1\n", "extra"),
    (lambda s: s.replace("rounds = 1", "rounds = \"ten\""), "train.rounds"),
    (lambda s: s.replace("rounds = 1", "rounds = 1\nlearning_rate = 0.1"), "train.learning_rate"),
    (lambda s: s.replace("min_group_size = 3", "min_group_size = 7"), "min_group_size"),
    (lambda s: s.replace("policy = \"covg\"", "policy = \"nope\""), "grouping.policy"),
    (lambda s: s.replace("groups_per_round = 1", "groups_per_round = 0"), "groups_per_round"),
    (lambda s: s.replace("[data]", "[data]\ndataset = \"fashion-mnist\"\npath = \"/nonexistent\""), "apt-get install"),
    (lambda s: s.replace("max_samples = 20", "max_samples = 2000\nmean_samples = 1000"), "max_samples"),
    (lambda s: s.replace("[[arms]]", "[cost]\ngroup_operations = [\"nope\"]\n[[arms]]"), "cost.group_operations"),
])
def test_cli_config_errors_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, edit, field):
    out = tmp_path / "out"
    cfg = _write_toml(tmp_path / "c.toml", edit(BASE.format(out=out, mings=3)))
    assert main(["run", cfg, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("groupfel: error:") and "\n" not in err and field in err
    assert not out.exists()


def test_cli_missing_config_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_different_config_into_same_dir_needs_force(tiny_dict, tmp_path):
    run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    tiny_dict["seed"] = 9
    with pytest.raises(InputError, match="--force"):
        run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False, force=True)
    assert json.loads((tmp_path / "run" / "rg-random" / "manifest.json").read_text())["seed"] == 9


def test_unbiased_aggregation_with_esrcov_stops_with_a_clear_message(tiny_dict, tmp_path, capsys):
    from emulator.errors import DivergenceError
    # Many groups, all sampled: the unlikeliest ones get weight 1/(p_g·S), astronomically large.
    tiny_dict["topology"]["clients_per_edge"] = 15
    tiny_dict["arms"] = [{"name": "u", "grouping": {"policy": "covg", "min_group_size": 3, "max_cov": 0.1},
                          "sampling": {"policy": "esrcov", "groups_per_round": 30}, "aggregation": "unbiased"}]
    with pytest.raises(DivergenceError, match="stabilized"):
        run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)


def test_gradient_probe_is_charged_as_training_and_resumes_identically(tiny_dict, tmp_path):
    tiny_dict["train"]["eval_every"] = 2
    tiny_dict["arms"] = [{"name": "hcct", "grouping": {"policy": "hcct", "min_group_size": 3},
                          "sampling": {"policy": "random", "groups_per_round": 2}, "regroup_every": 2}]
    config = parse_config(tiny_dict)
    world = build_world(config)
    full = run_arm(world, plan_arm(world, 0), tmp_path / "full")
    ledger = pd.read_parquet(tmp_path / "full" / "ledger.parquet")
    probe = ledger[ledger.group == -1]
    assert sorted(probe["round"].unique().tolist()) == [1, 3, 5]          # start + each regrouping
    h = world.cost.profiles["raspberry-pi-4"].training["sgd"]
    first = probe[probe["round"] == 1].sort_values("client")
    assert first["client"].tolist() == list(range(12)) and (first["component"] == "training").all()
    assert first["amount"].to_numpy() == pytest.approx(h(world.topology.n_samples))   # one epoch each
    assert full["cost"].iloc[0] == 0 and full["sim_time_s"].iloc[0] == 0   # round 0: the initial model
    assert full["cost"].iloc[1] == pytest.approx(ledger.loc[ledger["round"] <= 2, "amount"].sum())

    def kill(t, cost, acc):
        if t == 4:
            raise Killed
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "killed", kill)
    resumed = run_arm(world, plan_arm(world, 0), tmp_path / "killed")
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)


def test_cli_plot_of_a_run(tiny_config, tmp_path, capsys):
    run_experiment(tiny_config, tmp_path / "run", progress=False)
    assert main(["plot", str(tmp_path / "run"), "--x", "sim_time_s", "--y", "loss"]) == 0
    assert (tmp_path / "run" / "loss_vs_sim_time_s.png").stat().st_size > 5000
    assert main(["plot", str(tmp_path / "run"), "--y", "nope"]) == 2
    assert "--y" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "empty")]) == 2
