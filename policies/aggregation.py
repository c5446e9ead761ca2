"""Global aggregation rules at the cloud (Alg. 1, Line 15; Eq. 4; Eq. 39).

All three return the weight of each sampled group's model in x_{t+1} = Σ_g w_g x^g. Weights are
built in log space; the unbiased rule can still overflow when p_g is tiny (Sec. 5.3), which is
reported as non-finite weights for the emulator to stop on.
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
    def weights(self, n_g: np.ndarray, log_p: np.ndarray, n_total: float) -> np.ndarray:
        """Weights of the S sampled groups, given their sample counts n_g and log p_g."""


@aggregations.register("biased")
@dataclass(frozen=True)
class Biased(AggregationRule):
    """Alg. 1 Line 15: w_g = n_g / n_t, n_t the samples of the sampled groups."""

    description: ClassVar[str] = "biased (Alg. 1 Line 15): n_g / n_t"

    def weights(self, n_g, log_p, n_total):
        n_g = np.asarray(n_g, dtype=float)
        return n_g / n_g.sum()


def _log_unbiased(n_g, log_p, n_total):
    S = len(n_g)
    return -np.asarray(log_p, dtype=float) - np.log(S) + np.log(np.asarray(n_g, dtype=float)) - np.log(n_total)


@aggregations.register("unbiased")
@dataclass(frozen=True)
class Unbiased(AggregationRule):
    """Eq. 4: w_g = (1/(p_g·S))·(n_g/n), n all samples. Unbiased in expectation, explosive for tiny p_g."""

    description: ClassVar[str] = "unbiased (Eq. 4): (1/(p_g S)) (n_g/n), not normalised"

    def weights(self, n_g, log_p, n_total):
        with np.errstate(over="ignore"):
            return np.exp(_log_unbiased(n_g, log_p, n_total))


@aggregations.register("stabilized")
@dataclass(frozen=True)
class Stabilized(AggregationRule):
    """Eq. 39: the Eq. 4 weights renormalised to sum to 1 (the authors' code calls this "unbiased")."""

    description: ClassVar[str] = "stabilized (Eq. 39): Eq. 4 weights renormalised to sum to 1"

    def weights(self, n_g, log_p, n_total):
        logw = _log_unbiased(n_g, log_p, n_total)
        return np.exp(logw - logsumexp(logw))
