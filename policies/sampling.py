"""Group sampling at the cloud (Alg. 1, Lines 4 and 6; Group-FEL Sec. 5.1, Eq. 38).

p_g = w(1/CoV(g)) / Σ w(1/CoV(g')) with w(x) = x (RCoV), x² (SRCoV) or e^{x²} (ESRCoV), or
uniform (Random). Everything is computed as log-probabilities: e^{x²} overflows float64 once
x² > 709.8, i.e. for CoV below ≈ 0.0375 (CoV = 0.05 gives e^{400} ≈ 5e173, still finite), while
its logarithm is harmless. A CoV of 0 (a perfectly balanced group) has weight +∞: all the
groups with CoV 0 share the mass equally and nothing is divided by zero. The πps routine works on
the unnormalised log weights and normalises only among the groups it still has to choose between,
so a near-zero CoV's huge weight (1/CoV² = 10²⁰ at CoV 10⁻¹⁰) neither makes tied groups' shares
sum past 1 nor erases the order of the other groups.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .registry import Registry

samplings = Registry("sampling")


class SamplingPolicy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def log_weights(self, covs: np.ndarray) -> np.ndarray:
        """log w(1/CoV) for each group (any additive constant)."""

    def log_masses(self, covs: np.ndarray) -> np.ndarray:
        """log w(1/CoV) of each group, unnormalised, +inf for CoV 0: what the πps routine takes
        (:func:`inclusion_log_probabilities`, :func:`sample_without_replacement`)."""
        covs = np.asarray(covs, dtype=float)
        with np.errstate(divide="ignore"):
            logw = np.asarray(self.log_weights(covs), dtype=float)
        return cov_zero_first(covs, logw)

    def log_probabilities(self, covs: np.ndarray) -> np.ndarray:
        """log p (Eq. 38); exact under ties: groups with CoV 0 share the mass (the rest get
        log p = −∞), and near-tied huge weights normalise after subtracting their maximum."""
        return normalise(self.log_masses(covs))


def cov_zero_first(covs: np.ndarray, logw: np.ndarray) -> np.ndarray:
    """``logw`` with +inf (an infinite weight) for the groups of CoV 0."""
    return np.where(np.asarray(covs) == 0.0, np.inf, logw)


def normalise(logw: np.ndarray) -> np.ndarray:
    """log of w / Σ w for log weights ``logw`` (+inf: an infinite weight; those share the mass).
    Shifted by the maximum first, so weights of 10²⁰ that tie stay exact halves (scipy's
    ``x - logsumexp(x)`` rounds them both to 0)."""
    logw = np.asarray(logw, dtype=float)
    top = np.isposinf(logw)
    if top.any():
        return np.where(top, -np.log(top.sum()), -np.inf)
    z = logw - np.max(logw)
    return z - np.log(np.sum(np.exp(z)))


samplings.contract = (SamplingPolicy, "log_weights", ("covs",))


@samplings.register("random")
@dataclass(frozen=True)
class Uniform(SamplingPolicy):
    """Random: every group equally likely."""

    def log_weights(self, covs):
        return np.zeros(len(covs))

    def log_masses(self, covs):
        return np.zeros(len(covs))


@samplings.register("rcov")
@dataclass(frozen=True)
class RCoV(SamplingPolicy):
    """RCoV: w(x) = x, x = 1/CoV (Eq. 38)."""

    def log_weights(self, covs):
        return -np.log(covs)


@samplings.register("srcov")
@dataclass(frozen=True)
class SRCoV(SamplingPolicy):
    """SRCoV: w(x) = x², x = 1/CoV (Eq. 38)."""

    def log_weights(self, covs):
        return -2.0 * np.log(covs)


@samplings.register("esrcov")
@dataclass(frozen=True)
class ESRCoV(SamplingPolicy):
    """ESRCoV: w(x) = e^{x²}, x = 1/CoV (Eq. 38); log w = 1/CoV², a softmax of x²."""

    def log_weights(self, covs):
        return 1.0 / np.square(covs)


def inclusion_log_probabilities(log_p: np.ndarray, size: int) -> np.ndarray:
    """log π_g, each group's probability of being among the ``size`` sampled (Alg. 1, Line 6).

    π_g = min(1, c·p_g) with c such that Σ π_g = size: a group with S·p_g ≥ 1 is taken with
    certainty (π = 1) and the rest share the remaining draws in proportion to p, repeated until
    no share exceeds 1. Without certainty groups π_g = S·p_g, the factor in Eq. 4. In log space,
    so ESRCoV's skewed p (log p down to −10⁴) stay exact. ``log_p`` may be unnormalised log
    weights (:meth:`SamplingPolicy.log_masses`); +inf weights (CoV 0) form a top tier: all
    certain if they fit in ``size``, else they share the draws equally and the rest get none.
    """
    log_p = np.asarray(log_p, dtype=float)
    if not 1 <= size <= len(log_p):
        raise ValueError(f"cannot sample {size} of {len(log_p)} groups")
    if np.isnan(log_p).any() or np.isneginf(log_p).all():
        raise ValueError("sampling weights must be numbers, not all zero")
    certain = np.zeros(len(log_p), dtype=bool)
    while True:
        rest = np.flatnonzero(~certain)
        left = size - int(certain.sum())
        log_pi = np.zeros(len(log_p))
        if left == 0:
            log_pi[rest] = -np.inf
            return log_pi
        if np.isneginf(log_p[rest]).all():   # only weightless groups left: share the draws
            log_pi[rest] = np.log(left / len(rest))
            return log_pi
        log_pi[rest] = normalise(log_p[rest]) + np.log(left)
        over = rest[log_pi[rest] >= 0.0]
        if not len(over):
            return log_pi
        if len(over) >= left:   # ties at π = 1 (or rounding just above it): the largest fill the draws
            certain[over[np.argsort(-log_pi[over], kind="stable")[:left]]] = True
            continue
        certain[over] = True


def sample_without_replacement(log_p: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` distinct groups, group g with probability exactly π_g (Alg. 1, Line 6).

    Randomised systematic πps sampling (Madow 1949; Hartley & Rao 1962): certainty groups are
    taken, the others are put in a random order and laid end to end as intervals of length π_g,
    and the points u, u+1, ... (u uniform in [0, 1)) pick the groups whose intervals they hit.
    Each π_g < 1, so no group is hit twice and P(g sampled) = π_g exactly, which makes Eq. 4
    with π_g in place of S·p_g unbiased (Horvitz-Thompson; :mod:`groupfel.policies.aggregation`).
    Successive sampling (draw, remove, renormalise) has inclusion probabilities that are not
    S·p_g and have no closed form; Sampford's method is exact too but rejects almost every
    attempt when some π_g is close to 1, which ESRCoV's skew produces; conditional Poisson
    sampling needs an iterative fit. A group whose π_g is below ~1e-16 of the others' total
    (e.g. ESRCoV's e^{-400}) is never drawn, an error in π of at most that size.
    """
    log_pi = inclusion_log_probabilities(log_p, size)
    certain = np.flatnonzero(log_pi >= 0.0)
    rest = np.flatnonzero(np.isfinite(log_pi) & (log_pi < 0.0))   # π = 0 groups can never be hit
    left = size - len(certain)
    if left == 0:
        return np.sort(certain)
    order = rest[rng.permutation(len(rest))]
    u = rng.uniform()
    ends = np.cumsum(np.exp(log_pi[order]))
    ends *= left / ends[-1]
    ends[-1] = left
    hit = np.minimum(np.searchsorted(ends, u + np.arange(left), side="right"), len(order) - 1)
    return np.sort(np.concatenate([certain, order[hit]]))


