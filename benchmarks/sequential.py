"""Seeds added until decided, against a fixed design of equal power: simulated error rates and
expected seeds.

    python benchmarks/sequential.py [--studies 20000] [--max-seeds 20] [--batch 2]

Simulates whole studies with the demo's family (3 arms against a reference, on final_acc,
acc_at_common_cost, cost_to_target and sim_time_s: 12 comparisons) and noise shaped like the demo's
seed-to-seed spread (seeds 0, 1, 2 of ``groupfel run``; pooled over its arms), run with
:mod:`groupfel.experiments.sequential`: looks after 3 seeds and every ``--batch`` more, stopping
when every comparison is decided. Prints

- the family-wise rate of false ``higher``/``lower`` with identical arms, and of false
  ``equivalent`` with every true difference at its margin (normal and heavy-tailed noise);
- for true differences of a few sizes: the share of comparisons decided right (the power), the
  mean seeds the study took, and the seeds a fixed design (one look, same family and Holm) needs
  for at least the same power.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from groupfel.experiments import sequential as seq

# The demo's spread (seeds 0, 1, 2): sd of one arm's metric pooled over its arms, the reference
# arm's mean; margins are the defaults.
SD = np.array([0.0195, 0.0193, 818.0, 82.4])
REF = np.array([0.913, 0.899, 5506.0, 749.0])
RELATIVE = np.array([False, False, True, True])
MARGIN = np.array([0.01, 0.01, 0.05, 0.05])
CORR = 0.2    # two arms' values within a seed (shared data placement and costs)
ARMS = 3


def _sim(studies: int, true: np.ndarray, *, first: int, max_seeds: int, batch: int, sd=SD, tails=None, seed=0):
    return seq.simulate(studies, sd, MARGIN, true, ref_mean=REF, relative=RELATIVE, first=first, batch=batch,
                        max_seeds=max_seeds, corr=CORR, tails=tails, seed=seed)


def _fixed_for(power: float, true: np.ndarray, right: int, studies: int, sd, cap: int = 200) -> int | None:
    """The fewest seeds whose fixed design decides at least ``power`` of the comparisons right."""
    def power_at(n: int) -> float:
        d, _ = _sim(studies, true, first=n, max_seeds=n, batch=1, sd=sd, seed=7)
        return float((d == right).mean())

    lo, hi = 3, 3
    while power_at(hi) < power:
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:            # power grows with the seeds
        mid = (lo + hi) // 2
        if power_at(mid) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=20_000)
    ap.add_argument("--max-seeds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    n, kw = args.studies, {"first": 3, "max_seeds": args.max_seeds, "batch": args.batch}
    t0 = time.perf_counter()
    paired_sd = SD * np.sqrt(2 * (1 - CORR))
    print(f"{ARMS} arms x 4 metrics against a reference, looks after {seq.looks(3, args.batch, args.max_seeds)} "
          f"seeds; {n} simulated studies each; demo-shaped noise (paired sd {np.round(paired_sd, 4).tolist()})")
    at_margin = np.tile(np.where(RELATIVE, MARGIN * REF, MARGIN), (ARMS, 1))
    for tails, name in ((None, "normal"), (3.0, "Student t3")):
        d, used = _sim(n, np.zeros((ARMS, 4)), tails=tails, seed=1, **kw)
        false = ((d == seq.HIGHER) | (d == seq.LOWER)).any(axis=(1, 2)).mean()
        d2, _ = _sim(n, at_margin, tails=tails, seed=2, **kw)
        eq = (d2 == seq.EQUIVALENT).any(axis=(1, 2)).mean()
        se = np.sqrt(0.05 * 0.95 / n)
        print(f"  {name:10s} identical arms: false higher/lower in {false:.2%} of studies (family-wise; se "
              f"{se:.2%}); difference at the margin: false equivalent in {eq:.2%}")
    print("\ntrue difference (x paired sd)  decided right  mean seeds (max)  fixed design, equal power")
    scenarios = [(k, np.tile(k * paired_sd, (ARMS, 1)), seq.HIGHER, SD) for k in (0.75, 1.0, 1.5, 2.0)]
    scenarios.append(("0, spread / 8", np.zeros((ARMS, 4)), seq.EQUIVALENT, SD / 8))
    for k, true, right, sd in scenarios:
        d, used = _sim(n // 4, true, sd=sd, seed=3, **kw)
        power = float((d == right).mean())
        fixed = _fixed_for(power, true, right, n // 4, sd)
        print(f"  {str(k):28s} {power:13.1%}  {used.mean():10.1f} ({args.max_seeds})  "
              f"{fixed if fixed is not None else '> 200'}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
