"""Training algorithms: what clients optimise, what state they keep, how groups and the cloud
aggregate, and which cost curves they are charged (``train.algorithm``).

An algorithm is a dataclass subclass of :class:`Algorithm`, registered under a short name (or
named by a config as ``"module:Class"``, or an entry point of ``groupfel.algorithms``). Its fields
are its parameters (``[train] algorithm_params``; FedProx's ``mu`` is also ``train.mu``). The
run loop calls the hooks below and names no algorithm; FedAvg, FedProx and SCAFFOLD are written
through them exactly as a plug-in would be.

Hooks, in the order a global round calls them (:func:`groupfel.emulator.compute.run_group_rounds`):

1. :meth:`Algorithm.begin_round` (once per round, the sampled groups' members known): set up the
   round's scratch state (SCAFFOLD: every group's variate c_g starts at the cloud's c).
2. :meth:`Algorithm.local_start` (each group round): the model each training client starts its
   local steps from, if not its group's (a personal classifier, a client's own model, a mix of
   cluster models).
3. :meth:`Algorithm.correction` (each group round): the client-step correction, a vector added
   to every minibatch gradient of each training client (SCAFFOLD: c_g − c_i). The engine adds
   the proximal term μ/2‖w − x_g‖² of :attr:`Algorithm.proximal_mu` itself (FedProx).
4. :meth:`Algorithm.after_local` (each group round): see each client's trained model (SCAFFOLD:
   c_i⁺ = c_i − c_g + (x_g − y_i)/(τ_i·lr)).
5. :meth:`Algorithm.aggregate_group` (each group round, each group): the group's model from its
   survivors' models (Alg. 1, Line 14: the sample-weighted mean).
6. :meth:`Algorithm.aggregate_cloud` (once per round): the cloud's model from the sampled groups'
   models and the aggregation rule's weights (Line 15, Eq. 4 / Eq. 39), and any server state.

Before the first round the driver calls :meth:`Algorithm.bind` with an :class:`AlgorithmContext`:
the engine (to train or score models on clients' data beyond the plain local steps, e.g. a
personal model) and each client's samples. An algorithm whose clients do more training than
the E local epochs of a group round declares it in :attr:`Algorithm.training_passes` (charged as
that many times E·H_i(n_i), Eq. 5). In per-group mode each client is evaluated with
:meth:`Algorithm.personal_model` (default: its group's model); client training that computing
that model takes (Finetune's fine-tuning, Per-FedAvg's adaptation step) is declared in
:attr:`Algorithm.evaluation_passes` and charged at every evaluation. An algorithm whose local
step is not (corrected, proximal) SGD (pFedMe, Per-FedAvg) replaces the clients' training of a
group round with :meth:`Algorithm.local_update` (default: the engine's local SGD).

State: :meth:`Algorithm.client_state` names per-client tensors (N × P, kept across rounds, sampled
or not) and :meth:`Algorithm.server_state` the server's; both live in :class:`AlgorithmState`,
which the run checkpoints, so a resumed run continues bitwise. Costs: :attr:`Algorithm.curve` is
the training curve H it is charged where every device profile measured one (else ``sgd``), and
:attr:`Algorithm.group_operations` the group operations O_g of Eq. 5 when the config names none.
:attr:`Algorithm.modes` names the run modes it supports.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from groupfel.policies.registry import Registry

from groupfel.errors import InputError

from .. import tables


@dataclass
class AlgorithmState:
    """An algorithm's state across rounds: per-client tensors (rows = clients) and the server's."""

    clients: dict[str, torch.Tensor] = field(default_factory=dict)
    server: dict[str, torch.Tensor] = field(default_factory=dict)

    def state(self) -> dict:
        return {"clients": dict(self.clients), "server": dict(self.server)}

    @classmethod
    def from_state(cls, blob: dict | None) -> AlgorithmState:
        blob = blob or {}
        return cls(dict(blob.get("clients") or {}), dict(blob.get("server") or {}))


@dataclass
class GroupUpdate:
    """One group's group round k, as :meth:`Algorithm.aggregate_group` sees it."""

    gid: int
    n_samples: np.ndarray          # every member's samples
    alive: np.ndarray | None       # which members trained (None: all of them)
    weights: torch.Tensor          # Line 14's weights over the survivors (their n_i / Σ n_i)
    models: torch.Tensor           # the survivors' trained models, rows in member order
    rows: slice                    # those rows in the round's batch (for state kept per batch row)
    start: torch.Tensor            # the group's model before this group round


@dataclass
class AlgorithmContext:
    """What an algorithm may use besides its hooks' arguments (:meth:`Algorithm.bind`)."""

    engine: Any                    # groupfel.emulator.training.TrainingEngine: train(...), evaluate(...), steps(...)
    n_samples: np.ndarray          # every client's training samples
    score_train: Any               # (weights, clients) -> (accuracy, loss) arrays on the clients' training data
    seed: int


