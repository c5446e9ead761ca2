"""What-if sweep: the vectorised Eq. 5 sum against a literal per-round, per-client loop.

    python benchmarks/whatif.py

Both compute the same per-round costs on a scenario small enough for the loop (checked equal),
then the vectorised sweep runs the issue's size: 100,000 clients × 1,000 rounds × MinGS 2..40.
Last, the what-if over real CoV-Grouping: 100,000 clients with Dirichlet(0.1) labels in edges of
1,000, grouped by covg (MinGS 5, MaxCoV 0.5) on one process and on one per core, priced over
1,000 rounds (goal: ≤ 3 s).
"""
from __future__ import annotations

import os
import time

import numpy as np

from groupfel.cost_models import get_profile
from groupfel.cost_models.whatif import Scenario, dirichlet_label_counts, form_groups, group_costs, grouped_costs, sweep
from groupfel.experiments.cost_cli import _PolicyGrouper
from groupfel.experiments.group_cli import make_policy
from groupfel.policies.cov import cov_of_counts


def literal_total(s: int, overhead, training, sc: Scenario) -> float:
    """Eq. 5 as written: Σ_t Σ_{g∈S_t} K Σ_{i∈g} (O_g(|g|) + E·H(n_i)), one term at a time."""
    n = sc.sample_counts()
    rng = np.random.default_rng((sc.seed, 1, s))
    sizes, _, _ = group_costs(s, n, overhead, training, sc, rng)   # same permutation as the sweep
    perm = np.random.default_rng((sc.seed, 1, s)).permutation(n)
    members, start = [], 0
    for size in sizes:
        members.append(perm[start:start + size])
        start += size
    S = sc.groups_per_round or max(1, round(sc.participation * sc.clients / s))
    S = min(S, len(sizes))
    total = 0.0
    for _ in range(sc.rounds):
        for g in rng.choice(len(sizes), S, replace=False):
            for n_i in members[g]:
                total += sc.group_rounds * (float(overhead(len(members[g]))) + sc.local_epochs * float(training(n_i)))
    return total


def main() -> None:
    prof = get_profile("raspberry-pi-4/cifar10-resnet")
    o, h = prof.group_overhead["secagg"], prof.training["sgd"]
    small = Scenario(clients=10_000, rounds=20)
    sizes = [2, 5, 10, 20, 40]
    t0 = time.perf_counter()
    fast = sweep(sizes, o, h, small)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = [literal_total(s, o, h, small) for s in sizes]
    t_slow = time.perf_counter() - t0
    assert np.allclose(fast["total_all_rounds"], slow, rtol=1e-9), (fast["total_all_rounds"].tolist(), slow)
    print(f"10,000 clients × 20 rounds × {len(sizes)} sizes: vectorised {t_fast:.3f} s, literal loop "
          f"{t_slow:.2f} s, ratio {t_slow / t_fast:.0f}x (same totals)")
    t0 = time.perf_counter()
    sweep(list(range(2, 41)), o, h, Scenario(clients=100_000, rounds=1000))
    print(f"100,000 clients × 1,000 rounds × 39 sizes (2..40): vectorised {time.perf_counter() - t0:.2f} s")

    sc = Scenario(clients=100_000, rounds=1000)
    edges = np.arange(sc.clients) // 1000
    grouper = _PolicyGrouper(make_policy("covg", 5, 0.5))
    for jobs in sorted({1, len(os.sched_getaffinity(0))}):
        t0, c0 = time.perf_counter(), time.process_time()
        counts = dirichlet_label_counts(sc.clients, 10, 0.1, sc.sample_counts(), sc.seed)
        groups = form_groups(counts, edges, grouper, sc.seed, jobs)
        row = grouped_costs(groups, counts, o, h, sc, None, cov_of_counts)
        print(f"covg what-if, 100,000 clients in 100 edges of 1,000, {jobs} process(es): "
              f"{time.perf_counter() - t0:.2f} s wall ({row['groups']} groups, sizes {row['size_min']}.."
              f"{row['size_max']}, mean {row['size_mean']:.2f}; this process's CPU {time.process_time() - c0:.2f} s)")


if __name__ == "__main__":
    main()
