"""Portable numerics: the same numbers whatever CPU kernels the environment or the machine would
pick, and a manifest that says what decided them."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from groupfel.emulator import numerics

from conftest import TINY, write_toml

ROOT = Path(__file__).resolve().parents[1]
ARMS = [arm["name"] for arm in TINY["arms"]]


def _config(mode: str) -> dict:
    """A tiny CNN run (convolutions go to oneDNN, the linear layer to MKL, the rest to ATen), two
    arms on the local pool: the pin must hold in the workers, which load torch themselves."""
    d = copy.deepcopy(TINY)
    d.pop("seed")
    d.update(name="dispatch", seeds=[3])
    d["train"].update(model="cnn", group_rounds=1, rounds=2, numerics=mode)
    return d


# What a machine of another level would pick, forced: an AVX-512 machine, and a machine whose
# environment asks for other kernels everywhere (ATen without SIMD, oneDNN at SSE4.1, MKL's AVX2
# branch, MKL limited to AVX2 as on a machine without AVX-512).
LEVELS = {"avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
          "lowest": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "AVX2",
                     "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def _start(tmp_path: Path, level: str, config_numerics: str, flag: list[str]) -> tuple[subprocess.Popen, Path]:
    cfg = write_toml(tmp_path, _config(config_numerics), f"{level}.toml")
    env = {k: v for k, v in os.environ.items() if k not in numerics.RECORDED_ENV}
    env.update(LEVELS[level], PYTHONPATH=str(ROOT))
    out = tmp_path / level
    proc = subprocess.Popen([sys.executable, "-m", "groupfel.experiments.cli", "run", str(cfg), "--output", str(out),
                             "--quiet", "--jobs", "2", *flag], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, out


def _numbers(out: Path) -> dict[str, str]:
    return {arm: hashlib.sha256((out / "seed-3" / arm / "results.csv").read_bytes()
                                + (out / "seed-3" / arm / "ledger.parquet").read_bytes()).hexdigest()
            for arm in ARMS}


@pytest.mark.slow
@pytest.mark.skipif(numerics.native_capability() == "DEFAULT", reason="portable numerics need AVX2")
def test_portable_numbers_are_equal_under_two_forced_dispatch_levels(tmp_path):
    # the config asks native and the flag portable in one; the other takes the default (portable)
    runs = {"avx512": _start(tmp_path, "avx512", "native", ["--numerics", "portable"]),
            "lowest": _start(tmp_path, "lowest", "portable", [])}
    for level, (proc, _) in runs.items():
        text, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{level}: {text[-2000:]}"
    a, b = (_numbers(out) for _, out in runs.values())
    assert a == b
    for level, (_, out) in runs.items():
        for arm in ARMS:
            rec = json.loads((out / "seed-3" / arm / "manifest.json").read_text())["numerics"]
            assert (rec["mode"], rec["in_effect"], rec["cpu_capability"]) == ("portable", "portable", "AVX2"), level
            assert rec["env"]["MKL_CBWR"] == "COMPATIBLE" and rec["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
            assert rec["torch_threads"] == 1 and "Math Kernel Library" in rec["blas"]
            assert set(rec["versions"]) == {"torch", "numpy", "scipy", "pandas", "scikit-learn"}
            assert rec["versions"]["torch"].startswith("2.")


def _rec(**kw) -> dict:
    base = {"mode": "portable", "in_effect": "portable", "cpu": "AMD EPYC", "cpu_capability": "AVX2",
            "versions": {"torch": "2.13.0", "numpy": "2.4.6", "scipy": "1.17.1", "pandas": "3.1.1",
                         "scikit-learn": "1.9.1"}}
    return {**base, **kw}


def test_differences_name_the_mode_the_cpu_of_native_runs_and_the_versions():
    assert numerics.differences(_rec(), _rec(cpu="Intel Xeon")) == []      # portable: any AVX2 CPU
    assert numerics.differences(_rec(), _rec(mode="native", in_effect="native")) == [
        "portable numerics, now native"]
    assert numerics.differences(_rec(), _rec(mode="native")) == []   # asked native, pinned: the same kernels
    native = _rec(mode="native", in_effect="native", cpu_capability="AVX512")
    assert numerics.differences(native, {**native, "cpu": "Intel Xeon", "cpu_capability": "AVX2"}) == [
        "native numerics on AMD EPYC (AVX512), now on Intel Xeon (AVX2)"]
    newer = _rec(versions={**_rec()["versions"], "torch": "2.14.0"})
    assert numerics.differences(_rec(), newer) == ["versions torch 2.13.0 (now torch 2.14.0)"]


def _one_warning(fn, *args) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "\n" not in str(caught[0].message)
    return str(caught[0].message)


def test_a_resume_under_other_numerics_warns_in_one_line(tmp_path):
    arm = tmp_path / "seed-0" / "rg"
    arm.mkdir(parents=True)
    (arm / numerics.SESSIONS).write_text(json.dumps([{**numerics.record("portable"), "mode": "native",
                                                      "in_effect": "native"}]))
    text = _one_warning(numerics.check_resume, tmp_path, "portable")
    assert "resumed under other numerics than the run started with (native numerics, now portable)" in text
    (arm / numerics.SESSIONS).write_text(json.dumps([numerics.record("portable")]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        numerics.check_resume(tmp_path, "portable")        # the same numerics: silent


def test_a_session_under_other_numerics_is_kept_in_the_manifest(tmp_path):
    first = numerics.session(tmp_path, "portable")
    assert "numerics_sessions" not in first and first["numerics"]["mode"] == "portable"
    sessions = json.loads((tmp_path / numerics.SESSIONS).read_text())
    sessions[0]["versions"]["torch"] = "0.1"           # as if it started under another torch
    (tmp_path / numerics.SESSIONS).write_text(json.dumps(sessions))
    again = numerics.session(tmp_path, "portable")
    assert [s["versions"]["torch"] for s in again["numerics_sessions"]] == ["0.1", numerics.versions()["torch"]]


def test_loading_a_run_of_other_versions_says_so_in_one_line(tmp_path):
    manifest = {"numerics": _rec(versions={**numerics.versions(), "torch": "2.12.0"})}
    text = _one_warning(numerics.check_loaded, tmp_path, manifest)
    assert text.startswith(f"{tmp_path}: made under other numerics or versions than this machine's (")
    assert "torch 2.12.0" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        numerics.check_loaded(tmp_path, {"numerics": _rec(versions=numerics.versions())})
        numerics.check_loaded(tmp_path, {})                 # a run from before numerics were recorded


def test_the_test_process_runs_portable_numerics():
    """conftest sets them before torch loads, as the groupfel command does."""
    assert numerics.in_effect() == "portable" and numerics.capability() == "AVX2"
    assert "numerics" not in TINY["train"]        # native asked: the pinned process runs it portable, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        numerics.apply("native")
    with pytest.raises(ValueError, match="not one of"):
        numerics.apply("fast")


def test_the_demo_and_the_reproductions_run_portable_numerics():
    from groupfel.experiments import reproduce
    from groupfel.experiments.runner import default_config

    assert default_config().train.numerics == "portable"
    _, base, _ = reproduce.resolve(reproduce.load("fig13"), quick=True)
    assert base["train"]["numerics"] == "portable"
