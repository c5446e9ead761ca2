"""Training engines side by side: sequential per-client SGD vs the fused (grouped) engine.

    python benchmarks/engines.py [--threads 1] [--repeats 10]

Prints, for each model and dataset, the time to train one group of 6 clients for E = 2 local
epochs with each engine, and the ratio, measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from emulator.training import FusedEngine, TorchEngine
from topologies import load_dataset


def time_engine(engine, start, clients, repeats: int) -> float:
    engine.train(start, clients, 2, list(range(len(clients))))      # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        engine.train(start, clients, 2, list(range(len(clients))))
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    cases = [("digits", "mlp", 8, 30, 16), ("digits", "cnn", 8, 30, 16)]
    if os.path.isdir("/usr/share/datasets/fashion-mnist"):
        cases.append(("fashion-mnist", "cnn", 20, 200, 32))
    print(f"{'dataset':14} {'model':5} {'sequential ms':>14} {'fused ms':>10} {'speed-up':>9}")
    for name, model, lo, hi, batch in cases:
        data = load_dataset(name)
        parts = [np.sort(rng.choice(len(data.y_train), size=int(rng.integers(lo, hi + 1)), replace=False))
                 for _ in range(6)]
        seq = TorchEngine(data, parts, model, 0.05, batch)
        fused = FusedEngine(data, parts, model, 0.05, batch)
        start = seq.initial_weights(0)
        clients = list(range(6))
        reps = max(1, args.repeats // (5 if name == "fashion-mnist" else 1))
        ts, tf = time_engine(seq, start, clients, reps), time_engine(fused, start, clients, reps)
        print(f"{name:14} {model:5} {ts * 1e3:14.1f} {tf * 1e3:10.1f} {ts / tf:8.2f}x")


if __name__ == "__main__":
    main()
