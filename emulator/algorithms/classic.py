"""Group-FEL's own training algorithms (Group-FEL Sec. 6): FedAvg, FedProx and SCAFFOLD in the
hierarchy, written through the hooks of :class:`groupfel.emulator.algorithms.base.Algorithm` and
registered exactly as a plug-in would be."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from .base import Algorithm, algorithms


@algorithms.register("fedavg")
@dataclass
class FedAvg(Algorithm):
    """FedAvg (McMahan et al. 2017) in the hierarchy: local SGD, sample-weighted means."""


@algorithms.register("fedprox")
@dataclass
class FedProx(Algorithm):
    """FedProx (Li et al. 2020): the local loss adds μ/2‖w − x_g‖² (``mu``, also ``train.mu``)."""

    mu: float = 0.0

    def __post_init__(self):
        if not self.mu >= 0:
            raise ValueError(f"mu must be >= 0, got {self.mu!r}")

    @property
    def proximal_mu(self) -> float:
        return float(self.mu)


@dataclass
class _Round:
    control: dict[int, torch.Tensor]      # each sampled group's variate c_g
    before: torch.Tensor                  # the sampled clients' c_i when the round started
    members: np.ndarray
    delta: torch.Tensor | None = None     # the batch's c_i⁺ − c_i of the current group round
    old: torch.Tensor | None = None       # the batch's c_i, read by correction for after_local
    shares: dict = field(default_factory=dict)   # each group's n_i / n_g with every member alive
    buffers: dict = field(default_factory=dict)  # the round's row tables, reused by its group rounds
    trained_rows: torch.Tensor | None = None     # the clients whose c_i⁺ the "new" table holds

    def rows(self, name: str, n: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A table of ``n`` rows like ``like``'s, the same memory at every group round of the
        round (a fresh table of 60 × P floats cost more than the arithmetic written into it)."""
        b = self.buffers.get(name)
        if b is None or len(b) < n or b.dtype != (dtype or like.dtype):
            b = self.buffers[name] = torch.empty((max(n, len(self.members)), like.shape[1]),
                                                 dtype=dtype or like.dtype, device=like.device)
        return b[:n]   # from the table's start: aligned as a fresh one (a BLAS call may care)


@algorithms.register("scaffold")
@dataclass
class Scaffold(Algorithm):
    """SCAFFOLD (Karimireddy et al. 2020, Alg. 1, option II) in the hierarchy.

    Every client keeps a control variate c_i across rounds, sampled or not; the cloud keeps c. A
    group plays SCAFFOLD's server for its K group rounds: its variate c_g starts at the cloud's c;
    client i trains with gradient correction c_g − c_i, then sets
    c_i⁺ = c_i − c_g + (x_g − y_i) / (τ_i·lr) (τ_i its local steps).

    The variates are means weighted **by samples** at both levels (SCAFFOLD's uniform 1/N is the
    case of equal n_i): SCAFFOLD's server step c ← c + (1/N) Σ_{i∈S} Δc_i keeps c the mean of all
    N clients' c_i. In the hierarchy a group's c_g moves, after each group round, by
    Σ_{i∈survivors} (n_i/n_g) (c_i⁺ − c_i) with n_g the samples of all of its members (a dropped
    member's c_i does not change and counts as a zero change); the cloud's c moves, after the
    round, by Σ_{i∈sampled} (n_i/n) (c_i⁺ − c_i) with n the samples of all N clients. So c is always
    Σ_i (n_i/n) c_i over every client, however few groups a round samples, whoever drops out, and
    across a resume (c and every c_i are checkpointed). Its secure aggregation carries model and
    variates (``scaffold-secagg``).
    """

    group_operations: ClassVar[tuple[str, ...]] = ("scaffold-secagg",)
    modes: ClassVar[tuple[str, ...]] = ("global",)

    def client_state(self) -> tuple[str, ...]:
        return ("variates",)

    def server_state(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"control": torch.zeros_like(weights)}

    def begin_round(self, state, groups, members):
        c, variates = state.server["control"], state.clients["variates"]
        # the row tables are the run's, reused round after round (a run plays one round at a time)
        scratch = _Round({g: c for g in groups}, variates, members, buffers=self.__dict__.setdefault("_buffers", {}))
        # the rows as they were when the round started
        scratch.before = torch.index_select(variates, 0, torch.as_tensor(members, device=c.device),
                                            out=scratch.rows("before", len(members), variates))
        return scratch

    def correction(self, state, scratch, clients, group_of):
        # c_g − c_i, a group's run of rows at a time against its c_g broadcast (the same
        # differences as gathering c_g to every row first, without that copy)
        variates = state.clients["variates"]
        if (scratch.trained_rows is not None and torch.equal(scratch.trained_rows, clients)
                and scratch.buffers["new"].dtype == variates.dtype):
            # the same clients as the last group round: their c_i are the c_i⁺ it wrote, still in its table
            b = scratch.buffers
            b["old"], b["new"] = b["new"], b["old"]
            old = scratch.rows("old", len(clients), variates)
        else:
            old = torch.index_select(variates, 0, clients, out=scratch.rows("old", len(clients), variates))
        out = scratch.rows("correction", len(clients), variates)
        start = 0
        for end in [*(i for i in range(1, len(group_of)) if group_of[i] != group_of[i - 1]), len(group_of)]:
            torch.sub(scratch.control[group_of[start]], old[start:end], out=out[start:end])
            start = end
        scratch.old = old
        return out

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        # -correction + (starts - trained) / (steps·lr), in place (the same floats: x + (-c) is x - c)
        new = torch.sub(starts, trained, out=scratch.rows("new", len(trained), trained)) \
            .div_(steps[:, None] * lr).sub_(correction)
        variates = state.clients["variates"]
        old = scratch.old if scratch.old is not None else variates.index_select(0, clients)
        scratch.delta, scratch.old = torch.sub(new, old, out=old), None   # c_i⁺ − c_i, over c_i's copy
        variates.index_copy_(0, clients, new)
        scratch.trained_rows = clients

    def aggregate_group(self, state, scratch, update):
        # the survivors' changes over all members (a dropped member: no change)
        dev = update.models.device
        share = scratch.shares.get(update.gid) if update.alive is None else None   # a group's, every member alive
        if share is None:
            n = torch.as_tensor(update.n_samples, dtype=torch.float64, device=dev)
            share = (n / n.sum())[torch.as_tensor(update.alive, device=dev)] if update.alive is not None else n / n.sum()
            if update.alive is None:
                scratch.shares[update.gid] = share
        delta = scratch.delta[update.rows]
        wide = scratch.rows("delta64", len(delta), delta, torch.float64).copy_(delta)   # delta.double(), in place
        scratch.control[update.gid] = scratch.control[update.gid] + (share @ wide).to(delta.dtype)
        return update.weights @ update.models

    def aggregate_cloud(self, state, scratch, weights, models, members, n_samples):
        c = state.server["control"]
        idx = torch.as_tensor(np.asarray(members, dtype=np.int64), device=c.device)
        share = torch.as_tensor(n_samples[members] / n_samples.sum(), dtype=torch.float64, device=c.device)
        variates = state.clients["variates"]
        now = torch.index_select(variates, 0, idx, out=scratch.rows("old", len(idx), variates))
        wide = scratch.rows("delta64", len(idx), now, torch.float64).copy_(now.sub_(scratch.before))
        state.server["control"] = c + (share @ wide).to(c.dtype)
        return super().aggregate_cloud(state, scratch, weights, models, members, n_samples)
