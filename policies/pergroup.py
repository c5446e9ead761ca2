"""Grouping baselines of per-group (cross-silo) training: ``local``, ``global``, ``ifca`` and
``fedclar`` (HCCT Sec. 7.1, FedCollab Sec. 5.3, Group-FEL Sec. 7).

``local`` and ``global`` are fixed partitions. ``ifca`` and ``fedclar`` change membership while
training, from the models (the per-group round strategy, :mod:`groupfel.emulator.rounds`, calls
:meth:`Ifca.assign` every round and :meth:`FedClar.cluster` at ``cluster_round``); their
:meth:`group` gives the partition training starts from. ``modes`` names the run modes a policy
makes sense in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from .grouping import EdgeGrouping, EdgeView, GroupingPolicy, RandomGrouping, groupings

BOTH = ("global", "per-group")
MergeRule = Literal["average-linkage", "authors"]
MERGE_RULES = ("average-linkage", "authors")
ClusterStart = Literal["current", "probed"]
CLUSTER_STARTS = ("current", "probed")
CLUSTER_INITS = ("random", "shared")


@groupings.register("local")
@dataclass(frozen=True)
class LocalGrouping(GroupingPolicy):
    """Every client alone: independent (local) training, HCCT's "Independent"."""

    min_group_size: int = 1
    modes: ClassVar[tuple[str, ...]] = BOTH

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        return EdgeGrouping([np.array([i]) for i in range(view.n_clients)])


@groupings.register("global")
@dataclass(frozen=True)
class GlobalGrouping(GroupingPolicy):
    """One group of all of an edge's clients (with one edge: every client, HCCT's "Global")."""

    min_group_size: int = 1
    modes: ClassVar[tuple[str, ...]] = BOTH

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        return EdgeGrouping([np.arange(view.n_clients)])


@groupings.register("ifca")
@dataclass(frozen=True)
class Ifca(GroupingPolicy):
    """IFCA (Ghosh et al. 2020, as HCCT and FedCollab run it): ``n_clusters`` cluster models per
    edge, each from its own random initialisation; every round each client joins the cluster
    whose model has the lowest loss on its training data, then each cluster trains its model with
    its members. Per-group mode only: there is no single model to aggregate. ``min_group_size``
    is accepted like every policy's but has no effect: clusters are as large as the losses make
    them.

    ``init``: ``"random"`` (default; paper: Ghosh et al. initialise each cluster model on its
    own) or ``"shared"`` (code: the HCCT authors start every cluster model from the one initial
    model, so the first choices tie and go to cluster 0; HCCT notes that "all clients may find
    the same model appealing")."""

    n_clusters: int = 5
    min_group_size: int = 1
    init: str = "random"
    modes: ClassVar[tuple[str, ...]] = ("per-group",)
    regroup: ClassVar[str] = "every-round"

    def __post_init__(self):
        if not isinstance(self.n_clusters, int) or self.n_clusters < 1:
            raise ValueError(f"n_clusters must be an integer >= 1, got {self.n_clusters!r}")
        if self.init not in CLUSTER_INITS:
            raise ValueError(f"init must be one of {', '.join(CLUSTER_INITS)} (\"shared\": every cluster model from "
                             f"the one initial model, the HCCT authors' code), got {self.init!r}")

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        """Before any model exists: clients dealt at random over the clusters."""
        slots = rng.permutation(view.n_clients) % self.n_clusters
        return EdgeGrouping([np.flatnonzero(slots == k) for k in range(self.n_clusters) if (slots == k).any()])

    @staticmethod
    def assign(losses: np.ndarray) -> np.ndarray:
        """Clients × clusters losses -> each client's cluster (lowest loss; ties to the lowest index)."""
        return np.argmin(losses, axis=1)


