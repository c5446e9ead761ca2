"""Decisions that hold under repeated looks: group-sequential tests with alpha spending, TOST
equivalence, and Holm's step-down over the family.

A study compares every arm with the reference arm on each headline metric. Each comparison has two
null hypotheses, and at most one of them can be true:

- ``diff``: the mean paired difference is 0 (two-sided; rejected: **higher** or **lower**);
- ``eq``: the difference is at least the metric's margin away from 0, |μ| >= δ (rejected by two
  one-sided tests, TOST, Schuirmann 1987: **equivalent**).

A study that adds seeds looks at its data after every batch, on a schedule planned before its first
look: seeds ``first``, then every ``batch`` more, up to ``max_seeds``. Each hypothesis is tested with
the Lan-DeMets (1983) O'Brien-Fleming-type spending function α(t) = 2 − 2Φ(z_{1−α/2} / √t),
t = pairs / max_seeds; the boundaries come from the exact joint normal law of the look statistics
(recursive integration, Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19) and apply
to each look's paired t-test through its nominal significance level (Jennison & Turnbull 2000, §3.8).
The smallest level at which a look so far crosses its boundary, read through the simulated null law
of the *whole planned schedule* (every look up to max_seeds, whether or not the study gets there),
is the hypothesis's *repeated p-value* (Jennison & Turnbull 2000, §9.1): it never grows from one
look to the next, and the chance under the null that it ever falls to α or below, at any look of the
schedule, is at most α. Holm's step-down over the repeated p-values of a look (Maurer & Bretz 2013,
*Stat. Biopharm. Res.* 5:311: sequentially rejective graphical, here Holm, procedures for
group-sequential designs) controls the family-wise error over all looks; because at most one
hypothesis of a comparison is true, the divisor at each step is the number of comparisons with a
hypothesis still open (Shaffer 1986). A decision once made is kept. A run with a fixed seed list has
one look, at t = 1, where the repeated p-value is the t-test's p.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

ALPHA = 0.05
MIN_PAIRS = 3
# Levels at which the boundaries are tabulated; a repeated p-value is read off between them
# (log-linear interpolation), and clipped to this range.
_LEVELS = np.geomspace(1e-7, 1.0, 101)
_GRID = 101   # points of the continuation region in the recursive integration
_BISECTIONS = 48   # halvings of [0, 40] that find a boundary (to 1e-13)


def _special():
    from scipy import special

    return special


# Spending function: the Lan-DeMets O'Brien-Fleming type generalised by Liu et al. (2012) with
# exponent ρ (1: Lan-DeMets 1983; smaller spends more at early looks), or, where GAMMA is a number,
# the Hwang-Shih-DeCani family (γ = −4 is close to O'Brien-Fleming; larger spends more early).
RHO = 1.0
GAMMA: float | None = None


def spend(level, t, two_sided: bool = False, rho: float | None = None, gamma: float | None = None) -> np.ndarray:
    """The error spent by information fraction ``t``. O'Brien-Fleming type (Lan & DeMets 1983,
    *Biometrika* 70:659; exponent ρ of Liu et al. 2012, *J. Biopharm. Stat.* 22:687, as gsDesign's ``sfLDOF``):
    2 − 2Φ(z_{1−α/2} / t^{ρ/2}) for a one-sided test at level α; a two-sided test spends α/2 on
    each side (the convention of the published tables: 5 equal looks at 5 % give 4.877 … 2.031).
    Its share spent early shrinks with the level, so a family's Holm-divided levels keep their
    power at the last look. Hwang, Shih & DeCani (1990, *Stat. Med.* 9:1439) where ``gamma`` (or
    :data:`GAMMA`) is a number: α (1 − e^{−γt}) / (1 − e^{−γ}), α t for γ = 0, the same share of
    every level."""
    rho = RHO if rho is None else rho
    gamma = GAMMA if gamma is None else gamma
    if gamma is not None:
        t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
        share = t if gamma == 0 else -np.expm1(-gamma * t) / -np.expm1(-gamma)
        return np.asarray(level, dtype=float) * share
    if two_sided:
        return 2 * spend(np.asarray(level) / 2, t, rho=rho)
    sp = _special()
    z = sp.ndtri(1 - np.asarray(level, dtype=float) / 2)
    t = np.clip(np.asarray(t, dtype=float), 1e-12, 1.0)
    return 2 - 2 * sp.ndtr(z / t ** (rho / 2))


def boundaries(ns: tuple[int, ...], n_max: int, level: float, two_sided: bool) -> np.ndarray:
    """Nominal significance level of each look's test (looks at ``ns`` pairs of at most ``n_max``)
    so that the chance of crossing at any look is ``level`` spent by :func:`spend`."""
    return _boundaries(tuple(ns), n_max, np.array([level]), two_sided)[0]


def _boundaries(ns: tuple[int, ...], n_max: int, levels: np.ndarray, two_sided: bool) -> np.ndarray:
    """:func:`boundaries` for many levels at once, (levels, looks): the recursion runs on every
    level's continuation region side by side, and each look's boundary is found by bisection."""
    sp = _special()
    info = np.asarray(ns, dtype=float)
    spent = spend(levels[:, None], info[None, :] / max(n_max, ns[-1]), two_sided)
    inc = np.diff(spent, axis=1, prepend=0.0)
    tails = 2.0 if two_sided else 1.0
    out = np.zeros((len(levels), len(ns)))
    # look 1: the statistic is exactly standard normal
    with np.errstate(divide="ignore"):
        c = np.where(inc[:, 0] > 0, np.maximum(sp.ndtri(1 - inc[:, 0] / tails), 0.0), np.inf)
    out[:, 0] = tails * sp.ndtr(-c)
    x, w = _region(c, info[0], two_sided)
    w = w * np.exp(-x ** 2 / (2 * info[0])) / np.sqrt(2 * np.pi * info[0])
    for k in range(1, len(ns)):
        sd = np.sqrt(info[k] - info[k - 1])
        root = np.sqrt(info[k])

        def exits(c: np.ndarray) -> np.ndarray:
            p = sp.ndtr((x - c[:, None] * root) / sd)
            if two_sided:
                p = p + sp.ndtr((-c[:, None] * root - x) / sd)
            return (w * p).sum(axis=1)

        lo, hi = np.zeros(len(levels)), np.full(len(levels), 40.0)
        never = (inc[:, k] <= 1e-15) | (exits(hi) >= inc[:, k])
        every = exits(lo) <= inc[:, k]    # the level asks for more than is left: every path exits
        for _ in range(_BISECTIONS):
            mid = (lo + hi) / 2
            more = exits(mid) > inc[:, k]
            lo, hi = np.where(more, mid, lo), np.where(more, hi, mid)
        c = np.where(never, np.inf, np.where(every, 0.0, (lo + hi) / 2))
        out[:, k] = tails * sp.ndtr(-c)
        y, v = _region(c, info[k], two_sided)
        step = np.exp(-(y[:, :, None] - x[:, None, :]) ** 2 / (2 * sd ** 2)) / (sd * np.sqrt(2 * np.pi))
        x, w = y, v * np.einsum("lig,lg->li", step, w)
    return out


def _region(c: np.ndarray, info: float, two_sided: bool) -> tuple[np.ndarray, np.ndarray]:
    """Grids and trapezoid weights (levels, points) over each level's continuation region of the
    sum statistic (info = its variance); tails beyond 10 standard deviations carry no mass worth
    integrating."""
    s = np.sqrt(info)
    hi = np.minimum(c, 10.0) * s
    lo = -hi if two_sided else np.full_like(hi, -10.0 * s)
    x = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, _GRID)[None, :]
    w = np.repeat(((hi - lo) / (_GRID - 1))[:, None], _GRID, axis=1)
    w[:, [0, -1]] /= 2
    return x, w


@lru_cache(maxsize=64)
def _table(ns: tuple[int, ...], n_max: int, two_sided: bool) -> np.ndarray:
    """Nominal levels, shape (levels, looks), for every tabulated level. A look's boundary depends
    on the looks before it only, so a schedule's table holds those of its prefixes."""
    return _boundaries(ns, n_max, _LEVELS, two_sided)


