"""The test at one look: the paired t-test and TOST, the bootstrap-t (each tail at least the
t-test's), Hall's skewness-corrected t (the benchmark's alternatives), and what a look reports
beside them (skewness, a rare seed, no spread)."""
from __future__ import annotations

import functools

import numpy as np

from . import design

# A seed at least this many of the others' standard deviations from their mean is named beside a
# decision: with normal differences one seed lies that far in 2.1 % of studies of 20 pairs, 5.2 % of 10.
RARE_Z = 4.0

# Mixed into the seeds of a bootstrap's generator, so that it draws its own stream.
_BOOT_STREAM = 0xB007
_CHUNK = 2048   # rows of differences resampled at once (memory: rows x resamples floats)


# A spread below this share of the mean difference is rounding (a constant difference computed
# in floating point), not seed-to-seed variation.
FLAT = 1e-9


def no_spread(sd, mean) -> np.ndarray:
    """Whether paired differences with this ``sd`` and ``mean`` have no spread to test against."""
    sd = np.asarray(sd, dtype=float)
    return ~(sd > FLAT * np.abs(np.asarray(mean, dtype=float)))


def _skew(third, sd, n):
    """The skewness estimate of :data:`~.design.HALL_SKEW` from the third central moment (divisor n) and the
    sd (divisor n − 1); 0 where there is no spread."""
    with np.errstate(divide="ignore", invalid="ignore"):
        g = third / sd ** 3
        if design.HALL_SKEW == "G1":
            g = third / (sd ** 2 * (n - 1) / n) ** 1.5 * np.sqrt(n * (n - 1)) / (n - 2)
    return np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)


def hall_statistic(mean, sd, skew, n, mu=0.0):
    """Hall's (1992, *JRSS B* 54:221) skewness-corrected studentised mean for H0: μ = ``mu``, from
    pairs with this ``mean``, ``sd`` and skewness estimate: with θ = (mean − μ)/sd,
    T = √n (θ + γθ²/3 + γ²θ³/27 + γ/(6n)), referred to Student's t with n − 1 degrees of freedom.
    The terms γθ²/3 and γ/(6n) remove the first (n^−½) Edgeworth term of the studentised mean's
    law, the one a skewed law of the pairs puts there; the cubic keeps T monotone in the mean
    (θ + γθ²/3 + γ²θ³/27 = ((1 + γθ/3)³ − 1)/γ), so each tail is a tail of the mean."""
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = (np.asarray(mean, dtype=float) - mu) / sd
    g = np.asarray(skew, dtype=float)
    return np.sqrt(n) * (theta + g * theta ** 2 / 3 + g ** 2 * theta ** 3 / 27 + g / (6 * n))


