"""The schedule of looks and the alpha spent at each: the spending function, the boundaries from
the exact joint normal law of the look statistics, and the level each look's p-value crosses."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import design

# Levels at which the boundaries are tabulated; a repeated p-value is read off between them
# (log-linear interpolation), and clipped to this range.
_LEVELS = np.geomspace(1e-7, 1.0, 101)
_GRID = 101   # points of the continuation region in the recursive integration
_BISECTIONS = 48   # halvings of [0, 40] that find a boundary (to 1e-13)


def spend(level, t, two_sided: bool = False, rho: float | None = None, gamma: float | None = None) -> np.ndarray:
    """The error spent by information fraction ``t``. O'Brien-Fleming type (Lan & DeMets 1983,
    *Biometrika* 70:659; exponent ρ of Liu et al. 2012, *J. Biopharm. Stat.* 22:687, as gsDesign's ``sfLDOF``):
    2 − 2Φ(z_{1−α/2} / t^{ρ/2}) for a one-sided test at level α; a two-sided test spends α/2 on
    each side (the convention of the published tables: 5 equal looks at 5 % give 4.877 … 2.031).
    Its share spent early shrinks with the level, so a family's Holm-divided levels keep their
    power at the last look. Hwang, Shih & DeCani (1990, *Stat. Med.* 9:1439) where ``gamma`` (or
    :data:`~.design.GAMMA`) is a number: α (1 − e^{−γt}) / (1 − e^{−γ}), α t for γ = 0, the same share of
    every level."""
    rho = design.RHO if rho is None else rho
    gamma = design.GAMMA if gamma is None else gamma
    if gamma is not None:
        t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
        share = t if gamma == 0 else -np.expm1(-gamma * t) / -np.expm1(-gamma)
        return np.asarray(level, dtype=float) * share
    if two_sided:
        return 2 * spend(np.asarray(level) / 2, t, rho=rho)
    sp = design.special()
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
    sp = design.special()
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


def looks(first: int, batch: int, max_seeds: int) -> list[int]:
    """The numbers of seeds at which a study with added seeds looks: ``first``, then every
    ``batch`` more, and ``max_seeds`` last."""
    out = list(range(min(first, max_seeds), max_seeds, batch))
    return out + [max_seeds] if not out or out[-1] != max_seeds else out
