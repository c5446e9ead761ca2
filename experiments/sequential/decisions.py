"""Decisions from repeated p-values: Holm-Shaffer's step-down over the family, a decision per
comparison kept once made, and the non-binding futility stop."""
from __future__ import annotations

import numpy as np

from . import design

UNDECIDED, HIGHER, LOWER, EQUIVALENT = 0, 1, 2, 3
NAMES = {UNDECIDED: "undecided", HIGHER: "higher", LOWER: "lower", EQUIVALENT: "equivalent"}


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


def decide(diff_mean: np.ndarray, adj_diff: np.ndarray, adj_eq: np.ndarray, alpha: float = design.ALPHA) -> np.ndarray:
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


def predictive_power(mean, sd, n, n_max: int, margin, family, alpha: float = design.ALPHA):
    """The chance, under a flat prior on the mean paired difference given this look's ``mean``,
    ``sd`` and ``n`` pairs, that a fixed test at ``n_max`` pairs (level α divided by ``family``,
    normal approximation) shows a difference (two-sided) or equivalence within ``margin`` (TOST):
    (power of the difference, power of equivalence). Spiegelhalter, Freedman & Blackburn 1986,
    *Control. Clin. Trials* 7:8."""
    sp = design.special()
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


def futile(mean, sd, n, n_max: int, margin, family, alpha: float = design.ALPHA, threshold: float | None = None):
    """Whether an open comparison is heading nowhere: from a look with a test (:func:`untested`),
    before ``n_max``, the predictive power (:func:`predictive_power`) of both a difference and
    equivalence is below ``threshold`` (default :data:`~.design.FUTILITY`; 0: never)."""
    threshold = design.FUTILITY if threshold is None else threshold
    n = np.asarray(n)
    if threshold <= 0:
        return np.zeros(np.broadcast(np.asarray(mean), n).shape, bool)
    power_diff, power_eq = predictive_power(mean, sd, n, n_max, margin, family, alpha)
    return (power_diff < threshold) & (power_eq < threshold) & ~design.untested(n, n_max) & (n < n_max)
