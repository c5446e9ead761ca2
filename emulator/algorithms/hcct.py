"""HCCT's baselines (HCCT Sec. 7.1, Table 4) written as training algorithms through the public
hooks of :class:`groupfel.emulator.algorithms.Algorithm`, as a plug-in would be: ``fedfa``, ``maxfl``,
``flsc`` and ``fedper`` (the personalisation layers of HCCT-P).

None of them needs a grouping policy of its own. HCCT runs every baseline on one server, so they
run in per-group mode with ``grouping = "global"`` (one group of all clients); HCCT-P is the
``hcct`` grouping (HCCT Alg. 1) with ``train.algorithm = "fedper"``. They also run inside any
other grouping: each group is then one such federation (FLSC's cluster models are shared by all
clients, whatever their group).

What clients evaluate (per-group mode's local test error) is each method's own model,
:meth:`Algorithm.personal_model`: MAXFL's client uses the global model only while it finds it
appealing, FLSC's client its mix of cluster models, HCCT-P's client the group's layers with its
own classifier.

Costs: local training is charged as Eq. 5 training (MAXFL declares its clients' second model,
:attr:`MaxFL.training_passes`). The forward passes with which clients score models on their
training data (FedFA's accuracy, MAXFL's and FLSC's losses) go through ``ctx.score_train``, which
counts them; each is charged a third of an epoch of Eq. 5 training, as IFCA's
(``groupfel.emulator.rounds.common.FORWARD_FRACTION``), after the round or evaluation that ran it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from .base import Algorithm, AlgorithmContext, AlgorithmState, GroupUpdate, algorithms
from groupfel.errors import InputError
from ..models import layer_slices, trainable_mask
from ..rng import key, rng, seed_of

PER_GROUP = ("per-group",)


def _score(ctx: AlgorithmContext, weights: torch.Tensor, clients) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy, mean cross-entropy) of one model on each client's training data."""
    return ctx.score_train(weights, np.asarray(clients, dtype=np.int64))


def _group_losses(ctx: AlgorithmContext, clients: torch.Tensor, starts: torch.Tensor,
                  group_of: list[int]) -> np.ndarray:
    """Each training client's loss under its group's model (scored once per group)."""
    out = np.empty(len(clients))
    groups = np.asarray(group_of)
    for g in dict.fromkeys(group_of):
        rows = np.flatnonzero(groups == g)
        out[rows] = _score(ctx, starts[rows[0]], clients[rows].cpu().numpy())[1]
    return out


# -- FedFA ------------------------------------------------------------------------------------------

def fedfa_weights(accuracy: np.ndarray, n_samples: np.ndarray, floor: float | None = None) -> np.ndarray:
    """FedFA's aggregation weights (HCCT Sec. 7.1): q_i = −log2 A_i / Σ_j −log2 A_j.

    q_i is undefined at A_i = 0, so A_i is floored: at ``floor`` where given (the authors' code:
    1e-7), else at 1/(2 n_i), half a sample of client i. Where every A_i is 1 (every q_i = 0) the
    weights are the samples' shares."""
    n = np.asarray(n_samples, dtype=np.float64)
    a = np.maximum(np.asarray(accuracy, dtype=np.float64), 1.0 / (2.0 * n) if floor is None else floor)
    q = -np.log2(np.minimum(a, 1.0))
    if not q.sum() > 0:
        return np.asarray(n_samples, dtype=np.float64) / np.sum(n_samples)
    return q / q.sum()


@dataclass
class _Accuracies:
    accuracy: np.ndarray | None = None     # each training client's A_i in the current group round (batch rows)
    clients: torch.Tensor | None = None    # ... and who they are


