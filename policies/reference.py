"""Straightforward reference implementations, kept for tests and the benchmark.

:func:`covg_reference` is Group-FEL Alg. 2 as printed: every greedy step (Line 5) recomputes the
CoV (Eq. 31) of ``group ∪ {c}`` from scratch for each candidate ``c``, so it costs
O(|K|³·|Y|). :class:`groupfel.policies.grouping.CoVGrouping` must produce the same groups for the same
random generator; only its speed differs.
"""
from __future__ import annotations

import numpy as np

from .cov import group_cov
from .grouping import CoVGrouping, EdgeGrouping, EdgeView, settle_short_groups


def _open(policy: CoVGrouping, cov: float) -> bool:
    """Whether a group of CoV ``cov`` goes on growing past MinGS: above MaxCoV (Alg. 2), or at it
    too (the authors' code)."""
    return cov > policy.max_cov if policy.grow == "alg2" else cov >= policy.max_cov


def covg_reference(policy: CoVGrouping, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
    """Group-FEL Alg. 2, literally (one CoV call per candidate per step); with
    ``policy.grow == "authors"`` a group takes a client only when it lowers the CoV."""
    L = np.asarray(view.label_counts, dtype=float)
    norm = policy.normalization
    available = np.ones(len(L), dtype=bool)  # same draw sequence as the fast version
    fill = policy.grow == "alg2"   # a group below MinGS takes a client that raises its CoV
    groups: list[list[int]] = []
    while available.any():
        first = int(rng.choice(np.flatnonzero(available)))               # Line 3
        available[first] = False
        members = [first]
        current = group_cov(L, members, norm)
        while (_open(policy, current) or len(members) < policy.min_group_size) and available.any():
            best, best_cov = -1, np.inf
            for c in np.flatnonzero(available):                           # Lines 4-5
                cov = group_cov(L, members + [int(c)], norm)
                if cov < best_cov:  # strict: ties go to the lowest row index
                    best, best_cov = int(c), cov
            if best < 0 and fill:  # every candidate leaves the group empty (CoV = inf): take the first
                best, best_cov = int(np.flatnonzero(available)[0]), np.inf
            if best_cov < current or (fill and len(members) < policy.min_group_size):  # Line 6
                members.append(best)                                      # Line 7
                available[best] = False
                current = best_cov
            else:
                break                                                     # Line 9
        groups.append(members)                                            # Line 10
    return settle_short_groups(groups, policy.min_group_size, policy.leftover, L, norm)