@groupings.register("fedclar")
@dataclass(frozen=True)
class FedClar(GroupingPolicy):
    """FedCLAR (Presotto et al. 2022), the Group-FEL paper's personalised baseline: random groups
    of ``min_group_size`` (RG) until ``cluster_round``; then each client's update (its model
    after one local epoch minus the model it started from) is clustered by average-linkage
    hierarchical clustering on cosine distance, cut at ``threshold``, and every cluster becomes a
    group that keeps and trains its own model (starting from its members' sample-weighted mean
    model; in global mode, from the global model, the clusters being the groups Group-FEL samples
    from afterwards and the evaluated global model the clusters' sample-weighted mean, see
    :mod:`groupfel.emulator.membership`).

    ``merge = "authors"`` clusters as the Group-FEL authors' code does (Jiyao17/fl-grouping
    ``utils/fedclar.py``, ``__FedCLAR_clustering``) instead: on each client's model after the
    probe (not its update), the last layer's weight and bias only, in float32; every client starts
    as a cluster, and the pair of clusters whose models' cosine similarity is highest merges (the
    merged model the members-weighted mean of the two) while that similarity is at least
    ``similarity`` and the largest cluster holds at most 2·``min_group_size`` clients, checked
    before each merge (so the last merge may pass it); an undefined similarity (a zero layer) stops
    the merging, as NaN does theirs; clients never merged are left out of training. Their code
    raises where a single client or everything remains one cluster; ours leaves the single
    client out and keeps the one cluster. ``probe_epochs`` sets the probe's length (theirs: K·E);
    ``cluster_start = "probed"`` starts each cluster from its members' mean probed model, the model
    their pairwise member-weighted merges give."""

    min_group_size: int = 5
    cluster_round: int = 10
    threshold: float = 0.5
    merge: MergeRule = "average-linkage"
    similarity: float = 0.995
    probe_epochs: int = 1
    cluster_start: ClusterStart = "current"
    modes: ClassVar[tuple[str, ...]] = BOTH
    regroup: ClassVar[str] = "cluster"

    def __post_init__(self):
        RandomGrouping(self.min_group_size)   # validates min_group_size
        if not isinstance(self.cluster_round, int) or self.cluster_round < 0:
            raise ValueError(f"cluster_round must be an integer >= 0, got {self.cluster_round!r}")
        if not 0 < self.threshold <= 2:
            raise ValueError(f"threshold must be a cosine distance in (0, 2], got {self.threshold!r}")
        if self.merge not in MERGE_RULES:
            raise ValueError(f"merge must be one of {', '.join(MERGE_RULES)}, got {self.merge!r}")
        if not -1 <= self.similarity <= 1:
            raise ValueError(f"similarity must be a cosine similarity in [-1, 1], got {self.similarity!r}")
        if self.cluster_start not in CLUSTER_STARTS:
            raise ValueError(f"cluster_start must be one of {', '.join(CLUSTER_STARTS)}, got {self.cluster_start!r}")
        if not isinstance(self.probe_epochs, int) or self.probe_epochs < 1:
            raise ValueError(f"probe_epochs must be an integer >= 1, got {self.probe_epochs!r}")

    @property
    def cluster_input(self) -> str:
        return "last-layer" if self.merge == "authors" else "updates"

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        return RandomGrouping(self.min_group_size).group(view, rng)

    def cluster(self, updates: np.ndarray) -> list[np.ndarray]:
        """Rows of ``updates`` (one edge's clients; with ``merge = "authors"`` their models' last
        layers) -> clusters of row indices, largest first (the authors' rule: in merge order)."""
        if self.merge == "authors":
            return self._merge_as_authors(np.asarray(updates))
        if len(updates) < 2:
            return [np.arange(len(updates))]
        from scipy.cluster.hierarchy import fcluster, linkage   # scipy stays out of `groupfel group`'s start-up

        z = linkage(updates, method="average", metric="cosine")
        labels = fcluster(z, t=self.threshold, criterion="distance")
        out = [np.flatnonzero(labels == k) for k in np.unique(labels)]
        return sorted(out, key=lambda c: (-len(c), c[0]))

    def _merge_as_authors(self, layers: np.ndarray) -> list[np.ndarray]:
        models = list(np.asarray(layers, dtype=np.float32))   # their state dicts' precision
        clusters: list[list[int]] = [[i] for i in range(len(models))]
        norms = [np.linalg.norm(m) for m in models]

        def similarity(a: int, b: int) -> float:
            # each entry as their _sim_mat computes it (np.dot over the norms' product, in float32),
            # so that near-ties break as theirs do; the pairs a merge leaves alone keep their value
            with np.errstate(invalid="ignore", divide="ignore"):
                return float(np.dot(models[a], models[b]) / (norms[a] * norms[b]))

        sim = np.array([[similarity(a, b) for b in range(len(models))] for a in range(len(models))])
        while len(clusters) >= 2:
            np.fill_diagonal(sim, -1.0)
            # numpy's argmax returns the first maximum in row order, or the first NaN (which then
            # fails the threshold): as theirs
            i, j = divmod(int(np.argmax(sim)), len(clusters))
            if not (sim[i, j] >= self.similarity and max(map(len, clusters)) <= 2 * self.min_group_size):
                break
            i, j = min(i, j), max(i, j)
            a, b = clusters.pop(i), clusters.pop(j - 1)
            ma, mb = models.pop(i), models.pop(j - 1)
            del norms[j], norms[i]
            models.append(ma * np.float32(len(a) / (len(a) + len(b))) + mb * np.float32(len(b) / (len(a) + len(b))))
            norms.append(np.linalg.norm(models[-1]))
            clusters.append(a + b)
            keep = [k for k in range(len(sim)) if k not in (i, j)]
            new = [similarity(len(models) - 1, k) for k in range(len(models))]
            sim = np.block([[sim[np.ix_(keep, keep)], np.array(new[:-1])[:, None]], [np.array(new)[None, :]]])
        return [np.array(c) for c in clusters if len(c) > 1]
