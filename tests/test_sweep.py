"""Sweeps: point expansion, validation before work, resume after a kill, local vs Ray tables."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import one_arm, one_error_line, write_toml

from groupfel.errors import InputError
from groupfel.experiments.cli import main
from groupfel.experiments.report import build_report
from groupfel.experiments.sweep import SweepConfig, load_sweep, points, run_sweep, set_path

ROOT = Path(__file__).resolve().parents[1]

BASE = """
name = "tiny"
seed = 3
[data]
dataset = "digits"
alpha = 0.3
min_samples = 8
max_samples = 20
[topology]
edges = 2
clients_per_edge = 6
[train]
model = "mlp"
lr = 0.05
batch_size = 8
group_rounds = 2
local_epochs = 1
rounds = 6
target_accuracy = 0.3
[[arms]]
name = "covg"
grouping = { policy = "covg", min_group_size = 3, max_cov = 0.5 }
sampling = { policy = "esrcov", groups_per_round = 2 }
[[arms]]
name = "rg"
grouping = { policy = "rg", min_group_size = 3 }
sampling = { policy = "random", groups_per_round = 2 }
"""


def write_sweep(tmp_path, axes: str, seeds="[0, 1]", extra="") -> Path:
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "base.toml").write_text(BASE)
    path = tmp_path / "conf" / "sweep.toml"
    path.write_text(f'name = "tiny-sweep"\nbase = "base.toml"\nseeds = {seeds}\n{extra}\n[axes]\n{axes}\n')
    return path


def test_points_are_the_cartesian_product_or_zipped():
    axes = {"arms.0.grouping.min_group_size": [2, 3, 4], "data.alpha": [0.1, 1.0]}
    product = points(SweepConfig(name="s", base="b.toml", seeds=[0], axes=axes))
    assert len(product) == 6
    assert product[0] == {"arms.0.grouping.min_group_size": 2, "data.alpha": 0.1}
    assert product[1] == {"arms.0.grouping.min_group_size": 2, "data.alpha": 1.0}
    assert product[5] == {"arms.0.grouping.min_group_size": 4, "data.alpha": 1.0}
    zipped = points(SweepConfig(name="s", base="b.toml", seeds=[0], mode="zip",
                                axes={"arms.0.grouping.min_group_size": [2, 3], "data.alpha": [0.1, 1.0]}))
    assert zipped == [{"arms.0.grouping.min_group_size": 2, "data.alpha": 0.1},
                      {"arms.0.grouping.min_group_size": 3, "data.alpha": 1.0}]


def test_set_path_into_tables_and_lists():
    raw = {"arms": [{"grouping": {"min_group_size": 5}}, {"grouping": {}}], "data": {}}
    set_path(raw, "arms.1.grouping.min_group_size", 7)
    set_path(raw, "train.budget", 100.0)          # a missing table is created
    assert raw["arms"][1]["grouping"]["min_group_size"] == 7 and raw["train"] == {"budget": 100.0}
    with pytest.raises(InputError, match=r"arms.2 indexes a list of 2 items"):
        set_path(raw, "arms.2.name", "x")


def test_bad_sweep_files_fail_in_one_line(tmp_path):
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3]\n"data.alpha" = [0.1]',
                       extra='mode = "zip"')
    with pytest.raises(InputError, match=r"mode = \"zip\" needs axes of equal length"):
        load_sweep(path)
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [3, 50]')
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--output", str(out), "--quiet"]) == 2
    with pytest.raises(InputError, match=r"sweep point p01 \(arms.0.grouping.min_group_size=50\): "
                                         r"arms\[0\].grouping.min_group_size: 50 exceeds"):
        run_sweep(path, output=out, progress=False)
    assert not out.exists()                        # nothing written before every point validated


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [sys.executable, "-m", "groupfel.experiments.cli", *args], env


@pytest.mark.slow
def test_killed_sweep_resumes_and_finished_points_are_skipped(tmp_path):
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3]')
    whole = run_sweep(path, output=tmp_path / "whole", jobs=1, progress=False)
    out = tmp_path / "killed"
    cmd, env = _cli("sweep", str(path), "--output", str(out), "--jobs", "1", "--quiet")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while not list(out.glob("p00/seed-*/*/checkpoint.pt")) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)        # mid-run: an arm holds a checkpoint
    finally:
        proc.wait()
    manifests = list(out.glob("p*/seed-*/*/manifest.json"))
    assert len(manifests) < 8 and not (out / "runs.csv").exists()
    resumed = run_sweep(path, output=out, jobs=1, progress=False)
    for name in ("runs.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "whole" / name), pd.read_csv(out / name),
                                      check_exact=True)
    assert list(resumed["point"]) == list(whole["point"])
    # a rerun of a finished sweep runs nothing: no arm's results are rewritten
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("p*/seed-*/*/results.csv")}
    run_sweep(path, output=out, jobs=1, progress=False)
    assert {p: p.stat().st_mtime_ns for p in out.glob("p*/seed-*/*/results.csv")} == stamps


@pytest.mark.slow
def test_sweep_tables_have_axes_seeds_and_cis(tmp_path):
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3]\n"data.alpha" = [0.3, 1.0]',
                       extra='mode = "zip"')
    run_sweep(path, output=tmp_path / "out", jobs=2, progress=False)
    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert runs.equals(pd.read_parquet(tmp_path / "out" / "runs.parquet"))
    assert {"point", "arms.0.grouping.min_group_size", "data.alpha", "seed", "arm", "cost", "accuracy"} <= set(runs)
    assert set(zip(runs["point"], runs["data.alpha"])) == {("p00", 0.3), ("p01", 1.0)}
    assert sorted(runs["seed"].unique()) == [0, 1]
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert len(summary) == 4 and {"final_acc_mean", "final_acc_ci95_low", "final_acc_ci95_high",
                                  "acc_at_common_cost_diff_mean"} <= set(summary)
    # zipped axes move together: one plot per metric, against the first axis
    assert (tmp_path / "out" / "final_acc_vs_arms.0.grouping.min_group_size.png").stat().st_size > 5000
    assert not (tmp_path / "out" / "final_acc_vs_data.alpha.png").exists()
    config = json.loads((tmp_path / "out" / "p01" / "config.json").read_text())
    assert config["data"]["alpha"] == 1.0 and config["arms"][0]["grouping"]["min_group_size"] == 3
    page = build_report(tmp_path / "out").read_text()         # a sweep's report (rendered: test_report.py)
    assert "groupfel sweep: out" in page and page.count("data:image/png;base64,") >= 5 + 4   # 4 metrics, one zipped set


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_local_and_ray_backends_give_equal_tables(tmp_path):
    import ray

    path = write_sweep(tmp_path, '"data.alpha" = [0.3, 1.0]')
    run_sweep(path, output=tmp_path / "local", backend="local", jobs=2, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_sweep(path, output=tmp_path / "ray", backend="ray", progress=False)
    finally:
        ray.shutdown()
    for name in ("runs.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "local" / name), pd.read_csv(tmp_path / "ray" / name),
                                      check_exact=True)


def test_shipped_group_size_sweep_expands_to_valid_configs():
    from groupfel.experiments.sweep import point_configs

    sweep, base = load_sweep(ROOT / "experiments" / "configs" / "sweeps" / "group-size.toml")
    configs = point_configs(sweep, base)
    sizes = [(c.arms[0].grouping["min_group_size"], c.arms[1].grouping["min_group_size"]) for c in configs]
    assert sizes == [(3, 3), (5, 5), (10, 10), (20, 20)] and all(c.seeds == [0, 1, 2] for c in configs)


def test_a_duplicate_axis_value_and_a_reference_off_the_axis_are_refused(tmp_path):
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3, 2]')
    with pytest.raises(InputError, match=r"axes.'arms.0.grouping.min_group_size': the value 2 appears twice "
                                         r"\(items 0 and 2\)"):
        load_sweep(path)
    # zipped axes may repeat a value while another axis moves, but not a whole point
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 2, 3]\n"data.alpha" = [0.1, 0.3, 0.1]',
                       extra='mode = "zip"')
    assert len(points(load_sweep(path)[0])) == 3
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3, 2]\n"data.alpha" = [0.1, 0.3, 0.1]',
                       extra='mode = "zip"')
    with pytest.raises(InputError, match=r"points 0 and 2 of the zipped axes are the same"):
        load_sweep(path)
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3]',
                       extra='reference = { "arms.0.grouping.min_group_size" = 5 }')
    with pytest.raises(InputError, match=r"reference.'arms.0.grouping.min_group_size': 5 is not one of"):
        load_sweep(path)


def test_a_one_arm_sweep_compares_its_points_paired_by_seed(tmp_path, capsys, monkeypatch):
    """Before: "0 of 0 arms differ" and nothing compared. Here each point is compared with the
    reference (MinGS 3, given in the file), paired by seed: the difference of accuracy at equal
    cost is recomputed by hand from runs.csv (each seed's smaller final cost of the two runs)."""
    import matplotlib.axes

    labels = []
    real = matplotlib.axes.Axes.set_xlabel
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xlabel",
                        lambda self, text, *a, **k: (labels.append(text), real(self, text, *a, **k))[1])
    path = write_sweep(tmp_path, '"arms.0.grouping.min_group_size" = [2, 3, 6]', seeds="[0, 1, 2]",
                       extra='reference = { "arms.0.grouping.min_group_size" = 3 }')
    path.parent.joinpath("base.toml").write_text(BASE.replace("rounds = 6", "rounds = 2").split("[[arms]]\nname = \"rg\"")[0])
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--output", str(out), "--quiet", "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["ref_point"]) == ["p01"] * 3
    assert list(summary["acc_at_common_cost_vs_ref_verdict"].iloc[[1]]) == ["reference"]
    runs = pd.read_csv(out / "runs.csv")
    for point, row in zip(("p00", "p02"), summary.iloc[[0, 2]].itertuples()):
        diffs = []
        for seed in (0, 1, 2):
            a = runs[(runs.point == "p01") & (runs.seed == seed)]
            b = runs[(runs.point == point) & (runs.seed == seed)]
            c = min(a.cost.max(), b.cost.max())
            diffs.append(b[b.cost <= c + 1e-9].accuracy.iloc[-1] - a[a.cost <= c + 1e-9].accuracy.iloc[-1])
        assert row.acc_at_common_cost_vs_ref_mean == pytest.approx(sum(diffs) / 3, abs=1e-12)
    # Holm over the family of 2 points x 4 metrics: the smallest p is multiplied by the family's size
    p = summary[[f"{m}_vs_ref_p" for m in ("final_acc", "acc_at_common_cost", "cost_to_target", "sim_time_s")]]
    q = summary[[f"{m}_vs_ref_p_holm" for m in ("final_acc", "acc_at_common_cost", "cost_to_target", "sim_time_s")]]
    m = int(p.notna().sum().sum())
    assert q.min().min() == pytest.approx(min(1.0, m * p.min().min()))
    first = printed.splitlines()[0]
    assert first.startswith("For covg, accuracy at equal cost ") and " from MinGS 3 to 6 " in first, first
    assert "unit of MinGS: clients" in first
    # every plot names its x-axis and its units; the 4 metric-against-axis plots name the axis
    assert labels and all(t.endswith(")") and "(" in t for t in labels), labels
    assert labels.count("MinGS (clients; arms.0.grouping.min_group_size)") == 4, labels
    page = build_report(out).read_text()
    assert "<p class='opening'><b>For covg, accuracy at equal cost" in page
    assert page.index("class='opening'") < page.index("<h2>What was run</h2>")   # the page opens with it
    # the report's accuracy bands (three points overlaid on one panel) name their x-axis too
    assert {"cumulative cost, Eq. 5 (device seconds)", "simulated wall-clock time (s)"} <= set(labels), labels
    # a rerun of the finished sweep plans nothing and builds no engine (before: every point's world)
    import groupfel.experiments.runner
    import groupfel.experiments.tasks

    def refuse(*a, **k):
        raise AssertionError("a finished sweep's rerun built a world")
    monkeypatch.setattr(groupfel.experiments.tasks, "plan_world", refuse)
    monkeypatch.setattr(groupfel.experiments.runner, "plan_world", refuse)
    run_sweep(path, output=out, progress=False)
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), summary)


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


