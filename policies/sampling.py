"""Group sampling at the cloud (Alg. 1, Lines 4 and 6; Group-FEL Sec. 5.1, Eq. 38).

p_g = w(1/CoV(g)) / Σ w(1/CoV(g')) with w(x) = x (RCoV), x² (SRCoV) or e^{x²} (ESRCoV), or
uniform (Random). Everything is computed as log-probabilities: e^{x²} overflows float64 once
x² > 709.8, i.e. for CoV below ≈ 0.0375 (CoV = 0.05 gives e^{400} ≈ 5e173, still finite), while
its logarithm is harmless. A CoV of 0 is floored at
``COV_FLOOR`` so a perfectly balanced group gets (nearly) all the mass instead of a division by
zero.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import logsumexp

from .registry import Registry

COV_FLOOR = 1e-12

samplings = Registry("sampling")


class SamplingPolicy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def log_weights(self, covs: np.ndarray) -> np.ndarray:
        """log w(1/CoV) for each group (any additive constant)."""

    def log_probabilities(self, covs: np.ndarray) -> np.ndarray:
        """log p (Eq. 38), finite for every finite or zero CoV."""
        logw = self.log_weights(np.maximum(np.asarray(covs, dtype=float), COV_FLOOR))
        return logw - logsumexp(logw)


@samplings.register("random")
@dataclass(frozen=True)
class Uniform(SamplingPolicy):
    """Random: every group equally likely."""

    def log_weights(self, covs):
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


def sample_without_replacement(log_p: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` distinct groups, successively in proportion to p (Alg. 1, Line 6).

    Gumbel-top-k: the same distribution as numpy's ``choice(replace=False, p=p)`` but in log
    space, so groups whose p underflows to 0 can still be drawn once the likelier ones are taken.
    """
    if not 1 <= size <= len(log_p):
        raise ValueError(f"cannot sample {size} of {len(log_p)} groups")
    keys = log_p + rng.gumbel(size=len(log_p))
    return np.sort(np.argsort(-keys, kind="stable")[:size])


def groups_per_round(n_groups: int, group_sizes_samples: np.ndarray, *, groups: int | None,
                     data_fraction: float | None) -> int:
    """S: fixed (the paper: 12 of 60) or derived from a fraction of the data (the authors' code):
    the number of average-sized groups that hold ``data_fraction`` of all samples, at least 1."""
    if groups is not None:
        return min(groups, n_groups)
    mean_group = float(np.mean(group_sizes_samples))
    return int(min(n_groups, max(1, round(data_fraction * float(np.sum(group_sizes_samples)) / mean_group))))
