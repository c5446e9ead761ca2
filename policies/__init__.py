"""Pluggable policies: grouping at the edge, sampling and aggregation at the cloud.

Each kind has a registry (``groupings``, ``samplings``, ``aggregations``) mapping the name used
in configs to a dataclass; ``registry.make(name, params)`` validates the parameters. A name that is
not registered resolves as a plug-in (an installed entry point or ``"module:Class"``,
:mod:`groupfel.policies.plugins`).
"""
from importlib import import_module

from .cov import NORMALIZATIONS, cov_of_counts, group_cov
from .grouping import (EdgeGrouping, EdgeView, GroupingPolicy, Layer, enforce_min_size, groupings, resolve_leftover,
                       settle_short_groups)
from . import baselines, clustered, fedcollab, hcct, pergroup  # noqa: F401,E402  (register cdg, kldg, qcid,
#   fedcollab, hcct, hcct-e, local, global, ifca, fedclar, fedcluster, fesem, kmeans)

# Sampling and aggregation (they import scipy) load on first use, so that grouping alone
# (`groupfel group`) starts fast.
_LAZY = {"AggregationRule": "aggregation", "aggregations": "aggregation", "SamplingPolicy": "sampling",
         "groups_per_round": "sampling", "inclusion_log_probabilities": "sampling",
         "sample_without_replacement": "sampling", "sample_successive": "sampling", "samplings": "sampling"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AggregationRule", "aggregations", "NORMALIZATIONS", "cov_of_counts", "group_cov",
           "EdgeGrouping", "EdgeView", "GroupingPolicy", "Layer", "groupings", "resolve_leftover", "enforce_min_size",
           "settle_short_groups", "SamplingPolicy", "groups_per_round", "inclusion_log_probabilities",
           "sample_without_replacement", "sample_successive", "samplings"]
