"""Seeds added until decided: simulated error rates where studies stop early, and expected seeds
against a fixed design of equal power.

    nice python benchmarks/sequential.py [--studies 10000]

Simulates whole studies run with :mod:`groupfel.experiments.sequential` (looks after 3 seeds and
every 2 more up to max_seeds, stopping when every comparison is decided; Holm-Shaffer over the
family) and prints, for each setting, the share of studies with a false decision and its Monte
Carlo standard error:

- false ``higher``/``lower`` (family-wise, identical arms on the comparisons whose true difference
  is 0) where the others are decided early and one comparison is left open (max 20 and 50), with one
  arm and a small spread, with two open accuracies, with the demo's family and spread; normal,
  Student t3 and skewed (centred chi-square, 4 df) noise;
- false ``equivalent`` with the true difference exactly at the margin;
- for true differences of a few sizes (the demo's family and spread): the share of comparisons
  decided right (the power), the mean seeds the study took, and the seeds a fixed design (one look,
  Bonferroni over the 12 comparisons) needs for the same power, exact from the noncentral t law.
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


def _closing(arms: int, metrics: int, open_: list[tuple[int, int]], open_sd: float) -> dict:
    """A family of ``arms`` x ``metrics`` comparisons (margin 1) where every comparison but the
    ``open_`` ones has a true difference of half the margin and a small spread (both its hypotheses
    are soon rejected: it leaves the family), and the open ones a true difference of 0 and spread
    ``open_sd`` (each arm's sd; the reference arm's is small)."""
    sd = np.full((arms + 1, metrics), 0.02)
    true = np.full((arms, metrics), 0.5)
    for a, m in open_:
        sd[a + 1, m], true[a, m] = open_sd, 0.0
    return {"sd": sd, "margin": np.ones(metrics), "true_diff": true}


# name -> (simulate's keyword arguments, the false decision counted, (arm, metric) cells it counts in)
SETTINGS: dict[str, tuple[dict, int, list[tuple[int, int]] | None]] = {
    "one open comparison left, max 20": ({**_closing(3, 4, [(0, 0)], 2.0), "max_seeds": 20}, seq.HIGHER, [(0, 0)]),
    "one open comparison left, max 50": ({**_closing(3, 4, [(0, 0)], 2.0), "max_seeds": 50}, seq.HIGHER, [(0, 0)]),
    "one arm, small spread": ({"sd": np.array([0.6]), "margin": np.ones(1), "true_diff": np.zeros((1, 1)),
                               "max_seeds": 20}, seq.HIGHER, None),
    "two open accuracies": ({**_closing(1, 4, [(0, 0), (0, 1)], 2.0), "max_seeds": 20}, seq.HIGHER,
                            [(0, 0), (0, 1)]),
    "demo family and spread, identical arms": ({"sd": SD, "margin": MARGIN, "true_diff": np.zeros((ARMS, 4)),
                                                "ref_mean": REF, "relative": RELATIVE, "corr": CORR,
                                                "max_seeds": 20}, seq.HIGHER, None),
    "difference at the margin, one arm": ({"sd": np.array([1.5]), "margin": np.ones(1),
                                           "true_diff": np.ones((1, 1)), "max_seeds": 20}, seq.EQUIVALENT, None),
    "difference at the margin, demo family": ({"sd": SD / 3, "margin": MARGIN,
                                               "true_diff": np.tile(np.where(RELATIVE, MARGIN * REF, MARGIN), (ARMS, 1)),
                                               "ref_mean": REF, "relative": RELATIVE, "corr": CORR,
                                               "max_seeds": 20}, seq.EQUIVALENT, None),
}


def false_rate(decisions: np.ndarray, wrong: int, cells) -> np.ndarray:
    """Per study: a false decision in the counted cells (``higher`` counts ``lower`` too)."""
    d = decisions if cells is None else np.stack([decisions[:, a, m] for a, m in cells], axis=1)
    bad = (d == seq.HIGHER) | (d == seq.LOWER) if wrong == seq.HIGHER else d == wrong
    return bad.reshape(len(d), -1).any(axis=1)


def rate(simulate, studies: int, name: str, noise: str = "normal", seed: int = 1) -> tuple[float, float, float]:
    """(false rate, its MC standard error, mean seeds) of setting ``name`` under ``simulate``."""
    kwargs, wrong, cells = SETTINGS[name]
    decisions, used = simulate(studies, kwargs["sd"], kwargs["margin"], kwargs["true_diff"], first=3, batch=2,
                               corr=kwargs.get("corr", 0.5), ref_mean=kwargs.get("ref_mean"),
                               relative=kwargs.get("relative"), max_seeds=kwargs["max_seeds"], noise=noise, seed=seed)
    bad = false_rate(decisions, wrong, cells)
    return float(bad.mean()), float(np.sqrt(bad.mean() * (1 - bad.mean()) / studies)), float(used.mean())


def fixed_for(power: float, sd: float, diff: float, m: int) -> float:
    """The fewest seeds a fixed design (one look, Bonferroni over ``m``) needs for ``power``
    showing a difference ``diff`` with paired spread ``sd`` (exact: noncentral t)."""
    return seq.fixed_seeds_needed(sd, diff, 0.0, m, power=power)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=10_000)
    args = ap.parse_args()
    n = args.studies
    t0 = time.perf_counter()
    print(f"false decisions, share of {n} simulated studies (MC standard error); looks after 3, 5, 7, ... seeds")
    print(f"{'setting':42s} {'noise':7s} {'false':>7s} {'(se)':>7s} {'mean seeds':>10s}")
    for name in SETTINGS:
        for noise in seq.NOISE:
            r, se, used = rate(seq.simulate, n, name, noise)
            print(f"{name:42s} {noise:7s} {r:7.2%} {se:7.2%} {used:10.1f}")
    paired_sd = SD * np.sqrt(2 * (1 - CORR))
    print("\ndemo family: true difference (x paired sd)  decided right  mean seeds (max 20)  fixed design, equal power")
    for k in (0.75, 1.0, 1.5, 2.0):
        true = np.tile(k * paired_sd, (ARMS, 1))
        d, used = seq.simulate(n // 4, SD, MARGIN, true, ref_mean=REF, relative=RELATIVE, corr=CORR, seed=3)
        power = float((d == seq.HIGHER).mean())
        # near 100 % the power curve is flat and a fixed design's count meaningless: 99.9 % at most
        fixed = fixed_for(min(power, 0.999), 1.0, k, ARMS * 4) if power > 0 else float("nan")
        print(f"  {k:<40g} {power:13.1%}  {used.mean():18.1f}  {fixed:.0f}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