def plan(ns: tuple[int, ...], n_max: int, batch: int) -> tuple[int, ...]:
    """The whole schedule of a study that has looked at ``ns`` pairs: those looks, then one every
    ``batch`` more up to ``n_max`` (the looks it would take if it never stopped)."""
    ns = tuple(int(n) for n in ns)
    if ns[-1] >= n_max:
        return ns
    return ns + tuple(range(ns[-1] + batch, n_max, batch)) + (int(n_max),)


def _levels(p: np.ndarray, ns: tuple[int, ...], n_max: int, two_sided: bool) -> np.ndarray:
    """For each look (last axis: the first looks of the schedule ``ns``), the smallest tabulated
    level whose boundary the look's p-value is at or below (1: none). A look's boundary depends on
    the looks before it only, so the first looks of a longer schedule read its table."""
    table = _table(tuple(ns), int(n_max), two_sided)
    out = np.ones(p.shape)
    for k in range(p.shape[-1]):
        nominal = table[:, k]
        ok = nominal > 0
        if ok.sum() < 2:
            continue
        lp = np.log(np.clip(np.nan_to_num(p[..., k], nan=1.0), 1e-300, 1.0))
        # levels below the first positive nominal one cannot reject; above the last, nothing does
        out[..., k] = np.exp(np.interp(lp, np.log(nominal[ok]), np.log(_LEVELS[ok]), left=np.log(_LEVELS[ok][0]),
                                       right=0.0))
    return out


