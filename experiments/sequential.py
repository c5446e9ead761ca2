"""Decisions that hold under repeated looks: group-sequential tests with alpha spending, TOST
equivalence, and Holm's step-down over the family.

A study compares every arm with the reference arm on each headline metric. Each comparison has two
null hypotheses, and at most one of them can be true:

- ``diff``: the mean paired difference is 0 (two-sided; rejected: **higher** or **lower**);
- ``eq``: the difference is at least the metric's margin away from 0, |μ| >= δ (rejected by two
  one-sided tests, TOST, Schuirmann 1987: **equivalent**).

A study that adds seeds looks at its data after every batch. Each hypothesis is tested at each
look with the Lan-DeMets (1983) O'Brien-Fleming-type spending function
α(t) = 2 − 2Φ(z_{1−α/2} / √t), t = pairs / max_seeds; the boundaries come from the exact joint
normal law of the look statistics (recursive integration, Armitage, McPherson & Rowe 1969;
Jennison & Turnbull 2000, ch. 19) and apply to each look's paired t-test through its nominal
significance level (Jennison & Turnbull 2000, §3.8: the variance is estimated). The smallest level
at which a look so far crosses its boundary is the hypothesis's *repeated p-value*. Holm's
step-down over the repeated p-values (Maurer & Bretz 2013: graphical, Holm-type recycling of α in
group-sequential designs) controls the family-wise error; because at most one hypothesis of a
comparison is true, the divisor at each step is the number of comparisons with a hypothesis still
open (Shaffer 1986), not the number of hypotheses. A run with a fixed seed list has one look, at
t = 1, where the repeated p-value is the t-test's p.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

ALPHA = 0.05
MIN_PAIRS = 3
# Levels at which the boundaries are tabulated; a repeated p-value is read off between them
# (log-linear interpolation), and clipped to this range.
_LEVELS = np.geomspace(1e-7, 1.0, 101)
_GRID = 201   # points of the continuation region in the recursive integration


def _special():
    from scipy import special

    return special


def spend(level: float, t: np.ndarray, two_sided: bool = False) -> np.ndarray:
    """Lan-DeMets O'Brien-Fleming-type spending: the error spent by information fraction ``t``,
    2 − 2Φ(z_{1−α/2} / √t) for a one-sided test at level α; a two-sided test spends α/2 on each
    side (the convention of the published tables: 5 equal looks at 5 % give 4.877 … 2.031)."""
    if two_sided:
        return 2 * spend(level / 2, t)
    sp = _special()
    z = sp.ndtri(1 - level / 2)
    t = np.clip(np.asarray(t, dtype=float), 1e-12, 1.0)
    return 2 - 2 * sp.ndtr(z / np.sqrt(t))


def boundaries(ns: tuple[int, ...], n_max: int, level: float, two_sided: bool) -> np.ndarray:
    """Nominal significance level of each look's test (looks at ``ns`` pairs of at most ``n_max``)
    so that the chance of crossing at any look is ``level`` spent by :func:`spend`."""
    from scipy.optimize import brentq

    sp = _special()
    info = np.asarray(ns, dtype=float)
    spent = spend(level, info / max(n_max, ns[-1]), two_sided)
    inc = np.diff(np.concatenate([[0.0], spent]))
    tails = 2.0 if two_sided else 1.0
    out = np.zeros(len(ns))
    # look 1: the statistic is exactly standard normal
    c = max(sp.ndtri(1 - inc[0] / tails), 0.0) if inc[0] > 0 else np.inf
    out[0] = tails * sp.ndtr(-c)
    x, w = _region(c, info[0], two_sided)
    w = w * np.exp(-x ** 2 / (2 * info[0])) / np.sqrt(2 * np.pi * info[0])
    for k in range(1, len(ns)):
        sd = np.sqrt(info[k] - info[k - 1])
        root = np.sqrt(info[k])

        def exits(c: float) -> float:
            p = sp.ndtr((x - c * root) / sd)
            if two_sided:
                p = p + sp.ndtr((-c * root - x) / sd)
            return float(w @ p)

        if inc[k] <= 1e-15 or exits(40.0) >= inc[k]:
            c = np.inf
        elif exits(0.0) <= inc[k]:    # the level asks for more than is left: every path exits
            c = 0.0
        else:
            c = brentq(lambda c: exits(c) - inc[k], 0.0, 40.0, xtol=1e-10)
        out[k] = tails * sp.ndtr(-c)
        y, v = _region(c, info[k], two_sided)
        dens = np.exp(-(y[:, None] - x[None, :]) ** 2 / (2 * sd ** 2)) / (sd * np.sqrt(2 * np.pi)) @ w
        x, w = y, v * dens
    return out


def _region(c: float, info: float, two_sided: bool) -> tuple[np.ndarray, np.ndarray]:
    """Grid and trapezoid weights over the continuation region of the sum statistic (info = its
    variance); tails beyond 10 standard deviations carry no mass worth integrating."""
    s = np.sqrt(info)
    hi = min(c, 10.0) * s
    lo = -hi if two_sided else -10.0 * s
    x = np.linspace(lo, hi, _GRID)
    w = np.full(_GRID, (hi - lo) / (_GRID - 1))
    w[[0, -1]] /= 2
    return x, w


def _table(ns: tuple[int, ...], n_max: int, two_sided: bool) -> np.ndarray:
    """Nominal levels, shape (levels, looks), for every tabulated level. A look's boundary depends
    on the looks before it only, so a schedule's table is the first columns of a longer one's."""
    for longer in _tables:
        if longer[1:] == (n_max, two_sided) and longer[0][:len(ns)] == ns:
            return _tables[longer][:, :len(ns)]
    table = np.stack([boundaries(ns, n_max, a, two_sided) for a in _LEVELS])
    _tables[(ns, n_max, two_sided)] = table
    return table


_tables: dict[tuple, np.ndarray] = {}


def prepare(ns: tuple[int, ...], n_max: int) -> None:
    """Tabulate the boundaries of a whole schedule at once (its prefixes then cost nothing)."""
    for two_sided in (True, False):
        _table(tuple(ns), int(n_max), two_sided)


def _raw_repeated_p(p: np.ndarray, ns: tuple[int, ...], n_max: int, two_sided: bool) -> np.ndarray:
    """The smallest tabulated level at which a look's p-value is at or below its nominal level."""
    table = _table(tuple(ns), int(n_max), two_sided)
    out = np.ones(p.shape[:-1])
    for k in range(len(ns)):
        nominal = table[:, k]
        ok = nominal > 0
        if ok.sum() < 2:
            continue
        lp = np.log(np.clip(np.nan_to_num(p[..., k], nan=1.0), 1e-300, 1.0))
        # levels below the first positive nominal one cannot reject; above the last, nothing does
        lev = np.exp(np.interp(lp, np.log(nominal[ok]), np.log(_LEVELS[ok]), left=np.log(_LEVELS[ok][0]),
                               right=0.0))
        out = np.minimum(out, lev)
    return out


