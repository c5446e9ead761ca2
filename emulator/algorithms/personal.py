"""FedCollab's Table 1 base algorithms beyond FedAvg and FedProx: FedNova, and the personalised
methods Finetune, Per-FedAvg, pFedMe and Ditto, written through the hooks of
:class:`groupfel.emulator.algorithms.Algorithm` as a plug-in would be.

Each runs alone (per-group mode with one group: ``grouping.policy = "global"``) or "+FedCollab"
(per-group mode with ``grouping.policy = "fedcollab"``: the method runs inside each coalition).
The personalised ones evaluate each client with its own model (:meth:`Algorithm.personal_model`),
so they run in per-group mode; FedNova runs in both modes. Every extra client computation is
charged as Eq. 5 training: extra passes per group round in ``training_passes``, the work an
evaluation's personal models take in ``evaluation_passes``.

The steps these methods take besides the engine's local SGD (pFedMe's inner problem, Per-FedAvg's
two-batch step, Ditto's personal model) are plain minibatch SGD on ``engine.model`` with the
engine's batch size, shuffling and weight decay (no momentum), one client after another.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .base import Algorithm, AlgorithmContext, AlgorithmState, GroupUpdate, algorithms
from groupfel.errors import InputError
from ..rng import key, seed_of
from ..training import load_flat


# the most fine-tuning epochs or steps, or inner steps, per client and call: train.local_epochs's bound
MAX_STEPS = 10**4


def _positive(name: str, value: float, strict: bool = True) -> None:
    if not (value > 0 if strict else value >= 0):
        raise ValueError(f"{name} must be {'>' if strict else '>='} 0, got {value!r}")


def _batches(engine: Any, client: int, epochs: int, seed: int) -> Iterator[torch.Tensor]:
    """The client's minibatches (sample indices) over ``epochs`` epochs, shuffled as the engine does."""
    idx = engine.client_samples[client]
    gen = torch.Generator().manual_seed(int(seed))
    for _ in range(epochs):
        order = idx[torch.randperm(len(idx), generator=gen, device="cpu").to(idx.device)]   # the generator is a CPU one
        for b in range(0, len(order), engine.batch_size):
            yield order[b:b + engine.batch_size]