def sample_successive(log_p: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` distinct groups one at a time, each with probability p_g renormalised over
    the groups not yet drawn: numpy's ``choice(n, size, p=p, replace=False)``, which the Group-FEL
    authors' code calls (``GFL.sample`` in Jiyao17/fl-grouping ``utils/fed.py``).

    A group's inclusion probability is then not π_g (:func:`inclusion_log_probabilities`): under
    skewed p it is lower for the likeliest groups and higher for the rest, so Eq. 4's 1/π_g
    weights are biased on these draws. Exact by the Gumbel-top-k identity (the ``size`` largest of
    log p_g + Gumbel noise are a successive sample), so ESRCoV's log p down to −10⁴ need no
    exponentiation. Groups of infinite weight (CoV 0) come first, in random order; groups of zero
    weight come last, uniformly, and only when the others are exhausted.
    """
    log_p = np.asarray(log_p, dtype=float)
    if not 1 <= size <= len(log_p):
        raise ValueError(f"cannot sample {size} of {len(log_p)} groups")
    if np.isnan(log_p).any() or np.isneginf(log_p).all():
        raise ValueError("sampling weights must be numbers, not all zero")
    noise = rng.gumbel(size=len(log_p))
    tier = np.where(np.isposinf(log_p), 2, np.where(np.isneginf(log_p), 0, 1))
    key = np.where(tier == 1, log_p + noise, noise)
    return np.sort(np.lexsort((-key, -tier))[:size])


def groups_per_round(n_groups: int, group_sizes_samples: np.ndarray, *, groups: int | None,
                     data_fraction: float | None, total_samples: float | None = None) -> int:
    """S: fixed (the paper: 12 of 60) or derived from a fraction of the data (the authors' code):
    the number of average-sized groups that hold ``data_fraction`` of the groups' samples, or of
    ``total_samples`` (every client's, as the authors' code counts them), at least 1."""
    if groups is not None:
        return min(groups, n_groups)
    mean_group = float(np.mean(group_sizes_samples))
    total = float(np.sum(group_sizes_samples)) if total_samples is None else total_samples
    return int(min(n_groups, max(1, round(data_fraction * total / mean_group))))
