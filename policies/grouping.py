"""Grouping policies: how an edge server partitions its clients into groups (Alg. 1, Lines 2-3).

A policy sees only what an edge server may see (:class:`EdgeView`: label counts and sample
sizes) and returns groups of row indices into that view. Groups never cross edges because a
policy is called once per edge.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import ClassVar, Literal

import numpy as np

from .cov import NORMALIZATIONS, Normalization, cov_from_moments, cov_of_counts
from .registry import Registry

LeftoverRule = Literal["merge", "drop", "keep"]
LEFTOVER_RULES = ("merge", "drop", "keep")
GrowRule = Literal["alg2", "authors"]
GROW_RULES = ("alg2", "authors")

groupings = Registry("grouping")


@dataclass(frozen=True)
class Layer:
    """One module of the model in the flat parameter vector: its name (module path and class, e.g.
    ``"1 (BatchNorm2d)"``), the column range of each of its parameters (weight, bias, ...), and
    whether it normalises (BatchNorm, GroupNorm, LayerNorm, InstanceNorm)."""

    name: str
    parts: tuple[slice, ...]
    norm: bool = False

    @property
    def columns(self) -> slice:
        return slice(self.parts[0].start, self.parts[-1].stop)


@dataclass(frozen=True)
class EdgeView:
    """What an edge server knows about its clients: a clients × labels count matrix and, for
    policies that set ``needs_gradients`` (HCCT), the gradients its clients sent after a probe
    step (clients × parameters) with each model layer (a :class:`Layer`, or only its column range),
    and for policies that set ``needs_distances`` (FedCollab with discriminators) the pairwise
    distances the clients' discriminators estimated."""

    label_counts: np.ndarray
    gradients: np.ndarray | None = None
    layer_slices: tuple[Layer | slice, ...] | None = None
    distances: np.ndarray | None = None   # clients × clients, from FedCollab's client discriminators
    memo: dict | None = None              # what a policy keeps for this edge across re-partitions (checkpointed)
    trainable: np.ndarray | None = None   # which gradient columns are parameters' (None: all; False: BatchNorm state)

    @property
    def n_samples(self) -> np.ndarray:
        return np.asarray(self.label_counts).sum(axis=1)

    @property
    def layers(self) -> tuple[Layer, ...]:
        """:attr:`layer_slices` as layers (a bare range: one parameter, named by its position)."""
        return tuple(s if isinstance(s, Layer) else Layer(f"layer {i}", (s,))
                     for i, s in enumerate(self.layer_slices or ()))

    @property
    def n_clients(self) -> int:
        return int(self.label_counts.shape[0])


@dataclass
class EdgeGrouping:
    """A partition of an edge's clients (row indices), plus what the leftover rule did."""

    groups: list[np.ndarray]
    dropped: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=int))
    leftover_clients: int = 0  # clients the leftover rule touched (merged, dropped or kept short)