# Paths of the calibration below; its generator's seed is fixed, so every machine computes the
# same decisions from the same data.
_PATHS = 200_000
_CALIBRATION_SEED = 36


def _null_p(ns: tuple[int, ...], two_sided: bool, test: str = "t") -> np.ndarray:
    """The per-look test's p-values at the looks ``ns`` along simulated normal null paths,
    (paths, looks). For the t-test ("t"; the bootstrap-t is read through the t-test's law), each
    look adds a block of seeds whose sum (normal) and sum of squares about its own mean
    (chi-square) are drawn directly, which is exact for normal seeds and needs no memory per seed;
    Hall's statistic ("hall"; "hall-max": each tail the larger of it and the t-test's) also needs
    the block's third moment, so its seeds are drawn one by one."""
    sp = _special()
    rng = np.random.default_rng(_CALIBRATION_SEED)
    total = np.zeros(_PATHS)
    squares = np.zeros(_PATHS)
    cubes = np.zeros(_PATHS)
    out = np.empty((_PATHS, len(ns)))
    before = 0
    for k, n in enumerate(ns):
        size = n - before
        if test in ("hall", "hall-max"):
            x = rng.standard_normal((_PATHS, size))
            total += x.sum(axis=1)
            squares += (x ** 2).sum(axis=1)
            cubes += (x ** 3).sum(axis=1)
        else:
            block = rng.standard_normal(_PATHS) * np.sqrt(size)
            within = rng.chisquare(size - 1, _PATHS) if size > 1 else np.zeros(_PATHS)
            total += block
            squares += within + block ** 2 / size
        before = n
        mean = total / n
        sd = np.sqrt(np.maximum(squares - n * mean ** 2, 0) / (n - 1))
        t = mean / (sd / np.sqrt(n))
        up, down = sp.stdtr(n - 1, -t), sp.stdtr(n - 1, t)
        if test in ("hall", "hall-max") and n >= BOOT_MIN:
            third = cubes / n - 3 * mean * squares / n + 2 * mean ** 3
            h = hall_statistic(mean, sd, _skew(third, sd, n), n)
            hall = sp.stdtr(n - 1, -h), sp.stdtr(n - 1, h)
            up, down = (np.maximum(a, b) for a, b in zip(hall, (up, down))) if test == "hall-max" else hall
        out[:, k] = np.minimum(1.0, 2 * np.minimum(up, down)) if two_sided else up
    return np.where(untested(np.array(ns), ns[-1], equivalence=not two_sided), np.nan, out)


# The per-look test from BOOT_MIN pairs on: "bootstrap", each tail the larger of the t-test's and the
# bootstrap-t's. The others were measured against it (docs/statistics-and-safety.md) and run only in
# benchmarks/sequential.py: "hall", Hall's skewness-corrected t (:func:`hall_statistic`, analytic);
# "hall-max", each tail the larger of the t-test's and Hall's; "hall-boot", a bootstrap of Hall's
# statistic; "hall+bootstrap", each tail the larger of Hall's and the bootstrap-t's.
TEST = "bootstrap"
# The null law a repeated p-value is read through: "own", the per-look test's own on normal seeds
# where it is analytic (Hall's, "hall" and "hall-max"; the t-test's for the bootstrap, which cannot be
# simulated on so many paths), or "t", the t-test's.
CALIBRATION = "own"
# The skewness estimate in Hall's statistic: "m3/s3" (third central moment over s³, s with n − 1)
# or "G1" (the adjusted Fisher-Pearson, as reported).
HALL_SKEW = "m3/s3"


def _skew(third, sd, n):
    """The skewness estimate of :data:`HALL_SKEW` from the third central moment (divisor n) and the
    sd (divisor n − 1); 0 where there is no spread."""
    with np.errstate(divide="ignore", invalid="ignore"):
        g = third / sd ** 3
        if HALL_SKEW == "G1":
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


