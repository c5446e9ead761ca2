"""A Table 1 arm to the 10^6 budget, wall clock: the sequential engine (before) against the batched
engine (after), one after another in one run.

    python benchmarks/end_to_end.py [--arm covg-esrcov] [--budget 1e6] [--engines sequential,batched]

``experiments/configs/table1-fmnist.toml`` (Fashion-MNIST, 300 clients, CNN, K = 5, E = 2, 12
groups a round, seed 0), one arm, each engine on its own into a temporary directory: the
sequential engine with torch's default threads (what a run did before the batched engine), the
batched engine with its default workers (one per core). Prints each engine's wall clock, rounds
and final accuracy, and the speed-up; the two runs are the same computation (the engines agree to
float rounding), so their rounds and costs must match, and their accuracies nearly.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from groupfel.emulator.config import load_config
from groupfel.experiments.runner import run_experiment

CONFIG = Path(__file__).parents[1] / "experiments" / "configs" / "table1-fmnist.toml"


def run_arm(engine: str, arm: str, budget: float, out: Path) -> tuple[float, pd.Series]:
    config = load_config(CONFIG)
    config = config.model_copy(update={
        "name": f"e2e-{engine}",
        "arms": [a for a in config.arms if a.name == arm],
        "train": config.train.model_copy(update={"engine": engine, "budget": budget}),
    })
    t0 = time.perf_counter()
    summary = run_experiment(config, out / engine, progress=False)
    return time.perf_counter() - t0, summary.iloc[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", default="covg-esrcov")
    ap.add_argument("--budget", type=float, default=1e6)
    ap.add_argument("--engines", default="sequential,batched")
    args = ap.parse_args()
    print(f"Table 1 arm {args.arm} ({CONFIG.name}) to Eq. 5 budget {args.budget:g}, seed 0")
    walls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            wall, row = run_arm(engine, args.arm, args.budget, Path(tmp))
            walls[engine] = wall
            print(f"{engine:10} {wall / 60:6.1f} min  rounds {int(row['rounds'])}  cost {row['cost']:.6g}  "
                  f"final accuracy {row['final_acc']:.4f}", flush=True)
    if {"sequential", "batched"} <= walls.keys():
        print(f"speed-up batched / sequential: {walls['sequential'] / walls['batched']:.2f}x")


if __name__ == "__main__":
    main()