class GroupingPolicy(ABC):
    """Partition one edge's clients. Subclasses are dataclasses whose fields are the config keys.

    A policy declares, at class level, what the run loop must give it and where it runs; the
    loop reads these declarations and knows no policy by name. A policy that needs only label
    counts (CoVG, RG and most plug-ins) keeps the defaults.

    * ``needs_label_counts``: :attr:`EdgeView.label_counts` is filled (always true today).
    * ``needs_gradients``: a probe epoch fills :attr:`EdgeView.gradients` (HCCT); charged as training.
    * ``needs_distances``: the clients' discriminators fill :attr:`EdgeView.distances` (FedCollab
      Alg. 1); may be a property when a parameter decides it.
    * ``regroup``: how membership changes after the first grouping (:meth:`regroup_in` may make
      it depend on the mode or a parameter), each kind with the hook the loop then calls:

      - ``"interval"``: the arm's ``regroup_every`` calls :meth:`group` again (global mode);
      - ``"cluster"``: at the policy's ``cluster_round`` every client probes ``probe_epochs``
        epochs (charged) and ``cluster(updates) -> list[row arrays]`` clusters each edge's
        updates (FedCLAR; KMeans at round 0);
      - ``"every-round"``: ``n_clusters`` models per edge; before every round
        ``assign(losses) -> model index per client`` picks from the clients × models losses (IFCA);
      - ``"merge"``: start from singletons; before every round t ≥ 1
        ``repartition(view, groups) -> groups`` re-partitions the clients on their uploaded
        gradients, given the current groups (HCCT Alg. 1);
      - ``"split"``: start from :meth:`group`; before every round t ≥ 1, each group whose
        members all trained in round t − 1 is passed their updates of that round (trained −
        start model, nothing extra charged) to ``split(updates, sizes) -> list[row arrays]``;
        each part starts from the group's model (CFL / FedCluster);
      - ``"nearest"``: ``n_clusters`` centre models per edge; before round 0 every client probes
        one epoch from the initial model (charged) for a first local model, and
        ``initial_centers(local_models, rng) -> rows or None`` seeds the centres with those
        clients' models (None: each centre its own random initialisation); before every round
        ``assign(distances) -> centre index per client`` picks from the clients × centres L2
        distances between each client's latest local model and the centres (FeSEM).
    * ``probe_epochs``: the epochs of a ``"cluster"`` probe (default 1).
    * ``cluster_input``: the rows a ``"cluster"`` policy's ``cluster`` is given: ``"updates"``
      (default; each client's probed model minus its start, every parameter) or ``"last-layer"``
      (each client's probed model, the last non-normalising layer's parameters only).
    * ``cluster_start``: the model a cluster starts from: ``"current"`` (default; the global model
      in global mode, the members' sample-weighted mean group model in per-group mode) or
      ``"probed"`` (the mean of its members' probed models).
    * ``modes``: the run modes (``"global"``, ``"per-group"``) the policy makes sense in.
    * ``normalization``: the CoV normalisation the run reports its groups' CoV in (``"std"``).
    * ``min_group_size``: the smallest group the policy forms (default 1: no minimum).
    * ``leaves_clients_out``: :meth:`group` may leave clients in no group (default False).
    """

    name: ClassVar[str]
    needs_label_counts: ClassVar[bool] = True
    needs_gradients: ClassVar[bool] = False  # the runner then fills EdgeView.gradients by a probe step
    needs_distances: ClassVar[bool] = False  # the runner then fills EdgeView.distances (discriminators)
    regroup: ClassVar[Literal["interval", "cluster", "every-round", "merge", "split", "nearest"]] = "interval"
    probe_epochs: ClassVar[int] = 1
    cluster_input: ClassVar[Literal["updates", "last-layer"]] = "updates"
    cluster_start: ClassVar[Literal["current", "probed"]] = "current"
    # the CoV normalisation the run reports the groups' CoV in (a policy may make it a field, CoVG)
    normalization = "std"
    modes: ClassVar[tuple[str, ...]] = ("global", "per-group")
    # the loop compares it with each edge's clients; a policy without the field has no minimum
    # (a subclass's dataclass field of the same name overrides this default)
    min_group_size: int = 1
    # whether group() may leave clients in no group (else each one must be in a group or listed in
    # EdgeGrouping.dropped); the manifest counts the clients left out either way
    leaves_clients_out: ClassVar[bool] = False

    @abstractmethod
    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping: ...

    def regroup_in(self, mode: str) -> str:
        """The ``regroup`` kind this policy runs in ``mode`` (default: :attr:`regroup`)."""
        return self.regroup

    def mode_hint(self, mode: str) -> str | None:
        """Where a config whose ``mode`` cannot run this policy's regroup kind goes wrong and how to
        fix it, as ``"<parameter>: <message>"`` (or None for the loop's generic message)."""
        return None

    def objective(self, view: EdgeView, groups: list[np.ndarray]) -> float | None:
        """The value this policy maximises over a partition of ``view``'s clients into ``groups``
        (row indices), for the record (per-group mode's manifest: ``final_grouping.objective``);
        None: the policy has none."""
        return None

    def notes(self, memo: dict) -> dict[str, str]:
        """What a run records beside each partition this policy made on an edge (the run's
        ``groups.csv``: a column per key), read from the edge's :attr:`EdgeView.memo`."""
        return {}


