"""Whole runs: outputs, Eq. 5 against the ledger, determinism, resume, CLI errors."""
import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch

from groupfel.emulator.io import read_checkpoint
from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.emulator.membership import form_groups
from groupfel.emulator.world import build_world
from groupfel.experiments.cli import main
from groupfel.experiments.runner import run_experiment


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


def test_the_authors_covg_sampling_share_and_draw_run_end_to_end(tiny_dict, tmp_path):
    """``grow = "authors"`` with ``leftover = "drop"`` leaves out the clients of short groups (the
    manifest counts them and the ledger never charges them); ``fraction_of = "all-clients"`` takes S
    from every client's data, as the authors' code, with the successive draw."""
    arm = tiny_dict["arms"][0]
    tiny_dict["data"]["alpha"] = 0.1
    tiny_dict["topology"]["clients_per_edge"] = 10
    tiny_dict["arms"] = [arm, {**arm, "name": "authors", "sampling": {"policy": "esrcov", "data_fraction": 0.8,
                                                                      "fraction_of": "all-clients", "draw": "successive"},
                               "grouping": {**arm["grouping"], "grow": "authors", "leftover": "drop"}}]
    run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    ours, authors = ({"manifest": json.loads((tmp_path / "run" / a / "manifest.json").read_text()),
                      "ledger": pd.read_parquet(tmp_path / "run" / a / "ledger.parquet")}
                     for a in ("covg-esrcov", "authors"))
    dropped = authors["manifest"]["grouping"]["clients_dropped"]
    assert dropped > 0 and ours["manifest"]["grouping"]["clients_dropped"] == 0
    kept = authors["manifest"]["grouping"]["groups"]
    assert all(g["size"] >= 3 for g in kept) and sum(g["size"] for g in kept) == 20 - dropped
    charged = set(authors["ledger"].query("component == 'training'")["client"])
    assert charged <= {c for g in kept for c in g["clients"]}
    # S from 0.8 of every client's samples, the left-out ones included, over the kept groups' mean
    samples = np.array([g["samples"] for g in kept], dtype=float)
    world = build_world(parse_config(tiny_dict))
    S = min(len(kept), max(1, round(0.8 * world.topology.n_samples.sum() / samples.mean())))
    assert S != round(0.8 * samples.sum() / samples.mean())
    assert authors["ledger"].groupby("round")["group"].nunique().eq(S).all()


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
    (lambda s: s.replace("groups_per_round = 1", "groups_per_round = 1, draw = \"numpy\""), "sampling.draw"),
    (lambda s: s.replace("groups_per_round = 1", "groups_per_round = 1, fraction_of = \"all-clients\""), "fraction_of"),
    (lambda s: s.replace("min_group_size = 3", "min_group_size = 3, grow = \"greedy\""), "grow"),
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


def _rows(acc, loss):
    return [{"accuracy": a, "loss": b} for a, b in zip(acc, loss)]


def test_collapse_rule_hand_cases():
    from groupfel.emulator.rounds.global_mode import collapsed as _collapse
    # learned (0.6 ≥ 0.1 + 0.2), then 3 evaluations at chance (≤ 0.15): collapsed
    assert "back at chance" in _collapse(_rows([0.1, 0.6, 0.15, 0.12, 0.1], [2.3, 1.0, 2.3, 2.3, 2.3]), 10)
    # two at chance then a recovery, or never learned (peak 0.25 < 0.3): not a collapse
    assert _collapse(_rows([0.1, 0.6, 0.12, 0.1, 0.4], [2.3, 1.0, 2.3, 2.3, 1.5]), 10) is None
    assert _collapse(_rows([0.1, 0.25, 0.1, 0.1, 0.1], [2.3, 2.1, 2.3, 2.3, 2.3]), 10) is None
    # loss ≥ 3 × best (0.9) = 2.7 and > ln 10 three times, accuracy not at chance: collapsed
    assert "3x its best" in _collapse(_rows([0.2, 0.7, 0.3, 0.35, 0.3], [2.3, 0.9, 8.6, 2.8, 5.0]), 10)
    # 3 × best below ln 10: the loss must also be worse than a uniform guess
    assert _collapse(_rows([0.2, 0.9, 0.8, 0.8, 0.8], [2.3, 0.1, 0.5, 0.6, 0.5]), 10) is None


