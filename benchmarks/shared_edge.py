"""Shared edges (groupfel.emulator.network): the SimPy time they add to a Table 1 round, and a what-if
table of round makespan and Eq. 5 cost by group size at three access capacities.

    python benchmarks/shared_edge.py [--repeats 20] [--capacities 20,100,500] [--sizes 2,3,4,5,6,8,10,12,15,20,30,40]

1. The Table 1 round (12 sampled groups of 6 on 3 edges, K = 5, E = 2, Fashion-MNIST client sizes):
   the budget pricing and the SimPy processes alone (no training), on dedicated links and on
   shared edges with every part switched on (``benchmarks/engines.py``'s ``shared_edges``); medians.
2. One edge of 60 clients (Raspberry Pi 4 curves, cifar10-resnet: sgd and secagg), all in sampled
   groups of each size, a 1M-parameter model (4 MB), 50 Mbit/s client links, 20 ms latency, one
   edge core with secagg-server curves measured on this machine at 1M parameters
   (``benchmarks/edge-profile.csv``, from ``groupfel measure secagg --server``), K = 5, E = 2.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from groupfel.cost_models import get_profile, read_profiles
from groupfel.emulator.network import edge_makespan

HERE = Path(__file__).parent


def simpy_overhead(repeats: int) -> None:
    from engines import federation, setup, shared_edges

    from groupfel.emulator.training import TorchEngine

    data, parts, topo, sampled = setup(12, 6)
    engine = TorchEngine(data, parts, "mlp", 0.05, 32)
    for name, net in (("dedicated links", None), ("shared edges", shared_edges(topo.n_clients))):
        fed = federation(engine, topo, net)
        times, cpu = [], []
        for t in range(repeats + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            fed.round_cost(t, list(sampled.values()))
            fed.offline(t, list(sampled.items()))
            fed.run_round(t, list(sampled.items()))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        print(f"{name:16} SimPy + pricing per round: {1e3 * statistics.median(times[1:]):7.2f} ms wall, "
              f"{1e3 * statistics.median(cpu[1:]):7.2f} ms CPU (medians of {repeats})")


def whatif_table(capacities: list[float], sizes: list[int]) -> None:
    pi = get_profile("raspberry-pi-4/cifar10-resnet")
    edge = read_profiles(HERE / "edge-profile.csv")["x86-edge/cifar10-resnet"]
    n = np.maximum(np.random.default_rng(0).poisson(50, 60), 1)
    print("| group size | groups (sizes) | Eq. 5 cost of the edge's round (device s) | "
          + " | ".join(f"makespan at {c:g} Mbit/s (s)" for c in capacities) + " | core wait at "
          f"{capacities[0]:g} Mbit/s (s) |")
    print("|" + " --- |" * (4 + len(capacities)))
    t0 = time.perf_counter()
    for s in sizes:
        groups = [len(p) for p in np.array_split(np.arange(60), 60 // s)]
        rows = [edge_makespan(groups, n, pi.training["sgd"], pi.group_overhead["secagg"], group_rounds=5,
                              local_epochs=2, model_bytes=4_000_000, client_mbps=50.0, latency_s=0.02,
                              access_mbps=c, cores=1, edge_curves=edge.group_overhead, secagg=True)
                for c in capacities]
        span = f"{min(groups)}" if min(groups) == max(groups) else f"{min(groups)}-{max(groups)}"
        print(f"| {s} | {len(groups)} ({span}) | {rows[0]['edge_cost']:.0f} | "
              + " | ".join(f"{r['makespan_s']:.1f}" for r in rows) + f" | {rows[0]['core_wait_s']:.2f} |")
    print(f"\n{len(sizes) * len(capacities)} edge rounds simulated in {time.perf_counter() - t0:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--capacities", default="20,100,500")
    ap.add_argument("--sizes", default="2,3,4,5,6,8,10,12,15,20,30,40")
    ap.add_argument("--skip-overhead", action="store_true")
    args = ap.parse_args()
    if not args.skip_overhead:
        simpy_overhead(args.repeats)
        print()
    whatif_table([float(c) for c in args.capacities.split(",")], [int(s) for s in args.sizes.split(",")])


if __name__ == "__main__":
    main()
