"""The documentation site: it builds strictly, renders in Chromium, and its examples run.

* ``mkdocs build --strict`` of the whole site (any broken link, missing page or config field
  without a description fails it), then two pages screenshotted in headless Chromium: real PNGs,
  not blank, with the theme's stylesheet applied.
* The generated config reference lists every field of every config model, so it cannot drift.
* Every TOML block of docs/ runs as printed, as the README's do (tests/test_readme.py): a run
  config for one round (and its first two seeds: more only repeat them), a sweep file validated
  point by point, a profile file parsed. A config
  naming ``calib/profile.csv`` gets one written by ``groupfel calibrate`` from measurements in
  ``groupfel measure``'s CSV format.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel

from conftest import write_fsdd
from groupfel.cost_models import read_profiles
from groupfel.cost_models.power import read_power
from groupfel.emulator import config as config_models
from groupfel.emulator.config import parse_config
from groupfel.experiments.runner import run_experiment
from groupfel.experiments.sweep import SweepConfig, point_configs, points

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
MKDOCS = all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers.python"))
need_site = pytest.mark.skipif(not MKDOCS, reason="mkdocs, mkdocs-material or mkdocstrings[python] is not "
                               "installed: pip install -e '.[docs]' (.ci/run does)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _page(site: Path, rel: str) -> str:
    return (site / rel / "index.html").read_text() if rel else (site / "index.html").read_text()


@need_site
def test_site_builds_strict_with_every_page(site):
    for rel in ["", "guide/run", "guide/calibrate", "algorithms", "cost-models", "reproductions",
                "benchmarks", "reference/config", "reference/api/policies", "reference/api/cost-models"]:
        assert (site / rel / "index.html").is_file(), rel
    # the reproductions page includes experiments/reproductions/README.md rather than copying it
    assert "Full size, 3 seeds" in _page(site, "reproductions")
    # mkdocstrings rendered the docstrings, not just the page's heading
    assert "CoV-Grouping" in _page(site, "reference/api/policies")
    assert "report-default.png" in _page(site, "guide/report") and (site / "report-default.png").is_file()


def _models_in(annotation) -> list[type]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


@need_site
def test_config_reference_lists_every_field(site):
    html = _page(site, "reference/config")
    models, todo = [], [config_models.RunConfig]          # every model reachable from RunConfig
    while todo:
        model = todo.pop()
        if model not in models:
            models.append(model)
            todo += [t for f in model.model_fields.values() for t in _models_in(f.annotation)]
    assert len(models) >= 10
    for model in models:
        for name, field in model.model_fields.items():
            assert f"<code>{name}</code>" in html, f"{model.__name__}.{name} missing from the config reference"
            assert field.description, f"{model.__name__}.{name} has no description"
    assert "<code>esrcov</code>" in html and "<code>max_cov</code>" in html   # the policies' table


def _screenshot(url: str, path: Path, size: str = "1280,1000") -> np.ndarray:
    from PIL import Image

    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={size}", "--virtual-time-budget=5000", f"--screenshot={path}", url],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and path.is_file(), proc.stderr[-2000:]
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == tuple(int(v) for v in size.split(","))
        return np.asarray(img.convert("RGB"), dtype=np.int16)


@need_site
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
@pytest.mark.parametrize("rel", ["", "reference/config", "guide/whatif", "guide/timeline", "energy"])
def test_page_renders_in_chromium(site, rel, tmp_path, capsys):
    shot = tmp_path / f"{rel.replace('/', '-') or 'home'}.png"
    px = _screenshot((site / rel / "index.html").as_uri(), shot)
    with capsys.disabled():
        print(f"\ndocs screenshot: {shot}")
    # not blank: many distinct colours and a good share of ink on the page
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 50
    assert (px.sum(axis=2) < 600).mean() > 0.01
    # Material's stylesheet applied: its coloured header bar spans the top of the page
    header = px[5:40, :, :]
    assert ((header[..., 2] - header[..., 0]) > 40).mean() > 0.5, "no coloured header: theme CSS not loaded"
    for img in re.findall(r'<img[^>]+src="([^"]+\.png)"', _page(site, rel)):   # every picture the page shows is there
        assert (site / rel / img).resolve().is_file(), img


# --- every TOML block of docs/ runs as printed ----------------------------------------------------

BLOCKS = [(md.relative_to(ROOT).as_posix(), i, block)
          for md in sorted(DOCS.rglob("*.md"))
          for i, block in enumerate(re.findall(r"^```toml\n(.*?)^```", md.read_text(), re.S | re.M))]


def test_docs_have_toml_blocks():
    assert len(BLOCKS) >= 4


def _calibrated_profile(cwd: Path) -> None:
    """calib/profile.csv as in docs/guide/calibrate.md: measurements in `groupfel measure`'s CSV format
    (a quadratic secagg and a linear sgd curve, with noise), fitted by `groupfel calibrate`."""
    rng = np.random.default_rng(0)
    rows = ["# groupfel measure: secagg", "operation,method,device,group_size,n_samples,seconds"]
    for s in range(2, 13, 2):
        for _ in range(2):
            rows.append(f"secagg,secagg,raspberry-pi-4,{s},,{(2e-6 * s * s + 1e-4 * s + 3e-4) * rng.uniform(0.95, 1.05):.9g}")
    for n in range(16, 129, 16):
        rows.append(f"training,sgd,raspberry-pi-4,,{n},{(1.2e-4 * n + 5e-3) * rng.uniform(0.95, 1.05):.9g}")
    (cwd / "measurements.csv").write_text("\n".join(rows) + "\n")
    proc = subprocess.run([sys.executable, "-m", "groupfel.experiments.cli", "calibrate", "measurements.csv",
                           "--task", "cifar10-resnet", "--out", "calib/"],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]


def _page_modules(page: str) -> dict[str, str]:
    """The Python modules a page defines: a ```python block whose first line is ``# name.py``, or
    one right after a sentence ending "Save it as `name.py`:"."""
    text = (ROOT / page).read_text()
    out = {}
    for m in re.finditer(r"(?:Save it as `(\w+)\.py`:\s*\n\s*)?^```python\n(.*?)^```", text, re.S | re.M):
        first = re.match(r"# (\w+)\.py\n", m.group(2))
        name = m.group(1) or (first.group(1) if first else None)
        if name:
            out[name] = m.group(2)
    return out


def _write_digits_npz(path: Path) -> None:
    """data.npz as docs/plugins.md's example dataset reads it, from scikit-learn's digits."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    path.mkdir(parents=True)
    np.savez(path / "data.npz", x_train=x[:1400], y_train=y[:1400].astype(np.int64),
             x_test=x[1400:], y_test=y[1400:].astype(np.int64))


@pytest.mark.parametrize("where,index,block", BLOCKS, ids=[f"{w}#{i}" for w, i, _ in BLOCKS])
def test_docs_toml_block_runs(where, index, block, tmp_path, monkeypatch):
    data = tomllib.loads(block)
    if "project" in data:                      # a pyproject.toml excerpt: its entry points name the page's modules
        modules = _page_modules(where)
        for group, entries in data["project"]["entry-points"].items():
            assert group.startswith("groupfel.")
            assert all(target.split(":")[0] in modules for target in entries.values())
        return
    for name, source in _page_modules(where).items():   # the page's plug-in modules, importable as the page says
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    if data.get("data", {}).get("path") == "data/mine":
        _write_digits_npz(tmp_path / "data/mine")
    if data.get("data", {}).get("path") == "data/fsdd/recordings":
        write_fsdd(tmp_path / "data/fsdd/recordings", [3000] * 25)
    if "curves" in data or "power" in data:   # a profile file
        path = tmp_path / "profile.toml"
        path.write_text(block)
        assert read_profiles(path) if "curves" in data else read_power(path)
        return
    if "base" in data:                         # a sweep file: its base is the shipped one
        sweep = SweepConfig.model_validate(data)
        base = tomllib.loads((ROOT / "experiments/configs/sweeps" / sweep.base).read_text())
        assert len(point_configs(sweep, base)) == len(points(sweep)) > 1
        return
    for key in ("heterogeneity", "availability"):      # the docs' sample traces, named from the repository root
        part = data.get("topology", {}).get(key) or {}
        if str(part.get("fedscale_file", "")).startswith("docs/"):
            part["fedscale_file"] = str(ROOT / part["fedscale_file"])
    monkeypatch.chdir(tmp_path)
    if data.get("cost", {}).get("profiles_file") == "calib/profile.csv":
        _calibrated_profile(tmp_path)
    if data.get("cost", {}).get("profiles_file") == "power.toml":   # docs/energy.md's [[power]] block
        shutil.copy(ROOT / "tests" / "fixtures" / "power-rpi4-rest.toml", tmp_path / "power.toml")
    config = parse_config(data)                           # valid as written, every seed included
    data.setdefault("train", {})["rounds"] = 1
    if len(data.get("seeds", [])) > 2:   # two keep the multi-seed path; the rest rerun the same code
        data["seeds"] = data["seeds"][:2]
    data["output_dir"] = str(tmp_path)
    summary = run_experiment(parse_config(data), tmp_path / config.name, progress=False)
    assert (summary["rounds"] == 1).all() and len(summary) == len(config.arms)


def test_every_usage_block_lists_every_flag_of_its_command():
    """A guide page's usage block (docs/guide/<command>.md, first ``` block starting with 'groupfel
    <command>') names every flag argparse has: a flag added later fails here until the page says it.
    Before: run.md's usage lacked --seeds, --max-seeds, --device, --gpus-per-task, --ship-data and
    --py-module."""
    from groupfel.experiments.cli import build_parser

    subs = build_parser()._subparsers._group_actions[0].choices
    checked = 0
    for name, parser in subs.items():
        page = DOCS / "guide" / f"{name}.md"
        if not page.exists():
            continue
        m = re.search(r"```\n(groupfel " + re.escape(name) + r"\b.*?)```", page.read_text(), re.S)
        assert m, f"{page}: no usage block starting 'groupfel {name}'"
        flags = [a.option_strings[-1] for a in parser._actions if a.option_strings and "--help" not in a.option_strings]
        missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", m[1])]
        assert not missing, f"{page}: the usage block lacks {missing}"
        checked += 1
    assert checked >= 10
