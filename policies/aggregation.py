"""Global aggregation rules at the cloud (Alg. 1, Line 15; Eq. 4; Eq. 39).

All three return the weight of each sampled group's model in x_{t+1} = Σ_g w_g x^g, given the
sampled groups' inclusion probabilities π_g (:func:`groupfel.policies.sampling.inclusion_log_probabilities`).
Eq. 4 writes π_g = S·p_g, which is a group's inclusion probability only when S·p_g ≤ 1 for every
group and groups are drawn so that P(g sampled) = S·p_g; the sampler draws exactly π_g =
min(1, c·p_g) (systematic πps), so ``unbiased`` is the Horvitz-Thompson estimator and
E[Σ_sampled w_g x_g] = Σ_g (n_g/n) x_g holds exactly. Weights are built in log space.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.special import logsumexp

from .registry import Registry

aggregations = Registry("aggregation")


class AggregationRule(ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    @abstractmethod
    def weights(self, n_g: np.ndarray, log_pi: np.ndarray, n_total: float) -> np.ndarray:
        """Weights of the S sampled groups, given their sample counts n_g and log inclusion
        probabilities log π_g."""


aggregations.contract = (AggregationRule, "weights", ("n_g", "log_pi", "n_total"))


@aggregations.register("biased")
@dataclass(frozen=True)
class Biased(AggregationRule):
    """Alg. 1 Line 15: w_g = n_g / n_t, n_t the samples of the sampled groups."""

    description: ClassVar[str] = "biased (Alg. 1 Line 15): n_g / n_t"

    def weights(self, n_g, log_pi, n_total):
        n_g = np.asarray(n_g, dtype=float)
        return n_g / n_g.sum()


def _log_unbiased(n_g, log_pi, n_total):
    return -np.asarray(log_pi, dtype=float) + np.log(np.asarray(n_g, dtype=float)) - np.log(n_total)


@aggregations.register("unbiased")
@dataclass(frozen=True)
class Unbiased(AggregationRule):
    """Eq. 4 (Horvitz-Thompson): w_g = (1/π_g)·(n_g/n), n all samples, π_g = S·p_g capped at 1.
    Unbiased, but a rarely drawn group (tiny π_g) gets a huge weight when it is drawn (Sec. 5.3)."""

    description: ClassVar[str] = "unbiased (Eq. 4, Horvitz-Thompson): (1/pi_g) (n_g/n), pi_g = min(1, c p_g), not normalised"

    def weights(self, n_g, log_pi, n_total):
        with np.errstate(over="ignore"):
            return np.exp(_log_unbiased(n_g, log_pi, n_total))


@aggregations.register("stabilized")
@dataclass(frozen=True)
class Stabilized(AggregationRule):
    """Eq. 39: the Eq. 4 weights renormalised to sum to 1 (the Hájek estimator; the authors' code
    calls this "unbiased")."""

    description: ClassVar[str] = "stabilized (Eq. 39): Eq. 4 weights renormalised to sum to 1"

    def weights(self, n_g, log_pi, n_total):
        logw = _log_unbiased(n_g, log_pi, n_total)
        return np.exp(logw - logsumexp(logw))
