"""A run killed (SIGKILL) at any write step resumes to an uninterrupted run's tables, byte for byte.

The hook: ``GROUPFEL_CRASH_AT=N`` makes the process kill itself at its Nth write step
(:func:`groupfel.emulator.io.crash_point`: a temporary file written, renamed, a checkpoint's side
file half and fully written), so each kill point is deterministic, as SQLite's crash tests and
ALICE/CrashMonkey replay a program's writes. Each run is a process of its own (forked from an
interpreter that has done the imports), killed at a step, then the same command run again; every
CSV and Parquet file of the run must equal the uninterrupted run's, bitwise, and nothing of the
kill (temporary files, checkpoints) may be left.
"""
import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY, write_toml
from groupfel.emulator import io

# energy full-fleet with availability on shared edges: the repro, small
CRASHY = copy.deepcopy(TINY)
CRASHY["topology"].update(edges=2, clients_per_edge=4, edge_access_mbps=30.0,
                          availability={"mean_on_s": 20.0, "mean_off_s": 5.0})
CRASHY["data"].update(min_samples=8, max_samples=12)
CRASHY["cost"].update(energy=True, energy_accounting="full-fleet")
# one training process: the kill points are the run's writes, and a pool's start (a server that
# imports torch) would cost each of the 41 runs a test makes seconds
CRASHY["train"].update(rounds=3, eval_every=1, group_rounds=1, workers=1)
CRASHY["arms"][0]["grouping"]["min_group_size"] = 2
CRASHY["arms"][1]["grouping"]["min_group_size"] = 2
POINTS = 20


ZYGOTE = r"""
import json, os, sys, threading, time
# what every run imports, loaded once; nothing here starts a thread or a torch kernel, so each
# fork below starts as a fresh interpreter would, less the seconds of imports (a fork of a
# pytest-xdist worker, whose torch and execnet threads the child does not inherit, can hang in
# its first parallel kernel)
import matplotlib.pyplot, pandas, torch
import sklearn.datasets, sklearn.model_selection   # the digits dataset's loader
import groupfel.emulator.world, groupfel.experiments.runner
from groupfel.emulator import io
from groupfel.experiments.cli import main
# matplotlib's fonts and renderer warmed once (each run draws its plots; no thread is started)
fig, ax = matplotlib.pyplot.subplots()
ax.plot([1, 10], [0, 1], label="warm")
ax.set_xscale("log")
ax.legend()
fig.tight_layout()
fig.savefig(os.devnull, format="png")
matplotlib.pyplot.close(fig)
assert threading.active_count() == 1, threading.enumerate()


def run(req, i, go):
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if req.get("err") else null, 2)
    if req.get("crash_at"):
        os.environ[io.CRASH_AT] = str(req["crash_at"])
    if go:   # ready, then released with the others
        open(f"{go}.ready{i}", "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
    code = 98
    try:
        code = main(req["args"]) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 99
    finally:
        sys.stderr.flush()
        if req.get("steps"):
            with open(req["steps"], "w") as f:
                f.write(str(io.steps_taken()))
        os._exit(code)


for line in sys.stdin:
    batch = json.loads(line)
    pids = []
    for i, req in enumerate(batch["runs"]):
        pid = os.fork()
        if pid == 0:
            run(req, i, batch.get("go"))
        pids.append(pid)
    print(json.dumps({"status": [os.waitpid(pid, 0)[1] for pid in pids]}), flush=True)
"""


@pytest.fixture
def zygote():
    """An interpreter that has imported what a run needs and forks one child per run (a run
    killed at its step is a whole process killed, as before; the imports are paid once a test).
    One per test, not per module, so that the tests spread over the suite's workers."""
    env = {k: v for k, v in os.environ.items() if k != io.CRASH_AT}
    proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def _run_alone(zygote, args: list[str], crash_at: int = 0) -> tuple[int, int]:
    """``groupfel ARGS`` in a process of its own, killed at its write step ``crash_at`` (0: never);
    (its wait status, the write steps it took where it ended by itself)."""
    with tempfile.TemporaryDirectory() as tmp:
        steps = Path(tmp) / "steps"
        [status] = _send(zygote, {"runs": [{"args": args, "crash_at": int(crash_at), "steps": str(steps)}]})
        taken = steps.read_text() if steps.exists() else ""
    return status, int(taken or 0)


def _send(zygote, batch: dict, go: Path | None = None) -> list[int]:
    """The zygote's runs of ``batch``, each in a process of its own; with ``go``, released together
    once every one is ready. Their wait statuses."""
    zygote.stdin.write(json.dumps({**batch, "go": str(go) if go else None}) + "\n")
    zygote.stdin.flush()
    if go is not None:
        ready = [Path(f"{go}.ready{i}") for i in range(len(batch["runs"]))]
        deadline = time.time() + 60
        while not all(r.exists() for r in ready) and time.time() < deadline:
            time.sleep(0.001)
        go.touch()   # released at the same instant
    return json.loads(zygote.stdout.readline())["status"]


