"""HCCT and HCCT-E (paper ``000``): agglomerative merging of groups by client utility.

The utility of client i in group G is U_i = −α/D_G + cos(g_i, g_G) + β (HCCT Eq. 9, with the
cosine similarity of Eq. 8), where g_G = Σ_{i∈G} (D_i/D_G) g_i is the group gradient (HCCT
Eq. 13). Starting from singletons (Eq. 12), the pair of groups with the largest merge benefit
B = Û_{k'} − Û_{k1} − Û_{k2} (Eqs. 14-15) merges (Eq. 16) until no merge has a positive benefit
or one group is left (Eq. 17; HCCT Alg. 2). β cancels out of every benefit, so it is omitted.

Speed: Σ_{i∈G} cos(g_i, g_G) = ⟨Σ_{i∈G} ĝ_i, G_G⟩ / ‖G_G‖ with ĝ_i = g_i/‖g_i‖ and
G_G = Σ_{i∈G} D_i g_i, so every benefit follows from two K×K Gram matrices (A = ⟨G_a, G_b⟩,
B = ⟨N_a, G_b⟩ with N = Σ ĝ) that a merge updates by adding rows and columns. The gradients
are touched once (O(N²·M)); the merging is O(N³) numpy work, not O(N³·M).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .grouping import EdgeGrouping, EdgeView, GroupingPolicy, enforce_min_size, groupings

_EPS = 1e-12


def group_utility(grads: np.ndarray, sizes: np.ndarray, members, alpha: float) -> float:
    """Σ_{i∈G} (−α/D_G + cos(g_i, g_G)) for one group (HCCT Eqs. 9, 13, 14; β omitted)."""
    members = np.asarray(members, dtype=int)
    g, d = grads[members], sizes[members].astype(float)
    D = d.sum()
    gG = (d[:, None] * g).sum(axis=0) / D                                           # Eq. 13
    cos = g @ gG / np.maximum(np.linalg.norm(g, axis=1) * np.linalg.norm(gG), _EPS)  # Eq. 8
    return float(len(members) * (-alpha / D) + cos.sum())


LAYER_RATIOS = ("absolute", "signed", "authors")


def layer_ratios(grads: np.ndarray, layers, ratio: str = "absolute") -> np.ndarray:
    """HCCT Eq. 19's relative gradient variance Var/Mean of each layer across the clients.

    ``layers``: each layer's columns, a slice or index array, or a tuple of them, one per
    parameter of the layer (weight, bias). ``ratio`` reads Eq. 19's Var/Mean:

    * ``"absolute"`` (default, assumed: gradients are signed, so a plain mean could be ~0 or
      negative and make the ratio meaningless): the across-client variance of each parameter
      entry averaged over the layer, over the mean |across-client mean| of its entries.
    * ``"signed"``: the same variance over the layer's plain (signed) mean; the largest signed
      ratio wins.
    * ``"authors"`` (code: the HCCT authors' main_cluster.py): for each parameter of the layer
      apart, ``np.var`` over ``np.mean`` of all its entries of all clients pooled (the spread
      across entries counts as well as across clients), and the layer's value is the sum over its
      parameters. Ill-conditioned: the pooled mean of a gradient is about 0, so each ratio's sign
      and size follow the sign and size of that near-zero mean; a layer whose mean gradient is
      slightly positive wins with a huge ratio, and a few changed bits (another run, another seed)
      can change the layer chosen. A softmax classifier's gradients sum to exactly 0 over the
      classes, so its mean is float rounding and its ratio is ±(huge) by the rounding's sign.
    """
    def parts(layer):
        return layer if isinstance(layer, tuple) else (layer,)

    if ratio == "authors":
        return np.array([sum(grads[:, c].var() / grads[:, c].mean() for c in parts(layer)) for layer in layers])
    cols = [np.concatenate([np.arange(grads.shape[1])[c] for c in parts(layer)]) for layer in layers]
    if ratio == "signed":
        values = [grads[:, c].var(axis=0).mean() / grads[:, c].mean() for c in cols]
    else:
        values = [grads[:, c].var(axis=0).mean() / max(np.abs(grads[:, c].mean(axis=0)).mean(), _EPS) for c in cols]
    return np.array(values)


def relative_variance_layer(grads: np.ndarray, layers, ratio: str = "absolute") -> int:
    """HCCT Eq. 19's l*: the layer whose gradients vary most across clients relative to their
    size (the largest of :func:`layer_ratios`)."""
    return int(np.nanargmax(layer_ratios(grads, layers, ratio)))


def hcct_partition(grads: np.ndarray, sizes: np.ndarray, alpha: float,
                   groups: list[list[int]] | None = None, n_groups: int | None = None) -> list[list[int]]:
    """HCCT Alg. 2 on gradient rows ``grads`` (clients × M) of clients holding ``sizes`` samples,
    merging from the current partition ``groups`` {C_k} (Alg. 2's second argument; default: every
    client alone, Eq. 12). Groups only merge: every returned group is a union of given ones.

    ``n_groups`` = K fixes the number of groups (HCCT Sec. 7.4, Figs. 5-6): the pair of largest
    benefit (Eq. 16) merges even where the benefit is not positive, until K groups are left, and
    no merge happens once K are left."""
    d = sizes.astype(float)
    norms = np.maximum(np.linalg.norm(grads, axis=1), _EPS)
    G = d[:, None] * grads                      # D_i g_i: sums to D_G g_G (Eq. 13)
    N = grads / norms[:, None]                  # unit gradients: Σ cos = ⟨Σ ĝ_i, g_G⟩/‖g_G‖
    if groups is None:
        members = [[i] for i in range(len(grads))]
        D, count = d.copy(), np.ones(len(grads))
    else:                                       # each group's sums over its members
        members = [sorted(int(i) for i in g) for g in groups]
        G = np.stack([G[m].sum(axis=0) for m in members])
        N = np.stack([N[m].sum(axis=0) for m in members])
        D, count = np.array([d[m].sum() for m in members]), np.array([float(len(m)) for m in members])
    n = len(members)
    A, B = G @ G.T, N @ G.T
    alive = np.ones(n, dtype=bool)

    def utility_after_merge() -> np.ndarray:
        """Û of every pair (a, b) merged: Eq. 14 for the group a ∪ b."""
        dot = np.diag(B)[:, None] + np.diag(B)[None, :] + B + B.T
        sq = np.diag(A)[:, None] + np.diag(A)[None, :] + 2 * A
        return -alpha * (count[:, None] + count[None, :]) / (D[:, None] + D[None, :]) + dot / np.sqrt(np.maximum(sq, _EPS**2))

    own = -alpha * count / D + np.diag(B) / np.sqrt(np.maximum(np.diag(A), _EPS**2))  # Eqs. 12, 14
    benefit = utility_after_merge() - own[:, None] - own[None, :]                     # Eq. 15
    np.fill_diagonal(benefit, -np.inf)
    while alive.sum() > (1 if n_groups is None else n_groups):
        flat = int(np.argmax(benefit))                                                 # Eq. 16
        a, b = divmod(flat, n)
        if n_groups is None and not benefit[a, b] > 0:                                 # Eq. 17
            break
        a, b = min(a, b), max(a, b)
        members[a] += members[b]
        alive[b] = False
        for M in (A, B):  # group a becomes a ∪ b: its sums gain b's sums
            M[a, :] += M[b, :]
            M[:, a] += M[:, b]
        D[a] += D[b]
        count[a] += count[b]
        own[a] = -alpha * count[a] / D[a] + B[a, a] / np.sqrt(max(A[a, a], _EPS**2))
        # Only pairs involving a changed; recompute that row/column.
        dot = B[a, a] + np.diag(B) + B[a, :] + B[:, a]
        sq = A[a, a] + np.diag(A) + 2 * A[a, :]
        row = -alpha * (count[a] + count) / (D[a] + D) + dot / np.sqrt(np.maximum(sq, _EPS**2)) - own[a] - own
        row[~alive] = -np.inf
        row[a] = -np.inf
        benefit[a, :], benefit[:, a] = row, row
        benefit[b, :], benefit[:, b] = -np.inf, -np.inf
    return [members[k] for k in np.flatnonzero(alive)]


SCHEDULES = ("alg1", "once")
GRADIENTS = ("parameters", "state")
RESTARTS = ("singletons", "merge")
FIRSTS = ("alone", "global")


@groupings.register("hcct")
@dataclass(frozen=True)
class HCCTGrouping(GroupingPolicy):
    """HCCT (HCCT Alg. 2, Eqs. 9, 13-17) on the clients' full gradients.

    The number of groups is HCCT's own choice, unless ``n_groups`` fixes it (HCCT Figs. 5-6: Alg. 2
    merges the best pairs, beneficial or not, down to K groups). With ``min_group_size`` > 1, groups smaller than
    MinGS are then merged, smallest first, into the group whose summed utility (Eq. 14) drops
    least (:func:`groupfel.policies.grouping.enforce_min_size`); 1 (default) keeps HCCT's partition.
    ``alpha`` is Eq. 9's trade-off between data volume and gradient similarity, in samples.
    The random generator is not used: HCCT is deterministic given the gradients.

    ``schedule`` says when the partition is made (per-group mode, :mod:`groupfel.emulator.rounds`):

    * ``"alg1"`` (HCCT Alg. 1, lines 2-7; per-group mode's default): at t = 0 every client is its
      own group and trains alone; at every epoch t ≥ 1 :meth:`repartition` runs Alg. 2 on the
      gradients the clients uploaded while training.
    * ``"once"``: :meth:`group` partitions once, from singletons, on gradients of a probe epoch
      from the initial model, and the groups stay. Global mode's only schedule (there
      ``regroup_every`` re-partitions from a probe of the current global model).
    ``None`` is the mode's default.

    ``restart`` says where Alg. 2 starts at each epoch of ``"alg1"``:

    * ``"singletons"`` (default; paper: HCCT Alg. 2 line 2, "Initialize K = N groups C_k = {k}",
      as the authors' ``user_cluster`` does): every client alone, so a group may split again.
    * ``"merge"`` (a departure, assumed: Alg. 1 passes the current groups {C_k} in): Alg. 2
      merges the current groups, so groups only merge.

    ``first`` says how ``"alg1"`` trains epoch t = 0: ``"alone"`` (default; paper: HCCT Alg. 1
    lines 2-4, every client its own group) or ``"global"`` (code: the HCCT authors'
    main_cluster.py puts every client of an edge in one group at ``iter == 0``: one FedAvg epoch
    from the initial model, whose uploads Alg. 2 partitions at t = 1).

    ``gradient`` says what a client's gradient g_i holds: ``"parameters"`` (default; paper: HCCT
    Eq. 8 compares the gradients of the model's parameters) or ``"state"`` (code: the HCCT authors'
    main_cluster.py subtracts whole state dicts, so g_i also holds the change of BatchNorm's running
    statistics and batch counters). The two differ only for a model that holds such state
    (``train.model = "digit-bn-cnn"``); it applies to the partitions and to the utility (Fig. 5).
    """

    needs_gradients: ClassVar[bool] = True
    min_group_size: int = 1
    alpha: float = 10.0
    schedule: str | None = None
    n_groups: int | None = None
    restart: str = "singletons"
    first: str = "alone"
    gradient: str = "parameters"

    def __post_init__(self):
        if not isinstance(self.min_group_size, int) or self.min_group_size < 1:
            raise ValueError(f"min_group_size must be an integer >= 1, got {self.min_group_size!r}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0 (HCCT Eq. 9), got {self.alpha!r}")
        if self.n_groups is not None and (not isinstance(self.n_groups, int) or self.n_groups < 1):
            raise ValueError(f"n_groups must be an integer >= 1 (HCCT Figs. 5-6's fixed K), got {self.n_groups!r}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} (\"alg1\": HCCT Alg. 1, re-partition "
                             f"every epoch; \"once\": partition once), got {self.schedule!r}")
        if self.restart not in RESTARTS:
            raise ValueError(f"restart must be one of {', '.join(RESTARTS)} (\"singletons\": HCCT Alg. 2 line 2; "
                             f"\"merge\": merge the current groups), got {self.restart!r}")
        if self.first not in FIRSTS:
            raise ValueError(f"first must be one of {', '.join(FIRSTS)} (\"alone\": HCCT Alg. 1, every client alone "
                             f"at t = 0; \"global\": one group at t = 0, the authors' code), got {self.first!r}")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {', '.join(GRADIENTS)} (\"parameters\": HCCT Eq. 8; \"state\": "
                             f"the whole state dict's change, BatchNorm statistics included, the authors' code), "
                             f"got {self.gradient!r}")
        if self.schedule == "alg1" and self.min_group_size > 1:
            raise ValueError("schedule \"alg1\" starts from singletons (HCCT Alg. 1), so min_group_size must be 1; "
                             "use schedule = \"once\" for a minimum group size")

    def regroup_in(self, mode: str) -> str:
        """Alg. 1's merging (``"merge"``) where the schedule is ``"alg1"`` (per-group mode's
        default); else one partition, re-formed every ``regroup_every`` in global mode."""
        alg1 = self.schedule == "alg1" or (self.schedule is None and mode == "per-group")
        return "merge" if alg1 else "interval"

    def mode_hint(self, mode: str) -> str | None:
        return ("schedule: \"alg1\" (HCCT Alg. 1) runs in per-group mode; in global mode use schedule = \"once\" "
                "(and regroup_every to re-partition)")

    def _columns(self, view: EdgeView) -> np.ndarray | None:
        """The gradient columns compared: the parameters' (``gradient = "parameters"``) or all."""
        if self.gradient == "state" or view.trainable is None:
            return None
        return np.asarray(view.trainable, dtype=bool)

    def _gradients(self, view: EdgeView) -> np.ndarray:
        if view.gradients is None:
            raise ValueError(f"grouping policy {self.name!r} needs the clients' gradients (EdgeView.gradients)")
        grads = np.asarray(view.gradients, dtype=float)
        keep = self._columns(view)
        return grads if keep is None else grads[:, keep]

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        grads, sizes = self._gradients(view), view.n_samples
        groups = hcct_partition(grads, sizes, self.alpha, n_groups=self.n_groups)
        touched = 0
        if self.min_group_size > 1:
            groups, touched = enforce_min_size(
                groups, self.min_group_size, lambda m: -group_utility(grads, sizes, m, self.alpha))
        return EdgeGrouping([np.array(g, dtype=int) for g in groups], leftover_clients=touched)

    def objective(self, view: EdgeView, groups: list[np.ndarray]) -> float:
        """The clients' summed utility Σ_G Σ_{i∈G} U_i (HCCT Eqs. 9, 14; β omitted), which Alg. 2
        raises with every merge (HCCT Fig. 5's utility)."""
        grads = self._gradients(view)
        return float(sum(group_utility(grads, view.n_samples, g, self.alpha) for g in groups))

    def repartition(self, view: EdgeView, groups: list[np.ndarray]) -> list[np.ndarray]:
        """ClientPartition({g_i^t}, {C_k}) (HCCT Alg. 1 line 6, Alg. 2) on the clients' gradients:
        from singletons (``restart = "singletons"``, Alg. 2 line 2), or merging the current
        ``groups`` (row indices of ``view``) into unions of them (``restart = "merge"``)."""
        if self.restart == "singletons":   # every client of the current groups alone (not yet arrived: in none)
            start = [[int(i)] for i in sorted(int(i) for g in groups for i in g)]
        else:
            start = [list(g) for g in groups]
        merged = hcct_partition(self._gradients(view), view.n_samples, self.alpha, start, self.n_groups)
        return [np.array(sorted(g), dtype=int) for g in merged]


