"""Pluggable policies: grouping at the edge, sampling and aggregation at the cloud.

Each kind has a registry (``groupings``, ``samplings``, ``aggregations``) mapping the name used
in configs to a dataclass; ``registry.make(name, params)`` validates the parameters.
"""
from .aggregation import AggregationRule, aggregations
from .cov import NORMALIZATIONS, cov_of_counts, group_cov
from .grouping import EdgeGrouping, EdgeView, GroupingPolicy, enforce_min_size, groupings, resolve_leftover
from . import baselines, fedcollab, hcct  # noqa: F401,E402  (register cdg, kldg, qcid, fedcollab, hcct, hcct-e)
from .sampling import (SamplingPolicy, groups_per_round, inclusion_log_probabilities, sample_without_replacement,
                       samplings)

__all__ = ["AggregationRule", "aggregations", "NORMALIZATIONS", "cov_of_counts", "group_cov",
           "EdgeGrouping", "EdgeView", "GroupingPolicy", "groupings", "resolve_leftover", "enforce_min_size",
           "SamplingPolicy", "groups_per_round", "inclusion_log_probabilities", "sample_without_replacement",
           "samplings"]
