"""What a new user hits with bad or odd input: costs never silently wrong, one clear line instead
of a traceback, nothing written before validation, one writer per run directory."""
from __future__ import annotations

import json

import numpy as np
import pytest

from groupfel.cost_models.calibrate import fit_curve
from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.experiments.cli import main
from groupfel.experiments.runner import run_experiment


def _one_arm(d, **train):
    d["arms"] = [d["arms"][1]]       # rg-random: cheap, no training to group
    d["train"].update(train)
    return d


# --- 1. costs are never silently wrong -------------------------------------------------------------

def test_negative_curve_where_the_run_uses_it_is_refused_before_work(tiny_dict, tmp_path):
    prof = tmp_path / "neg.csv"
    prof.write_text("device,task,operation,method,a,b,c\n"
                    "raspberry-pi-4,cifar10-resnet,group_overhead,secagg,-0.5,-1,-2\n")
    tiny_dict["cost"]["profiles_file"] = str(prof)
    with pytest.raises(InputError, match=r"curve raspberry-pi-4/cifar10-resnet/secagg is -3\.5 s at group size 1"):
        run_experiment(parse_config(_one_arm(tiny_dict, rounds=1)), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_toml_profile_with_negative_measured_points_is_refused(tiny_dict, tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text('[[curves]]\ndevice = "raspberry-pi-4"\ntask = "cifar10-resnet"\noperation = "training"\n'
                    'method = "sgd"\npoints = [[5, -1.0], [40, 2.0]]\n')
    tiny_dict["cost"]["profiles_file"] = str(prof)
    with pytest.raises(InputError, match=r"raspberry-pi-4/cifar10-resnet/sgd is -?[0-9.e-]+ s at samples"):
        run_experiment(parse_config(_one_arm(tiny_dict, rounds=1)), tmp_path / "run", progress=False)


def test_shipped_backdoor_fit_stays_clamped_with_a_manifest_warning(tiny_dict, tmp_path):
    tiny_dict["cost"]["group_operations"] = ["secagg", "backdoor-distance"]
    with pytest.warns(UserWarning, match="shipped curve .*backdoor-distance is -0.05969 s at group size 1"):
        run_experiment(parse_config(_one_arm(tiny_dict, rounds=1)), tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "rg-random" / "manifest.json").read_text())
    assert any("backdoor-distance" in w and "charged as 0" in w for w in manifest["warnings"])


def test_whatif_refuses_a_negative_curve_and_an_impossible_memory(tmp_path, capsys):
    prof = tmp_path / "neg.csv"
    prof.write_text("device,task,operation,method,a,b,c\nlab,t,group_overhead,secagg,-0.5,-1,-2\n"
                    "lab,t,training,sgd,0.1,0\n")
    assert main(["whatif", "--profile", "lab/t/secagg", "--profiles-file", str(prof), "--out", str(tmp_path / "w")]) == 2
    assert "curve lab/t/secagg is -6 s at group size 2" in capsys.readouterr().err
    assert main(["whatif", "--clients", "10000000000", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "lower --clients" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("row, message", [
    ("secagg,-3,1.0", "group_size must be a whole number >= 1"),
    ("secagg,2.5,1.0", "group_size must be a whole number >= 1"),
    ("secagg,3,inf", "seconds must be >= 0 and finite"),
    ("training,,1.0", "n_samples must be a whole number >= 1"),
])
def test_calibrate_refuses_bad_rows_with_one_line(tmp_path, capsys, row, message):
    path = tmp_path / "m.csv"
    lines = ["operation,group_size,n_samples,seconds", *[f"secagg,{s},,{0.5 + 0.01 * s * s}" for s in range(2, 8)]]
    op, x, secs = row.split(",")
    lines.append(f"{op},{x},,{secs}" if op != "training" else f"training,,-5,{secs}")
    path.write_text("\n".join(lines) + "\n")
    assert main(["calibrate", str(path), "--out", str(tmp_path / "cal")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "row 7" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "cal").exists()


def test_calibrate_hints_at_a_semicolon_separator(tmp_path, capsys):
    path = tmp_path / "m.csv"
    path.write_text("operation;group_size;seconds\nsecagg;2;0.5\nsecagg;3;0.6\nsecagg;4;0.8\n")
    assert main(["calibrate", str(path), "--out", str(tmp_path / "cal")]) == 2
    assert "separated by ';'" in capsys.readouterr().err


def test_outlier_rule_flags_at_most_1_in_20_on_clean_proportional_noise():
    """57 points with 3 % proportional noise on the Pi 4 secagg curve flagged 11 (the absolute
    z-score read the noisy large groups as outliers); a wild point is still caught."""
    flagged = []
    for seed in range(50):
        rng = np.random.default_rng(seed)
        x = np.repeat(np.arange(2, 31), 2)[:57].astype(float)
        y = (0.01629675 * x**2 - 0.02373668 * x + 0.55442565) * (1 + rng.normal(0, 0.03, len(x)))
        flagged.append(int(fit_curve(x, y, 2, "t")[-1].sum()))
        assert flagged[-1] <= len(x) / 20
        y[10] *= 3                                   # one preempted run
        assert fit_curve(x, y, 2, "t")[-1][10]
    assert np.mean(flagged) <= 0.5


# --- 7. the README's test command on a machine without a browser -----------------------------------

def _pytest_report_test(tmp_path, **env):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GROUPFEL_")}
    # no browser on PATH: only the interpreter's directory (chromium lives in /usr/bin)
    clean.update(PATH=str(tmp_path), PYTHONPATH=str(root), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/test_report.py::test_report_renders_in_chromium"],
                          cwd=root, env=clean, capture_output=True, text=True, timeout=600)


def test_browser_test_skips_with_the_reason_without_a_browser_unless_required(tmp_path):
    proc = _pytest_report_test(tmp_path, GROUPFEL_BROWSER=str(tmp_path / "no-chromium"))
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-2000:]
    assert "no Chromium found" in proc.stdout
    proc = _pytest_report_test(tmp_path, GROUPFEL_BROWSER=str(tmp_path / "no-chromium"), GROUPFEL_REQUIRE_BROWSER="1")
    assert proc.returncode == 1 and "1 error" in proc.stdout and "GROUPFEL_REQUIRE_BROWSER is set" in proc.stdout


# --- 2. one clear line, never a traceback ----------------------------------------------------------

def _toml(tmp_path, d, name="c.toml"):
    import tomli_w

    path = tmp_path / name
    path.write_text(tomli_w.dumps(d))
    return path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("groupfel: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(seed=-1), "config: seed: Input should be greater than or equal to 0"),
    (lambda d: d.pop("seed") and d.update(seeds=[0, -2]), "config: seeds.1: Input should be greater than or equal to 0"),
    (lambda d: d.update(seed=1, seeds=[0, 1]), "seed = 1 and seeds = [0, 1] are both set, which is ambiguous"),
    (lambda d: d.pop("seed") and d.update(seeds=[1, 1]), "groupfel: error: config: seeds must be distinct"),
])
def test_config_values_the_schema_cannot_hold(tiny_dict, tmp_path, capsys, edit, message):
    edit(tiny_dict)
    assert main(["run", str(_toml(tmp_path, tiny_dict)), "--output", str(tmp_path / "run")]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_binary_config_and_sweep_file_given_to_run(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    assert main(["run", str(path)]) == 2
    assert "not a UTF-8 text file" in _one_error_line(capsys)
    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "s"\nbase = "base.toml"\nseeds = [0, 1]\n[axes]\n"train.lr" = [0.01, 0.1]\n')
    assert main(["run", str(sweep)]) == 2
    assert f"this is a sweep file (it has axes), not a run config; run it with 'groupfel sweep {sweep}'" \
        in _one_error_line(capsys)


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
    base = copy_of(tiny_dict)
    base.pop("seeds")
    _toml(tmp_path, base, "base.toml")
    (tmp_path / "s.toml").write_text('name = "s"\nbase = "base.toml"\nseeds = [0, 1]\n[axes]\n"train.lr" = [0.01, 0.1]\n')
    assert [c.seeds for c in point_configs(*load_sweep(tmp_path / "s.toml"))] == [[0, 1], [0, 1]]


def copy_of(d):
    import copy

    return copy.deepcopy(d)


def test_reproduce_set_error_names_the_field_first(tmp_path, capsys):
    assert main(["reproduce", "fig2b", "--quick", "--set", "train.lr=abc", "--output", str(tmp_path / "r")]) == 2
    err = _one_error_line(capsys)
    assert err.startswith("groupfel: error: reproduce --set train.lr='abc': Input should be a valid number")
    assert not (tmp_path / "r").exists()


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
    d = _one_arm(tiny_dict, rounds=rounds, workers=2)
    d["train"]["model"] = "cnn"
    return _toml(tmp_path, d), parse_config(d)


def test_ctrl_c_prints_one_line_exits_130_and_the_rerun_resumes(tiny_dict, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pandas as pd

    path, config = _write_run_config(tiny_dict, tmp_path, rounds=150)
    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "groupfel.experiments.cli", "run", str(path), "--output", str(run)],
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as from a terminal: a background shell (nohup ... &) starts us with SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    def forked_children() -> list[int]:   # the engine's workers: forks of the run (same executable), not
        exe, out = os.readlink(f"/proc/{proc.pid}/exe"), []   # a short-lived helper it spawns
        for t in Path(f"/proc/{proc.pid}/task").iterdir():
            try:   # a thread, or a child, may end while we look
                children = (t / "children").read_text().split()
            except FileNotFoundError:
                continue
            for c in children:
                try:
                    if os.readlink(f"/proc/{c}/exe") == exe:
                        out.append(int(c))
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
    time.sleep(0.5)          # some rounds run (and checkpoint) before the interrupt
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == f"groupfel: interrupted; continue with 'groupfel run --resume {run}'"
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


# --- 3. nothing written before validation completes ------------------------------------------------

def test_jobs_0_writes_nothing(tiny_dict, tmp_path, capsys):
    tiny_dict.pop("seed")
    tiny_dict.update(seeds=[0, 1])
    run = tmp_path / "run"
    assert main(["run", str(_toml(tmp_path, tiny_dict)), "--output", str(run), "--jobs", "0"]) == 2
    assert "--jobs: must be >= 1" in _one_error_line(capsys)
    assert not run.exists()


def test_reproduce_without_its_dataset_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GROUPFEL_FASHION_MNIST", str(tmp_path / "nowhere"))
    out = tmp_path / "r"
    assert main(["reproduce", "hcct-table4", "--quick", "--output", str(out)]) == 2
    assert "fashion-mnist" in _one_error_line(capsys).lower()
    assert not out.exists()


# --- 4. one writer per run directory ----------------------------------------------------------------

def test_a_second_writer_exits_2_naming_the_holder(tiny_dict, tmp_path, capsys):
    import os
    import subprocess
    import sys

    from groupfel.emulator.io import run_lock

    run = tmp_path / "run"
    d = _one_arm(tiny_dict, rounds=1)
    path = _toml(tmp_path, d)
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
            err = _one_error_line(capsys)
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


def test_sweep_into_a_locked_directory_is_refused(tiny_dict, tmp_path, capsys):
    import multiprocessing

    base = _one_arm(tiny_dict, rounds=1)
    _toml(tmp_path, base, "base.toml")
    (tmp_path / "s.toml").write_text('name = "s"\nbase = "base.toml"\nseeds = [0]\n[axes]\n"train.lr" = [0.01]\n')
    ready, stop = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()

    def hold():
        from groupfel.emulator.io import run_lock

        with run_lock(tmp_path / "sw"):
            ready.set()
            stop.wait(60)

    p = multiprocessing.get_context("fork").Process(target=hold)
    p.start()
    try:
        assert ready.wait(30)
        assert main(["sweep", str(tmp_path / "s.toml"), "--output", str(tmp_path / "sw"), "--quiet"]) == 2
        assert f"(PID {p.pid})" in _one_error_line(capsys)
        assert not (tmp_path / "sw" / "sweep.json").exists()
    finally:
        stop.set()
        p.join()


# --- 5. intervals never show impossible values; verdicts a statistician would sign ------------------

def _study(final_acc: dict, cost: dict | None = None):
    import pandas as pd

    from groupfel.experiments.stats import summarize_seeds

    rows = [{"seed": s, "arm": arm, "final_acc": v, "acc_at_common_cost": v, "sim_time_s": 10.0 + v,
             "cost_to_target": (cost or {}).get(arm, [np.nan] * len(vals))[s], "cost": 1.0, "common_cost": 1.0}
            for arm, vals in final_acc.items() for s, v in enumerate(vals)]
    return summarize_seeds(pd.DataFrame(rows), list(final_acc))


def test_holm_hand_case():
    from groupfel.experiments.stats import holm

    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005, np.nan]) == pytest.approx([0.03, 0.06, 0.06, 0.02, np.nan], nan_ok=True)


def test_bounded_intervals_are_clipped_with_a_footnote():
    from groupfel.experiments.reproduce import Metric
    from groupfel.experiments.stats import CLIPPED_NOTE, render_summary

    s = _study({"a": [0.99, 0.80, 0.97], "b": [0.5, 0.4, 0.45]}, cost={"a": [10.0, 4000.0, 20.0], "b": [5.0, 6, 7]})
    a = s.iloc[0]
    assert a["final_acc_ci95_high"] == 1.0 and a["final_acc_ci95_clipped"]       # the t interval passes 1
    assert a["cost_to_target_ci95_low"] == 0.0 and a["cost_to_target_ci95_clipped"]   # ... and 0
    text = render_summary(s, 0.85)
    assert "0.92 [0.661, 1]†" in text and "1343 [0, 7059]†" in text and CLIPPED_NOTE in text
    assert Metric("accuracy", "final_acc", 100).bounds == (0, 100)
    assert Metric("cost", "cost_to_target").bounds == (0, np.inf) and Metric("ipr", "last.ipr").bounds is None


def test_two_seeds_warn_and_equal_differences_are_too_few_seeds():
    from groupfel.experiments.stats import TWO_SEEDS_NOTE, conclusion, render_summary

    s = _study({"a": [0.5, 0.6], "b": [0.6, 0.7]})           # +0.1 in both seeds: a zero-width interval
    text = render_summary(s, None)
    assert TWO_SEEDS_NOTE in text and "supported:" not in text
    assert s.iloc[1]["final_acc_verdict"] == "too few seeds (2 pairs)"
    s = _study({"a": [0.5, 0.6, 0.55], "b": [0.6, 0.7, 0.65]})   # three equal differences: no spread
    assert s.iloc[1]["final_acc_verdict"] == "too few seeds (3 pairs, no spread)"
    assert "supported" not in conclusion(s, None).replace("do not support", "")


def test_verdicts_are_holm_corrected_with_the_unadjusted_interval_beside():
    """Six arms against the first on three metrics: an unadjusted interval that just excludes 0
    is not a finding after the correction; a large consistent difference still is."""
    from groupfel.experiments.stats import render_summary

    base = [0.50, 0.60, 0.55, 0.52, 0.58]
    arms = {"a": base, "big": [v + 0.2 + 0.01 * i for i, v in enumerate(base)],
            "edge": [v + d for v, d in zip(base, [0.02, 0.001, 0.03, 0.005, 0.025])]}
    arms.update({f"null{k}": [v + d for v, d in zip(base, np.random.default_rng(k).normal(0, 0.02, 5))]
                 for k in range(4)})
    s = _study(arms)
    edge = s[s["arm"] == "edge"].iloc[0]
    assert edge["final_acc_diff_ci95_low"] > 0                   # unadjusted: excludes 0
    assert edge["final_acc_verdict"].startswith("not supported (Holm p")
    assert s[s["arm"] == "big"].iloc[0]["final_acc_verdict"].startswith("higher (supported: Holm p")
    text = render_summary(s, None)
    assert "Holm's correction over the 18 comparisons" in text and "[95 % CI]" in text


# --- 6. start-up --------------------------------------------------------------------------------------

def test_building_the_parser_imports_neither_torch_scipy_nor_matplotlib():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, json\nfrom groupfel.experiments.cli import build_parser\nbuild_parser()\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'scipy', 'matplotlib'})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root)},
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == []


