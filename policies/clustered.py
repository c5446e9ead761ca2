"""Clustered-FL baselines of FedCollab's Table 2 (FedCollab Sec. 5.3): ``fedcluster`` (CFL),
``fesem`` and ``kmeans``, beside ``ifca`` (:mod:`groupfel.policies.pergroup`) and ``fedcollab``.

Each is a grouping policy that declares how membership changes (``regroup``) and gives the hook
the per-group round strategy (:mod:`groupfel.emulator.rounds`) calls; the loop knows none of them by name.

* ``fedcluster`` (Sattler et al. 2021, "Clustered federated learning", Alg. 1): one cluster to
  start; after every round a cluster whose clients' updates are near a stationary point of their
  joint objective but not of each client's (Sattler Eqs. 29-30: the sample-weighted mean update's
  norm below ``eps1``, the largest single update's norm above ``eps2``) is bipartitioned so that
  the largest cosine similarity across the two parts is small (Sattler Eq. 31: single linkage
  finds its exact minimum; complete linkage, the authors' code's default here, approximates it).
  Regroup kind ``"split"``: during FL.
* ``fesem`` (Long et al. 2022, "Multi-center federated learning", FeSEM): ``n_clusters`` centre
  models; every round each client joins the centre nearest (L2) to its local model (E-step) and
  each centre becomes the average of its members' trained models (M-step). Regroup kind
  ``"nearest"``: during FL.
* ``kmeans`` (Ghosh et al. 2019, "Robust federated learning in a heterogeneous environment"):
  every client trains ``local_epochs`` epochs alone from the initial model, the edge runs k-means
  on the local models' parameters, and each cluster then trains its own model. Regroup kind
  ``"cluster"`` at round 0: before FL.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .grouping import EdgeGrouping, EdgeView, GroupingPolicy, groupings

PER_GROUP = ("per-group",)
LINKAGES = ("complete", "single")


def _one_group(view: EdgeView) -> EdgeGrouping:
    return EdgeGrouping([np.arange(view.n_clients)])


def _check_int(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@groupings.register("fedcluster")
@dataclass(frozen=True)
class FedCluster(GroupingPolicy):
    """CFL (Sattler et al. 2021), FedCollab's "FedCluster": recursive bipartition of a cluster by
    the cosine similarity of its clients' updates, during FL.

    After every round, each cluster whose members all trained in it is tested with the round's
    updates Δθ_i (trained − start model, what the clients uploaded; nothing extra is computed or
    charged): it splits when ‖Σ_i (n_i/n_c) Δθ_i‖ < ``eps1`` and max_i ‖Δθ_i‖ > ``eps2``
    (Sattler Eqs. 29-30; the sample weights are the paper's, the authors' code averages without
    them). The split (:meth:`split`) is a two-cluster cut of agglomerative clustering on the
    cosine distances (:func:`bipartition`), with ``linkage``: ``"complete"`` (default; code:
    Sattler's public code), which does not always reach Eq. 31's minimum of the largest
    cross-part cosine similarity, or ``"single"`` (paper: Eq. 31 exactly). Both parts start from the cluster's model (the authors aggregate the
    round's updates inside the new parts; we split after aggregating, one round's update apart).
    A split that would leave a part smaller than ``min_group_size`` is not made.

    ``eps1`` and ``eps2`` are in the units of the model's parameters; the defaults are the
    authors' code's (MNIST example, EPS_1 = 0.4, EPS_2 = 1.6), not tuned here.
    """

    eps1: float = 0.4
    eps2: float = 1.6
    min_group_size: int = 1
    linkage: str = "complete"
    modes: ClassVar[tuple[str, ...]] = PER_GROUP
    regroup: ClassVar[str] = "split"

    def __post_init__(self):
        _check_int("min_group_size", self.min_group_size, 1)
        if self.linkage not in LINKAGES:
            raise ValueError(f"linkage must be one of {', '.join(LINKAGES)} (\"single\": Sattler Eq. 31 exactly; "
                             f"\"complete\": the authors' code), got {self.linkage!r}")
        if not self.eps1 >= 0 or not self.eps2 >= 0:
            raise ValueError(f"eps1 and eps2 must be update norms >= 0, got {self.eps1!r}, {self.eps2!r}")

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        """CFL starts from one cluster of every client (of the edge)."""
        return _one_group(view)

    def split(self, updates: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
        """One cluster's clients' updates (rows) and sample counts -> its parts (row indices):
        the cluster itself, or its bipartition (Sattler Eqs. 29-31)."""
        updates = np.asarray(updates, dtype=np.float64)
        n = len(updates)
        whole = [np.arange(n)]
        if n < max(2, 2 * self.min_group_size):
            return whole
        w = np.asarray(sizes, dtype=np.float64)
        mean_norm = float(np.linalg.norm((w / w.sum()) @ updates))                 # Eq. 29
        max_norm = float(np.linalg.norm(updates, axis=1).max())                    # Eq. 30
        if not (mean_norm < self.eps1 and max_norm > self.eps2):
            return whole
        parts = bipartition(updates, self.linkage)
        if min(len(p) for p in parts) < self.min_group_size:
            return whole
        return parts


def cosine_similarity(updates: np.ndarray) -> np.ndarray:
    """α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖ ‖Δθ_j‖) (Sattler Eq. 24); a zero update is similar to nothing."""
    norms = np.linalg.norm(updates, axis=1)
    unit = updates / np.where(norms > 0, norms, 1.0)[:, None]
    return np.clip(unit @ unit.T, -1.0, 1.0)


def bipartition(updates: np.ndarray, linkage: str = "complete") -> list[np.ndarray]:
    """Sattler Eq. 31's bipartition: agglomerative clustering on the cosine distance 1 − α cut
    into two clusters (the part holding row 0 first). With ``"single"`` linkage this is Eq. 31's
    exact minimiser of the largest cross-part similarity (the cut removes the longest edge of
    the distances' minimum spanning tree, so the smallest cross-part distance is the largest
    possible); ``"complete"`` linkage (the authors' code) may end at a larger one."""
    from scipy.cluster.hierarchy import fcluster, linkage as cluster
    from scipy.spatial.distance import squareform

    dist = 1.0 - cosine_similarity(updates)
    np.fill_diagonal(dist, 0.0)
    labels = fcluster(cluster(squareform(np.maximum(dist, 0.0), checks=False), method=linkage),
                      t=2, criterion="maxclust")
    first = labels == labels[0]
    return [np.flatnonzero(first), np.flatnonzero(~first)]


@groupings.register("fesem")
@dataclass(frozen=True)
class FeSEM(GroupingPolicy):
    """FeSEM (Long et al. 2022), stochastic EM over ``n_clusters`` centre models per edge,
    during FL.

    Before round 0 every client trains one probe epoch from the initial model (charged as
    training) for a first local model. Before every round, the E-step (:meth:`assign`) puts each
    client in the cluster whose centre is nearest (L2) to its local model (its model after its
    latest training); the cluster's members then train from the centre and the centre becomes
    their sample-weighted average (the M-step, the group aggregation). A client whose group
    did not train keeps its previous local model.

    ``init`` chooses the starting centres: ``"random"`` (default) gives each centre its own random
    initialisation, as a from-scratch FeSEM does (and IFCA here); ``"clients"`` seeds them with
    the probe models of ``n_clusters`` clients chosen by k-means++ (D² sampling), which makes the
    clustering depend on the data rather than on the initialisation.
    """

    n_clusters: int = 4
    init: str = "random"
    min_group_size: int = 1
    modes: ClassVar[tuple[str, ...]] = PER_GROUP
    regroup: ClassVar[str] = "nearest"

    def __post_init__(self):
        _check_int("n_clusters", self.n_clusters, 1)
        if self.init not in ("random", "clients"):
            raise ValueError(f"init must be 'random' or 'clients', got {self.init!r}")

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        """Before any local model exists: one group (the E-step of round 0 replaces it)."""
        return _one_group(view)

    def initial_centers(self, local_models: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        """Rows of ``local_models`` (one edge's probe models) that seed the centres, or None: each
        centre from its own random initialisation."""
        if self.init == "random":
            return None
        return kmeans_pp_seeds(local_models, min(self.n_clusters, len(local_models)), rng)

    @staticmethod
    def assign(distances: np.ndarray) -> np.ndarray:
        """E-step: clients × centres distances -> each client's centre (nearest; ties to the lowest index)."""
        return np.argmin(distances, axis=1)


def kmeans_pp_seeds(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): the first row uniformly, each next one
    with probability proportional to its squared distance to the nearest row chosen so far."""
    points = np.asarray(points, dtype=np.float64)
    chosen = [int(rng.integers(len(points)))]
    d2 = ((points - points[chosen[0]]) ** 2).sum(axis=1)
    while len(chosen) < k:
        total = d2.sum()
        nxt = int(rng.choice(len(points), p=d2 / total)) if total > 0 else \
            int(np.setdiff1d(np.arange(len(points)), chosen)[0])
        chosen.append(nxt)
        d2 = np.minimum(d2, ((points - points[nxt]) ** 2).sum(axis=1))
    return np.array(chosen)


@groupings.register("kmeans")
@dataclass(frozen=True)
class KMeansGrouping(GroupingPolicy):
    """KMeans (Ghosh et al. 2019, one-shot clustering), before FL: every client trains
    ``local_epochs`` epochs alone from the initial model (charged as training), the edge runs
    k-means (Lloyd's algorithm, k-means++ seeding, ``n_init`` restarts, fixed seed) with
    ``n_clusters`` clusters on the local models, and each cluster trains its own model from
    the initial model. The clients start from the same model, so k-means on the local models
    equals k-means on their updates (:meth:`cluster` receives the updates).

    Ghosh et al. train each local model to (near) optimality; ``local_epochs`` = 5 is our
    choice (assumed), not theirs.
    """

    n_clusters: int = 4
    local_epochs: int = 5
    n_init: int = 10
    min_group_size: int = 1
    modes: ClassVar[tuple[str, ...]] = PER_GROUP
    regroup: ClassVar[str] = "cluster"
    cluster_round: ClassVar[int] = 0

    def __post_init__(self):
        _check_int("n_clusters", self.n_clusters, 1)
        _check_int("local_epochs", self.local_epochs, 1)
        _check_int("n_init", self.n_init, 1)

    @property
    def probe_epochs(self) -> int:
        return self.local_epochs

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        """Before the local models exist: one group (the clustering of round 0 replaces it)."""
        return _one_group(view)

    def cluster(self, updates: np.ndarray) -> list[np.ndarray]:
        """Rows of ``updates`` (one edge's clients) -> k-means clusters of row indices, in order
        of their first row."""
        updates = np.asarray(updates, dtype=np.float64)
        k = min(self.n_clusters, len(updates))
        if k < 2:
            return [np.arange(len(updates))]
        from sklearn.cluster import KMeans

        labels = KMeans(n_clusters=k, n_init=self.n_init, random_state=0).fit(updates).labels_
        out = [np.flatnonzero(labels == c) for c in np.unique(labels)]
        return sorted(out, key=lambda c: c[0])