groupings.contract = (GroupingPolicy, "group", ("view", "rng"))


def _check_common(min_group_size: int, leftover: str) -> None:
    if not isinstance(min_group_size, int) or min_group_size < 1:
        raise ValueError(f"min_group_size must be an integer >= 1, got {min_group_size!r}")
    if leftover not in LEFTOVER_RULES:
        raise ValueError(f"leftover must be one of {LEFTOVER_RULES}, got {leftover!r}")


def resolve_leftover(groups: list[list[int]], short: list[int], rule: LeftoverRule,
                     label_counts: np.ndarray, normalization: Normalization = "std") -> EdgeGrouping:
    """Handle clients left in a final group smaller than MinGS (Alg. 2 may produce one, DESIGN §5).

    * ``merge`` (default): each leftover client joins the group whose CoV it raises least; if
      there is no complete group, the short group is kept.
    * ``drop``: the clients are excluded from training (the authors' code); reported as dropped.
    * ``keep``: the short group stays, violating constraint (35).
    """
    short = list(short)
    if not short:
        return EdgeGrouping([np.array(g, dtype=int) for g in groups])
    if rule == "drop" and groups:
        return EdgeGrouping([np.array(g, dtype=int) for g in groups], np.array(short, dtype=int), len(short))
    if rule == "keep" or not groups:
        return EdgeGrouping([np.array(g, dtype=int) for g in groups + [short]], leftover_clients=len(short))
    counts = np.stack([label_counts[g].sum(axis=0) for g in groups]).astype(float)
    base = cov_of_counts(counts, normalization)
    for c in short:
        new = cov_of_counts(counts + label_counts[c], normalization)
        with np.errstate(invalid="ignore"):  # inf - inf: groups without samples stay as bad
            harm = np.where(np.isinf(new) & np.isinf(base), 0.0, new - base)
        best = int(np.argmin(harm))
        groups[best].append(c)
        counts[best] += label_counts[c]
        base[best] = new[best]
    return EdgeGrouping([np.array(g, dtype=int) for g in groups], leftover_clients=len(short))


def settle_short_groups(groups: list[list[int]], min_size: int, rule: LeftoverRule,
                        label_counts: np.ndarray, normalization: Normalization = "std") -> EdgeGrouping:
    """Apply the leftover rule to every group below ``min_size``, wherever it formed: ``keep``
    keeps each as it is; ``merge`` and ``drop`` treat their clients as :func:`resolve_leftover`
    treats one short last group."""
    complete = [g for g in groups if len(g) >= min_size]
    short = [g for g in groups if len(g) < min_size]
    if rule == "keep":
        return EdgeGrouping([np.array(g, dtype=int) for g in complete + short],
                            leftover_clients=sum(map(len, short)))
    return resolve_leftover(complete, [c for g in short for c in g], rule, label_counts, normalization)


def enforce_min_size(groups: list[list[int]], min_size: int,
                     cost: Callable[[list[int]], float]) -> tuple[list[list[int]], int]:
    """Merge groups smaller than ``min_size`` into the group they hurt least (for policies that
    choose their own number of groups: HCCT, FedCollab).

    ``cost(members)`` is the policy's objective of one group, to be minimised, additive over
    groups. The smallest short group merges into the group ``b`` minimising
    cost(a ∪ b) − cost(a) − cost(b); repeat until every group reaches ``min_size`` or one group
    is left. Returns the groups and how many clients sat in merged short groups.
    """
    groups = [list(g) for g in groups]
    touched = 0
    while len(groups) > 1:
        sizes = np.array([len(g) for g in groups])
        a = int(np.argmin(sizes))
        if sizes[a] >= min_size:
            break
        short = groups.pop(a)
        touched += len(short)
        deltas = [cost(short + g) - cost(short) - cost(g) for g in groups]
        groups[int(np.argmin(deltas))].extend(short)
    return groups, touched