# Paths of the calibration below; its generator's seed is fixed, so every machine computes the
# same decisions from the same data.
_PATHS = 200_000
_CALIBRATION_SEED = 36


def _null_p(ns: tuple[int, ...], two_sided: bool) -> np.ndarray:
    """t-test p-values at the looks ``ns`` along simulated normal null paths, (paths, looks). Each
    look adds a block of seeds whose sum (normal) and sum of squares about its own mean
    (chi-square) are drawn directly, which is exact for normal seeds and needs no memory per seed;
    the blocks are drawn in look order, so a schedule's first looks are the same paths as its
    prefix's."""
    from scipy import stats

    rng = np.random.default_rng(_CALIBRATION_SEED)
    total = np.zeros(_PATHS)
    squares = np.zeros(_PATHS)
    out = np.empty((_PATHS, len(ns)))
    before = 0
    for k, n in enumerate(ns):
        size = n - before
        block = rng.standard_normal(_PATHS) * np.sqrt(size)
        within = rng.chisquare(size - 1, _PATHS) if size > 1 else np.zeros(_PATHS)
        total += block
        squares += within + block ** 2 / size
        before = n
        mean = total / n
        sd = np.sqrt(np.maximum(squares - n * mean ** 2, 0) / (n - 1))
        t = mean / (sd / np.sqrt(n))
        out[:, k] = 2 * stats.t.sf(np.abs(t), n - 1) if two_sided else stats.t.sf(t, n - 1)
    return out


