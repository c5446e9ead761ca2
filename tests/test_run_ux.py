"""What a user of ``groupfel run`` sees: round numbering, input warnings, the budget check and the
progress bar."""
from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

from groupfel.emulator.config import parse_config
from groupfel.errors import InputError, InputWarning
from groupfel.experiments.cli import main
from groupfel.experiments.runner import run_experiment


def _one_arm(d, **train):
    d["arms"] = [d["arms"][1]]       # rg-random: cheap, no training to group
    d["train"].update(train)
    return d


def test_rounds_are_numbered_from_1_everywhere(tiny_dict, tmp_path, capsys):
    run_experiment(parse_config(_one_arm(tiny_dict, rounds=3)), tmp_path / "run", progress=False)
    arm = tmp_path / "run" / "rg-random"
    results = pd.read_csv(arm / "results.csv")
    ledger = pd.read_parquet(arm / "ledger.parquet")
    manifest = json.loads((arm / "manifest.json").read_text())
    assert results["round"].tolist() == [0, 1, 2, 3]        # evaluation after r rounds; 0 = initial model
    assert sorted(ledger["round"].unique().tolist()) == [1, 2, 3] == list(range(1, manifest["rounds_run"] + 1))
    for r, cost in zip(results["round"], results["cost"]):
        assert cost == pytest.approx(ledger.loc[ledger["round"] <= r, "amount"].sum())
    # round_time_s: the simulated span of round r alone
    assert results["round_time_s"].iloc[1:].tolist() == pytest.approx(results["sim_time_s"].diff().iloc[1:].tolist())
    assert main(["timeline", str(arm)]) == 0                # default: the first round
    assert "round 1:" in capsys.readouterr().out
    assert main(["timeline", str(arm), "--round", "0"]) == 2
    assert "rounds run: 1..3" in capsys.readouterr().err


def test_progress_bar_shows_no_nan_accuracy(tiny_dict, tmp_path, capsys):
    run_experiment(parse_config(_one_arm(tiny_dict, rounds=3, eval_every=2)), tmp_path / "run", progress=True)
    err = capsys.readouterr().err
    assert "nan" not in err and "acc=" in err and "round=3" in err


def test_budget_below_the_first_round_is_refused_before_work(tiny_dict, tmp_path, capsys):
    d = _one_arm(tiny_dict, rounds=2)
    run_experiment(parse_config(d), tmp_path / "full", progress=False)
    ledger = pd.read_parquet(tmp_path / "full" / "rg-random" / "ledger.parquet")
    first = float(ledger.loc[ledger["round"] == 1, "amount"].sum())
    d["train"].update(rounds=None, budget=first * (1 - 1e-9))
    with pytest.raises(InputError, match="train.budget.*first round"):
        run_experiment(parse_config(d), tmp_path / "low", progress=False)
    assert not (tmp_path / "low").exists()
    d["train"].update(budget=first)        # exactly one round fits
    summary = run_experiment(parse_config(d), tmp_path / "exact", progress=False)
    assert summary["rounds"].tolist() == [1] and summary["cost"].iloc[0] == pytest.approx(first)


def test_budget_below_the_first_round_with_a_training_grouping(tiny_dict, tmp_path):
    tiny_dict["arms"] = [{"name": "hcct", "grouping": {"policy": "hcct", "min_group_size": 3},
                          "sampling": {"policy": "random", "groups_per_round": 2}}]
    tiny_dict["train"].update(rounds=None, budget=1.0)
    with pytest.raises(InputError, match="train.budget"):
        run_experiment(parse_config(tiny_dict), tmp_path / "run", progress=False)


def test_groups_per_round_above_the_groups_warns_and_is_recorded(tiny_dict, tmp_path):
    d = _one_arm(tiny_dict, rounds=1)
    d["arms"][0]["sampling"]["groups_per_round"] = 50
    with pytest.warns(InputWarning, match="groups_per_round = 50 exceeds the 4 groups"):
        run_experiment(parse_config(d), tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "rg-random" / "manifest.json").read_text())
    assert any("exceeds the 4 groups" in w for w in manifest["warnings"])
    assert manifest["groups_per_round"] == 4


def test_device_shares_not_summing_to_1_warn_once_and_are_recorded(tiny_dict, tmp_path, capsys):
    tiny_dict["topology"]["devices"] = {"raspberry-pi-4": 2.0}
    tiny_dict["train"]["rounds"] = 1
    (tmp_path / "c.toml").write_text(_to_toml(tiny_dict))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["run", str(tmp_path / "c.toml"), "--output", str(tmp_path / "run"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("groupfel: warning: topology.devices: shares sum to 2") == 1
    for arm in ("covg-esrcov", "rg-random"):
        manifest = json.loads((tmp_path / "run" / arm / "manifest.json").read_text())
        assert manifest["warnings"] == ["topology.devices: shares sum to 2, not 1; normalised to raspberry-pi-4 = 1"]


def _to_toml(d: dict) -> str:
    """The few value types the test configs use."""
    def value(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v)
    lines = [f"{k} = {value(v)}" for k, v in d.items() if not isinstance(v, (dict, list))]
    for k, v in d.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{kk} = {value(vv)}" for kk, vv in v.items())]
    for arm in d.get("arms", []):
        lines += ["[[arms]]", *(f"{kk} = {value(vv)}" for kk, vv in arm.items())]
    return "\n".join(lines) + "\n"