@algorithms.register("fedfa")
@dataclass
class FedFA(Algorithm):
    """FedFA (Huang et al. 2022) as HCCT runs it (HCCT Sec. 7.1, with plain minibatch SGD):
    every group averages its clients' updates with weights −log2 A_i^t / Σ_j −log2 A_j^t
    (:func:`fedfa_weights`), A_i^t the training accuracy of client i at epoch t, so the clients
    the model serves worst weigh most. A_i^t is the accuracy, on the client's training data, of
    the model it received (its start model of the group round), measured before its local steps.
    The weights replace the samples' shares of Alg. 1, Line 14 (``aggregate_group``); the
    accuracies come from ``after_local``. Runs in both modes (in global mode the cloud then
    aggregates the groups by the arm's rule).

    ``floor`` is the accuracy that stands in for 0 in −log2 A_i (HCCT is silent): ``None``
    (default, assumed) half a sample, 1/(2 n_i); the authors' code floors at 1e-7."""

    floor: float | None = None

    def __post_init__(self):
        if self.floor is not None and not 0 < self.floor < 1:
            raise ValueError(f"floor must be an accuracy in (0, 1) standing in for 0 (the authors' code: 1e-7), "
                             f"got {self.floor!r}")

    def begin_round(self, state, groups, members):
        return _Accuracies()

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        scratch.accuracy = np.array([_score(self.ctx, starts[r], [int(c)])[0][0] for r, c in enumerate(clients.tolist())])
        scratch.clients = clients

    def aggregate_group(self, state, scratch, update: GroupUpdate) -> torch.Tensor:
        clients = scratch.clients[update.rows].cpu().numpy()
        q = fedfa_weights(scratch.accuracy[update.rows], self.ctx.n_samples[clients], self.floor)
        return torch.as_tensor(q, dtype=update.models.dtype, device=update.models.device) @ update.models


# -- MAXFL ------------------------------------------------------------------------------------------

def maxfl_joins(global_loss: np.ndarray, threshold: np.ndarray, margin: float = 0.0,
                strict: bool = False) -> np.ndarray:
    """MAXFL's participation rule: client i trains (and uses) the global model while its loss under
    it is within its threshold: f_i(x) ≤ threshold + margin (``strict``: <, the authors' code)."""
    bound = np.asarray(threshold) + margin
    return np.asarray(global_loss) < bound if strict else np.asarray(global_loss) <= bound


THRESHOLDS = ("loss", "distance")
VECTORS = ("parameters", "state")
PRIORS = ("trained", "once")


@dataclass
class _MaxRound:
    t: int
    joins: dict[int, bool] = field(default_factory=dict)   # each client's decision this round
    row_joins: torch.Tensor | None = None                 # the current group round's batch rows
    clients: torch.Tensor | None = None                   # ... and who they are
    k: int = 0                                            # group rounds done