@lru_cache(maxsize=256)
def _calibration(ns: tuple[int, ...], n_max: int, two_sided: bool) -> np.ndarray:
    """The repeated p-values of :func:`_raw_repeated_p` under the null, sorted, from simulated
    normal paths. The boundaries are exact for normal statistics; applied to t-tests through their
    nominal levels they cross a few per cent too often at small degrees of freedom (Jennison &
    Turnbull 2000, §3.8), so the repeated p-value is read through this simulated null law."""
    return np.sort(_raw_repeated_p(_null_p(ns, two_sided), ns, n_max, two_sided))


def repeated_p(p: np.ndarray, ns: tuple[int, ...], n_max: int, two_sided: bool) -> np.ndarray:
    """The chance under the null that some look crosses its boundary at the level at which this
    study's looks first cross: the repeated p-value of the looks at ``ns`` pairs, each with a t-test
    p-value in ``p`` (..., looks) (NaN: no test at that look). One look at the full information:
    ``p`` itself (the t-test is exact). Otherwise it is read from :func:`_calibration`'s simulated
    law, at its upper 97.5 % confidence bound (so the simulation's own error errs on the safe
    side), and proportionally below the 100th smallest simulated value."""
    p = np.asarray(p, dtype=float)
    if len(ns) == 1 and ns[0] >= n_max:
        return p[..., 0].copy()
    raw = _raw_repeated_p(p, tuple(ns), int(n_max), two_sided)
    null = _calibration(tuple(ns), int(n_max), two_sided)
    cdf = np.searchsorted(null, raw, side="right") / len(null)
    cdf = np.minimum(1.0, cdf + 1.96 * np.sqrt(cdf * (1 - cdf) / len(null)))
    floor = null[99]
    tail = raw * (100 / len(null) + 1.96 * np.sqrt(100) / len(null)) / floor
    out = np.where(raw < floor, tail, cdf)
    return np.where(np.all(np.isnan(p), axis=-1), np.nan, np.minimum(out, 1.0))


def step_down(q: np.ndarray, comparison: np.ndarray) -> np.ndarray:
    """Holm-Shaffer adjusted p-values of hypotheses with p-values ``q`` (..., H) (NaN: not in the
    family), ``comparison[h]`` naming the comparison each belongs to (at most one true per
    comparison): the i-th smallest is multiplied by the number of comparisons with a hypothesis
    among the i-th and larger, kept monotone, capped at 1."""
    q = np.asarray(q, dtype=float)
    comparison = np.asarray(comparison)
    flat = q.reshape(-1, q.shape[-1])
    out = np.full(flat.shape, np.nan)
    ids = np.unique(comparison)
    onehot = (comparison[:, None] == ids[None, :])          # (H, C)
    for r in range(flat.shape[0]):
        row = flat[r]
        idx = np.flatnonzero(np.isfinite(row))
        if not len(idx):
            continue
        order = idx[np.argsort(row[idx], kind="stable")]
        # comparisons with a hypothesis at position i or later, for each i
        later = np.cumsum(onehot[order][::-1], axis=0)[::-1] > 0
        divisor = later.sum(axis=1)
        out[r, order] = np.minimum(1.0, np.maximum.accumulate(divisor * row[order]))
    return out.reshape(q.shape)


def step_down_fast(q: np.ndarray, comparison: np.ndarray) -> np.ndarray:
    """:func:`step_down` for many studies at once, when every hypothesis of every study is in the
    family (no NaN): vectorised over the leading axis (the simulations' thousands of studies)."""
    q = np.asarray(q, dtype=float)
    order = np.argsort(q, axis=-1, kind="stable")
    sorted_q = np.take_along_axis(q, order, axis=-1)
    ids = np.unique(comparison)
    onehot = (np.asarray(comparison)[:, None] == ids[None, :]).astype(np.int64)   # (H, C)
    counts = onehot[order]                                                         # (N, H, C)
    later = np.cumsum(counts[:, ::-1], axis=1)[:, ::-1] > 0
    divisor = later.sum(axis=2)
    adj = np.minimum(1.0, np.maximum.accumulate(divisor * sorted_q, axis=-1))
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, axis=-1)
    return out