def _grad(engine: Any, w: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """∇ of the mean cross-entropy on ``batch`` at the flat model ``w``, plus weight decay wd·w."""
    params = list(engine.model.parameters())
    load_flat(params, w)
    for p in params:
        p.grad = None
    engine.model.train()
    x = engine.x[batch]
    if engine.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    F.cross_entropy(engine.model(x), engine.y[batch]).backward()
    g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    return g + engine.weight_decay * w if engine.weight_decay else g


def _personal_seed(seed: int) -> int:
    """A second batch order for a client whose training seed is ``seed`` (the ``personal`` stream)."""
    return seed_of(key(int(seed), "personal"))


def _plain_sgd_only(ctx: AlgorithmContext, name: str) -> None:
    if getattr(ctx.engine, "optimizer", "sgd") != "sgd":
        raise InputError(f"train.optimizer: {name}'s local steps are plain SGD (its paper's update rule); set "
                         f"optimizer = \"sgd\"")
    if getattr(ctx.engine, "momentum", 0.0):
        raise InputError(f"train.momentum: {name}'s local steps are plain SGD (its paper's update rule); set "
                         f"momentum = 0")


# -- FedNova -------------------------------------------------------------------------------------

@algorithms.register("fednova")
@dataclass
class FedNova(Algorithm):
    """FedNova (Wang et al. 2020, Eq. 6, "normalized averaging") at the group level.

    Client i runs τ_i local SGD steps (τ_i = E·⌈n_i/B⌉ differs with n_i: quantity shift) and
    its normalised update is d_i = (x_g − y_i)/‖a_i‖₁, with ‖a_i‖₁ = τ_i for plain SGD and
    (τ_i − ρ(1 − ρ^τ_i)/(1 − ρ))/(1 − ρ) with momentum ρ. The group steps
    x_g ← x_g − τ_eff Σ_i p_i d_i, τ_eff = Σ_i p_i ‖a_i‖₁, p_i = n_i / Σ n_i over the survivors,
    so every client's objective counts by its data, not by its steps. With equal τ_i it is
    FedAvg. The cloud (global mode) averages the groups' models as FedAvg does.
    """

    def bind(self, ctx):
        if getattr(ctx.engine, "optimizer", "sgd") != "sgd":   # ‖a_i‖₁ is defined for SGD's steps only
            raise InputError("train.optimizer: FedNova normalises SGD's local steps (with momentum or without); "
                             "set optimizer = \"sgd\"")
        super().bind(ctx)

    def begin_round(self, state, groups, members):
        return {}

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        rho = float(self.ctx.engine.momentum) if hasattr(self, "ctx") else 0.0   # unbound: a bare test
        scratch["a"] = steps if not rho else (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)

    def aggregate_group(self, state: AlgorithmState, scratch: Any, update: GroupUpdate) -> torch.Tensor:
        a = scratch["a"][update.rows].to(update.models.dtype)
        p = update.weights
        d = (update.start - update.models) / a[:, None]            # normalised updates d_i
        return update.start - (p @ a) * (p @ d)


# -- Finetune ------------------------------------------------------------------------------------

@algorithms.register("finetune")
@dataclass
class Finetune(Algorithm):
    """Finetune (FedCollab Sec. 5.2): FedAvg, and each client evaluates its group's model after
    fine-tuning it locally for ``epochs`` epochs of SGD on its own training data (the engine's
    lr, batch size and weight decay; its batch order from the ``finetune`` stream). The
    fine-tuning is charged at every evaluation (``evaluation_passes`` = epochs, × H_i(n_i)).

    ``steps`` (code: FedCollab's authors fine-tune for 2 minibatch steps; FedCollab's text
    gives no length) replaces the epochs by that many plain minibatch SGD steps (the engine's
    lr, batch size and weight decay, no momentum), charged as one epoch, an upper bound."""

    epochs: int = 1
    steps: int | None = None
    modes: ClassVar[tuple[str, ...]] = ("per-group",)

    def __post_init__(self):
        if not (isinstance(self.epochs, int) and 1 <= self.epochs <= MAX_STEPS):
            raise ValueError(f"epochs must be an integer from 1 to {MAX_STEPS:,}, got {self.epochs!r}")
        if self.steps is not None and not (isinstance(self.steps, int) and 1 <= self.steps <= MAX_STEPS):
            raise ValueError(f"steps must be an integer from 1 to {MAX_STEPS:,} (FedCollab's code: 2), "
                             f"got {self.steps!r}")

    @property
    def evaluation_passes(self) -> float:   # type: ignore[override]
        return float(self.epochs) if self.steps is None else 1.0

    def personal_model(self, state, client, model):
        seed = seed_of(key(self.ctx.seed, "finetune", client))
        engine = self.ctx.engine
        if self.steps is None:
            return engine.train(model, [client], self.epochs, [seed])[0]
        w = model.clone()
        per_epoch = -(-len(engine.client_samples[client]) // engine.batch_size)
        batches = _batches(engine, client, -(-self.steps // per_epoch), seed)
        for _, batch in zip(range(self.steps), batches):
            w = w - engine.lr * _grad(engine, w, batch)
        return w


# -- Per-FedAvg ----------------------------------------------------------------------------------

@algorithms.register("perfedavg")
@dataclass
class PerFedAvg(Algorithm):
    """Per-FedAvg (Fallah et al. 2020, Alg. 1, first-order version).

    A local step on two independent minibatches D, D' of the client's data (its training seed
    and the ``personal`` stream):  w̃ = w − α ∇f_i(w; D),  w ← w − β ∇f_i(w̃; D'), with β the
    round's lr: τ_i such steps per group round, two gradients each (``training_passes`` = 2).
    Groups average as FedAvg. A client is evaluated with its one-step adaptation
    w − α ∇f_i(w) of its group's model, the gradient over its whole training set
    (``evaluation_passes`` = 1).

    ``batches``: ``"independent"`` (default; paper: Fallah et al. Alg. 1, D and D' drawn
    independently), ``"halves"`` (each minibatch split, D its first ⌈n/2⌉ samples and D' the
    rest; every sample then takes one gradient a step, ``training_passes`` = 1) or ``"authors"``
    (code: baowenxuan/FedCollab src/algorithm/PerFedAvg.py and LocalFinetune.py, all of it:
    minibatches under 4 samples skipped, D the first ⌊n/2⌋ samples, α = the round's lr (their
    optimiser's lm_lr takes both steps; ``alpha`` is not used), and a client evaluated with one
    minibatch step at the lr from its group's model, its first shuffled minibatch)."""

    alpha: float = 0.01
    batches: str = "independent"
    evaluation_passes: ClassVar[float] = 1.0
    modes: ClassVar[tuple[str, ...]] = ("per-group",)

    def __post_init__(self):
        _positive("alpha", self.alpha)
        if self.batches not in ("independent", "halves", "authors"):
            raise ValueError(f"batches must be one of independent, halves, authors (\"authors\": FedCollab's "
                             f"PerFedAvg.py), got {self.batches!r}")

    @property
    def training_passes(self) -> float:   # type: ignore[override]
        return 2.0 if self.batches == "independent" else 1.0

    def bind(self, ctx):
        _plain_sgd_only(ctx, "perfedavg")
        super().bind(ctx)

    def local_update(self, engine, state, scratch, table, clients, rows, epochs, seeds, lr, correction, momentum):
        out = torch.empty(len(clients), table.shape[1], dtype=table.dtype, device=table.device)
        for i, (c, s) in enumerate(zip(clients, seeds)):
            w = table[rows[i]].clone()
            alpha = lr if self.batches == "authors" else self.alpha
            if self.batches == "halves":
                pairs = ((b[:(len(b) + 1) // 2], b[(len(b) + 1) // 2:]) for b in _batches(engine, c, epochs, s))
            elif self.batches == "authors":   # PerFedAvg.py: `if len(Y) < 4: continue`, pivot = len(Y) // 2
                pairs = ((b[:len(b) // 2], b[len(b) // 2:]) for b in _batches(engine, c, epochs, s) if len(b) >= 4)
            else:
                pairs = zip(_batches(engine, c, epochs, s), _batches(engine, c, epochs, _personal_seed(s)))
            for d, d2 in pairs:
                if not len(d2):   # a one-sample minibatch has no second half
                    continue
                adapted = w - alpha * _grad(engine, w, d)
                w = w - lr * _grad(engine, adapted, d2)
            out[i] = w
        return out

    def personal_model(self, state, client, model):
        engine = self.ctx.engine
        if self.batches == "authors":   # LocalFinetune.py's local_personalize, finetune_steps = 1
            batch = next(_batches(engine, client, 1, seed_of(key(self.ctx.seed, "finetune", client))))
            return model - engine.lr * _grad(engine, model, batch)
        return model - self.alpha * _grad(engine, model, engine.client_samples[client])


# -- pFedMe --------------------------------------------------------------------------------------

@algorithms.register("pfedme")
@dataclass
class PFedMe(Algorithm):
    """pFedMe (Dinh et al. 2020, Alg. 1): personalisation through Moreau envelopes.

    For each minibatch D of its τ_i local steps a client approximately solves
    θ_i = argmin_θ f_i(θ; D) + λ/2 ‖θ − w‖² with K (``inner_steps``) gradient steps of size
    ``personal_lr`` (θ ← θ − personal_lr·(∇f_i(θ; D) + λ(θ − w)); θ starts at the model it
    received and carries over between minibatches, as in the authors' code), then moves its
    local model w ← w − η λ (w − θ_i), η the round's lr: K gradients per step
    (``training_passes`` = K). The group mixes x_g ← (1 − β) x_g + β Σ_i p_i w_i. A client is
    evaluated with its personal model θ_i of its last step (its group's model until it trains).

    ``theta``: ``"carry"`` (default; code: Dinh et al.'s public code carries θ between
    minibatches, where their Alg. 1 leaves it open) or
    ``"reset"`` (code: FedCollab's authors restart θ at the local model w for every minibatch).
    """

    lam: float = 15.0
    inner_steps: int = 5
    personal_lr: float = 0.05
    beta: float = 1.0
    theta: str = "carry"
    modes: ClassVar[tuple[str, ...]] = ("per-group",)

    def __post_init__(self):
        if self.theta not in ("carry", "reset"):
            raise ValueError(f"theta must be one of carry, reset (\"reset\": θ restarts at w every minibatch, "
                             f"FedCollab's code), got {self.theta!r}")
        _positive("lam", self.lam)
        _positive("personal_lr", self.personal_lr)
        _positive("beta", self.beta)
        if not (isinstance(self.inner_steps, int) and 1 <= self.inner_steps <= MAX_STEPS):
            raise ValueError(f"inner_steps must be an integer from 1 to {MAX_STEPS:,}, got {self.inner_steps!r}")

    @property
    def training_passes(self) -> float:   # type: ignore[override]
        return float(self.inner_steps)

    def bind(self, ctx):
        _plain_sgd_only(ctx, "pfedme")
        super().bind(ctx)

    def client_state(self) -> tuple[str, ...]:
        return ("personal",)

    def init_state(self, n_clients: int, weights: torch.Tensor) -> AlgorithmState:
        state = super().init_state(n_clients, weights)
        state.server["trained"] = torch.zeros(n_clients, device=weights.device)        # whose θ_i exists
        return state

    def local_update(self, engine, state, scratch, table, clients, rows, epochs, seeds, lr, correction, momentum):
        out = torch.empty(len(clients), table.shape[1], dtype=table.dtype, device=table.device)
        lam, plr = self.lam, self.personal_lr
        for i, (c, s) in enumerate(zip(clients, seeds)):
            w = table[rows[i]].clone()
            theta = w.clone()
            for batch in _batches(engine, c, epochs, s):
                if self.theta == "reset":
                    theta = w.clone()
                for _ in range(self.inner_steps):
                    theta = theta - plr * (_grad(engine, theta, batch) + lam * (theta - w))
                w = w - lr * lam * (w - theta)
            state.clients["personal"][c] = theta
            state.server["trained"][c] = 1.0
            out[i] = w
        return out

    def aggregate_group(self, state, scratch, update):
        mean = update.weights @ update.models
        return mean if self.beta == 1.0 else (1 - self.beta) * update.start + self.beta * mean

    def personal_model(self, state, client, model):
        return state.clients["personal"][client] if state.server["trained"][client] else model


# -- Ditto ---------------------------------------------------------------------------------------

@algorithms.register("ditto")
@dataclass
class Ditto(Algorithm):
    """Ditto (Li et al. 2021, Alg. 1).

    Beside the global objective (here: the group's model, trained by local SGD and averaged as
    FedAvg does), each client keeps a personal model v_i, v_i = w⁰ at the start, and in every
    group round it also trains v_i for E epochs of SGD on
    f_i(v) + λ/2 ‖v − w‖²:  v ← v − η (∇f_i(v; D) + λ (v − w)), w the group's model it received
    this group round, η the round's lr, its batches from the ``personal`` stream. Two trainings
    per group round (``training_passes`` = 2). A client is evaluated with v_i.
    """

    lam: float = 0.1
    training_passes: ClassVar[float] = 2.0
    modes: ClassVar[tuple[str, ...]] = ("per-group",)

    def __post_init__(self):
        _positive("lam", self.lam, strict=False)

    def bind(self, ctx):
        _plain_sgd_only(ctx, "ditto")
        super().bind(ctx)

    def client_state(self) -> tuple[str, ...]:
        return ("personal",)

    def init_state(self, n_clients: int, weights: torch.Tensor) -> AlgorithmState:
        state = super().init_state(n_clients, weights)
        state.clients["personal"] = weights.repeat(n_clients, 1)
        return state

    def local_update(self, engine, state, scratch, table, clients, rows, epochs, seeds, lr, correction, momentum):
        trained = super().local_update(engine, state, scratch, table, clients, rows, epochs, seeds, lr, correction,
                                       momentum)
        personal = state.clients["personal"]
        for i, (c, s) in enumerate(zip(clients, seeds)):
            v, w = personal[c].clone(), table[rows[i]]
            for batch in _batches(engine, c, epochs, _personal_seed(s)):
                v = v - lr * (_grad(engine, v, batch) + self.lam * (v - w))
            personal[c] = v
        return trained

    def personal_model(self, state, client, model):
        return state.clients["personal"][client]


__all__ = ["Ditto", "FedNova", "Finetune", "PFedMe", "PerFedAvg"]
