"""A fixed design's power and the seeds it needs (exact, noncentral t): the guide printed beside an
undecided comparison, and the benchmark's yardstick."""
from __future__ import annotations

import numpy as np

from . import design


def power_difference(n: np.ndarray, sd: float, diff: float, level: float) -> np.ndarray:
    """Exact power of the two-sided paired t-test at ``level`` with ``n`` pairs, true mean
    difference ``diff`` and spread ``sd``: the noncentral t law of its statistic."""
    from scipy import stats

    n = np.asarray(n, dtype=float)
    df, ncp = n - 1, diff * np.sqrt(n) / sd
    c = stats.t.ppf(1 - level / 2, df)
    return stats.nct.sf(c, df, ncp) + stats.nct.cdf(-c, df, ncp)


# Nodes of the quadrature over the sample variance in :func:`power_equivalence`.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(96)


def power_equivalence(n: int, sd: float, diff: float, margin: float, level: float) -> float:
    """Exact power of TOST at ``level`` with ``n`` pairs: the chance that the mean lies within
    ±(δ − t·se), an integral over the sample variance's chi-square law (Gauss-Legendre on its
    quantiles; the bivariate noncentral t law of the two statistics, Owen 1965)."""
    from scipy import stats

    df = n - 1
    u = (_NODES + 1) / 2
    se = sd * np.sqrt(stats.chi2.ppf(u, df) / df) / np.sqrt(n)
    half = margin - stats.t.ppf(1 - level, df) * se
    scale = sd / np.sqrt(n)
    inside = np.maximum(stats.norm.cdf((half - diff) / scale) - stats.norm.cdf((-half - diff) / scale), 0.0)
    return float(np.sum(_WEIGHTS * np.where(half > 0, inside, 0.0)) / 2)


def fixed_seeds_needed(sd: float, diff: float, margin: float, m: int, alpha: float = design.ALPHA,
                       power: float = 0.8, cap: int = 10_000) -> float:
    """How many paired seeds a fixed design (one look, Bonferroni over ``m`` comparisons) needs, at
    the observed spread ``sd`` and difference ``diff``, to decide with ``power`` (exact, from the
    noncentral t law): the fewer of what showing the difference and what showing equivalence take
    (NaN: neither can within ``cap`` seeds, e.g. no spread)."""
    if not (np.isfinite(sd) and sd > 0 and np.isfinite(diff)):
        return float("nan")
    a = alpha / max(m, 1)
    options = []
    if diff != 0:
        options.append(_first_reach(lambda n: power_difference(n, sd, diff, a) >= power, cap))
    if np.isfinite(margin) and abs(diff) < margin:
        options.append(_smallest(lambda k: power_equivalence(k, sd, diff, margin, a) >= power, cap))
    best = min(options) if options else np.inf
    return float(best) if np.isfinite(best) else float("nan")


def _first_reach(ok, cap: int, first: int = 64) -> float:
    """The first n in [MIN_PAIRS, cap] where the vectorised ``ok(n)`` holds (inf: none), read off
    blocks of doubling length: the same n as one pass over the whole range, which costs ten
    thousand noncentral t laws where the answer is a few tens of seeds."""
    start, length = design.MIN_PAIRS, first
    while start <= cap:
        n = np.arange(start, min(start + length, cap + 1))
        reach = ok(n)
        if reach.any():
            return float(n[reach][0])
        start, length = start + length, 2 * length
    return np.inf


def _smallest(ok, cap: int) -> float:
    """The smallest n in [MIN_PAIRS, cap] with ``ok(n)``, ``ok`` false then true as n grows."""
    lo, hi = design.MIN_PAIRS, design.MIN_PAIRS
    while not ok(hi):
        if hi >= cap:
            return np.inf
        lo, hi = hi + 1, min(2 * hi, cap)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return float(hi)
