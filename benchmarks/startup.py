"""Start-up time of ``groupfel --help`` and ``groupfel group`` on a 100-client label matrix,
against bare Python and against importing torch (what a command that trains nothing must not pay),
and the cost of rerunning a finished run and a finished sweep (a no-op: nothing is planned, no
engine built; goal: start-up plus 0.5 s).

    python benchmarks/startup.py

Each command runs as a fresh process; the commands are interleaved, repeated, and the median wall
time of each is printed with the ratios.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 7


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


RUN = """
name = "noop"
seed = 0
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
rounds = 2
eval_every = 1
[[arms]]
name = "covg"
grouping = { policy = "covg", min_group_size = 3 }
sampling = { policy = "esrcov", groups_per_round = 2 }
[[arms]]
name = "rg"
grouping = { policy = "rg", min_group_size = 3 }
sampling = { policy = "random", groups_per_round = 2 }
"""
SWEEP = """
name = "noop-sweep"
base = "run.toml"
seeds = [0, 1]
[axes]
"arms.0.grouping.min_group_size" = [2, 3]
"""


def finished_run_and_sweep(tmp: Path) -> tuple[list[str], list[str]]:
    """A finished run and a finished sweep in ``tmp``; the commands that rerun them."""
    cli = [sys.executable, "-m", "groupfel.experiments.cli"]
    (tmp / "run.toml").write_text(RUN)
    (tmp / "sweep.toml").write_text(SWEEP)
    run = cli + ["run", str(tmp / "run.toml"), "--output", str(tmp / "run"), "--quiet"]
    sweep = cli + ["sweep", str(tmp / "sweep.toml"), "--output", str(tmp / "sweep"), "--quiet", "--jobs", "1"]
    for cmd in (run, sweep):
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return run, sweep


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rerun, resweep = finished_run_and_sweep(Path(tmp))
        matrix = Path(tmp) / "labels.csv"
        counts = np.random.default_rng(0).integers(0, 30, size=(100, 10))
        matrix.write_text(",".join(f"l{i}" for i in range(10)) + "\n"
                          + "\n".join(",".join(map(str, row)) for row in counts) + "\n")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "groupfel --help": [sys.executable, "-m", "groupfel.experiments.cli", "--help"],
            "groupfel group (100 clients)": [sys.executable, "-m", "groupfel.experiments.cli", "group", "--policy", "covg",
                                             "--label-matrix", str(matrix), "--min-group-size", "5"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "rerun a finished run (no-op)": rerun,
            "rerun a finished sweep (no-op)": resweep,
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(REPEATS):
            for name, cmd in commands.items():
                times[name].append(wall(cmd))
    med = {name: statistics.median(t) for name, t in times.items()}
    base, helped, group, torch, rerun, resweep = med.values()
    for name, t in med.items():
        print(f"{name:<32} {t:6.3f} s (median of {REPEATS})")
    print(f"\ngroupfel group: {group - base:.3f} s above bare Python, "
          f"{torch / group:.1f}x faster than importing torch alone")
    print(f"no-op reruns: run {rerun - helped:.3f} s, sweep {resweep - helped:.3f} s above start-up (goal 0.5 s)")


if __name__ == "__main__":
    main()
