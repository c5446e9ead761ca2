"""Group-FEL's own training algorithms (Group-FEL Sec. 6): FedAvg, FedProx and SCAFFOLD in the
hierarchy, written through the hooks of :class:`groupfel.emulator.algorithms.base.Algorithm` and
registered exactly as a plug-in would be."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from .. import tables
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
    members: np.ndarray
    idx: torch.Tensor                     # the members, on the variates' device
    before: torch.Tensor | None = None    # the members' c_i when the round started
    current: torch.Tensor | None = None   # the members' c_i as the round goes (the run's table gets them at its end)
    at: torch.Tensor | None = None        # the batch's rows in ``current`` (None: every member, in order)
    new: torch.Tensor | None = None       # the batch's c_i⁺ of the current group round
    old: torch.Tensor | None = None       # the batch's c_i (correction's, for after_local and the groups)
    runs: list[tuple[int, int]] = field(default_factory=list)   # the batch's runs of rows of one group
    table: torch.Tensor | None = None     # the group round's start models, and each row's: local_update's
    table_rows: list[int] = field(default_factory=list)
    shares: dict = field(default_factory=dict)   # each group's n_i / n_g with every member alive
    wide: torch.Tensor | None = None      # float64 changes c_i⁺ − c_i (a group's rows, or the round's)
    moved: tuple[torch.Tensor, torch.Tensor] | None = None   # a group's Σ share·change, float64 and float32
    buffers: dict = field(default_factory=dict)  # the round's row tables, reused by its group rounds

    def rows(self, name: str, n: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A table of ``n`` rows like ``like``'s, the same memory at every group round of the
        round (a fresh table of 60 × P floats cost more than the arithmetic written into it)."""
        b = self.buffers.get(name)
        if b is None or len(b) < n or b.dtype != (dtype or like.dtype):
            b = self.buffers[name] = tables.empty((max(n, len(self.members)), like.shape[1]),
                                                  dtype or like.dtype, like.device)
        return b[:n]   # from the table's start: aligned as a fresh one (a BLAS call may care)


def _wide_difference(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``a − b`` in their float32, written into the float64 ``out``: the numbers of ``(a - b).double()``.
    torch computes a float32 temporary and widens it; on a CPU, where that temporary outgrows the
    core's cache (a round's 60 rows of 19,810 floats), numpy's widening store in one pass measured
    1.8x faster, and torch 1.2x faster for a group's rows (6 of them)."""
    if out.device.type == "cpu" and a.nbytes > _CACHED:
        np.subtract(a.numpy(), b.numpy(), out=out.numpy())
        return out
    return torch.sub(a, b, out=out)


