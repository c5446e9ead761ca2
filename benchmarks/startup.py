"""Start-up time of ``groupfel group`` on a 100-client label matrix, against bare Python and
against importing torch (what a command that trains nothing must not pay).

    python benchmarks/startup.py

Each command runs as a fresh process; the three are interleaved, repeated, and the median wall
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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        matrix = Path(tmp) / "labels.csv"
        counts = np.random.default_rng(0).integers(0, 30, size=(100, 10))
        matrix.write_text(",".join(f"l{i}" for i in range(10)) + "\n"
                          + "\n".join(",".join(map(str, row)) for row in counts) + "\n")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "groupfel group (100 clients)": [sys.executable, "-m", "groupfel.experiments.cli", "group", "--policy", "covg",
                                             "--label-matrix", str(matrix), "--min-group-size", "5"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(REPEATS):
            for name, cmd in commands.items():
                times[name].append(wall(cmd))
    med = {name: statistics.median(t) for name, t in times.items()}
    base, group, torch = med.values()
    for name, t in med.items():
        print(f"{name:<30} {t:6.3f} s (median of {REPEATS})")
    print(f"\ngroupfel group: {group - base:.3f} s above bare Python, "
          f"{torch / group:.1f}x faster than importing torch alone")


if __name__ == "__main__":
    main()