def test_collapsing_run_stops_with_exit_1_and_keeps_what_it_wrote(tiny_dict, tmp_path, capsys):
    """Unbiased aggregation (Eq. 4) with ESRCoV and a large lr on tiny digits: the model learns
    (0.32 at round 3) and falls back to chance without a norm jump; the run stops, names the
    aggregation and sampling, and keeps its results, ledger and manifest."""
    from groupfel.errors import DivergenceError
    tiny_dict["topology"]["clients_per_edge"] = 10
    tiny_dict["train"].update(lr=1.0, rounds=16)
    tiny_dict["arms"] = [{"name": "u", "grouping": {"policy": "covg", "min_group_size": 2, "max_cov": 0.5},
                          "sampling": {"policy": "esrcov", "groups_per_round": 2}, "aggregation": "unbiased"}]
    with pytest.raises(DivergenceError, match=r"collapsed.*back at chance.*unbiased aggregation with esrcov"):
        run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    arm = tmp_path / "run" / "u"
    results = pd.read_csv(arm / "results.csv")
    manifest = json.loads((arm / "manifest.json").read_text())
    assert manifest["stop_reason"] == "diverged" and "collapsed" in manifest["message"]
    assert manifest["rounds_run"] == results["round"].iloc[-1] < 16
    assert results["accuracy"].max() >= 0.3 and (results["accuracy"].iloc[-3:] <= 0.15).all()
    assert pd.read_parquet(arm / "ledger.parquet")["amount"].sum() == pytest.approx(manifest["total_cost_eq5"])
    assert not (arm / "checkpoint.pt").exists()
    # finished as far as resume is concerned: resuming reprints the run, the collapse stays recorded
    assert main(["run", "--resume", str(tmp_path / "run"), "--quiet"]) == 0
    assert "diverged" in capsys.readouterr().out


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

    for at in (3, 4):   # resumed inside a grouping epoch (stored grouping) and at a regrouping
        def kill(t, cost, acc, at=at):
            if t == at:
                raise Killed
        with pytest.raises(Killed):
            run_arm(world, plan_arm(world, 0), tmp_path / f"killed{at}", kill)
        resumed = run_arm(world, plan_arm(world, 0), tmp_path / f"killed{at}")
        pd.testing.assert_frame_equal(full, resumed, check_exact=True)
        pd.testing.assert_frame_equal(ledger, pd.read_parquet(tmp_path / f"killed{at}" / "ledger.parquet"),
                                      check_exact=True)


def test_hcct_regrouping_probes_fresh_batches_from_the_current_model(tiny_dict, monkeypatch):
    """HCCT Alg. 1 re-clustering: each regrouping epoch trains its probe from the global model
    it is given, on freshly drawn batches, so a regrouping can change the groups."""
    tiny_dict["seed"] = 5
    tiny_dict["topology"]["clients_per_edge"] = 10
    tiny_dict["arms"] = [{"name": "hcct", "grouping": {"policy": "hcct", "min_group_size": 2},
                          "sampling": {"policy": "random", "groups_per_round": 2}, "regroup_every": 2}]
    world = build_world(parse_config(tiny_dict))
    plan = plan_arm(world, 0)
    calls = []
    train = world.engine.train

    def spy(start, clients, epochs, seeds):
        calls.append((start.clone(), list(seeds)))
        return train(start, clients, epochs, seeds)
    monkeypatch.setattr(world.engine, "train", spy)
    w0 = world.engine.initial_weights(5)
    first = form_groups(world, plan.grouping, 0, w0)
    again = form_groups(world, plan.grouping, 0, w0)
    regroup = form_groups(world, plan.grouping, 2, w0)
    (s0, seeds0), (_, seeds_again), (_, seeds2) = calls[0], calls[2], calls[4]
    assert torch.equal(s0, w0) and seeds0 == seeds_again and seeds0 != seeds2
    members = lambda g: [g_.clients.tolist() for g_ in g.groups]   # noqa: E731
    assert members(first) == members(again) and members(first) != members(regroup)
    moved = w0 * 0.5
    form_groups(world, plan.grouping, 2, moved)
    assert torch.equal(calls[-1][0], moved)


