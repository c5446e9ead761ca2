"""Which CPU kernels decide a run's numbers, pinned (``portable``) or the machine's own (``native``).

torch picks its CPU kernels in three layers, each by the CPU it finds: ATen's vectorised kernels
(``ATEN_CPU_CAPABILITY``: default, avx2, avx512), oneDNN's JIT convolutions (``ONEDNN_MAX_CPU_ISA``)
and MKL's BLAS (``MKL_CBWR``, conditional numerical reproducibility). Each layer sums in another
order at another level, so the same seed gives other numbers on another kind of CPU. ``portable``
pins ATen and oneDNN to AVX2 (with FMA), which every x86-64 CPU since 2013-2015 has, and MKL to its
COMPATIBLE branch: MKL's AVX2 branch is reproducible on Intel CPUs only (elsewhere MKL falls back to
its automatic branch), COMPATIBLE on Intel and AMD alike. One torch thread per process (so one MKL
and one OpenMP thread). Measured on one machine: with the pin, results are bitwise equal whatever
level the machine would pick natively (AVX-512, AVX2) or the environment forces; without it, each
level gives its own.

Each layer reads its variable once, when torch loads (ATen) or at its first call (oneDNN, MKL),
so :func:`apply` must run before ``import torch`` in every process that trains: the command line
and :func:`groupfel.experiments.api.run` call it first, the local pool's workers inherit the environment,
Ray's workers get it through the task's ``runtime_env``. A process that loaded torch earlier keeps
what it loaded with: :func:`in_effect` says what that is, and the manifest records it.
"""
from __future__ import annotations

import os
import platform
import sys
import warnings
from contextlib import contextmanager
from importlib import metadata

MODES = ("portable", "native")
# The pin: one level every x86-64 CPU the portable guarantee covers has (x86-64-v3: AVX2 + FMA);
# MKL's only branch documented as reproducible on non-Intel CPUs is COMPATIBLE.
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"}
PORTABLE_CAPABILITY = "AVX2"
# Everything in the environment that changes which kernels run or how many threads sum.
RECORDED_ENV = (*PORTABLE_ENV, "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_CPU_ISA_HINTS", "OMP_NUM_THREADS",
                "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")
# The libraries that touch a number of a run.
LIBRARIES = ("torch", "numpy", "scipy", "pandas", "scikit-learn")

_loaded_with: dict[str, str | None] | None = None   # the environment torch loaded with, if we saw it


def env(mode: str) -> dict[str, str]:
    """The variables ``mode`` sets in a process (and in its workers) before torch loads."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")   # elsewhere the pin means nothing: native
    return dict(PORTABLE_ENV) if mode == "portable" and x86 else {}


def apply(mode: str) -> None:
    """Set ``mode``'s variables in this process, before torch loads; a process whose torch is
    already loaded keeps its kernels, and a warning says so when they are not ``mode``'s."""
    global _loaded_with
    if mode not in MODES:
        raise ValueError(f"numerics: {mode!r} is not one of {MODES}")
    if "torch" not in sys.modules:
        os.environ.update(env(mode))     # native: the machine's own choice, or what the environment forces
        _loaded_with = {k: os.environ.get(k) for k in RECORDED_ENV}
        return
    if mode == "portable" and in_effect() != mode:   # native asked, portable in effect: slower, still right
        warnings.warn(f"train.numerics = {mode}: torch was loaded in this process before groupfel could set its "
                      f"kernels ({capability()} in effect), so this run's numbers are {in_effect()}; run it from "
                      f"the groupfel command, or call groupfel.emulator.numerics.apply({mode!r}) before importing torch",
                      stacklevel=2)


@contextmanager
def threads(mode: str):
    """One torch thread (so one MKL and one OpenMP thread) while ``mode`` is portable: a
    reduction split over threads sums in another order on a machine with other cores. The
    backends' tasks and the batched engine's workers run one thread each already."""
    import torch

    before = torch.get_num_threads()
    if mode == "portable":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def capability() -> str:
    """ATen's CPU capability in effect in this process (loads torch)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def _loaded_env() -> dict[str, str | None]:
    return _loaded_with if _loaded_with is not None else {k: os.environ.get(k) for k in RECORDED_ENV}


def in_effect() -> str:
    """``portable`` where this process's kernels are pinned (ATen at AVX2, MKL and oneDNN told so
    when torch loaded), else ``native``."""
    pinned = all(_loaded_env().get(k) == v for k, v in PORTABLE_ENV.items())
    return "portable" if pinned and capability() == PORTABLE_CAPABILITY else "native"


def versions() -> dict[str, str | None]:
    out = {}
    for pkg in LIBRARIES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def cpu_model() -> str:
    """The CPU's model name (Linux), else the architecture."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas() -> dict:
    """torch's BLAS, oneDNN and OpenMP as torch was built with them (``torch.__config__``)."""
    import torch

    out = {}
    for line in torch.__config__.show().splitlines():
        line = line.strip(" -")
        if "Math Kernel Library" in line or line.startswith("OpenBLAS"):
            out["blas"] = line
        elif line.startswith(("Intel(R) MKL-DNN", "oneDNN")):
            out["onednn"] = line
        elif line.startswith("OpenMP"):
            out["openmp"] = line
    out["mkldnn_enabled"] = torch.backends.mkldnn.enabled
    return out