@algorithms.register("maxfl")
@dataclass
class MaxFL(Algorithm):
    """MAXFL (Cho et al. 2022) as HCCT describes it (Sec. 2, Sec. 7.1): a client joins the global
    model only while the global model is appealing to it, its training loss under the global
    model no worse than its threshold, the loss of a model ŵ_i it trains independently
    (:func:`maxfl_joins`, with ``margin`` added to the threshold); otherwise it keeps training
    independently.

    Every client keeps ŵ_i (``client_state`` ``"own"``, from the initial model) and trains it every
    group round (HCCT: the threshold "introduces additional computation costs"). At the first group
    round of each round, each client compares the two losses on its training data
    (``local_start``): a participant starts its local steps from its group's model and its
    trained model enters the group's sample-weighted mean over participants (``aggregate_group``;
    a group without participants keeps its model), and it trains ŵ_i as well (``after_local``);
    any other client trains only ŵ_i. A client is evaluated with the model it uses, the global
    model if appealing, else ŵ_i (``personal_model``). Training is charged as two passes for every
    client (``training_passes``): exact for participants, one pass too many for the others.
    Per-group mode (with ``grouping = "global"``: HCCT's single global model).

    ``threshold`` is client i's threshold: ``"loss"`` (default; paper: Cho et al.'s rule,
    f_i(x) ≤ f_i(ŵ_i)) or ``"distance"`` (code: the HCCT authors' MAXFL, f_i(x) < ‖ŵ_i − x‖², the
    squared distance between the global model and the client's independent model).

    ``prior`` is where ŵ_i comes from: ``"trained"`` (default, as above: trained every group
    round) or ``"once"`` (code: the HCCT authors' main_cluster.py, ``w_prior``): ŵ_i is trained
    once from the initial model at round 0's lr, for ``prior_epochs`` epochs (0, the default: E,
    one group round's local epochs; the authors' models/Update.py trains it for local_ep × epochs,
    E × T: ``prior_epochs = 50`` for E = 1 and 50 rounds), and stays; at round 0 every client
    joins (the authors' epoch 0 is one global FedAvg) and from round 1 each decides against the fixed
    ŵ_i. ``"own"`` is then the model each client holds (the authors' ``w_locals``): a participant
    starts from the sample-weighted mean of the participants' held models and holds its group's
    aggregate afterwards; any other client trains on from the model it holds; each is evaluated with
    the model it holds. Training is then one pass a group round; ŵ_i's one up-front training (the
    first round's after_local) is not charged.

    ``vector`` is what ``threshold = "distance"`` measures ‖ŵ_i − x‖² over: ``"parameters"``
    (default) or ``"state"`` (code: the HCCT authors' main_cluster.py, the whole state dict,
    BatchNorm's running statistics and batch counters included); they differ only for a model
    that holds such state (``digit-bn-cnn``).

    Each evaluation row counts the clients that joined the global model in the round just trained
    (``maxfl_participants``). Where none joins in the first round that decides (round 1 with
    ``prior = "once"``), the authors' code raises (a KeyError: no participant to average) where a
    run here trains every client alone on: not comparable with the paper's MAXFL."""

    margin: float = 0.0
    threshold: str = "loss"
    prior: str = "trained"
    prior_epochs: int = 0
    vector: str = "parameters"
    modes: ClassVar[tuple[str, ...]] = PER_GROUP

    def __post_init__(self):
        if not np.isfinite(self.margin):
            raise ValueError(f"margin must be a finite loss difference, got {self.margin!r}")
        if self.threshold not in THRESHOLDS:
            raise ValueError(f"threshold must be one of {', '.join(THRESHOLDS)} (\"loss\": f_i(x) <= f_i(w_i); "
                             f"\"distance\": f_i(x) < |w_i - x|^2, the HCCT authors' code), got {self.threshold!r}")
        if self.vector not in VECTORS:
            raise ValueError(f"vector must be one of {', '.join(VECTORS)} (\"parameters\"; \"state\": the whole state "
                             f"dict, BatchNorm statistics included, the HCCT authors' code), got {self.vector!r}")
        if self.prior_epochs < 0 or self.prior_epochs != int(self.prior_epochs):
            raise ValueError(f"prior_epochs must be a whole number of epochs >= 0 (0: one group round's local "
                             f"epochs), got {self.prior_epochs!r}")
        if self.prior_epochs and self.prior != "once":
            raise ValueError("prior_epochs needs prior = \"once\" (w_i trained once up front)")
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {', '.join(PRIORS)} (\"trained\": w_i trained every round; "
                             f"\"once\": trained once up front, the HCCT authors' code), got {self.prior!r}")

    @property
    def training_passes(self) -> float:   # type: ignore[override]
        return 1.0 if self.prior == "once" else 2.0

    def _joins(self, global_loss: np.ndarray, own: torch.Tensor, models: torch.Tensor, clients) -> np.ndarray:
        """Each client's decision from its loss under the global model (``models``, one row per
        client) and its own model ŵ_i (``own``)."""
        if self.threshold == "distance":
            gap = own.double() - models.double()
            keep = trainable_mask(self.ctx.engine) if self.vector == "parameters" else None
            if keep is not None:
                gap = gap[:, torch.as_tensor(keep, device=gap.device)]
            bound = (gap ** 2).sum(dim=1).cpu().numpy()
        else:
            bound = np.array([_score(self.ctx, own[r], [int(c)])[1][0] for r, c in enumerate(clients)])
        return maxfl_joins(global_loss, bound, self.margin, strict=self.threshold == "distance")

    def client_state(self) -> tuple[str, ...]:
        return ("own", "prior") if self.prior == "once" else ("own",)

    def init_state(self, n_clients: int, weights: torch.Tensor) -> AlgorithmState:
        # ŵ_i starts at the initial model, as independent training does; the round counter seeds ŵ_i's batches
        clients = {k: weights.repeat(n_clients, 1) for k in self.client_state()}
        return AlgorithmState(clients, {"round": torch.zeros((), dtype=torch.int64, device=weights.device)})

    def _threshold_model(self, state: AlgorithmState) -> torch.Tensor:
        return state.clients["prior" if self.prior == "once" else "own"]

    def begin_round(self, state, groups, members):
        t = int(state.server["round"])
        state.server["round"] = torch.tensor(t + 1, device=state.server["round"].device)
        return _MaxRound(t)

    def local_start(self, state, scratch, clients, starts, group_of):
        own, bound = state.clients["own"], self._threshold_model(state)
        new = [r for r, c in enumerate(clients.tolist()) if c not in scratch.joins]
        if new and self.prior == "once" and scratch.t == 0:   # the authors' epoch 0: one global FedAvg
            scratch.joins.update({int(clients[r]): True for r in new})
        elif new:   # the round's first group round with these clients: each decides once
            g_loss = _group_losses(self.ctx, clients, starts, group_of)[new]
            ids = clients[new]
            for r, j in zip(new, self._joins(g_loss, bound[ids], starts[new], ids.tolist())):
                scratch.joins[int(clients[r])] = bool(j)
        scratch.row_joins = torch.tensor([scratch.joins[c] for c in clients.tolist()], device=own.device)
        state.server["participants"] = torch.tensor(sum(scratch.joins.values()), device=own.device)
        scratch.clients = clients
        if self.prior == "once" and scratch.t > 0:
            # main_cluster.py: a participants' group starts from the D_i-weighted mean of the models its members hold
            starts = starts.clone()
            groups = np.asarray(group_of)
            for g in dict.fromkeys(group_of):
                rows = np.flatnonzero((groups == g) & scratch.row_joins.cpu().numpy())
                if len(rows):
                    n = torch.as_tensor(self.ctx.n_samples[clients[rows].cpu().numpy()], dtype=torch.float64)
                    starts[rows] = ((n / n.sum()) @ own[clients[rows]].double()).to(starts.dtype)
        return torch.where(scratch.row_joins[:, None], starts, own[clients])

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        own, joins = state.clients["own"], scratch.row_joins
        alone = ~joins
        own[clients[alone]] = trained[alone]                       # the model they trained is ŵ_i (or: they hold)
        if self.prior == "once":
            if scratch.t == 0 and scratch.k == 0:                  # w_prior: from the initial model, once
                engine, c0 = self.ctx.engine, int(clients[0])
                epochs = int(self.prior_epochs) or int(steps[0]) // engine.steps(c0, 1)
                seeds = [int(rng(self.ctx.seed, "maxfl-prior", int(c)).integers(2**31)) for c in clients]
                state.clients["prior"][clients] = engine.train(starts, clients.tolist(), epochs, seeds, lr=lr)
            scratch.k += 1
            return
        if joins.any():                                            # participants train ŵ_i too
            members = clients[joins]
            engine = self.ctx.engine
            c0 = int(members[0])
            epochs = int(steps[joins][0]) // engine.steps(c0, 1)
            seeds = [int(rng(self.ctx.seed, "independent", scratch.t, scratch.k, int(c)).integers(2**31))
                     for c in members]
            own[members] = engine.train(own[members], members.tolist(), epochs, seeds, lr=lr)
        scratch.k += 1

    def aggregate_group(self, state, scratch, update):
        w = update.weights * scratch.row_joins[update.rows].to(update.weights.dtype)
        if not w.sum() > 0:
            return update.start
        out = (w / w.sum()) @ update.models
        if self.prior == "once":                                   # the participants hold the aggregate
            rows = torch.arange(update.rows.start, update.rows.stop)[scratch.row_joins[update.rows].cpu()]
            state.clients["own"][scratch.clients[rows]] = out
        return out

    def round_metrics(self, state):
        got = state.server.get("participants")
        return {"maxfl_participants": float("nan") if got is None else float(got)}

    def personal_model(self, state, client, model):
        own = state.clients["own"][client]
        if self.prior == "once":                                   # main_cluster.py evaluates w_locals
            return own
        g = _score(self.ctx, model, [client])[1]
        return model if self._joins(g, own[None], model[None], [client])[0] else own


