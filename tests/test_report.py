"""groupfel report: one self-contained HTML page that renders in headless Chromium."""
import re
import subprocess

import pytest

from groupfel.emulator.config import parse_config
from groupfel.experiments.cli import main
from groupfel.experiments.runner import run_experiment


def chromium(exe, *args, timeout=180):
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_report_renders_in_chromium(browser, tiny_dict, tmp_path, capsys):
    tiny_dict.update(seeds=[0, 1])
    tiny_dict["train"].update(rounds=3, target_accuracy=0.3)
    run = tmp_path / "run"
    run_experiment(parse_config(tiny_dict), run, progress=False, jobs=1)
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)      # nothing from the network
    assert str(tmp_path) not in page                                     # no absolute path of the run
    for section in ("What was run", "Accuracy against cost", "Summary", "Eq. 5 cost breakdown", "Grouping",
                    "Makespan", "Versions and wall time", "paired difference from covg-esrcov"):
        assert section in page

    dom = chromium(browser, "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                   (tmp_path / "report.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    images = int(re.search(r'data-images="(\d+)"', body).group(1))
    assert images >= 5
    assert f'data-decoded="{images}"' in body                 # every image decoded
    assert 'data-errors="0"' in body                          # no script or console error
    assert "CONSOLE" not in dom.stderr

    # groupfel plot overlays several directories (a multi-seed run and one of its seeds), with bands
    assert main(["plot", str(run), str(run / "seed-1"), "--x", "sim_time_s", "--out", str(tmp_path / "o.png")]) == 0
    assert (tmp_path / "o.png").stat().st_size > 5000

    shot = tmp_path / "report.png"
    res = chromium(browser, "--window-size=1280,5000", f"--screenshot={shot}", (tmp_path / "report.html").as_uri())
    assert res.returncode == 0 and shot.stat().st_size > 50_000
    with capsys.disabled():
        print(f"\nreport screenshot: {shot}")


def test_report_embeds_the_runs_own_band_plots_unless_older_than_its_rows(tiny_dict, tmp_path):
    """A multi-seed run's report shows the band plots its run drew from the same rows (not drawn a
    second time); a plot older than runs.csv is drawn anew from the rows."""
    import base64
    import os

    tiny_dict.update(seeds=[0, 1])
    tiny_dict["train"].update(rounds=2)
    run = tmp_path / "run"
    run_experiment(parse_config(tiny_dict), run, progress=False, jobs=1)
    own = {name: base64.b64encode((run / name).read_bytes()).decode()
           for name in ("accuracy_vs_cost.png", "accuracy_vs_time.png")}
    assert main(["report", str(run), "--out", str(tmp_path / "a.html")]) == 0
    page = (tmp_path / "a.html").read_text()
    assert all(b64 in page for b64 in own.values())

    stamp = (run / "runs.csv").stat().st_mtime_ns
    os.utime(run / "accuracy_vs_cost.png", ns=(stamp - 10**9, stamp - 10**9))
    assert main(["report", str(run), "--out", str(tmp_path / "b.html")]) == 0
    page = (tmp_path / "b.html").read_text()
    assert own["accuracy_vs_cost.png"] not in page and own["accuracy_vs_time.png"] in page
    assert page.count("<img") == (tmp_path / "a.html").read_text().count("<img")


@pytest.mark.slow
def test_an_energy_report_renders_its_joules_carbon_and_who_pays_in_chromium(browser, tiny_dict, tmp_path, capsys):
    tiny_dict.update(seeds=[0, 1, 2])
    tiny_dict["train"].update(rounds=3)
    tiny_dict["topology"]["edge_access_mbps"] = 50.0
    tiny_dict["cost"].update(energy=True, edge_power="raspberry-pi-4-edge", carbon_intensity=380.0)
    run = tmp_path / "run"
    run_experiment(parse_config(tiny_dict), run, progress=False, jobs=1)
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    for section in ("Accuracy against energy", "Clients, edge servers and the cloud", "constant 380 g/kWh",
                    "Joules per round by state", "Who pays: joules per client", "Gini", "energy_j", "carbon_g"):
        assert section in page, section
    dom = chromium(browser, "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0", "--dump-dom",
                   (tmp_path / "report.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    images = int(re.search(r'data-images="(\d+)"', body).group(1))
    assert f'data-decoded="{images}"' in body and 'data-errors="0"' in body and "CONSOLE" not in dom.stderr
    shot = tmp_path / "report.png"
    res = chromium(browser, "--window-size=1280,9000", f"--screenshot={shot}", (tmp_path / "report.html").as_uri())
    assert res.returncode == 0 and shot.stat().st_size > 50_000
    with capsys.disabled():
        print(f"\nenergy report screenshot: {shot}")


def test_report_of_an_unfinished_run_says_what_to_do(tiny_dict, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "no config.json" in capsys.readouterr().err


# --- moved from test_trust3.py (what a new user hits with bad or odd input) ---------------------------


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


def test_band_figure_uses_small_multiples_beyond_4_arms():
    import pandas as pd

    from groupfel.experiments.plots import band_figure

    rows = [{"arm": f"a{k}", "seed": s, "round": r, "cost": 10.0 * r, "accuracy": 0.1 + 0.1 * r + 0.01 * s}
            for k in range(5) for s in range(2) for r in range(4)]
    fig = band_figure({"x": pd.DataFrame(rows)})
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 5
    fig = band_figure({"x": pd.DataFrame([r for r in rows if r["arm"] in ("a0", "a1")])})
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 1


def test_report_reads_the_cost_model_the_run_recorded_without_torch(tiny_dict, tmp_path):
    """Each arm's manifest records the training curve and group operations its run resolved
    (SCAFFOLD: its own secure aggregation); the report prices from that record in a process that
    never imports torch, and reads the algorithm's declarations only for runs without the record."""
    import json
    import sys

    tiny_dict["train"].update(rounds=1, algorithm="scaffold")
    del tiny_dict["cost"]["group_operations"]   # the algorithm's own
    run = tmp_path / "run"
    run_experiment(parse_config(tiny_dict), run, progress=False, jobs=1)
    manifest = json.loads((run / "covg-esrcov" / "manifest.json").read_text())
    assert manifest["cost_model"] == {"training": "sgd", "operations": ["scaffold-secagg"]}
    code = (f"import sys; from groupfel.experiments.report import build_report; "
            f"build_report({str(run)!r}, {str(tmp_path / 'a.html')!r}); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    page = (tmp_path / "a.html").read_text()
    assert "group operations\n<code>scaffold-secagg</code>" in page

    for arm in ("covg-esrcov", "rg-random"):   # a run from before the record
        path = run / arm / "manifest.json"
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "cost_model"}))
    assert main(["report", str(run), "--out", str(tmp_path / "b.html")]) == 0
    assert "group operations\n<code>scaffold-secagg</code>" in (tmp_path / "b.html").read_text()