def untested(pairs, n_max: int, seeds=None, equivalence: bool = False):
    """Which looks of a plan of several looks (with ``pairs``, after ``seeds`` seeds, default as
    many, up to ``n_max``) have no test: those with fewer than :data:`BOOT_MIN` pairs, where only a
    t-test is possible and a skewed law of the differences makes its far tail, the one early
    boundaries read, wrong by orders of magnitude. The last look keeps its t-test, so a plan of
    fewer seeds still decides. ``equivalence``: TOST's looks, tested from :data:`EQ_MIN` pairs."""
    pairs = np.asarray(pairs)
    return (pairs < (EQ_MIN if equivalence else BOOT_MIN)) & (np.asarray(pairs if seeds is None else seeds) < n_max)


def skewness(d) -> float:
    """Sample skewness of paired differences (adjusted Fisher-Pearson G1); NaN with fewer than 3
    or without spread."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < MIN_PAIRS or no_spread(d.std(ddof=1), d.mean()):
        return float("nan")
    c = d - d.mean()
    g1 = (c ** 3).mean() / (c ** 2).mean() ** 1.5
    return float(g1 * np.sqrt(n * (n - 1)) / (n - 2))


@lru_cache(maxsize=64)
def _calibration(ns: tuple[int, ...], n_max: int, two_sided: bool, test: str = "t") -> np.ndarray:
    """The smallest level crossed at any look of the whole schedule ``ns`` under the null, sorted,
    from simulated normal paths. The boundaries are exact for normal statistics; applied to t-tests
    through their nominal levels they cross a few per cent too often at small degrees of freedom
    (Jennison & Turnbull 2000, §3.8), so the repeated p-value is read through this simulated law."""
    return np.sort(_levels(_null_p(ns, two_sided, test), ns, n_max, two_sided).min(axis=-1))


def repeated_p_path(p: np.ndarray, ns: tuple[int, ...], n_max: int, two_sided: bool, batch: int = 2) -> np.ndarray:
    """The repeated p-value after each look, (..., looks): the chance under the null that some look
    of the planned schedule (:func:`plan`: the looks at ``ns`` pairs, then every ``batch`` more up to
    ``n_max``) crosses its boundary at the smallest level this study's looks so far crossed. ``p``:
    each look's p-value (..., looks; NaN: no test at that look; a look of :func:`untested` counts
    as no evidence, and its repeated p-value is 1 where no look before had one). Non-increasing
    along the looks. One look at the full information: ``p`` itself (the t-test is exact). Otherwise read from
    :func:`_calibration`'s simulated law, at its upper 97.5 % confidence bound (so the simulation's
    own error errs on the safe side), and proportionally below the 100th smallest simulated value."""
    p = np.asarray(p, dtype=float)
    ns = tuple(int(n) for n in ns)
    if len(ns) == 1 and ns[0] >= n_max:
        return p.copy()
    full = plan(ns, int(n_max), int(batch))
    before = np.isnan(np.fmin.accumulate(p, axis=-1))       # no look had a test yet
    p = np.where(untested(np.array(ns), int(n_max), equivalence=not two_sided), np.nan, p)   # no evidence yet
    raw = np.minimum.accumulate(_levels(p, full, int(n_max), two_sided), axis=-1)
    law = TEST if CALIBRATION == "own" and TEST in ("hall", "hall-max") else "t"
    null = _calibration(full, int(n_max), two_sided, law)
    cdf = np.searchsorted(null, raw, side="right") / len(null)
    cdf = np.minimum(1.0, cdf + 1.96 * np.sqrt(cdf * (1 - cdf) / len(null)))
    floor = null[99]
    tail = raw * (100 / len(null) + 1.96 * np.sqrt(100) / len(null)) / floor
    out = np.minimum(np.where(raw < floor, tail, cdf), 1.0)
    return np.where(before, np.nan, out)


def repeated_p(p: np.ndarray, ns: tuple[int, ...], n_max: int, two_sided: bool, batch: int = 2) -> np.ndarray:
    """The repeated p-value after the last of the looks at ``ns`` (:func:`repeated_p_path`); NaN
    where no look had a test."""
    return repeated_p_path(p, ns, n_max, two_sided, batch)[..., -1]
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


def look_pvalues(d: np.ndarray, margin: np.ndarray | float, seeds=None, resamples: int | None = None,
                 above: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p-values of paired differences ``d`` (..., n) with ``margin`` δ (...): two-sided p for μ = 0,
    and the one-sided TOST p-values for μ <= −δ and for μ >= δ. From :data:`BOOT_MIN` pairs on, a
    bootstrap-t (:func:`bootstrap_t`, resamples drawn from ``seeds``, the pairs' seed numbers:
    default 0, …, n − 1), which follows a skewed law of the differences; below, the paired
    t-test, which assumes them near normal. NaN with fewer than MIN_PAIRS pairs or no spread
    (:func:`no_spread`: no test is meaningful there). ``above``: rows whose t-test p-values of
    both hypotheses (μ = 0, and TOST's larger) exceed it keep those (smaller, so still above it):
    the simulations need only whether a p-value can reach a boundary at 5 %. :data:`TEST` names
    the test from BOOT_MIN pairs on (others than the default run in the benchmark only)."""
    from scipy import stats

    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1) if n > 1 else np.full(mean.shape, np.nan)
    se = sd / np.sqrt(n)
    bad = (n < MIN_PAIRS) | no_spread(sd, mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        t0 = mean / se
        lo = (mean + margin) / se
        hi = (mean - margin) / se
    df = max(n - 1, 1)
    up, down, p_lo, p_hi = (np.array(np.broadcast_to(x, mean.shape), dtype=float) for x in
                            (stats.t.sf(t0, df), stats.t.cdf(t0, df), stats.t.sf(lo, df), stats.t.cdf(hi, df)))
    if n >= BOOT_MIN and TEST.startswith("hall"):
        g = _skew(((d - mean[..., None]) ** 3).mean(axis=-1), sd, n)
    if n >= BOOT_MIN and TEST in ("hall", "hall-max", "hall+bootstrap"):
        with np.errstate(invalid="ignore"):
            h0, h_lo, h_hi = (hall_statistic(mean, sd, g, n, mu) for mu in (0.0, -np.asarray(margin), margin))
        hall = (stats.t.sf(h0, df), stats.t.cdf(h0, df), stats.t.sf(h_lo, df), stats.t.cdf(h_hi, df))
        if TEST == "hall-max":
            hall = (np.maximum(a, b) for a, b in zip(hall, (up, down, p_lo, p_hi)))
        up, down, p_lo, p_hi = (np.array(np.broadcast_to(x, mean.shape), dtype=float) for x in hall)
    elif n >= BOOT_MIN and TEST == "hall-boot":
        with np.errstate(invalid="ignore"):
            cuts = [np.broadcast_to(hall_statistic(mean, sd, g, n, mu), mean.shape)
                    for mu in (0.0, -np.asarray(margin), margin)]
        b_count = resamples or BOOTSTRAP
        up, down, p_lo, p_hi = (np.array(x, dtype=float) for x in
                                bootstrap_t(d, *cuts, range(n) if seeds is None else seeds, b_count, hall=True))
    if n >= BOOT_MIN and TEST in ("bootstrap", "hall+bootstrap"):
        # each tail: the larger of the t-test's (Hall's, "hall+bootstrap") and the bootstrap-t's
        rows = np.broadcast_to(np.minimum(2 * np.minimum(up, down), np.maximum(p_lo, p_hi)) <= above, mean.shape)
        cuts = (np.broadcast_to(x, mean.shape)[rows] for x in (t0, lo, hi))
        b_count = resamples or BOOTSTRAP
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
    if n < MIN_PAIRS + 1:
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


# A seed at least this many of the others' standard deviations from their mean is named beside a
# decision: with normal differences one seed lies that far in 2.1 % of studies of 20 pairs, 5.2 % of 10.
RARE_Z = 4.0

# Resamples of a look's bootstrap-t: the smallest two-sided p-value it gives is 2 / 10,000, so
# Holm's step-down over up to 250 comparisons can still reach 5 %.
BOOTSTRAP = 9_999
# Pairs from which a look's test is the bootstrap-t: with fewer, the resamples are too few and too
# often constant to tell the statistic's tails (3 pairs have 10 distinct resamples).
BOOT_MIN = 8
# Pairs from which equivalence (TOST) is tested.
EQ_MIN = 8
# Mixed into the seeds of a bootstrap's generator, so that it draws its own stream.
_BOOT_STREAM = 0xB007
_CHUNK = 2048   # rows of differences resampled at once (memory: rows x resamples floats)


def bootstrap_weights(seeds, resamples: int = BOOTSTRAP) -> np.ndarray:
    """How often each pair appears in each resample, (resamples, pairs): multinomial counts from a
    generator seeded by the pairs' seed numbers, so a study's bootstrap is a function of its seeds
    (the same data give the same p-values on every machine and every rerun)."""
    seeds = [int(s) for s in seeds]
    rng = np.random.default_rng([_BOOT_STREAM, len(seeds), *seeds])
    return rng.multinomial(len(seeds), np.full(len(seeds), 1.0 / len(seeds)), size=resamples).astype(float)


def bootstrap_t(d: np.ndarray, t0, t_lo, t_hi, seeds, resamples: int = BOOTSTRAP, hall: bool = False):
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


# A spread below this share of the mean difference is rounding (a constant difference computed
# in floating point), not seed-to-seed variation.
FLAT = 1e-9


def no_spread(sd, mean) -> np.ndarray:
    """Whether paired differences with this ``sd`` and ``mean`` have no spread to test against."""
    sd = np.asarray(sd, dtype=float)
    return ~(sd > FLAT * np.abs(np.asarray(mean, dtype=float)))


def looks(first: int, batch: int, max_seeds: int) -> list[int]:
    """The numbers of seeds at which a study with added seeds looks: ``first``, then every
    ``batch`` more, and ``max_seeds`` last."""
    out = list(range(min(first, max_seeds), max_seeds, batch))
    return out + [max_seeds] if not out or out[-1] != max_seeds else out


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


def fixed_seeds_needed(sd: float, diff: float, margin: float, m: int, alpha: float = ALPHA,
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
        n = np.arange(MIN_PAIRS, cap + 1)
        reach = power_difference(n, sd, diff, a) >= power
        options.append(n[reach][0] if reach.any() else np.inf)
    if np.isfinite(margin) and abs(diff) < margin:
        options.append(_smallest(lambda k: power_equivalence(k, sd, diff, margin, a) >= power, cap))
    best = min(options) if options else np.inf
    return float(best) if np.isfinite(best) else float("nan")


def _smallest(ok, cap: int) -> float:
    """The smallest n in [MIN_PAIRS, cap] with ``ok(n)``, ``ok`` false then true as n grows."""
    lo, hi = MIN_PAIRS, MIN_PAIRS
    while not ok(hi):
        if hi >= cap:
            return np.inf
        lo, hi = hi + 1, min(2 * hi, cap)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return float(hi)


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


def keep(before: np.ndarray, now: np.ndarray) -> np.ndarray:
    """Decisions after a look: each one made at an earlier look is kept, the others are this
    look's. (Repeated p-values never grow, so a look's evidence only adds; a comparison first
    shown equivalent stays equivalent even if a later look also shows a difference inside the
    margin.)"""
    return np.where(before != UNDECIDED, before, now)


# A study stops early, undecided, when every open comparison's predictive power is below this
# (0: never): it is heading nowhere by max_seeds. Non-binding: the boundaries ignore it, and a
# study that stops makes no more decisions, so no error rate can grow. 10 %: chosen on simulated
# studies (benchmarks/sequential.py, generator seed 5) as the largest threshold that costs at most
# 1 point of power at 0.5 paired sd; reported on others.
FUTILITY = 0.1


def predictive_power(mean, sd, n, n_max: int, margin, family, alpha: float = ALPHA):
    """The chance, under a flat prior on the mean paired difference given this look's ``mean``,
    ``sd`` and ``n`` pairs, that a fixed test at ``n_max`` pairs (level α divided by ``family``,
    normal approximation) shows a difference (two-sided) or equivalence within ``margin`` (TOST):
    (power of the difference, power of equivalence). Spiegelhalter, Freedman & Blackburn 1986,
    *Control. Clin. Trials* 7:8."""
    sp = _special()
    mean, sd, margin = (np.asarray(x, dtype=float) for x in (mean, sd, margin))
    n = np.asarray(n, dtype=float)
    tau = np.clip(n / n_max, 1e-9, 1.0)
    a = alpha / np.maximum(np.asarray(family, dtype=float), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = mean / (sd / np.sqrt(n))
        c = sp.ndtri(1 - a / 2)
        rest = np.sqrt(np.maximum(1 - tau, 1e-12))
        diff = sp.ndtr((z - c * np.sqrt(tau)) / rest) + sp.ndtr((-z - c * np.sqrt(tau)) / rest)
        half = margin - sp.ndtri(1 - a) * sd / np.sqrt(n_max)
        sd_f = sd * np.sqrt(np.maximum(n_max - n, 0) / (n_max * n))
        eq = np.where(half > 0, sp.ndtr((half - mean) / sd_f) - sp.ndtr((-half - mean) / sd_f), 0.0)
    ok = np.isfinite(z)
    return np.where(ok, diff, 0.0), np.where(ok & np.isfinite(eq), eq, 0.0)


def futile(mean, sd, n, n_max: int, margin, family, alpha: float = ALPHA, threshold: float | None = None):
    """Whether an open comparison is heading nowhere: from a look with a test (:func:`untested`),
    before ``n_max``, the predictive power (:func:`predictive_power`) of both a difference and
    equivalence is below ``threshold`` (default :data:`FUTILITY`; 0: never)."""
    threshold = FUTILITY if threshold is None else threshold
    n = np.asarray(n)
    if threshold <= 0:
        return np.zeros(np.broadcast(np.asarray(mean), n).shape, bool)
    power_diff, power_eq = predictive_power(mean, sd, n, n_max, margin, family, alpha)
    return (power_diff < threshold) & (power_eq < threshold) & ~untested(n, n_max) & (n < n_max)


# -- simulated studies -------------------------------------------------------------------------------

# Noise of simulated seeds: "normal" and "t3" (Student t, 3 degrees of freedom) in every part of
# every arm's value; the skewed kinds in the compared arms' own noise only (the reference arm's and
# the shared part normal), so that the paired differences are skewed too (the same skewed noise in
# both arms would leave them symmetric).
SKEWED = {"chi2_4": 1.41, "gamma(0.5)": 2.83, "lognormal": 6.18, "bad seeds": -1.78}   # kind: skewness
NOISE = ("normal", "t3", *SKEWED)


def noise_draw(rng: np.random.Generator, kind: str, shape) -> np.ndarray:
    """Standardised noise (mean 0, sd 1) of one of :data:`NOISE`: normal; Student t3; centred
    chi-square with 4 degrees of freedom; gamma with shape 0.5; lognormal(0, 1); normal with a 10 %
    chance of a bad seed 6 sd down (accuracy-like: a rare run that went wrong)."""
    if kind == "t3":
        return rng.standard_t(3.0, shape) / np.sqrt(3.0)
    if kind == "chi2_4":
        return (rng.chisquare(4.0, shape) - 4.0) / np.sqrt(8.0)
    if kind == "gamma(0.5)":
        return (rng.gamma(0.5, 1.0, shape) - 0.5) / np.sqrt(0.5)
    if kind == "lognormal":
        return (rng.lognormal(0.0, 1.0, shape) - np.exp(0.5)) / np.sqrt((np.e - 1) * np.e)
    if kind == "bad seeds":
        return (rng.standard_normal(shape) - 6.0 * (rng.uniform(size=shape) < 0.1) + 0.6) / np.sqrt(1 + 36 * 0.09)
    return rng.standard_normal(shape)


def simulated_values(rng: np.random.Generator, n_studies: int, sd: np.ndarray, true_diff: np.ndarray,
                     ref_mean: np.ndarray, corr: float, kind: str, max_seeds: int) -> np.ndarray:
    """Every seed's metric values of every arm, (studies, A + 1, seeds, M), the reference arm first
    (see :func:`simulate`)."""
    n_arms, n_metrics = true_diff.shape
    skewed = kind in SKEWED
    shared = noise_draw(rng, "normal" if skewed else kind, (n_studies, 1, max_seeds, n_metrics))
    own = noise_draw(rng, "normal" if skewed else kind, (n_studies, n_arms + 1, max_seeds, n_metrics))
    if skewed:
        own[:, 1:] = noise_draw(rng, kind, (n_studies, n_arms, max_seeds, n_metrics))
    values = sd[None, :, None, :] * (np.sqrt(corr) * shared + np.sqrt(1 - corr) * own)
    values[:, 0] += ref_mean
    values[:, 1:] += (ref_mean[None, :] + true_diff)[None, :, None, :]
    return values


def simulate(n_studies: int, sd: np.ndarray, margin: np.ndarray, true_diff: np.ndarray, *, first: int = 3,
             batch: int = 2, max_seeds: int = 20, ref_mean: np.ndarray | None = None, relative: np.ndarray | None = None,
             corr: float = 0.5, tails: float | None = None, noise: str = "normal", seed: int = 0,
             alpha: float = ALPHA, resamples: int = BOOTSTRAP, futility: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n_studies`` simulated studies of ``A`` arms against a reference on ``M`` metrics, run with
    the procedure of this module: looks after ``first`` seeds and every ``batch`` more up to
    ``max_seeds``, stopping when every comparison is decided. ``sd`` (M,) or (A + 1, M), the first
    row the reference arm's: seed-to-seed sd of one arm's metric; ``corr``: correlation of two arms'
    values within a seed (the seed's data placement and costs are shared); ``true_diff`` (A, M):
    each arm's true difference from the reference; ``margin`` (M,): δ, as a share of the reference
    arm's observed mean where ``relative`` (M,) is true (its true mean: ``ref_mean``); ``noise``: one
    of :data:`NOISE` (``tails`` = 3: "t3"); ``resamples``: each bootstrap's. Returns the decisions
    (studies, A, M) and the seeds each study used. A look's tests run on the comparisons still open
    (a decided one keeps its last p-values: a little conservative, through the divisor only)."""
    rng = np.random.default_rng(seed)
    futility = FUTILITY if futility is None else futility
    margin = np.asarray(margin, float)
    true_diff = np.asarray(true_diff, float)
    n_arms, n_metrics = true_diff.shape
    sd = np.broadcast_to(np.asarray(sd, float), (n_arms + 1, n_metrics))
    ref_mean = np.zeros(n_metrics) if ref_mean is None else np.asarray(ref_mean, float)
    relative = np.zeros(n_metrics, bool) if relative is None else np.asarray(relative, bool)
    kind = "t3" if tails == 3 else noise
    if tails not in (None, 3) or kind not in NOISE:
        raise ValueError(f"simulate: noise is one of {NOISE}")

    values = simulated_values(rng, n_studies, sd, true_diff, ref_mean, corr, kind, max_seeds)
    ns = tuple(looks(first, batch, max_seeds))
    p = np.full((3, n_studies, n_arms, n_metrics, len(ns)), np.nan)
    comparison = np.tile(np.arange(n_arms * n_metrics), 2)
    c = n_arms * n_metrics
    decisions = np.zeros((n_studies, n_arms, n_metrics), int)
    used = np.full(n_studies, ns[-1])
    open_ = np.ones(n_studies, bool)
    for k, n in enumerate(ns):
        idx = np.flatnonzero(open_)
        v = values[idx]
        d = np.moveaxis(v[:, 1:, :n] - v[:, :1, :n], 2, -1)                     # (open, A, M, n)
        delta = np.where(relative, margin * np.abs(v[:, 0, :n].mean(axis=1)), margin)[:, None, :]
        # a decided comparison keeps its last p-values (they only fall, and count only through the
        # Holm-Shaffer divisor of the others): testing the open ones alone keeps the bootstrap cheap
        todo = decisions[idx] == UNDECIDED
        if not untested(np.array([n]), max_seeds)[0] and todo.any():
            now = np.full((3, *todo.shape), np.nan)
            now[:, todo] = np.stack(look_pvalues(d[todo], np.broadcast_to(delta, todo.shape)[todo],
                                                 resamples=resamples, above=0.2))
            if untested(np.array([n]), max_seeds, equivalence=True)[0]:
                now[1:] = np.nan
            p[..., k][:, idx] = now
        # the repeated p-values after this look: each depends on the looks up to it only
        q_diff = repeated_p_path(p[0, idx, ..., :k + 1], ns[:k + 1], max_seeds, True, batch)[..., -1]
        q_eq = np.maximum(repeated_p_path(p[1, idx, ..., :k + 1], ns[:k + 1], max_seeds, False, batch),
                          repeated_p_path(p[2, idx, ..., :k + 1], ns[:k + 1], max_seeds, False, batch))[..., -1]
        q = np.nan_to_num(np.concatenate([q_diff.reshape(len(idx), -1), q_eq.reshape(len(idx), -1)], axis=1), nan=1.0)
        adj = step_down_fast(q, comparison)
        now = decide(d.mean(axis=-1), adj[:, :c].reshape(-1, n_arms, n_metrics),
                     adj[:, c:].reshape(-1, n_arms, n_metrics), alpha)
        decisions[idx] = keep(decisions[idx], now)
        stop = (decisions[idx] != UNDECIDED).all(axis=(1, 2))
        if futility > 0:    # every open comparison heading nowhere: the study stops undecided
            undecided = decisions[idx] == UNDECIDED
            family = undecided.sum(axis=(1, 2))[:, None, None]
            nowhere = futile(d.mean(axis=-1), d.std(axis=-1, ddof=1), n, max_seeds,
                             np.broadcast_to(delta, undecided.shape), family, alpha, futility)
            stop |= (nowhere | ~undecided).all(axis=(1, 2))
        used[idx[stop]] = n
        open_[idx[stop]] = False
        if not open_.any():
            break
    return decisions, used
