"""The Group-FEL paper's grouping baselines, ported to group formation at the edge (Sec. 6.1,
6.4): CDG (OUEA), KLDG (SHARE) and QCID (Fed-CBS). All form groups of about MinGS clients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from .grouping import (EdgeGrouping, EdgeView, GroupingPolicy, LeftoverRule, _check_common, groupings, resolve_leftover,
                       settle_short_groups)


def _distributions(counts: np.ndarray) -> np.ndarray:
    """Rows normalised to label distributions (an empty row stays all-zero)."""
    totals = counts.sum(axis=-1, keepdims=True)
    return counts / np.where(totals > 0, totals, 1.0)


@groupings.register("cdg")
@dataclass(frozen=True)
class ClusterDistributionGrouping(GroupingPolicy):
    """CDG, OUEA's Alg. 1 ported to groups (Group-FEL Sec. 6.4): k-means on the clients' label
    distributions, then each cluster is dealt round-robin across floor(n/MinGS) groups so that
    every group mixes clusters. Dealing the concatenated clusters in turn gives every group
    floor or ceil of n/(floor(n/MinGS)) clients, never fewer than MinGS, so no leftover arises.

    ``n_clusters`` defaults to MinGS: a group of MinGS then tends to get one client per cluster.

    ``deal = "authors"`` is OUEA as the Group-FEL authors' code runs it (Jiyao17/fl-grouping
    ``utils/fed.py``, ``__CD_grouping``), deterministic: Lloyd's k-means on the raw label counts
    with n // (n // MinGS) clusters, seeded with the edge's first clients, until no centre moves
    (at most 1000 steps); each cluster is then dealt from the first group again, so the first
    groups get more clients. Their loop that removes groups below MinGS skips the group after each
    one it removes, so every other short group stays; the removed ones' clients are left out. A
    cluster's members are dealt in row order (theirs pop a Python set).
    """

    min_group_size: int = 5
    n_clusters: int | None = None
    deal: Literal["cycle", "authors"] = "cycle"

    def __post_init__(self):
        _check_common(self.min_group_size, "merge")
        if self.n_clusters is not None and (not isinstance(self.n_clusters, int) or self.n_clusters < 1):
            raise ValueError(f"n_clusters must be an integer >= 1, got {self.n_clusters!r}")
        if self.deal not in ("cycle", "authors"):
            raise ValueError(f"deal must be 'cycle' or 'authors', got {self.deal!r}")

    def _authors(self, L: np.ndarray) -> EdgeGrouping:
        n = len(L)
        n_groups = max(1, n // self.min_group_size)
        k = self.n_clusters or n // n_groups
        centers = L[:k].copy()
        for _ in range(1000):
            nearest = np.argmin(np.linalg.norm(L[:, None, :] - centers[None], axis=-1), axis=1)
            with np.errstate(invalid="ignore"):   # an empty cluster's centre is NaN, as in theirs
                new = np.stack([L[nearest == c].mean(axis=0) if (nearest == c).any() else np.full(L.shape[1], np.nan)
                                for c in range(k)])
            if np.all(np.linalg.norm(centers - new, axis=1) == 0):
                break
            centers = new
        groups: list[list[int]] = [[] for _ in range(n_groups)]
        for c in range(k):
            for i, client in enumerate(np.flatnonzero(nearest == c)):
                groups[i % n_groups].append(int(client))
        kept = list(groups)
        for g in kept:   # their removal loop, as written: it skips the group after each removal
            if len(g) < self.min_group_size:
                kept.remove(g)
        left_out = sorted(c for g in groups if not any(g is h for h in kept) for c in g)
        return EdgeGrouping([np.array(g, dtype=int) for g in kept if g],   # an empty group trains no one
                            np.array(left_out, dtype=int), len(left_out))

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        if self.deal == "authors":
            return self._authors(np.asarray(view.label_counts, dtype=float))
        P = _distributions(np.asarray(view.label_counts, dtype=float))
        n = len(P)
        n_groups = max(1, n // self.min_group_size)
        k = min(self.n_clusters or self.min_group_size, n)
        from sklearn.cluster import KMeans   # slow to import; only cdg needs it

        km = KMeans(n_clusters=k, n_init=1, random_state=int(rng.integers(2**31)))
        clusters = km.fit_predict(P) if k > 1 else np.zeros(n, dtype=int)
        # Random order inside a cluster (so regrouping deals differently), clusters one after another.
        order = np.lexsort((rng.permutation(n), clusters))
        slot = np.arange(n) % n_groups
        return EdgeGrouping([order[slot == g] for g in range(n_groups)])


def _kl_to(P: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(P_rows ‖ q) with 0·log 0 = 0; labels absent from q are absent from every row too."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(P > 0, P * np.log(P / np.where(q > 0, q, 1.0)), 0.0)
    return terms.sum(axis=-1)


def _kld_uniform(counts: np.ndarray) -> np.ndarray:
    """The Group-FEL authors' divergence of count vectors (last axis) from the uniform label
    distribution: Σ p·log(p / (1/m)) over the labels present, plus 1 per label absent; 0 for an
    empty vector (their ``kld_normal``)."""
    m = counts.shape[-1]
    total = counts.sum(axis=-1, keepdims=True)
    p = counts / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p == 0, 1.0, p * np.log(p / (1 / m)))
    return np.where(total[..., 0] > 0, terms.sum(axis=-1), 0.0)


@groupings.register("kldg")
@dataclass(frozen=True)
class KLDGrouping(GroupingPolicy):
    """KLDG, SHARE's KL-divergence grouping ported to groups (Group-FEL Sec. 6.4): start each
    group from a random client and add, MinGS−1 times, the client minimising
    KL(group label distribution ‖ the edge's label distribution). One step scores every
    candidate at once (vectorised), so a step is O(|K|·|Y|). Ties go to the lowest row index.

    ``assign = "authors"`` is SHARE as the Group-FEL authors' code runs it (Jiyao17/fl-grouping
    ``utils/fed.py``, ``__KLD_grouping``), deterministic: the edge's first n // MinGS clients
    each start a group; then, one client at a time, the (client, group) pair whose placement
    raises the group's divergence from the uniform label distribution least is placed, over every
    remaining pair. Their divergence is KL(p ‖ uniform) over the labels the group holds plus 1 for
    each label it lacks. No group is capped, so sizes are uneven; groups below MinGS go to the
    leftover rule (theirs: ``leftover = "drop"``).
    """

    min_group_size: int = 5
    leftover: LeftoverRule = "merge"
    assign: Literal["fill", "authors"] = "fill"

    def __post_init__(self):
        _check_common(self.min_group_size, self.leftover)
        if self.assign not in ("fill", "authors"):
            raise ValueError(f"assign must be 'fill' or 'authors', got {self.assign!r}")

    def _authors(self, L: np.ndarray) -> EdgeGrouping:
        n_groups = max(1, len(L) // self.min_group_size)
        groups = [[i] for i in range(min(n_groups, len(L)))]
        counts = L[:len(groups)].copy()
        rest = list(range(len(groups), len(L)))
        while rest:
            rise = _kld_uniform(counts[None] + L[rest][:, None]) - _kld_uniform(counts)[None]
            c, g = np.unravel_index(int(np.argmin(rise)), rise.shape)   # ties: first client, then first group
            client = rest.pop(int(c))
            groups[int(g)].append(client)
            counts[int(g)] += L[client]
        return settle_short_groups(groups, self.min_group_size, self.leftover, L)

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        L = np.asarray(view.label_counts, dtype=float)
        if self.assign == "authors":
            return self._authors(L)
        target = _distributions(L.sum(axis=0))
        available = np.ones(len(L), dtype=bool)
        groups: list[list[int]] = []
        while available.sum() >= self.min_group_size:
            first = int(rng.choice(np.flatnonzero(available)))
            available[first] = False
            members, counts = [first], L[first].copy()
            while len(members) < self.min_group_size:
                cand = np.flatnonzero(available)
                c = int(cand[np.argmin(_kl_to(_distributions(counts + L[cand]), target))])
                members.append(c)
                available[c] = False
                counts += L[c]
            groups.append(members)
        return resolve_leftover(groups, list(map(int, np.flatnonzero(available))), self.leftover, L)


def qcid(counts: np.ndarray) -> np.ndarray:
    """Fed-CBS's quadratic class-imbalance degree Σ_j (p_j − 1/m)² of count vectors (last axis)."""
    m = counts.shape[-1]
    return ((_distributions(counts) - 1.0 / m) ** 2).sum(axis=-1)