# --- 9. friction ----------------------------------------------------------------------------------------

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


def test_study_fig5_shows_progress(tmp_path, capsys):
    assert main(["study", "fig5", "--max-clients", "100", "--out", str(tmp_path / "s")]) == 0
    assert "fig5: timing groupings" in capsys.readouterr().err


# --- 8. a sweep's report as readable as a run's --------------------------------------------------------

def test_band_figure_uses_small_multiples_beyond_4_arms():
    import pandas as pd

    from groupfel.experiments.plots import band_figure

    rows = [{"arm": f"a{k}", "seed": s, "round": r, "cost": 10.0 * r, "accuracy": 0.1 + 0.1 * r + 0.01 * s}
            for k in range(5) for s in range(2) for r in range(4)]
    fig = band_figure({"x": pd.DataFrame(rows)})
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 5
    fig = band_figure({"x": pd.DataFrame([r for r in rows if r["arm"] in ("a0", "a1")])})
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 1


def test_zipped_sweep_report_is_compact_with_verdicts_and_one_plot_per_zipped_set(browser, tiny_dict, tmp_path,
                                                                                   capsys):
    import re
    import subprocess

    from groupfel.experiments.sweep import load_sweep, run_sweep

    tiny_dict.pop("seed")
    tiny_dict["train"].update(rounds=1)
    arm = tiny_dict["arms"][1]
    tiny_dict["arms"] = [{**arm, "name": f"rg-{k}", "grouping": {"policy": "rg", "min_group_size": 3 + (k % 2)}}
                         for k in range(5)]
    _toml(tmp_path, tiny_dict, "base.toml")
    (tmp_path / "s.toml").write_text('name = "z"\nbase = "base.toml"\nseeds = [0]\nmode = "zip"\n[axes]\n'
                                     '"train.lr" = [0.02, 0.08]\n"train.batch_size" = [8, 16]\n')
    assert main(["sweep", str(tmp_path / "s.toml"), "--output", str(tmp_path / "sw"), "--quiet"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:5] == ["point", "train.lr", "train.batch_size", "arm", "seeds"] and len(header) < 12
    assert "reference" in out and "too few seeds (1 pair)" in out and "Holm's correction over the sweep's" in out
    plots = sorted(p.name for p in (tmp_path / "sw").glob("*_vs_*.png"))
    assert plots == sorted(f"{m}_vs_train.lr.png" for m in ("final_acc", "acc_at_common_cost", "cost_to_target",
                                                            "sim_time_s"))
    assert main(["report", str(tmp_path / "sw")]) == 0
    page = (tmp_path / "sw" / "report.html").read_text()
    assert "<th>verdict</th>" in page and "<details><summary>full table" in page
    assert "arms differ from their point" in page
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", (tmp_path / "sw" / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=180)
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    images = int(re.search(r'data-images="(\d+)"', body).group(1))
    assert images >= 6 and f'data-decoded="{images}"' in body and 'data-errors="0"' in body


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
