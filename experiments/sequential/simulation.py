"""Simulated studies run with the procedure: the noise kinds of seeds and whole studies, every look,
the stopping rule and Holm-Shaffer over the family (the tests' and the benchmark's error rates)."""
from __future__ import annotations

import numpy as np

from . import design
from .decisions import UNDECIDED, decide, futile, keep, step_down_fast
from .looktests import look_pvalues, skewness_rows
from .nulllaw import repeated_p_path
from .spending import looks

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
             alpha: float = design.ALPHA, resamples: int = design.BOOTSTRAP, futility: float | None = None,
             values: np.ndarray | None = None, withhold_skew: float | None = None, decided_at: bool = False) -> tuple:
    """``n_studies`` simulated studies of ``A`` arms against a reference on ``M`` metrics, run with
    the procedure of this module: looks after ``first`` seeds and every ``batch`` more up to
    ``max_seeds``, stopping when every comparison is decided. ``sd`` (M,) or (A + 1, M), the first
    row the reference arm's: seed-to-seed sd of one arm's metric; ``corr``: correlation of two arms'
    values within a seed (the seed's data placement and costs are shared); ``true_diff`` (A, M):
    each arm's true difference from the reference; ``margin`` (M,): δ, as a share of the reference
    arm's observed mean where ``relative`` (M,) is true (its true mean: ``ref_mean``); ``noise``: one
    of :data:`NOISE` (``tails`` = 3: "t3"); ``resamples``: each bootstrap's. Returns the decisions
    (studies, A, M) and the seeds each study used. A look's tests run on the comparisons still open
    (a decided one keeps its last p-values: a little conservative, through the divisor only).
    ``values``: every seed's values, (studies, A + 1, max_seeds, M), the reference arm first, in
    place of simulated ones (another procedure's simulated studies, run through this one).
    ``withhold_skew``: a look makes no decision on a comparison whose differences' sample skewness
    (:func:`~.looktests.skewness`) is this far from 0 or further; it stays open. ``decided_at``: also
    return the seeds after which each comparison was first decided, (studies, A, M), 0 where never
    (an arm whose comparisons are all decided need not run again: its later seeds are never read)."""
    rng = np.random.default_rng(seed)
    futility = design.FUTILITY if futility is None else futility
    margin = np.asarray(margin, float)
    true_diff = np.asarray(true_diff, float)
    n_arms, n_metrics = true_diff.shape
    sd = np.broadcast_to(np.asarray(sd, float), (n_arms + 1, n_metrics))
    ref_mean = np.zeros(n_metrics) if ref_mean is None else np.asarray(ref_mean, float)
    relative = np.zeros(n_metrics, bool) if relative is None else np.asarray(relative, bool)
    kind = "t3" if tails == 3 else noise
    if tails not in (None, 3) or kind not in NOISE:
        raise ValueError(f"simulate: noise is one of {NOISE}")

    if values is None:
        values = simulated_values(rng, n_studies, sd, true_diff, ref_mean, corr, kind, max_seeds)
    ns = tuple(looks(first, batch, max_seeds))
    p = np.full((3, n_studies, n_arms, n_metrics, len(ns)), np.nan)
    comparison = np.tile(np.arange(n_arms * n_metrics), 2)
    c = n_arms * n_metrics
    decisions = np.zeros((n_studies, n_arms, n_metrics), int)
    used = np.full(n_studies, ns[-1])
    open_ = np.ones(n_studies, bool)
    first_decided = np.zeros((n_studies, n_arms, n_metrics), int)
    for k, n in enumerate(ns):
        idx = np.flatnonzero(open_)
        v = values[idx]
        d = np.moveaxis(v[:, 1:, :n] - v[:, :1, :n], 2, -1)                     # (open, A, M, n)
        delta = np.where(relative, margin * np.abs(v[:, 0, :n].mean(axis=1)), margin)[:, None, :]
        # a decided comparison keeps its last p-values (they only fall, and count only through the
        # Holm-Shaffer divisor of the others): testing the open ones alone keeps the bootstrap cheap
        todo = decisions[idx] == UNDECIDED
        if not design.untested(np.array([n]), max_seeds)[0] and todo.any():
            now = np.full((3, *todo.shape), np.nan)
            now[:, todo] = np.stack(look_pvalues(d[todo], np.broadcast_to(delta, todo.shape)[todo],
                                                 resamples=resamples, above=0.2))
            if design.untested(np.array([n]), max_seeds, equivalence=True)[0]:
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
        if withhold_skew is not None:
            now = np.where(np.abs(skewness_rows(d)) >= withhold_skew, UNDECIDED, now)
        first_decided[idx] = np.where((decisions[idx] == UNDECIDED) & (now != UNDECIDED), n, first_decided[idx])
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
    return (decisions, used, first_decided) if decided_at else (decisions, used)