def test_resume_refuses_a_checkpoint_that_would_run_code(tiny_dict, tmp_path, capsys, code_running_payload):
    """A run directory from someone else: its checkpoint.pt is loaded with weights_only=True."""
    tiny_dict["arms"] = tiny_dict["arms"][:1]
    tiny_dict["train"]["rounds"] = 2
    run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)
    arm = tmp_path / "run" / "covg-esrcov"
    marker = tmp_path / "pwned"
    (arm / "manifest.json").unlink()
    torch.save({"t": code_running_payload(marker)}, arm / "checkpoint.pt")
    assert main(["run", "--resume", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint.pt" in err and "refused" in err
    assert not marker.exists()


def test_checkpoint_loads_with_weights_only(tiny_dict, tmp_path):
    """Every checkpoint holds tensors and plain containers only (ledger columns, rows, groupings)."""
    tiny_dict["arms"] = [{"name": "hcct", "grouping": {"policy": "hcct", "min_group_size": 3},
                          "sampling": {"policy": "random", "groups_per_round": 2}, "regroup_every": 2}]
    config = parse_config(tiny_dict)
    world = build_world(config)

    def kill(t, cost, acc):
        if t == 3:
            raise Killed
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "a", kill)
    blob = read_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert blob["t"] == 3 and blob["grouping_epoch"] == 2 and len(blob["ledger"]["columns"]["amount"]) > 0


def test_cli_plot_of_a_run(tiny_config, tmp_path, capsys):
    run_experiment(tiny_config, tmp_path / "run", progress=False)
    assert main(["plot", str(tmp_path / "run"), "--x", "sim_time_s", "--y", "loss"]) == 0
    assert (tmp_path / "run" / "loss_vs_sim_time_s.png").stat().st_size > 5000
    assert main(["plot", str(tmp_path / "run"), "--y", "nope"]) == 2
    assert "--y" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "empty")]) == 2


