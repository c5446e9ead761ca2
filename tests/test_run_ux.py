"""What a user of ``groupfel run`` sees: round numbering, input warnings, the budget check and the
progress bar."""
from __future__ import annotations

import copy
import json
import warnings

import pandas as pd
import pytest
from conftest import one_arm, one_error_line, write_toml

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
    assert "--round: '0': give an integer from 1" in capsys.readouterr().err
    assert main(["timeline", str(arm), "--round", "4"]) == 2
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


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(seed=-1), "config: seed: -1 is out of range; give a number at least 0"),
    (lambda d: d.pop("seed") and d.update(seeds=[0, -2]), "config: seeds.1: -2 is out of range; give a number at least 0"),
    (lambda d: d.update(seed=1, seeds=[0, 1]), "seed = 1 and seeds = [0, 1] are both set, which is ambiguous"),
    (lambda d: d.pop("seed") and d.update(seeds=[1, 1]), "groupfel: error: config: seeds must be distinct"),
])
def test_config_values_the_schema_cannot_hold(tiny_dict, tmp_path, capsys, edit, message):
    edit(tiny_dict)
    assert main(["run", str(write_toml(tmp_path, tiny_dict)), "--output", str(tmp_path / "run")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_binary_config_and_sweep_file_given_to_run(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    assert main(["run", str(path)]) == 2
    assert "not a UTF-8 text file" in one_error_line(capsys)
    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "s"\nbase = "base.toml"\nseeds = [0, 1]\n[axes]\n"train.lr" = [0.01, 0.1]\n')
    assert main(["run", str(sweep)]) == 2
    assert f"this is a sweep file (it has axes), not a run config; run it with 'groupfel sweep {sweep}'" \
        in one_error_line(capsys)


def test_configs_the_tool_writes_hold_seed_and_seeds_and_still_load(tiny_dict, tmp_path):
    """config.json holds both fields, and a sweep adds seeds to a base with seed: neither trips
    the ambiguity check, which is for a user's own config."""
    from groupfel.experiments.runner import config_from_run_dir
    from groupfel.experiments.sweep import load_sweep, point_configs

    tiny_dict.update(seeds=[0, 1])
    config = parse_config(tiny_dict)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(config.model_dump_json())
    assert "seed" in json.loads(config.model_dump_json())
    assert config_from_run_dir(tmp_path / "run") == config
    base = copy.deepcopy(tiny_dict)
    base.pop("seeds")
    write_toml(tmp_path, base, "base.toml")
    (tmp_path / "s.toml").write_text('name = "s"\nbase = "base.toml"\nseeds = [0, 1]\n[axes]\n"train.lr" = [0.01, 0.1]\n')
    assert [c.seeds for c in point_configs(*load_sweep(tmp_path / "s.toml"))] == [[0, 1], [0, 1]]


def test_broken_pipe_is_quiet(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # a table of 1,000 rows (130 kB, more than a pipe holds) read by a reader that stops after one line
    cmd = (f"{sys.executable} -m groupfel.experiments.cli whatif --clients 1000 --rounds 1 --group-sizes 1..1000 "
           f"--out {tmp_path / 'w'} | head -1")
    proc = subprocess.run(cmd, shell=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.stdout.count("\n") == 1 and "group_size" in proc.stdout
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def _write_run_config(tiny_dict, tmp_path, rounds):
    d = one_arm(tiny_dict, rounds=rounds, workers=2)
    d["train"]["model"] = "cnn"
    return write_toml(tmp_path, d), parse_config(d)


def test_ctrl_c_prints_one_line_exits_130_and_the_rerun_resumes(tiny_dict, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pandas as pd

    path, config = _write_run_config(tiny_dict, tmp_path, rounds=40)
    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "groupfel.experiments.cli", "run", str(path), "--output", str(run)],
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as from a terminal: a background shell (nohup ... &) starts us with SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    def forked_children(pid: int | None = None) -> list[int]:
        # the engine's workers and the server they fork from: the run's descendants (same
        # executable), not a short-lived helper it spawns
        pid = pid or proc.pid
        exe, out = os.readlink(f"/proc/{proc.pid}/exe"), []
        try:   # a thread, or a child, may end while we look
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            return out
        for t in tasks:
            try:
                children = (t / "children").read_text().split()
            except FileNotFoundError:
                continue
            for c in children:
                try:
                    if os.readlink(f"/proc/{c}/exe") == exe:
                        out += [int(c), *forked_children(int(c))]
                except FileNotFoundError:
                    pass
        return out

    checked, deadline = 0, time.time() + 300
    while not checked and proc.poll() is None and time.time() < deadline:
        for pid in forked_children():   # each ignores SIGINT (bit 2 of SigIgn): the parent speaks for the run
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                continue
            # ignored, or still blocked as forked (the initializer ignores it, then unblocks)
            masks = int(status.split("SigIgn:")[1].split()[0], 16) | int(status.split("SigBlk:")[1].split()[0], 16)
            assert masks & (1 << (signal.SIGINT - 1)), pid
            checked += 1
        time.sleep(0.05)
    assert checked, "no engine worker was found to check"
    while not (run / "rg-random" / "checkpoint.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)     # some rounds run (and checkpoint) before the interrupt
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == f"groupfel: interrupted; continue with 'groupfel run --resume {run}'", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    run_experiment(config, tmp_path / "ref", progress=False)
    pd.testing.assert_frame_equal(pd.read_csv(run / "rg-random" / "results.csv"),
                                  pd.read_csv(tmp_path / "ref" / "rg-random" / "results.csv"))


def test_full_disk_is_one_line_and_the_rerun_resumes_with_the_same_numbers(tiny_dict, tmp_path, capsys):
    import subprocess

    import pandas as pd

    path, config = _write_run_config(tiny_dict, tmp_path, rounds=30)
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        run = small / "run"
        assert main(["run", str(path), "--output", str(run), "--quiet"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"groupfel: error: the disk is full: cannot write {run}/")
        assert "bytes free on" in err[0] and "rerun the same command" in err[0]
        subprocess.run(["mount", "-o", "remount,size=16m", str(small)], check=True)
        assert main(["run", str(path), "--output", str(run), "--quiet"]) == 0
        run_experiment(config, tmp_path / "ref", progress=False)
        pd.testing.assert_frame_equal(pd.read_csv(run / "rg-random" / "results.csv"),
                                      pd.read_csv(tmp_path / "ref" / "rg-random" / "results.csv"))
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)


def test_jobs_0_writes_nothing(tiny_dict, tmp_path, capsys):
    tiny_dict.pop("seed")
    tiny_dict.update(seeds=[0, 1])
    run = tmp_path / "run"
    assert main(["run", str(write_toml(tmp_path, tiny_dict)), "--output", str(run), "--jobs", "0"]) == 2
    assert "argument --jobs: '0': give an integer from 1 to 1,024 processes" in one_error_line(capsys)
    assert not run.exists()


def test_a_second_writer_exits_2_naming_the_holder(tiny_dict, tmp_path, capsys):
    import os
    import subprocess
    import sys

    from groupfel.emulator.io import run_lock

    run = tmp_path / "run"
    d = one_arm(tiny_dict, rounds=1)
    path = write_toml(tmp_path, d)
    # another process holds the lock (as a running `groupfel run` would)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom groupfel.emulator.io import run_lock\n"
                               f"with run_lock({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                              env={**os.environ, "PYTHONPATH": os.getcwd()}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["run", str(path), "--output", str(run)], ["run", "--resume", str(run)]):
            if argv[1] == "--resume":
                (run / "config.json").write_text(parse_config(d).model_dump_json())
            assert main(argv) == 2
            err = one_error_line(capsys)
            assert f"another groupfel process (PID {holder.pid}) is writing this run directory" in err
        assert not (run / "rg-random").exists()
    finally:
        holder.kill()
        holder.wait()
    # the OS released it with the process: the run goes ahead, and the lock is re-entrant in-process
    with run_lock(run):
        assert main(["run", str(path), "--output", str(run), "--force", "--quiet"]) == 0
    with run_lock(run):
        pass


def test_the_lock_lives_with_the_process_not_its_forked_children(tmp_path):
    """The training engine forks workers while the run holds the lock: the lock must not outlive
    the run in them (a killed run's orphaned workers would lock the directory for good)."""
    import multiprocessing

    from groupfel.emulator.io import run_lock

    ctx = multiprocessing.get_context("fork")
    with run_lock(tmp_path / "run"):
        child_ready, stop = ctx.Event(), ctx.Event()
        child = ctx.Process(target=lambda: (child_ready.set(), stop.wait(60)))
        child.start()
        assert child_ready.wait(30)
    try:
        probe = ctx.Process(target=lambda: run_lock(tmp_path / "run").__enter__())   # another process locks
        probe.start()
        probe.join(30)
        assert probe.exitcode == 0
    finally:
        stop.set()
        child.join()


def test_friction_items(tiny_dict, tmp_path, capsys):
    from groupfel.emulator.arm import norm_growth
    from groupfel.experiments.cli import build_parser
    from groupfel.experiments.cost_cli import _number

    whatif = build_parser()._subparsers._group_actions[0].choices["whatif"].format_help()
    for flag, default in (("--clients", "10000"), ("--rounds", "100"), ("--samples-mean", "50"), ("--seed", "0")):
        import re

        line = re.search(rf"\n  {flag} [A-Z_]+(.*?)(?=\n  -)", whatif.split("options:")[1], re.S).group(1)
        assert f"(default {default})" in " ".join(line.split()), (flag, line)
    assert norm_growth(float("inf")) == "became infinite or NaN (not a number)" and norm_growth(3.0) == "grew 3x"
    assert [_number(v) for v in (10000.0, 9999.0, 123456.0, 0.07158)] == ["10000", "9999", "123456", "0.07158"]
    tiny_dict["faults"] = {"dropout": 1.0}
    with pytest.raises(InputError, match="config: faults.dropout = 1 drops every client .*nothing would train"):
        parse_config(tiny_dict)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["topology"].update(clients_per_edge=10**11),
     "topology.clients_per_edge: 100000000000 is out of range; give a number at most 100,000,000"),
    (lambda d: d["topology"].update(edges=10**5, clients_per_edge=10**4),
     "topology: 100,000 edges x 10,000 clients = 1,000,000,000 clients is more than 100,000,000"),
    (lambda d: d["data"].update(max_samples=10**20), "data.max_samples: 100000000000000000000 is out of range; give a "
     "number at most 100,000,000"),
    (lambda d: d.update(seed=10**20), "seed: 100000000000000000000 is out of range; give a number at most "
     "9,223,372,036,854,775,807"),
])
def test_config_sizes_are_bounded_before_anything_is_built(tiny_dict, tmp_path, capsys, edit, message):
    """Before: numpy's _ArrayMemoryError (1.46 TiB), MemoryError, 'Overflow when unpacking long long',
    or a NaN blamed on the aggregation rule."""
    edit(tiny_dict)
    assert main(["run", str(write_toml(tmp_path, tiny_dict)), "--output", str(tmp_path / "run")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()