# -- FLSC -------------------------------------------------------------------------------------------

def flsc_choice(losses: np.ndarray, n_soft: int) -> np.ndarray:
    """FLSC's soft clustering: each client's N_g cluster models with the lowest losses on its
    data (clients × N_g indices, lowest loss first; ties to the lower index)."""
    return np.argsort(np.asarray(losses), axis=1, kind="stable")[:, :n_soft]


def flsc_aggregate(clusters: torch.Tensor, choice: np.ndarray, models: torch.Tensor,
                   n_samples: np.ndarray) -> torch.Tensor:
    """Each cluster model becomes the sample-weighted mean of the trained models of the clients
    that chose it; a cluster nobody chose keeps its model."""
    out = clusters.clone()
    for m in range(len(clusters)):
        rows = np.flatnonzero((choice == m).any(axis=1))
        if len(rows):
            n = torch.as_tensor(n_samples[rows], dtype=torch.float64, device=models.device)
            out[m] = ((n / n.sum()) @ models[torch.as_tensor(rows, device=models.device)].double()).to(clusters.dtype)
    return out


@dataclass
class _SoftRound:
    choice: dict[int, np.ndarray] = field(default_factory=dict)   # each client's N_g clusters this round
    rows: np.ndarray | None = None                                # the current group round's choices (batch rows)
    clients: np.ndarray | None = None
    before: torch.Tensor | None = None                            # the clusters when the group round started
    trained: torch.Tensor | None = None                           # the group round's trained models (batch rows)
    done: list[slice] = field(default_factory=list)               # batch rows aggregated so far