def record(mode: str) -> dict:
    """What decided this process's numbers, for a manifest: the mode asked for and the one in
    effect, the CPU and ATen's capability, the kernel variables torch loaded with, the BLAS, the
    thread counts and the libraries' versions."""
    import torch

    return {"mode": mode, "in_effect": in_effect(), "cpu": cpu_model(), "cpu_capability": capability(),
            "env": _loaded_env(), **_blas(), "torch_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "versions": versions()}


def differences(then: dict, now: dict) -> list[str]:
    """How the numerics ``now`` differ from ``then`` in what can change a number: the mode in
    effect, native kernels on another CPU, another library version."""
    out = []
    if then.get("in_effect") != now.get("in_effect"):   # what decided the numbers, not what was asked
        out.append(f"{_said(then)} numerics, now {_said(now)}")
    elif now.get("in_effect") == "native" and (then.get("cpu"), then.get("cpu_capability")) != (
            now.get("cpu"), now.get("cpu_capability")):
        out.append(f"native numerics on {then.get('cpu')} ({then.get('cpu_capability')}), now on {now.get('cpu')} "
                   f"({now.get('cpu_capability')})")
    old, new = then.get("versions", {}), now.get("versions", {})
    changed = [k for k in LIBRARIES if k in old and old.get(k) != new.get(k)]
    if changed:
        out.append("versions " + ", ".join(f"{k} {old.get(k)}" for k in changed)
                   + " (now " + ", ".join(f"{k} {new.get(k)}" for k in changed) + ")")
    return out


SESSIONS = "numerics.json"


def session(arm_dir, mode: str) -> dict:
    """Record this session's numerics in ``arm_dir/numerics.json`` (one entry per session that
    trained the arm under other numerics than the last) and return the manifest's entries: this
    session's, and every session's where they differ (:func:`check_resume` warns of it)."""
    import json
    from pathlib import Path

    from groupfel.userfile import read_json

    from .io import atomic_write

    path = Path(arm_dir) / SESSIONS
    now = record(mode)
    try:
        sessions = read_json(path, str(path), kind="run") if path.exists() else []
    except ValueError:      # damaged, or not a regular file: the sessions start again
        sessions = []
    if not sessions or differences(sessions[-1], now):
        sessions.append(now)
        atomic_write(path, lambda p: p.write_text(json.dumps(sessions, indent=1) + "\n"))
    return {"numerics": now, **({"numerics_sessions": sessions} if len(sessions) > 1 else {})}


def _said(rec: dict) -> str:
    mode, effect = rec.get("mode"), rec.get("in_effect")
    return str(mode) if mode == effect or effect is None else f"{mode} (in effect: {effect})"


def started_with(run_dir) -> dict | None:
    """The numerics the first arm trained in ``run_dir`` (any depth) started with, if any."""
    from pathlib import Path

    from groupfel.userfile import read_json

    for path in sorted(Path(run_dir).rglob(SESSIONS)):
        try:
            return read_json(path, str(path), kind="run")[0]
        except (ValueError, IndexError, KeyError, TypeError):
            continue
    return None


def check_resume(run_dir, mode: str) -> None:
    """Warn in one line when ``run_dir`` holds arms trained under other numerics than this
    process's (another mode, native kernels on another CPU, other library versions)."""
    then = started_with(run_dir)
    if then is not None and (diff := differences(then, record(mode))):
        warnings.warn(f"{run_dir}: resumed under other numerics than the run started with ({'; '.join(diff)}); "
                      f"arms it trains from here mix both, and each arm's manifest records its sessions' numerics",
                      stacklevel=2)


def check_loaded(run_dir, manifest: dict | None) -> None:
    """One line when a finished run was made under other numerics or versions than this process
    would use (what :func:`groupfel.experiments.api.load` and ``groupfel report`` say)."""
    then = (manifest or {}).get("numerics")
    if then is None:
        return
    mode = then.get("mode", "portable")
    now = {"mode": mode, "in_effect": _would_be(mode), "cpu": cpu_model(), "cpu_capability": native_capability(),
           "versions": versions()}
    if diff := differences(then, now):
        warnings.warn(f"{run_dir}: made under other numerics or versions than this machine's ({'; '.join(diff)}); "
                      f"rerunning it here may not give its numbers", stacklevel=2)


def _would_be(mode: str) -> str:
    """The numerics a fresh groupfel process on this machine, in this environment, would run
    ``mode`` with (an environment that already pins the kernels pins them for native too)."""
    pinned = mode == "portable" or all(os.environ.get(k) == v for k, v in PORTABLE_ENV.items())
    return "portable" if pinned and native_capability() in ("AVX2", "AVX512") else "native"


def native_capability() -> str:
    """The ATen capability torch picks on this CPU when not told otherwise (read from the CPU's
    flags, so a pinned process can say what a native one would use)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = set(next((line for line in fh if line.startswith("flags")), "").split())
    except OSError:
        return capability()
    if {"avx512f", "avx512cd", "avx512dq", "avx512bw", "avx512vl"} <= flags:
        return "AVX512"
    return "AVX2" if {"avx2", "fma"} <= flags else "DEFAULT"