def look_pvalues(d: np.ndarray, margin: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Paired t-test p-values of differences ``d`` (..., n) with ``margin`` δ (...): two-sided p for
    μ = 0, and the one-sided TOST p-values for μ <= −δ and for μ >= δ. NaN with fewer than
    MIN_PAIRS pairs or no spread (no test is meaningful there)."""
    from scipy import stats

    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1) if n > 1 else np.full(mean.shape, np.nan)
    se = sd / np.sqrt(n)
    bad = (n < MIN_PAIRS) | ~(se > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t0 = mean / se
        lo = (mean + margin) / se
        hi = (mean - margin) / se
    df = max(n - 1, 1)
    p_diff = 2 * stats.t.sf(np.abs(t0), df)
    p_lo, p_hi = stats.t.sf(lo, df), stats.t.cdf(hi, df)
    nan = np.nan
    return (np.where(bad, nan, p_diff), np.where(bad, nan, p_lo), np.where(bad, nan, p_hi))


def looks(first: int, batch: int, max_seeds: int) -> list[int]:
    """The numbers of seeds at which a study with added seeds looks: ``first``, then every
    ``batch`` more, and ``max_seeds`` last."""
    out = list(range(min(first, max_seeds), max_seeds, batch))
    return out + [max_seeds] if not out or out[-1] != max_seeds else out


def fixed_seeds_needed(sd: float, diff: float, margin: float, m: int, alpha: float = ALPHA,
                       power: float = 0.8) -> float:
    """About how many paired seeds a fixed design (one look, Bonferroni over ``m`` comparisons)
    needs, at the observed spread ``sd`` and difference ``diff``, to decide with ``power``: the
    fewer of what showing the difference and what showing equivalence take (NaN: neither can,
    e.g. no spread)."""
    from scipy import stats

    if not (np.isfinite(sd) and sd > 0 and np.isfinite(diff)):
        return float("nan")
    a = alpha / max(m, 1)
    n = np.arange(MIN_PAIRS, 10001)
    df = n - 1
    options = []
    if diff != 0:
        reach = (stats.t.ppf(1 - a / 2, df) + stats.t.ppf(power, df)) * sd / np.sqrt(n) <= abs(diff)
        options.append(n[reach][0] if reach.any() else np.inf)
    if np.isfinite(margin) and abs(diff) < margin:
        reach = (stats.t.ppf(1 - a, df) + stats.t.ppf(power, df)) * sd / np.sqrt(n) <= margin - abs(diff)
        options.append(n[reach][0] if reach.any() else np.inf)
    best = min(options) if options else np.inf
    return float(best) if np.isfinite(best) else float("nan")


# -- decisions -------------------------------------------------------------------------------------

UNDECIDED, HIGHER, LOWER, EQUIVALENT = 0, 1, 2, 3
NAMES = {UNDECIDED: "undecided", HIGHER: "higher", LOWER: "lower", EQUIVALENT: "equivalent"}


def decide(diff_mean: np.ndarray, adj_diff: np.ndarray, adj_eq: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """One decision per comparison from its adjusted p-values: a supported difference first (a
    difference smaller than the margin can be both), then equivalence, else undecided."""
    out = np.full(np.shape(diff_mean), UNDECIDED)
    eq = np.nan_to_num(adj_eq, nan=1.0) <= alpha
    diff = np.nan_to_num(adj_diff, nan=1.0) <= alpha
    out = np.where(eq, EQUIVALENT, out)
    return np.where(diff, np.where(np.asarray(diff_mean) > 0, HIGHER, LOWER), out)


# -- simulated studies -------------------------------------------------------------------------------

def simulate(n_studies: int, sd: np.ndarray, margin: np.ndarray, true_diff: np.ndarray, *, first: int = 3,
             batch: int = 2, max_seeds: int = 20, ref_mean: np.ndarray | None = None, relative: np.ndarray | None = None,
             corr: float = 0.5, tails: float | None = None, seed: int = 0, alpha: float = ALPHA
             ) -> tuple[np.ndarray, np.ndarray]:
    """``n_studies`` simulated studies of ``A`` arms against a reference on ``M`` metrics, run with
    the procedure of this module: looks after ``first`` seeds and every ``batch`` more up to
    ``max_seeds``, stopping when every comparison is decided. ``sd`` (M,): seed-to-seed sd of one
    arm's metric; ``corr``: correlation of two arms' values within a seed (the seed's data placement
    and costs are shared); ``true_diff`` (A, M): each arm's true difference from the reference;
    ``margin`` (M,): δ, as a share of the reference arm's observed mean where ``relative`` (M,) is
    true (its true mean: ``ref_mean``); ``tails``: Student-t noise with that many degrees of freedom
    instead of normal. Returns the decisions (studies, A, M) and the seeds each study used."""
    rng = np.random.default_rng(seed)
    sd, margin = np.asarray(sd, float), np.asarray(margin, float)
    true_diff = np.asarray(true_diff, float)
    n_arms, n_metrics = true_diff.shape
    ref_mean = np.zeros(n_metrics) if ref_mean is None else np.asarray(ref_mean, float)
    relative = np.zeros(n_metrics, bool) if relative is None else np.asarray(relative, bool)

    def noise(shape):
        z = rng.standard_t(tails, shape) / np.sqrt(tails / (tails - 2)) if tails else rng.standard_normal(shape)
        return z

    shared = noise((n_studies, 1, max_seeds, n_metrics))
    own = noise((n_studies, n_arms + 1, max_seeds, n_metrics))
    values = sd[None, None, None, :] * (np.sqrt(corr) * shared + np.sqrt(1 - corr) * own)
    values[:, 0] += ref_mean
    values[:, 1:] += (ref_mean[None, :] + true_diff)[None, :, None, :]
    ns = looks(first, batch, max_seeds)
    prepare(tuple(ns), max_seeds)
    comparison = np.tile(np.arange(n_arms * n_metrics), 2)
    p = np.full((3, n_studies, n_arms, n_metrics, len(ns)), np.nan)
    means = np.zeros((n_studies, n_arms, n_metrics, len(ns)))
    for k, n in enumerate(ns):
        d = np.moveaxis(values[:, 1:, :n] - values[:, :1, :n], 2, -1)          # (N, A, M, n)
        delta = np.where(relative, margin * np.abs(values[:, 0, :n].mean(axis=1)), margin)[:, None, :]
        p[..., k] = look_pvalues(d, delta)
        means[..., k] = d.mean(axis=-1)
    decisions = np.zeros((n_studies, n_arms, n_metrics), int)
    used = np.full(n_studies, ns[-1])
    open_ = np.ones(n_studies, bool)
    for k, n in enumerate(ns):
        q_diff = repeated_p(p[0, ..., :k + 1], tuple(ns[:k + 1]), max_seeds, True)
        q_eq = np.maximum(repeated_p(p[1, ..., :k + 1], tuple(ns[:k + 1]), max_seeds, False),
                          repeated_p(p[2, ..., :k + 1], tuple(ns[:k + 1]), max_seeds, False))
        q = np.nan_to_num(np.concatenate([q_diff.reshape(n_studies, -1), q_eq.reshape(n_studies, -1)], axis=1), nan=1.0)
        adj = step_down_fast(q, comparison)
        c = n_arms * n_metrics
        now = decide(means[..., k], adj[:, :c].reshape(n_studies, n_arms, n_metrics),
                     adj[:, c:].reshape(n_studies, n_arms, n_metrics), alpha)
        decisions[open_] = now[open_]
        stop = open_ & (now != UNDECIDED).all(axis=(1, 2))
        used[stop] = n
        open_ &= ~stop
    return decisions, used
