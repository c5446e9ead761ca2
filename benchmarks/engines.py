"""One global round of the Table 1 setting: batched vs sequential engine, with a matmul's GFLOP/s.

    python benchmarks/engines.py [--models cnn,mlp,resnet-1] [--repeats 5] [--groups 12] [--size 6] [--batch 32] [--threads N]
                                 [--network]

Fashion-MNIST, 12 sampled groups of 6 clients of 20-200 samples (Table 1's client sizes), K = 5,
E = 2, B = 32: each repeat runs the round's compute (:func:`groupfel.emulator.compute.run_group_rounds`, one
engine call per group round) and then its simulated time and charges (the SimPy processes, the
budget pricing), the way the run loop does. Printed per model, medians over the repeats, all in
one process: the sequential and the batched engine's seconds per round and the ratio, each as
GFLOP/s (forward + backward FLOPs counted by torch's FlopCounterMode) and as a share of a 2048³
float32 matmul measured in the same run; and the emulator's own share of a round (everything
that is not the engine). ``--network`` times the same round on shared edges
(:func:`shared_edges`: access capacity, cores, an edge profile, heterogeneous clients and
availability, :mod:`groupfel.emulator.network`), for the overhead that model adds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from groupfel.cost_models import CostModel, get_profile
from groupfel.emulator.compute import LocalSpec, run_group_rounds
from groupfel.emulator.federation import Federation, Group, RoundContext
from groupfel.emulator.ledger import CostLedger
from groupfel.emulator.training import BatchedEngine, TorchEngine
from groupfel.topologies import Link, build_topology, client_sizes, label_matrix, load_dataset

K, E, B = 5, 2, 32


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def flops_per_sample(engine: TorchEngine, B: int) -> float:
    """Forward + backward FLOPs of one training sample (a full batch of B, divided by B)."""
    x, y = engine.x[:B], engine.y[:B]
    if engine.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(engine.model(x), y).backward()
    engine.model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / B


class Timed:
    """Wraps an engine and adds up the seconds spent in ``train``."""

    def __init__(self, engine):
        self.engine, self.seconds = engine, 0.0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def train(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.engine.train(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def setup(groups: int, size: int, seed: int = 0, dataset: str = "fashion-mnist"):
    data = load_dataset(dataset)
    rng = np.random.default_rng(seed)
    n = groups * size
    sizes = client_sizes(n, 20, 200, 110, 45, rng)
    perm = rng.permutation(len(data.y_train))
    parts = np.split(perm[:sizes.sum()], np.cumsum(sizes)[:-1])
    labels = label_matrix(data.y_train, parts, data.num_classes)
    topo = build_topology([size * (groups // 3)] * 3, ["raspberry-pi-4"] * n, parts, labels,
                          Link(20.0, 0.02), Link(1000.0, 0.01))
    sampled = {g: Group(g // (groups // 3), np.arange(g * size, (g + 1) * size), sizes[g * size:(g + 1) * size], 0.0)
               for g in range(groups)}
    return data, parts, topo, sampled


def shared_edges(n_clients: int, seed: int = 0):
    """Every part of the shared-edge model switched on: 100 Mbit/s of access per edge, 2 cores
    with aggregation and secagg-server curves, lognormal client links and slowdowns, and clients
    online 90 % of the time (on/off means 900 s and 100 s)."""
    from groupfel.cost_models import quadratic
    from groupfel.emulator.config import AvailabilityConfig, HeterogeneityConfig
    from groupfel.emulator.network import Availability, EdgeNetwork, client_net

    curves = {"aggregation": quadratic(0.0, 0.01, 0.0), "secagg-server": quadratic(3.5e-5, 5e-4, 4e-3),
              "secagg-server-recovery": quadratic(3.4e-5, -3e-4, 1e-2)}
    clients = client_net(HeterogeneityConfig(bandwidth_sigma=0.5, latency_sigma=0.3, slowdown_sigma=0.2), n_clients,
                         20.0, 0.02, seed)
    avail = Availability(AvailabilityConfig(mean_on_s=900.0, mean_off_s=100.0), n_clients, seed)
    return EdgeNetwork(100e6, 2, True, clients, 1, True, curves, avail)


def federation(engine, topo, network=None) -> Federation:
    """The SimPy side of a run, made once per arm as the run loop does (its clock and its prices
    persist across rounds); ``network``: on shared edges."""
    cost = CostModel({"raspberry-pi-4": get_profile("raspberry-pi-4/cifar10-resnet")})
    ctx = RoundContext(Federation.environment(), engine.model_bytes, cost, CostLedger(), topo, 0, K, E)
    if network is None:
        return Federation(ctx)
    from groupfel.emulator.network import ContendedFederation

    return ContendedFederation(ctx, network)


def one_round(engine, fed, sampled, start, t: int) -> tuple[float, float]:
    """(wall seconds of the whole global round, seconds inside the engine)."""
    timed = Timed(engine)
    t0 = time.perf_counter()
    fed.round_cost(t, list(sampled.values()))                                    # the budget check
    offline = fed.offline(t, list(sampled.items()))                              # availability
    models = run_group_rounds(timed, {g: start for g in sampled}, sampled, t, LocalSpec(0, K, E, 0.05, offline=offline))
    fed.run_round(t, list(sampled.items()))
    sum(models[g] / len(models) for g in sampled)                                # Line 15
    return time.perf_counter() - t0, timed.seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="cnn,mlp,resnet-1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--size", type=int, default=6)
    ap.add_argument("--batch", type=int, default=B, help="local batch size (Table 1: 32; the authors' Fashion-MNIST: 5)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--formulation", default=None, choices=["stacked", "per-client"],
                    help="force the batched engine's formulation (default: its own choice)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of this process (the sequential engine); default torch's")
    ap.add_argument("--network", action="store_true", help="on shared edges (groupfel.emulator.network)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data, parts, topo, sampled = setup(args.groups, args.size)
    passes = K * E * sum(int(g.n_samples.sum()) for g in sampled.values())
    print(f"Table 1 round: {args.groups} groups x {args.size} clients, K={K}, E={E}, B={args.batch}, "
          f"{passes} sample-passes; torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} torch threads; medians of {args.repeats}")
    print(f"{'model':9} {'seq s':>7} {'batched s':>9} {'speed-up':>8} {'seq GF/s':>9} {'bat GF/s':>9} "
          f"{'matmul GF/s':>11} {'bat/matmul':>10} {'emulator share':>14} {'formulation':>12}")
    for model in args.models.split(","):
        seq = TorchEngine(data, parts, model, 0.05, args.batch)
        bat = BatchedEngine(data, parts, model, 0.05, args.batch, workers=args.workers, formulation=args.formulation)
        start = seq.initial_weights(0)
        flops = flops_per_sample(seq, args.batch) * passes
        net = shared_edges(topo.n_clients) if args.network else None
        fed_seq, fed_bat = federation(seq, topo, net), federation(bat, topo, net)
        one_round(bat, fed_bat, sampled, start, 0)                                # warm-up, forks workers
        one_round(seq, fed_seq, sampled, start, 0)
        ts, tb, share, mm = [], [], [], []
        for r in range(1, args.repeats + 1):                                      # interleaved, side by side
            ts.append(one_round(seq, fed_seq, sampled, start, r)[0])
            wall, inside = one_round(bat, fed_bat, sampled, start, r)
            tb.append(wall)
            share.append((wall - inside) / wall)
            mm.append(matmul_gflops(repeats=3))
        s, b, m = statistics.median(ts), statistics.median(tb), statistics.median(mm)
        print(f"{model:9} {s:7.2f} {b:9.2f} {s / b:7.2f}x {flops / s / 1e9:9.1f} {flops / b / 1e9:9.1f} "
              f"{m:11.1f} {flops / b / 1e9 / m:9.0%} {statistics.median(share):14.2%} {bat.formulation:>12}")


if __name__ == "__main__":
    main()