@algorithms.register("flsc")
@dataclass
class Flsc(Algorithm):
    """FLSC, federated learning with soft clustering (Li et al. 2022), as HCCT runs it (Sec. 7.1):
    ``n_clusters`` global models (``server_state`` ``"clusters"``; ``init = "random"``, default:
    each from its own random initialisation, IFCA's; ``"shared"``, code: the HCCT authors', all
    from the run's initial model); in every epoch each client picks the ``n_soft`` (N_g) models with the
    lowest loss on its training data (:func:`flsc_choice`), starts its local steps from their
    average (``local_start``), and every chosen model becomes the sample-weighted mean of the
    trained models of the clients that chose it (:func:`flsc_aggregate`, in ``aggregate_group``).
    A client is evaluated (``evaluate``) with the average of its N_g best models
    (``"clusters"``, default, assumed) or with the local model it trained last (``"local"``, code:
    the HCCT authors' main_cluster.py evaluates ``w_locals``; before any training, the initial
    model). The group's own model (the clients' plain sample-weighted mean) plays no role.
    Per-group mode, with ``grouping = "global"`` as HCCT (one server)."""

    n_clusters: int = 5
    n_soft: int = 2
    init: str = "random"
    evaluate: str = "clusters"
    modes: ClassVar[tuple[str, ...]] = PER_GROUP

    def __post_init__(self):
        if not isinstance(self.n_clusters, int) or self.n_clusters < 1:
            raise ValueError(f"n_clusters must be an integer >= 1, got {self.n_clusters!r}")
        if not isinstance(self.n_soft, int) or not 1 <= self.n_soft <= self.n_clusters:
            raise ValueError(f"n_soft (FLSC's N_g) must be an integer from 1 to n_clusters = {self.n_clusters}, "
                             f"got {self.n_soft!r}")
        if self.init not in ("random", "shared"):
            raise ValueError(f"init must be one of random, shared (\"shared\": every cluster model from the one "
                             f"initial model, the HCCT authors' code), got {self.init!r}")
        if self.evaluate not in ("clusters", "local"):
            raise ValueError(f"evaluate must be one of clusters, local (\"local\": each client's last trained "
                             f"model, the HCCT authors' code), got {self.evaluate!r}")

    def client_state(self) -> tuple[str, ...]:
        return ("local",) if self.evaluate == "local" else ()

    def init_state(self, n_clients: int, weights: torch.Tensor) -> AlgorithmState:
        state = super().init_state(n_clients, weights)
        if self.evaluate == "local":     # before any training a client holds the initial model
            state.clients["local"] = weights.repeat(n_clients, 1)
        return state

    def _clusters(self, state: AlgorithmState) -> torch.Tensor:
        """The cluster models, initialised on first use (the engine is needed, so not in init_state)."""
        if "clusters" not in state.server:
            seeds = [seed_of(key(self.ctx.seed, "cluster-init", m)) if self.init == "random" else self.ctx.seed
                     for m in range(self.n_clusters)]
            state.server["clusters"] = torch.stack([self.ctx.engine.initial_weights(s) for s in seeds])
        return state.server["clusters"]

    def _choose(self, clusters: torch.Tensor, clients: np.ndarray) -> np.ndarray:
        losses = np.stack([_score(self.ctx, x, clients)[1] for x in clusters], axis=1)
        return flsc_choice(losses, self.n_soft)

    def begin_round(self, state, groups, members):
        return _SoftRound()

    def local_start(self, state, scratch, clients, starts, group_of):
        clusters = self._clusters(state)
        ids = clients.cpu().numpy()
        new = np.array([c for c in ids if int(c) not in scratch.choice], dtype=np.int64)
        if len(new):
            for c, ch in zip(new, self._choose(clusters, new)):
                scratch.choice[int(c)] = ch
        scratch.rows = np.stack([scratch.choice[int(c)] for c in ids])
        scratch.clients, scratch.before, scratch.done = ids, clusters.clone(), []
        return clusters[torch.as_tensor(scratch.rows, device=clusters.device)].mean(dim=1)

    def aggregate_group(self, state, scratch, update):
        # every group aggregated so far this group round counts: one cluster model may be chosen
        # by clients of several groups
        scratch.done.append(update.rows)
        rows = np.concatenate([np.arange(s.start, s.stop) for s in scratch.done])
        state.server["clusters"] = flsc_aggregate(scratch.before, scratch.rows[rows], scratch.trained[rows],
                                                  self.ctx.n_samples[scratch.clients[rows]])
        return update.weights @ update.models

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        scratch.trained = trained
        if self.evaluate == "local":
            state.clients["local"][clients] = trained

    def personal_model(self, state, client, model):
        if self.evaluate == "local":
            return state.clients["local"][client]
        clusters = self._clusters(state)
        return clusters[torch.as_tensor(self._choose(clusters, np.array([client]))[0], device=clusters.device)].mean(dim=0)