@dataclass
class Algorithm:
    """Base class and FedAvg: plain local SGD, sample-weighted means at both levels."""

    name: ClassVar[str]
    curve: ClassVar[str | None] = None           # its training curve's name; None: the algorithm's name
    group_operations: ClassVar[tuple[str, ...]] = ("secagg",)
    modes: ClassVar[tuple[str, ...]] = ("global", "per-group")
    training_passes: ClassVar[float] = 1.0       # client training per group round, in units of E·H_i(n_i)
    evaluation_passes: ClassVar[float] = 0.0     # client training per per-group evaluation, in units of H_i(n_i)
    reads_starts: ClassVar[bool] = True          # after_local reads its start rows (False: they are not gathered)

    def bind(self, ctx: AlgorithmContext) -> None:
        """Called once before the first round (and on a resume) with the run's context."""
        self.ctx = ctx

    def personal_model(self, state: AlgorithmState, client: int, model: torch.Tensor) -> torch.Tensor:
        """The model client ``client`` is evaluated with in per-group mode, given its group's."""
        return model

    def member_models(self, state: AlgorithmState, clients: np.ndarray, models: torch.Tensor) -> torch.Tensor | None:
        """The models ``clients`` bring into a group re-formed by HCCT (Alg. 1 line 15's w_i, which
        the new group averages), given their old groups' ``models`` (one row each); None: those
        models as they are."""
        return None

    def round_metrics(self, state: AlgorithmState) -> dict[str, float]:
        """Columns this algorithm adds to each per-group evaluation row (MAXFL: its participants)."""
        return {}

    @property
    def proximal_mu(self) -> float:
        """μ of the proximal term μ/2‖w − x_g‖² the engine adds to the local loss (FedProx)."""
        return 0.0

    @property
    def training_curve(self) -> str:
        return self.curve or self.name

    # -- state -----------------------------------------------------------------------------------
    def client_state(self) -> tuple[str, ...]:
        """Names of the per-client tensors (N × P, zeros at the start) this algorithm keeps."""
        return ()

    def server_state(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """The server's state at the start, given the initial model."""
        return {}

    def init_state(self, n_clients: int, weights: torch.Tensor) -> AlgorithmState:
        return AlgorithmState({k: tables.empty((n_clients, weights.numel()), weights.dtype, weights.device).zero_()
                               for k in self.client_state()}, self.server_state(weights))

    # -- a round ---------------------------------------------------------------------------------
    def begin_round(self, state: AlgorithmState, groups: list[int], members: np.ndarray) -> Any:
        """Scratch state for one round of the groups ``groups`` (their clients: ``members``)."""
        return None

    def local_start(self, state: AlgorithmState, scratch: Any, clients: torch.Tensor, starts: torch.Tensor,
                    group_of: list[int]) -> torch.Tensor | None:
        """The model each training client (rows of ``clients``; ``group_of``: its group's id)
        starts this group round's local steps from, given its group's model (rows of ``starts``),
        or None: its group's model (the default; the engine is then given each group's model once).
        The client's upload and :meth:`after_local`'s ``starts`` are then relative to this model."""
        return None

    def correction(self, state: AlgorithmState, scratch: Any, clients: torch.Tensor,
                   group_of: list[int]) -> torch.Tensor | None:
        """The gradient correction of each training client (rows of ``clients``; ``group_of``: the
        id of each one's group), or None."""
        return None

    def local_update(self, engine: Any, state: AlgorithmState, scratch: Any, table: torch.Tensor,
                     clients: list[int], rows: list[int], epochs: int, seeds: list[int], lr: float,
                     correction: torch.Tensor | None, momentum: torch.Tensor | None) -> torch.Tensor:
        """Alg. 1, Lines 10-13: each training client's model after its local epochs of a group
        round, client i starting from ``table[rows[i]]`` (default: the engine's local SGD or Adam).
        ``momentum`` holds the clients' optimiser state rows (``train.client_state``), updated in
        place; None: each starts fresh."""
        return engine.train(table, clients, epochs, seeds, lr=lr, correction=correction, momentum=momentum,
                            rows=rows)

    def after_local(self, state: AlgorithmState, scratch: Any, clients: torch.Tensor, starts: torch.Tensor | None,
                    trained: torch.Tensor, steps: torch.Tensor, lr: float, correction: torch.Tensor | None) -> None:
        """Each training client's start and trained model of a group round (``steps``: its τ_i).
        ``starts`` is read-only (rows may be views of one model); None where :attr:`reads_starts`
        is False (the algorithm keeps what :meth:`local_update` was given instead)."""

    def aggregate_group(self, state: AlgorithmState, scratch: Any, update: GroupUpdate) -> torch.Tensor:
        """Alg. 1, Line 14: the sample-weighted mean of the survivors' models."""
        return update.weights @ update.models

    def aggregate_cloud(self, state: AlgorithmState, scratch: Any, weights: np.ndarray,
                        models: list[torch.Tensor], members: np.ndarray, n_samples: np.ndarray) -> torch.Tensor:
        """Line 15 / Eq. 4 / Eq. 39: Σ_g w_g x_g with the aggregation rule's weights ``weights``
        (``members``: the sampled groups' clients; ``n_samples``: every client's samples)."""
        return sum(float(w) * x for w, x in zip(weights, models))


algorithms = Registry("algorithm")
algorithms.noun = "algorithm"
algorithms.contract = (Algorithm, "aggregate_group", ("state", "scratch", "update"))


def make_algorithm(name: str, params: dict[str, Any] | None = None, mu: float = 0.0) -> Algorithm:
    """The configured algorithm (``train.algorithm``) with its parameters
    (``train.algorithm_params``; ``train.mu`` for one with a ``mu`` field), checked with one-line
    errors naming the field."""
    cls = algorithms.resolve(name, "train.algorithm")
    params = dict(params or {})
    if mu:
        if "mu" not in {f.name for f in dataclasses.fields(cls) if f.init}:
            raise InputError(f"train.mu: mu is FedProx's proximal weight and {name!r} has no mu parameter; set "
                             f"algorithm = \"fedprox\" or drop mu")
        params.setdefault("mu", mu)
    return algorithms.build(cls, name, params, "train.algorithm_params")