LAYERS = ("every", "once")


@groupings.register("hcct-e")
@dataclass(frozen=True)
class HCCTEGrouping(HCCTGrouping):
    """HCCT-E (HCCT Sec. 5.2): HCCT on the single layer l* of HCCT Eq. 19 (largest relative
    gradient variance across clients), with the similarity of HCCT Eq. 20.

    ``layer`` says when l* is chosen: ``"every"`` (default, assumed: from the gradients of every
    partition) or ``"once"`` (code: the HCCT authors' main_cluster.py picks ``cluster_layer``
    once, from every client's one training from the initial model, and keeps it): from the first
    gradients partitioned on the edge (under ``"alg1"``, the uploads of epoch t = 0, trained from
    the initial model), kept in the edge's ``EdgeView.memo``.

    ``layer_ratio`` says how Eq. 19's Var/Mean is read (:func:`relative_variance_layer`):
    ``"absolute"`` (default, assumed), ``"signed"``, or ``"authors"`` (code: main_cluster.py's
    own expression, per parameter pooled over clients and entries and summed over weight and
    bias; ill-conditioned, as its sign follows a layer's mean gradient, about 0).

    ``norm_layers``: whether normalisation modules (BatchNorm, GroupNorm, ...) are candidates for
    l*. False (default; code: the authors' candidates are the model's convolutional and linear
    layers, ``layer_values`` in main_cluster.py; HCCT Sec. 5.2 compares layers of the network, and
    a BatchNorm's affine parameters are not one): only the other layers. The run records the layer
    chosen at every partition by its module name (``groups.csv``'s ``layer``)."""

    layer: str = "every"
    layer_ratio: str = "absolute"
    norm_layers: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.layer not in LAYERS:
            raise ValueError(f"layer must be one of {', '.join(LAYERS)} (\"every\": l* from every partition's "
                             f"gradients; \"once\": from the first, the HCCT authors' code), got {self.layer!r}")
        if self.layer_ratio not in LAYER_RATIOS:
            raise ValueError(f"layer_ratio must be one of {', '.join(LAYER_RATIOS)} (\"absolute\": Eq. 19 over the "
                             f"mean |gradient|; \"signed\": over the signed mean; \"authors\": the HCCT authors' "
                             f"expression), got {self.layer_ratio!r}")
        if not isinstance(self.norm_layers, bool):
            raise ValueError(f"norm_layers must be true or false (whether normalisation modules may be HCCT-E's "
                             f"layer), got {self.norm_layers!r}")

    def _gradients(self, view: EdgeView) -> np.ndarray:
        if not view.layer_slices:
            return super()._gradients(view)
        if view.gradients is None:
            raise ValueError(f"grouping policy {self.name!r} needs the clients' gradients (EdgeView.gradients)")
        grads = np.asarray(view.gradients, dtype=float)
        keep = self._columns(view)
        names, candidates = [], []
        for layer in view.layers:
            if layer.norm and not self.norm_layers:
                continue
            parts = [np.arange(p.start, p.stop) for p in layer.parts]
            parts = tuple(p if keep is None else p[keep[p]] for p in parts)
            parts = tuple(p for p in parts if len(p))
            if parts:
                names.append(layer.name)
                candidates.append(parts)
        if not candidates:
            raise ValueError(f"grouping policy {self.name!r}: the model has no layer to choose from"
                             + ("" if self.norm_layers else " but normalisation modules; set norm_layers = true"))
        pick = lambda: relative_variance_layer(grads, candidates, self.layer_ratio)  # noqa: E731
        if self.layer == "once" and view.memo is not None:
            best = view.memo["hcct_e_layer"] if "hcct_e_layer" in view.memo else view.memo.setdefault("hcct_e_layer", pick())
        else:
            best = pick()
        if view.memo is not None:
            view.memo["hcct_e_layer_name"] = names[best]
        return grads[:, np.concatenate(candidates[best])]

    def notes(self, memo: dict) -> dict[str, str]:
        """The layer l* of the edge's latest partition, by module name."""
        return {"layer": memo["hcct_e_layer_name"]} if "hcct_e_layer_name" in memo else {}