_CACHED = 1 << 20   # bytes of a float32 temporary that stay in a core's cache


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
    reads_starts: ClassVar[bool] = False   # each group's start model is broadcast to its run of rows instead

    def client_state(self) -> tuple[str, ...]:
        return ("variates",)

    def server_state(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"control": torch.zeros_like(weights)}

    def begin_round(self, state, groups, members):
        c, variates = state.server["control"], state.clients["variates"]
        # the row tables are the run's, reused round after round (a run plays one round at a time)
        buffers = self.__dict__.setdefault("_buffers", {})
        scratch = _Round({}, members, torch.as_tensor(members, device=c.device), buffers=buffers)
        # each group's c_g: a row of the round's own table, moved in place (no fresh P floats per group round)
        controls = scratch.rows("control", len(groups), c[None])
        controls.copy_(c.expand(len(groups), -1))
        scratch.control = dict(zip(groups, controls))
        # the rows as they were when the round started; the round's group rounds read them and write
        # their c_i⁺ to tables of the round's own (one gather and one write-back a round, not one of
        # each per group round), so they are copied only where a group round leaves some of them as they were
        scratch.before = torch.index_select(variates, 0, scratch.idx, out=scratch.rows("before", len(members), variates))
        scratch.current = scratch.before
        scratch.wide = scratch.rows("wide", len(members), variates, torch.float64)
        scratch.moved = (scratch.rows("moved64", 1, variates, torch.float64), scratch.rows("moved", 1, variates)[0])
        return scratch

    def correction(self, state, scratch, clients, group_of):
        # c_g − c_i, a group's run of rows at a time against its c_g broadcast (the same
        # differences as gathering c_g to every row first, without that copy)
        current = scratch.current
        if len(clients) == len(scratch.idx) and torch.equal(clients, scratch.idx):
            scratch.at, old = None, current   # every member trains: their c_i are the round's table itself
        else:
            where = {int(c): i for i, c in enumerate(scratch.members)}
            scratch.at = torch.as_tensor([where[c] for c in clients.tolist()], device=clients.device)
            old = torch.index_select(current, 0, scratch.at, out=scratch.rows("old", len(clients), current))
        out = scratch.rows("correction", len(clients), current)
        ends = [*(i for i in range(1, len(group_of)) if group_of[i] != group_of[i - 1]), len(group_of)]
        scratch.runs = list(zip([0, *ends[:-1]], ends))
        for start, end in scratch.runs:
            torch.sub(scratch.control[group_of[start]], old[start:end], out=out[start:end])
        scratch.old = old
        return out

    def local_update(self, engine, state, scratch, table, clients, rows, epochs, seeds, lr, correction, momentum):
        scratch.table, scratch.table_rows = table, rows   # after_local's start models, without a gather
        return super().local_update(engine, state, scratch, table, clients, rows, epochs, seeds, lr, correction,
                                    momentum)

    def after_local(self, state, scratch, clients, starts, trained, steps, lr, correction):
        # -correction + (starts - trained) / (steps·lr), in place (the same floats: x + (-c) is x - c),
        # each group's start model broadcast to its run of rows (the same differences as its rows).
        # Every member trained: c_i⁺ go to whichever of the round's two tables the round's c_i are not
        # in (those keep the c_i for the groups' changes); else into a table of the batch, copied to its rows
        every = scratch.at is None
        b = scratch.buffers
        if scratch.current is scratch.before:   # the first write of the round: to "current"
            spare = "current"
        else:
            spare = "spare" if scratch.current.data_ptr() == b["current"].data_ptr() else "current"
        new = scratch.rows(spare if every else "new", len(trained), trained)
        for start, end in scratch.runs:
            torch.sub(scratch.table[scratch.table_rows[start]], trained[start:end], out=new[start:end])
        new.div_(steps[:, None] * lr).sub_(correction)
        if every:
            scratch.current = new
        else:
            if scratch.current is scratch.before:
                scratch.current = scratch.rows(spare, len(scratch.members), new).copy_(scratch.before)
            scratch.current.index_copy_(0, scratch.at, new)
        scratch.new = new   # each group's c_i⁺ − c_i is taken in aggregate_group, straight into float64

    def aggregate_group(self, state, scratch, update):
        # the survivors' changes over all members (a dropped member: no change)
        dev = update.models.device
        share = scratch.shares.get(update.gid) if update.alive is None else None   # a group's, every member alive
        if share is None:
            n = torch.as_tensor(update.n_samples, dtype=torch.float64, device=dev)
            share = (n / n.sum())[torch.as_tensor(update.alive, device=dev)] if update.alive is not None else n / n.sum()
            if update.alive is None:
                scratch.shares[update.gid] = share
        r = update.rows
        wide = _wide_difference(scratch.new[r], scratch.old[r], scratch.wide[:share.shape[0]])   # c_i⁺ − c_i
        # c_g + float32(share @ wide), in c_g's row: the same product and rounding, no fresh rows
        moved64, moved = scratch.moved
        scratch.control[update.gid].add_(moved.copy_(torch.mm(share[None], wide, out=moved64)[0]))
        return update.weights @ update.models

    def aggregate_cloud(self, state, scratch, weights, models, members, n_samples):
        c = state.server["control"]
        idx = torch.as_tensor(np.asarray(members, dtype=np.int64), device=c.device)
        share = torch.as_tensor(n_samples[members] / n_samples.sum(), dtype=torch.float64, device=c.device)
        now = scratch.current
        wide = _wide_difference(now, scratch.before, scratch.wide)
        state.clients["variates"].index_copy_(0, idx, now)   # the round's c_i into the run's table
        state.server["control"] = c + (share @ wide).to(c.dtype)
        return super().aggregate_cloud(state, scratch, weights, models, members, n_samples)
