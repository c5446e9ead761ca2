"""Peak memory of a 300-client Fashion-MNIST run (3 edges × 100 clients, the CNN, 12 groups per
round, persistent momentum for every client), for one engine.

    python benchmarks/memory.py [batched|sequential] [--rounds 2]

Prints the peak RSS of the main process and of the largest worker (a forked worker's RSS counts
the pages it shares with the main process: the dataset, torch's libraries).
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from groupfel.emulator.config import parse_config
from groupfel.emulator.driver import plan_arms, run_arm
from groupfel.emulator.world import build_world


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", nargs="?", default="batched", choices=["batched", "sequential"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    config = parse_config({
        "name": "memory", "seed": 0,
        "data": {"dataset": "fashion-mnist", "alpha": 0.1, "min_samples": 20, "max_samples": 200},
        "topology": {"edges": 3, "clients_per_edge": 100},
        "train": {"model": "cnn", "engine": args.engine, "batch_size": 32, "rounds": args.rounds,
                  "momentum": 0.9, "client_state": "persistent"},
        "arms": [{"name": "covg", "grouping": {"policy": "covg", "min_group_size": 5, "max_cov": 0.5},
                  "sampling": {"policy": "esrcov", "groups_per_round": 12}}]})
    world = build_world(config)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        df = run_arm(world, plan_arms(world, only=0)[0], Path(out) / "covg")
    pool = getattr(world.engine, "_pool", None)
    if pool is not None:   # reap the workers so their peak shows in RUSAGE_CHILDREN
        pool.terminate()
        pool.join()
    main_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"engine={args.engine} rounds={args.rounds} accuracy={df['accuracy'].iloc[-1]:.3f} "
          f"wall={time.perf_counter() - t0:.1f} s  peak RSS: main {main_rss:.0f} MiB, largest worker {worker_rss:.0f} MiB")


if __name__ == "__main__":
    main()
