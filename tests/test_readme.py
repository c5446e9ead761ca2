"""The README holds: every TOML block runs, and its test command prints pytest's summary line.

Rule for README TOML blocks: each is a complete run config, or a sweep file whose `base` is a
config shipped in experiments/configs/sweeps/ (its points are validated, not run). This test parses each as written and
runs it for one round (``train.rounds = 1``, output in a temporary directory); nothing else is
overridden, so a block must be valid and cheap (digits-sized) as printed.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from groupfel.emulator.config import parse_config
from groupfel.experiments.runner import run_experiment
from groupfel.experiments.sweep import SweepConfig, point_configs, points

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TOML_BLOCKS = re.findall(r"^```toml\n(.*?)^```", README, re.S | re.M)


def test_readme_has_toml_blocks():
    assert TOML_BLOCKS


@pytest.mark.parametrize("index", range(len(TOML_BLOCKS)))
def test_readme_toml_block_runs(index, tmp_path):
    data = tomllib.loads(TOML_BLOCKS[index])
    if "base" in data:          # a sweep file: its base is the shipped one beside the canonical sweep
        sweep = SweepConfig.model_validate(data)
        base = tomllib.loads((ROOT / "experiments/configs/sweeps" / sweep.base).read_text())
        assert len(point_configs(sweep, base)) == len(points(sweep)) > 1   # every point valid as written
        return
    config = parse_config(data)                           # valid as written
    data.setdefault("train", {})["rounds"] = 1
    data["output_dir"] = str(tmp_path)
    summary = run_experiment(parse_config(data), tmp_path / config.name, progress=False)
    assert (summary["rounds"] == 1).all() and len(summary) == len(config.arms)


def _test_command() -> str:
    block = re.search(r"The test suite:\n\n```\n(.*?)\n```", README, re.S)
    assert block, "README: the test command block after 'The test suite:' is missing"
    return block.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _test_command() in [line.strip() for line in ci]


def test_readme_test_command_ends_with_the_summary_line():
    """`pytest -q` plus an ``addopts = "-q"`` would be -qq, which prints no "N passed" line."""
    pytest_part = _test_command().split("&&")[-1].strip()
    argv = shlex.split(pytest_part)
    assert argv[:3] == ["python", "-m", "pytest"]
    proc = subprocess.run([sys.executable, *argv[1:], "-p", "no:cacheprovider", "tests/test_cov.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert re.match(r"^\d+ passed", proc.stdout.strip().splitlines()[-1]), proc.stdout[-500:]


def _demo_block() -> str:
    block = re.search(r"it prints exactly this[^\n]*\n\n```\n(.*?)\n```", README, re.S)
    assert block, "README: the demo's printed block after 'it prints exactly this' is missing"
    return block.group(1)


@pytest.mark.slow
def test_readme_demo_block_is_what_groupfel_run_prints(tmp_path, capsys):
    """The whole default demo (about a minute on 2 cores): the README shows its printout verbatim,
    so the text cannot drift from the numbers (portable numerics: the same on any AVX2 machine)."""
    from groupfel.experiments.cli import main

    out = tmp_path / "default"
    assert main(["run", "--output", str(out), "--quiet"]) == 0
    # a plain `groupfel run` writes to results/default and its way to continue names no --output
    printed = capsys.readouterr().out.strip().replace(f" --output {out}", "").replace(str(out), "results/default")
    assert printed == _demo_block()


def test_the_run_guide_shows_the_readme_demo_block():
    guide = (ROOT / "docs" / "guide" / "run.md").read_text()
    assert f"```\n{_demo_block()}\n```" in guide


def test_readme_front_page_is_short():
    """The front page sets up, shows the demo and points on; the detail is on the docs site."""
    assert len(README.splitlines()) <= 200, len(README.splitlines())
