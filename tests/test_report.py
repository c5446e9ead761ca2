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


def test_report_of_an_unfinished_run_says_what_to_do(tiny_dict, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["report", str(tmp_path / "run")]) == 2
    assert "no config.json" in capsys.readouterr().err