@pytest.mark.slow
def test_seeds_run_every_arm_on_every_seed(tiny_dict, tmp_path, capsys):
    tiny_dict["seeds"] = [0, 1, 2]
    tiny_dict["train"].update(rounds=4, target_accuracy=0.3)
    config = parse_config(tiny_dict)
    summary = run_experiment(config, tmp_path / "run", progress=False, jobs=1)
    runs = pd.read_csv(tmp_path / "run" / "runs.csv")
    assert sorted(set(zip(runs["seed"], runs["arm"]))) == [(s, a) for s in (0, 1, 2) for a in ("covg-esrcov", "rg-random")]
    for s in (0, 1, 2):     # each seed is a single-seed run directory; arms share its data placement
        seed_run = tmp_path / "run" / f"seed-{s}"
        assert json.loads((seed_run / "config.json").read_text())["seed"] == s
        assert (pd.read_csv(seed_run / "rg-random" / "results.csv")["seed"] == s).all()
        groups = [json.loads((seed_run / a / "manifest.json").read_text())["grouping"]["groups"]
                  for a in ("covg-esrcov", "rg-random")]
        assert sorted(c for g in groups[0] for c in g["clients"]) == sorted(c for g in groups[1] for c in g["clients"])
    assert list(summary["arm"]) == ["covg-esrcov", "rg-random"] and (summary["seeds"] == 3).all()
    on_disk = pd.read_csv(tmp_path / "run" / "summary.csv")
    assert {"final_acc_mean", "final_acc_ci95_low", "final_acc_ci95_high", "target_reached"} <= set(on_disk)
    assert (on_disk["final_acc_ci95_low"] <= on_disk["final_acc_mean"]).all()
    # the same seed alone gives the same numbers as within the multi-seed run
    tiny_dict.pop("seeds")
    tiny_dict["seed"] = 1
    run_experiment(parse_config(tiny_dict), tmp_path / "alone", progress=False)
    alone = pd.read_csv(tmp_path / "alone" / "rg-random" / "results.csv")
    pd.testing.assert_frame_equal(alone, pd.read_csv(tmp_path / "run" / "seed-1" / "rg-random" / "results.csv"))
    # --resume of the finished multi-seed run reprints the study table with its verdicts
    assert main(["run", "--resume", str(tmp_path / "run"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "paired difference from covg-esrcov" in out and "Over 3 seeds" in out


def test_a_diverged_arm_of_a_multi_seed_run_does_not_stop_the_others(tiny_dict, tmp_path, capsys):
    """Seeds and sweeps run (seed, arm) tasks: one that diverges keeps its rows, the others still
    run, the tables are written, and the command exits 1 naming the diverged run."""
    import tomli_w

    tiny_dict["topology"]["clients_per_edge"] = 10
    tiny_dict["train"].update(lr=1.0, rounds=16)
    tiny_dict.pop("seed")
    tiny_dict.update(seeds=[3], output_dir=str(tmp_path), name="mixed")
    tiny_dict["arms"] = [{"name": "u", "grouping": {"policy": "covg", "min_group_size": 2, "max_cov": 0.5},
                          "sampling": {"policy": "esrcov", "groups_per_round": 2}, "aggregation": "unbiased"},
                         {"name": "rg", "grouping": {"policy": "rg", "min_group_size": 2},
                          "sampling": {"policy": "random", "groups_per_round": 2}}]
    config = tmp_path / "mixed.toml"
    config.write_text(tomli_w.dumps(tiny_dict))
    assert main(["run", str(config), "--jobs", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "training diverged: seed-3/u:" in err and "collapsed" in err and "seed-3/rg" not in err
    runs = pd.read_csv(tmp_path / "mixed" / "runs.csv")
    assert set(runs["arm"]) == {"u", "rg"} and runs.loc[runs["arm"] == "rg", "round"].max() == 16
    assert (tmp_path / "mixed" / "summary.csv").exists()


# --- damaged run files: one line naming the file; a rerun redoes only the damaged arm --------------------

def _finished(tiny_dict, tmp_path):
    tiny_dict["train"]["rounds"] = 2
    run = tmp_path / "run"
    run_experiment(parse_config(tiny_dict), run, progress=False)
    return run


@pytest.mark.parametrize("name, damage, says", [
    ("manifest.json", lambda p: p.write_text(p.read_text()[:40]), "not valid JSON"),
    ("results.csv", lambda p: p.write_text(p.read_text()[:-30]), "not a readable table"),
    ("ledger.parquet", lambda p: p.write_bytes(p.read_bytes()[:100]), "not a readable Parquet file"),
])
def test_a_damaged_arm_file_is_one_line_and_a_rerun_redoes_only_that_arm(tiny_dict, tmp_path, capsys, name, damage,
                                                                         says):
    """Before: json.decoder.JSONDecodeError, pandas' ParserError or pyarrow's ArrowInvalid tracebacks
    from report and resume."""
    run = _finished(tiny_dict, tmp_path)
    before = pd.read_csv(run / "covg-esrcov" / "results.csv")
    kept = (run / "rg-random" / "results.csv").stat().st_mtime_ns
    damage(run / "covg-esrcov" / name)
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run / 'covg-esrcov' / name}: damaged ({says}" in err, err
    assert f"groupfel run --resume {run}" in err
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(run / "covg-esrcov" / "results.csv"), before, check_exact=True)
    assert (run / "rg-random" / "results.csv").stat().st_mtime_ns == kept       # the intact arm is not redone


def test_a_damaged_config_or_checkpoint(tiny_dict, tmp_path, capsys):
    run = _finished(tiny_dict, tmp_path)
    (run / "config.json").write_text('{"name": "tiny", "se')
    assert main(["run", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run / 'config.json'}: damaged (not valid JSON" in err, err
    assert "groupfel run CONFIG" in err
    # a checkpoint truncated by a copy: the arm restarts from round 0 with a warning, and ends the same
    run2 = _finished(copy.deepcopy(tiny_dict), tmp_path / "b")
    before = pd.read_csv(run2 / "rg-random" / "results.csv")
    (run2 / "rg-random" / "manifest.json").unlink()
    (run2 / "rg-random" / "checkpoint.pt").write_bytes(b"PK\x03\x04trunc")
    with pytest.warns(UserWarning, match=r"checkpoint.pt: damaged \(truncated or not a checkpoint\); arm "
                                         r"'rg-random' restarts from round 0"):
        run_experiment(parse_config({**tiny_dict, "train": {**tiny_dict["train"], "rounds": 2}}), run2,
                       progress=False)
    pd.testing.assert_frame_equal(pd.read_csv(run2 / "rg-random" / "results.csv"), before, check_exact=True)


def test_rerunning_a_finished_run_builds_no_engine(tiny_dict, tmp_path, monkeypatch):
    """Before: every arm's world (data, topology, engine) was built before the run found nothing left."""
    import groupfel.experiments.tasks

    run = _finished(tiny_dict, tmp_path)
    want = pd.read_csv(run / "summary.csv")
    stamp = (run / "accuracy_vs_cost.png").stat().st_mtime_ns

    def refuse(*a, **k):
        raise AssertionError("a finished run's rerun built a world")
    monkeypatch.setattr(groupfel.experiments.tasks, "plan_world", refuse)
    monkeypatch.setattr("groupfel.experiments.runner.plan_world", refuse)
    got = run_experiment(parse_config(tiny_dict), run, progress=False)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_exact=False, check_dtype=False)
    assert (run / "accuracy_vs_cost.png").stat().st_mtime_ns == stamp      # the plot is kept