def skewness(d) -> float:
    """Sample skewness of paired differences (adjusted Fisher-Pearson G1); NaN with fewer than 3
    or without spread."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < design.MIN_PAIRS or no_spread(d.std(ddof=1), d.mean()):
        return float("nan")
    c = d - d.mean()
    g1 = (c ** 3).mean() / (c ** 2).mean() ** 1.5
    return float(g1 * np.sqrt(n * (n - 1)) / (n - 2))


def skewness_rows(d: np.ndarray) -> np.ndarray:
    """:func:`skewness` along the last axis (adjusted Fisher-Pearson G1; NaN without
    spread or with fewer than 3 pairs)."""
    n = d.shape[-1]
    c = d - d.mean(axis=-1, keepdims=True)
    m2 = (c ** 2).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g1 = (c ** 3).mean(axis=-1) / m2 ** 1.5 * np.sqrt(n * (n - 1)) / (n - 2)
    return np.where((n >= design.MIN_PAIRS) & (m2 > 0), g1, np.nan)


def look_pvalues(d: np.ndarray, margin: np.ndarray | float, seeds=None, resamples: int | None = None,
                 above: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p-values of paired differences ``d`` (..., n) with ``margin`` δ (...): two-sided p for μ = 0,
    and the one-sided TOST p-values for μ <= −δ and for μ >= δ. From :data:`~.design.BOOT_MIN` pairs on, a
    bootstrap-t (:func:`bootstrap_t`, resamples drawn from ``seeds``, the pairs' seed numbers:
    default 0, …, n − 1), which follows a skewed law of the differences; below, the paired
    t-test, which assumes them near normal. NaN with fewer than MIN_PAIRS pairs or no spread
    (:func:`no_spread`: no test is meaningful there). ``above``: rows whose t-test p-values of
    both hypotheses (μ = 0, and TOST's larger) exceed it keep those (smaller, so still above it):
    the simulations need only whether a p-value can reach a boundary at 5 %. :data:`~.design.TEST` names
    the test from BOOT_MIN pairs on (others than the default run in the benchmark only)."""
    from scipy import stats

    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1) if n > 1 else np.full(mean.shape, np.nan)
    se = sd / np.sqrt(n)
    bad = (n < design.MIN_PAIRS) | no_spread(sd, mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        t0 = mean / se
        lo = (mean + margin) / se
        hi = (mean - margin) / se
    df = max(n - 1, 1)
    up, down, p_lo, p_hi = (np.array(np.broadcast_to(x, mean.shape), dtype=float) for x in
                            (stats.t.sf(t0, df), stats.t.cdf(t0, df), stats.t.sf(lo, df), stats.t.cdf(hi, df)))
    if n >= design.BOOT_MIN and design.TEST.startswith("hall"):
        g = _skew(((d - mean[..., None]) ** 3).mean(axis=-1), sd, n)
    if n >= design.BOOT_MIN and design.TEST in ("hall", "hall-max", "hall+bootstrap"):
        with np.errstate(invalid="ignore"):
            h0, h_lo, h_hi = (hall_statistic(mean, sd, g, n, mu) for mu in (0.0, -np.asarray(margin), margin))
        hall = (stats.t.sf(h0, df), stats.t.cdf(h0, df), stats.t.sf(h_lo, df), stats.t.cdf(h_hi, df))
        if design.TEST == "hall-max":
            hall = (np.maximum(a, b) for a, b in zip(hall, (up, down, p_lo, p_hi)))
        up, down, p_lo, p_hi = (np.array(np.broadcast_to(x, mean.shape), dtype=float) for x in hall)
    elif n >= design.BOOT_MIN and design.TEST == "hall-boot":
        with np.errstate(invalid="ignore"):
            cuts = [np.broadcast_to(hall_statistic(mean, sd, g, n, mu), mean.shape)
                    for mu in (0.0, -np.asarray(margin), margin)]
        b_count = resamples or design.BOOTSTRAP
        up, down, p_lo, p_hi = (np.array(x, dtype=float) for x in
                                bootstrap_t(d, *cuts, range(n) if seeds is None else seeds, b_count, hall=True))
    if n >= design.BOOT_MIN and design.TEST in ("bootstrap", "hall+bootstrap"):
        # each tail: the larger of the t-test's (Hall's, "hall+bootstrap") and the bootstrap-t's
        rows = np.broadcast_to(np.minimum(2 * np.minimum(up, down), np.maximum(p_lo, p_hi)) <= above, mean.shape)
        cuts = (np.broadcast_to(x, mean.shape)[rows] for x in (t0, lo, hi))
        b_count = resamples or design.BOOTSTRAP
        tails = bootstrap_t(d[rows], *cuts, range(n) if seeds is None else seeds, b_count)
        for x, b in zip((up, down, p_lo, p_hi), tails):
            x[rows] = beyond_every_resample(x[rows], b, b_count)
    p_diff = np.minimum(1.0, 2 * np.minimum(up, down))
    nan = np.nan
    return (np.where(bad, nan, p_diff), np.where(bad, nan, p_lo), np.where(bad, nan, p_hi))


def beyond_every_resample(t_tail: np.ndarray, boot_tail: np.ndarray, resamples: int) -> np.ndarray:
    """One tail's p-value from the t-test's and the bootstrap-t's: the larger of the two. Where the
    observed statistic lies beyond every resample the bootstrap's tail is its floor,
    1 / (resamples + 1), never 0, and the p-value stays there. (Falling back on the t-test's tail
    there, which early boundaries could cross, was measured and refused: under skewed nulls the
    statistic lies beyond every resample far more often than once in ``resamples`` + 1 tests, and
    two open accuracies with gamma(0.5) differences went from 4.8 % to 7.5 % false decisions.)"""
    return np.maximum(np.asarray(t_tail, dtype=float), np.asarray(boot_tail, dtype=float))


def t_fallback(t_tail: np.ndarray, boot_tail: np.ndarray, resamples: int) -> np.ndarray:
    """The refused alternative to :func:`beyond_every_resample`, for the benchmark: the t-test's
    tail where the statistic lies beyond every resample."""
    t_tail, boot_tail = np.asarray(t_tail, dtype=float), np.asarray(boot_tail, dtype=float)
    floor = boot_tail <= 1.0 / (resamples + 1) * (1 + 1e-9)
    return np.where(floor, t_tail, np.maximum(t_tail, boot_tail))


def rare_seed(d, seeds=None) -> tuple[float, float]:
    """The seed whose paired difference lies furthest from the others' mean, and how far, in
    standard deviations of the others (leave one out): a decision can rest on such a seed (a run
    that went wrong), and the next seeds may hold another. (NaN, NaN) with fewer than 4 pairs or
    no spread among the others."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < design.MIN_PAIRS + 1:
        return float("nan"), float("nan")
    seeds = np.arange(n) if seeds is None else np.asarray(seeds)
    total, squares = d.sum(), (d ** 2).sum()
    others_mean = (total - d) / (n - 1)
    others_var = np.maximum((squares - d ** 2) - (n - 1) * others_mean ** 2, 0.0) / (n - 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(d - others_mean) / np.sqrt(others_var)
    z = np.where(others_var > (FLAT * np.abs(others_mean)) ** 2, z, np.nan)
    if not np.isfinite(z).any():
        return float("nan"), float("nan")
    i = int(np.nanargmax(z))
    return float(seeds[i]), float(z[i])


def bootstrap_weights(seeds, resamples: int = design.BOOTSTRAP) -> np.ndarray:
    """How often each pair appears in each resample, (resamples, pairs): multinomial counts from a
    generator seeded by the pairs' seed numbers, so a study's bootstrap is a function of its seeds
    (the same data give the same p-values on every machine and every rerun). Read-only: one array
    per set of seeds, which every metric and look of a study shares."""
    return _weights(tuple(int(s) for s in seeds), int(resamples))


@functools.lru_cache(maxsize=8)   # a study uses a few sets of seeds at a time
def _weights(seeds: tuple[int, ...], resamples: int) -> np.ndarray:
    rng = np.random.default_rng([_BOOT_STREAM, len(seeds), *seeds])
    w = rng.multinomial(len(seeds), np.full(len(seeds), 1.0 / len(seeds)), size=resamples).astype(float)
    w.flags.writeable = False
    return w


def bootstrap_t(d: np.ndarray, t0, t_lo, t_hi, seeds, resamples: int = design.BOOTSTRAP, hall: bool = False):
    """Bootstrap-t p-values (Efron & Tibshirani 1993, ch. 12; Hall 1992, §3.10) of differences
    ``d`` (..., n): the law of the studentised mean (m − μ)/se is read off resamples of the pairs,
    T* = (m* − m)/se*, whose skew follows the data's (a t-test's symmetric law makes one tail too
    light for skewed differences). Two-sided p for μ = 0 (equal-tailed: twice the smaller tail at
    ``t0`` = m/se), and the TOST tails P(T* >= ``t_lo``), P(T* <= ``t_hi``); each tail counts the
    observed statistic itself ((k + 1) / (B + 1)). A resample of one repeated pair has no spread:
    its T* is infinite (or 0), so it counts against the test. Resampling uses counts
    (:func:`bootstrap_weights`) and matrix products, so thousands of simulated studies are cheap.
    ``hall``: each resample's statistic is Hall's (:func:`hall_statistic`, with its own skewness)
    and the cuts are the observed Hall statistics (the benchmark's "hall-boot")."""
    d = np.asarray(d, dtype=float)
    shape, n = d.shape[:-1], d.shape[-1]
    w = bootstrap_weights(seeds, resamples)                   # (B, n)
    flat = d.reshape(-1, n)
    centred = flat - flat.mean(axis=1, keepdims=True)         # less cancellation in the sums
    cuts = [np.broadcast_to(np.asarray(x, dtype=float), shape).reshape(-1) for x in (t0, t_lo, t_hi)]
    up0, down0, up_lo, down_hi = (np.zeros(len(flat)) for _ in range(4))
    for a in range(0, len(flat), _CHUNK):
        c = centred[a:a + _CHUNK]
        m = c @ w.T / n                                        # (rows, B): m* − m
        ss = (c ** 2) @ w.T
        var = np.maximum(ss - n * m ** 2, 0.0) / (n - 1)
        flat_ = var <= 1e-12 * np.maximum(ss / n, 1e-300)      # one repeated pair: no spread
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(flat_, np.sign(m) * np.inf, m / np.sqrt(var / n))
            if hall:   # each resample's own Hall statistic (its own skewness) at its parent's mean
                third = (c ** 3) @ w.T / n - 3 * m * ss / n + 2 * m ** 3
                sd = np.sqrt(var)
                t = np.where(flat_, t, hall_statistic(m, sd, _skew(third, sd, n), n))
        t = np.nan_to_num(t, nan=0.0)
        s = slice(a, a + len(c))
        up0[s] = (t >= cuts[0][s, None]).sum(axis=1)
        down0[s] = (t <= cuts[0][s, None]).sum(axis=1)
        up_lo[s] = (t >= cuts[1][s, None]).sum(axis=1)
        down_hi[s] = (t <= cuts[2][s, None]).sum(axis=1)
    return tuple(((k + 1) / (resamples + 1)).reshape(shape) for k in (up0, down0, up_lo, down_hi))