def _tables(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.suffix in (".csv", ".parquet")}


def _leftovers(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if p.name.endswith(io.TMP_SUFFIX) or p.name.startswith(io.CHECKPOINT))


def _crash_and_resume(zygote, tmp_path: Path, d: dict, extra: list[str]) -> list[tuple[int, str]]:
    """Kill the run at POINTS write steps spread over all of them; each then rerun (the same
    command; --resume where config.json was written). Returns (step, what went wrong) for each
    kill point whose tables differ from the uninterrupted run's."""
    config = write_toml(tmp_path, d)
    base = tmp_path / "base"
    status, steps = _run_alone(zygote, ["run", str(config), "--output", str(base), "--quiet", *extra])
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    expected = _tables(base)
    assert any(k.endswith("network.parquet") for k in expected) and any(k.endswith("energy.parquet") for k in expected)
    # spread over every step, the first ones (config files) and the last (the tables at the end) included
    points = sorted(set(np.linspace(1, steps, POINTS).round().astype(int)))
    assert len(points) >= POINTS, (steps, points)
    bad = []
    for k in points:
        run = tmp_path / f"k{k}"
        status, _ = _run_alone(zygote, ["run", str(config), "--output", str(run), "--quiet", *extra], crash_at=k)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            bad.append((k, f"not killed at its step {k} (status {status})"))
            continue
        resume = (["run", "--resume", str(run), "--quiet", *extra] if (run / "config.json").is_file() and k % 2
                  else ["run", str(config), "--output", str(run), "--quiet", *extra])
        status, _ = _run_alone(zygote, resume)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            bad.append((k, f"resume failed (status {status})"))
            continue
        got = _tables(run)
        differ = sorted(f for f in set(expected) | set(got) if expected.get(f) != got.get(f))
        if differ or _leftovers(run):
            bad.append((k, f"differ: {differ}; left: {_leftovers(run)}"))
    return bad


@pytest.mark.slow
def test_killed_energy_run_resumes_to_the_same_bytes_at_every_point(zygote, tmp_path):
    """Energy full-fleet + availability + shared edges (the issue's case: network.parquet lost a
    round's rows and energy_j moved by 1e-13 J), one seed, two arms."""
    assert _crash_and_resume(zygote, tmp_path, copy.deepcopy(CRASHY), []) == []


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["1", "4"])
def test_killed_multi_seed_run_resumes_to_the_same_bytes_at_every_point(zygote, tmp_path, stack):
    """Two seeds x two arms, each (seed, arm) alone (--stack 1) or all four trained together in
    one stack (--stack 4); killed within an arm, between arms and seeds, and in the top-level
    tables."""
    d = copy.deepcopy(CRASHY)
    del d["seed"]
    d["seeds"] = [0, 1]
    d["train"]["rounds"] = 2
    assert _crash_and_resume(zygote, tmp_path, d, ["--jobs", "1", "--stack", stack]) == []


# -- runs started together never nest ------------------------------------------------------------------

def test_nested_runs_started_together_never_both_run(zygote, tmp_path):
    """20 times: `groupfel run c.toml --output out` and `... --output out/sub` released at the same
    instant (in either order). One runs; the other exits 2 with one line; never a run inside a run."""
    d = copy.deepcopy(TINY)
    d["arms"] = d["arms"][1:]
    d["train"].update(rounds=1, workers=1)
    config = write_toml(tmp_path, d)
    outcomes = []
    for i in range(20):
        outer = tmp_path / f"try{i}"
        inner = outer / "sub"
        runs = [["run", str(config), "--output", str(outer), "--quiet"],
                ["run", str(config), "--output", str(inner), "--quiet"]]
        if i % 2:
            runs.reverse()
        errs = [tmp_path / f"err{i}-{j}" for j in range(2)]
        statuses = _send(zygote, {"runs": [{"args": a, "err": str(e)} for a, e in zip(runs, errs)]},
                         go=tmp_path / f"go{i}")
        codes = [os.WEXITSTATUS(s) if os.WIFEXITED(s) else -1 for s in statuses]
        assert sorted(codes) == [0, 2], (i, codes, [e.read_text() for e in errs])
        lines = errs[codes.index(2)].read_text().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("groupfel: error: "), lines
        nested = (outer / "config.json").exists() and (inner / "config.json").exists()
        assert not nested, (i, codes)
        outcomes.append("outer" if (outer / "config.json").exists() else "inner")
    assert len(outcomes) == 20