# -- HCCT-P: personalisation layers (FedPer) -----------------------------------------------------------

@algorithms.register("fedper")
@dataclass
class FedPer(Algorithm):
    """Personalisation layers (FedPer, Arivazhagan et al. 2019; HCCT's HCCT-P with the ``hcct``
    grouping, HCCT Sec. 5.3): the last ``personal_layers`` layers of the model (the classifier)
    stay with each client. A client starts every group round from its group's model with its own
    classifier (``local_start``) and keeps the classifier it trained (``after_local``); the group
    averages whole models as FedAvg does, but only the shared layers of the mean reach a client.
    Each client is evaluated with its group's shared layers and its own classifier
    (``personal_model``). The classifiers (``client_state`` ``"own"``: full rows, of which the
    classifier's range is used) start from the initial model's. Per-group mode.

    ``swap`` says where the own classifier enters: ``"train"`` (default; paper: FedPer [23], as
    above) or ``"evaluate"`` (code: the HCCT authors' main_cluster.py with ``personalize = 1``):
    every client trains from its group's whole model, FedAvg's, and keeps the classifier it
    trained; only at evaluation are the group's last ``personal_layers`` layers swapped for it.

    ``regroup`` says what a member brings into a group that HCCT re-forms (Alg. 1 line 15):
    ``"group"`` (default; paper: the model of its old group) or ``"own"`` (code: the HCCT
    authors' main_cluster.py with ``personalize = 1`` keeps in ``w_locals`` the group's model with
    the member's own last layer, and averages those): the new group starts from its members' own
    classifiers, where ``"group"`` averages their old groups' (those of members that left included)."""

    personal_layers: int = 1
    swap: str = "train"
    regroup: str = "group"
    modes: ClassVar[tuple[str, ...]] = PER_GROUP

    def __post_init__(self):
        if not isinstance(self.personal_layers, int) or self.personal_layers < 1:
            raise ValueError(f"personal_layers must be an integer >= 1, got {self.personal_layers!r}")
        if self.swap not in ("train", "evaluate"):
            raise ValueError(f"swap must be one of train, evaluate (\"evaluate\": train as FedAvg, swap in the own "
                             f"classifier only to evaluate, the HCCT authors' code), got {self.swap!r}")
        if self.regroup not in ("group", "own"):
            raise ValueError(f"regroup must be one of group, own (\"own\": a re-formed group starts from its members' "
                             f"own classifiers, the HCCT authors' code), got {self.regroup!r}")

    def bind(self, ctx: AlgorithmContext) -> None:
        super().bind(ctx)
        layers = layer_slices(ctx.engine)
        if not layers or self.personal_layers >= len(layers):
            raise InputError(f"train.algorithm_params.personal_layers: {self.personal_layers} leaves no shared layer "
                             f"of a model with {len(layers or ())} layers; use fewer")
        self.head = slice(layers[-self.personal_layers].start, layers[-1].stop)

    def init_state(self, n_clients: int, weights: torch.Tensor) -> AlgorithmState:
        return AlgorithmState({"own": weights.repeat(n_clients, 1)}, {})

    def local_start(self, state, scratch, clients, starts, group_of):
        if self.swap == "evaluate":
            return None
        out = starts.clone()
        out[:, self.head] = state.clients["own"][clients][:, self.head]
        return out

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        state.clients["own"][clients, self.head] = trained[:, self.head]

    def personal_model(self, state, client, model):
        out = model.clone()
        out[self.head] = state.clients["own"][client, self.head]
        return out

    def member_models(self, state, clients, models):
        if self.regroup == "group":
            return None
        out = models.clone()
        out[:, self.head] = state.clients["own"][torch.as_tensor(clients, device=out.device)][:, self.head]
        return out


__all__ = ["FedFA", "MaxFL", "Flsc", "FedPer", "fedfa_weights", "maxfl_joins", "flsc_choice", "flsc_aggregate"]
