"""The default demo's time (``groupfel run`` with no argument): wall clock and CPU seconds.

    python benchmarks/demo.py [--numerics portable|native]

Runs the embedded default (4 arms × 3 seeds on the local process pool) into a temporary
directory. On a busy machine the wall clock shows the other jobs, so this also prints the CPU
seconds of the whole process tree and what they come to on this machine's cores when idle (the
goal: ≤ 90 s on 2 cores).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from sweep import TreeCPU

from groupfel.experiments.runner import default_config, run_experiment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--numerics", choices=["portable", "native"], help="default: the demo's (portable)")
    args = ap.parse_args()
    config = default_config()
    if args.numerics:
        config = config.model_copy(update={"train": config.train.model_copy(update={"numerics": args.numerics})})
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with TreeCPU() as cpu:
            run_experiment(config, Path(tmp) / "default", progress=False)
        wall = time.perf_counter() - t0
    print(f"default demo ({config.train.numerics} numerics): {wall:.1f} s wall, {cpu.seconds:.1f} CPU-seconds in all (load average "
          f"{os.getloadavg()[0]:.1f}); on {cores} idle cores about {cpu.seconds / cores:.0f} s plus the serial "
          f"validation and plots (goal <= 90 s)")


if __name__ == "__main__":
    main()
