"""The simulated null law of a whole planned schedule, and the repeated p-values read through it."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import design
from .looktests import _skew, hall_statistic
from .spending import _levels, plan

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
    sp = design.special()
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
        if test in ("hall", "hall-max") and n >= design.BOOT_MIN:
            third = cubes / n - 3 * mean * squares / n + 2 * mean ** 3
            h = hall_statistic(mean, sd, _skew(third, sd, n), n)
            hall = sp.stdtr(n - 1, -h), sp.stdtr(n - 1, h)
            up, down = (np.maximum(a, b) for a, b in zip(hall, (up, down))) if test == "hall-max" else hall
        out[:, k] = np.minimum(1.0, 2 * np.minimum(up, down)) if two_sided else up
    return np.where(design.untested(np.array(ns), ns[-1], equivalence=not two_sided), np.nan, out)


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
    p = np.where(design.untested(np.array(ns), int(n_max), equivalence=not two_sided), np.nan, p)   # no evidence yet
    raw = np.minimum.accumulate(_levels(p, full, int(n_max), two_sided), axis=-1)
    law = design.TEST if design.CALIBRATION == "own" and design.TEST in ("hall", "hall-max") else "t"
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