def test_sweep_into_a_locked_directory_is_refused(tiny_dict, tmp_path, capsys):
    import multiprocessing

    base = one_arm(tiny_dict, rounds=1)
    write_toml(tmp_path, base, "base.toml")
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
        assert f"(PID {p.pid})" in one_error_line(capsys)
        assert not (tmp_path / "sw" / "sweep.json").exists()
    finally:
        stop.set()
        p.join()


def test_zipped_sweep_report_is_compact_with_verdicts_and_one_plot_per_zipped_set(browser, tiny_dict, tmp_path,
                                                                                   capsys):
    import re

    tiny_dict.pop("seed")
    tiny_dict["train"].update(rounds=1)
    arm = tiny_dict["arms"][1]
    tiny_dict["arms"] = [{**arm, "name": f"rg-{k}", "grouping": {"policy": "rg", "min_group_size": 3 + (k % 2)}}
                         for k in range(5)]
    write_toml(tmp_path, tiny_dict, "base.toml")
    (tmp_path / "s.toml").write_text('name = "z"\nbase = "base.toml"\nseeds = [0]\nmode = "zip"\n[axes]\n'
                                     '"train.lr" = [0.02, 0.08]\n"train.batch_size" = [8, 16]\n')
    assert main(["sweep", str(tmp_path / "s.toml"), "--output", str(tmp_path / "sw"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("For rg-0, accuracy at equal cost ")   # the axis comparison first
    header = next(ln for ln in out.splitlines() if ln.startswith("point")).split()
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