@groupings.register("covg")
@dataclass(frozen=True)
class CoVGrouping(GroupingPolicy):
    """CoV-Grouping, Alg. 2: grow each group from a random client by the CoV-minimising client.

    One greedy step (Alg. 2, Line 5) scores every remaining candidate at once from the group's
    running label counts (one matrix-vector product gives every candidate's sum of squares), so
    a step costs O(|K|·|Y|) and the whole run O(|K|²·|Y|) instead of the printed O(|K|³·|Y|)
    of :func:`groupfel.policies.reference.covg_reference`, which yields the same groups. Ties go to the
    lowest row index.

    ``grow`` says when a group takes its best candidate:

    * ``alg2`` (default): Alg. 2, Line 6 as printed. A group below MinGS takes the best
      remaining client even when the CoV rises, so only an edge's last group can fall short.
    * ``authors``: the authors' code (Jiyao17/fl-grouping ``utils/fed.py``,
      ``__CV_greedy_grouping``). A group takes a client only when it lowers the CoV, and closes
      when none does, so groups below MinGS can form anywhere; every one of them goes to the
      leftover rule. With ``leftover = "drop"`` their clients sit out until the next regrouping,
      as in the authors' runs. It also grows a group whose CoV equals MaxCoV, which Alg. 2
      closes. An edge where no group reaches MinGS keeps its clients as one group (the leftover
      rules' case without a complete group), where the authors' code would leave the edge out.
    """

    min_group_size: int = 5
    max_cov: float = 0.5
    normalization: Normalization = "std"
    leftover: LeftoverRule = "merge"
    grow: GrowRule = "alg2"

    def __post_init__(self):
        _check_common(self.min_group_size, self.leftover)
        if not self.max_cov >= 0:
            raise ValueError(f"max_cov must be >= 0, got {self.max_cov!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")
        if self.grow not in GROW_RULES:
            raise ValueError(f"grow must be one of {GROW_RULES}, got {self.grow!r}")

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        L = np.asarray(view.label_counts, dtype=float)
        m, norm = L.shape[1], self.normalization
        rows, sq = L.sum(axis=1), (L ** 2).sum(axis=1)
        available, taken = np.ones(len(L), dtype=bool), np.zeros(len(L))
        fill = self.grow == "alg2"  # a group below MinGS takes a client that raises its CoV
        open_at = (lambda cov: cov > self.max_cov) if fill else (lambda cov: cov >= self.max_cov)
        groups: list[list[int]] = []
        while available.any():
            first = int(rng.choice(np.flatnonzero(available)))           # Line 3
            available[first], taken[first] = False, np.inf
            members, counts = [first], L[first].copy()
            current = float(cov_of_counts(counts, norm))
            while (open_at(current) or len(members) < self.min_group_size) and available.any():
                # Lines 4-5 for every client at once: Σ(c+x)² = Σc² + 2 x·c + Σx², all exact integers.
                scores = cov_from_moments(counts.sum() + rows, (counts ** 2).sum() + 2 * (L @ counts) + sq, m, norm)
                scores += taken  # +inf for clients already grouped
                best = int(np.argmin(scores))
                if not available[best] and fill:  # every candidate has CoV = inf: take the first one
                    best = int(np.flatnonzero(available)[0])
                if scores[best] < current or (fill and len(members) < self.min_group_size):  # Line 6
                    members.append(best)                                  # Line 7
                    available[best], taken[best] = False, np.inf
                    counts += L[best]
                    current = float(scores[best])
                else:
                    break                                                 # Line 9
            groups.append(members)                                        # Line 10
        return settle_short_groups(groups, self.min_group_size, self.leftover, L, norm)


@groupings.register("rg")
@dataclass(frozen=True)
class RandomGrouping(GroupingPolicy):
    """RG: a random permutation cut into groups of MinGS; the remainder goes to the leftover rule."""

    min_group_size: int = 5
    leftover: LeftoverRule = "merge"

    def __post_init__(self):
        _check_common(self.min_group_size, self.leftover)

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        order = rng.permutation(view.n_clients)
        s = self.min_group_size
        full = len(order) // s * s
        groups = [list(map(int, order[i:i + s])) for i in range(0, full, s)]
        return resolve_leftover(groups, list(map(int, order[full:])), self.leftover,
                                np.asarray(view.label_counts, dtype=float))