@groupings.register("qcid")
@dataclass(frozen=True)
class QCIDGrouping(GroupingPolicy):
    """QCID grouping: Fed-CBS's class-imbalance-aware sampling, run per edge to fill groups of
    MinGS one after another (Group-FEL Sec. 6.1 and 6.5).

    Fed-CBS draws the first member of a group with probability
    ∝ 1/QCID(M_k)^β + λ·sqrt(3 ln t / (2 T_k)) and each next member with probability
    ∝ 1/QCID(M_group ∪ M_k)^β. The exploration term counts how often client k was picked (T_k)
    in t selections; in a partition every client is picked exactly once per grouping, so here
    t is the index of the group being formed (1, 2, ...) and T_k = 1 for every candidate still
    free: the term is a uniform floor that grows as the edge runs out of clients, and it is 0
    for the first group. ``exploration`` is λ.

    Fed-CBS draws new clients every round, which is how the Group-FEL paper compares it in
    Fig. 15: configs using this policy should set ``regroup_every = 1``.
    """

    min_group_size: int = 5
    beta: float = 2.0
    exploration: float = 1.0
    leftover: LeftoverRule = "merge"

    def __post_init__(self):
        _check_common(self.min_group_size, self.leftover)
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta!r}")
        if not self.exploration >= 0:
            raise ValueError(f"exploration must be >= 0, got {self.exploration!r}")

    def _draw(self, rng: np.random.Generator, q: np.ndarray, floor: float) -> int:
        """Index drawn ∝ 1/q^β + floor; a perfectly balanced candidate (q = 0) wins outright."""
        perfect = np.flatnonzero(q <= 1e-15)
        if len(perfect):
            return int(rng.choice(perfect))
        w = np.exp(-self.beta * (np.log(q) - np.log(q.min())))  # scaled by q.min()^β: no overflow
        w = w + floor * q.min() ** self.beta
        return int(rng.choice(len(q), p=w / w.sum()))

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        L = np.asarray(view.label_counts, dtype=float)
        available = np.ones(len(L), dtype=bool)
        groups: list[list[int]] = []
        while available.sum() >= self.min_group_size:
            t = len(groups) + 1
            cand = np.flatnonzero(available)
            floor = self.exploration * np.sqrt(3 * np.log(t) / 2)
            first = int(cand[self._draw(rng, qcid(L[cand]), floor)])
            available[first] = False
            members, counts = [first], L[first].copy()
            while len(members) < self.min_group_size:
                cand = np.flatnonzero(available)
                c = int(cand[self._draw(rng, qcid(counts + L[cand]), 0.0)])
                members.append(c)
                available[c] = False
                counts += L[c]
            groups.append(members)
        return resolve_leftover(groups, list(map(int, np.flatnonzero(available))), self.leftover, L)
