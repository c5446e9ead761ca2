"""The compute of global rounds, apart from simulated time.

A round's membership, dropouts and seeds are fixed before it runs (per-event seeds), so for each
group round k one engine call trains every surviving client of every sampled group, each from its
own group's model (Alg. 1, Lines 10-13), and the groups then aggregate over their survivors
(Line 14). The SimPy processes of :mod:`emulator.federation` replay the same round's time and
charges without touching torch.

Algorithms (``train.algorithm``): FedAvg and FedProx differ only in the local objective (the
engine's ``mu``). SCAFFOLD (Karimireddy et al. 2020, Alg. 1, option II) keeps a control variate
c_i for every client across rounds, sampled or not, and a server variate c at the cloud. In the
hierarchy a group plays SCAFFOLD's server for its K group rounds: its variate c_g starts at the
cloud's c; client i trains with gradient correction c_g − c_i, then sets
c_i⁺ = c_i − c_g + (x_g − y_i) / (τ_i·lr) (τ_i its local steps).

The variates are means weighted **by samples** at both levels (SCAFFOLD's uniform 1/N is the
case of equal n_i): SCAFFOLD's server step c ← c + (1/N) Σ_{i∈S} Δc_i keeps c the mean of all N
clients' c_i, sampled or not. In the hierarchy a group's c_g moves, after each group round, by
Σ_{i∈survivors} (n_i/n_g) (c_i⁺ − c_i) with n_g the samples of all of its members (a dropped
member's c_i does not change and counts as a zero change); the cloud's c moves, after the round,
by Σ_{i∈sampled} (n_i/n) (c_i⁺ − c_i) with n the samples of all N clients of the topology
(:func:`aggregate_control`). So c is always Σ_i (n_i/n) c_i over every client, however few groups
a round samples, whoever drops out, and across a resume (c and every c_i are checkpointed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import FaultsConfig
from .federation import Group, client_seeds, draw_faults
from .training import TrainingEngine

ALGORITHMS = ("fedavg", "fedprox", "scaffold")


@dataclass(frozen=True)
class LocalSpec:
    """What every client does in a round (besides the engine's own lr, momentum, μ)."""

    seed: int
    group_rounds: int           # K
    local_epochs: int           # E
    lr: float                   # this round's learning rate (after train.lr_decay)
    algorithm: str = "fedavg"
    faults: FaultsConfig | None = None


@dataclass
class ClientState:
    """What clients keep across rounds: SCAFFOLD variates c_i and, with
    ``train.client_state = "persistent"``, their optimiser's momentum buffers. (N, P) or None."""

    variates: torch.Tensor | None = None
    momentum: torch.Tensor | None = None

    @classmethod
    def create(cls, n_clients: int, n_params: int, scaffold: bool, persistent_momentum: bool) -> ClientState:
        zeros = lambda: torch.zeros(n_clients, n_params)  # noqa: E731
        return cls(zeros() if scaffold else None, zeros() if persistent_momentum else None)

    def state(self) -> dict:
        return {"variates": self.variates, "momentum": self.momentum}

    @classmethod
    def from_state(cls, blob: dict) -> ClientState:
        return cls(blob["variates"], blob["momentum"])


def run_group_rounds(engine: TrainingEngine, starts: dict[int, torch.Tensor], groups: dict[int, Group], t: int,
                     spec: LocalSpec, clients: ClientState | None = None,
                     control: dict[int, torch.Tensor] | None = None,
                     uploads: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """K group rounds of round ``t`` for every group in ``groups``, each from its own start model
    (global mode: x_t for every group; per-group mode: each group's own). Returns each group's
    model x^g_{t,K}. SCAFFOLD: ``control`` holds each group's starting variate and is updated in
    place to its c_g after the K group rounds; ``clients.variates`` are updated. ``uploads``, if
    given, receives each client's update (start − trained model) of the last group round it
    trained in: the gradient it uploaded (HCCT Alg. 1 lines 11, 18), up to the factor lr."""
    scaffold = spec.algorithm == "scaffold"
    if scaffold and (control is None or clients is None or clients.variates is None):
        raise ValueError("scaffold needs client variates and the groups' control variates")
    x = dict(starts)
    order = list(groups)
    full_weights: dict[int, torch.Tensor] = {}            # Line 14's weights with every member alive
    for k in range(spec.group_rounds):
        members, rows, group_rows, alive_of = [], [], [], {}
        live, starts_k, row_of = [], [], {}               # groups with a survivor; distinct start models
        for gid in order:
            g = groups[gid]
            dropped, _ = draw_faults(spec.faults, spec.seed, t, k, g.clients)
            alive = ~dropped
            if not alive.any():
                continue                                  # the group keeps x_g
            alive_of[gid] = None if not dropped.any() else alive
            # global mode's first group round starts every group from the same x_t: send it once
            row = row_of.setdefault(id(x[gid]), len(starts_k))
            if row == len(starts_k):
                starts_k.append(x[gid])
            n_alive = int(alive.sum())
            members.extend(g.clients[alive].tolist())
            rows.extend([row] * n_alive)
            group_rows.extend([len(live)] * n_alive)
            live.append(gid)
        if not members:
            continue
        seeds = client_seeds(spec.seed, t, k, np.asarray(members)).tolist()
        table = torch.stack(starts_k)
        idx = torch.as_tensor(members)
        correction = None
        if scaffold:
            c_table = torch.stack([control[gid] for gid in live])
            correction = c_table[torch.as_tensor(group_rows)] - clients.variates[idx]
        momentum = clients.momentum[idx] if clients is not None and clients.momentum is not None else None
        local = engine.train(table, members, spec.local_epochs, seeds, lr=spec.lr, correction=correction,
                             momentum=momentum, rows=rows)
        if momentum is not None:
            clients.momentum[idx] = momentum
        if uploads is not None:
            for r, c in enumerate(members):
                uploads[c] = table[rows[r]] - local[r]
        if scaffold:
            tau = torch.tensor([engine.steps(c, spec.local_epochs) for c in members], dtype=local.dtype)
            new = -correction + (table[torch.as_tensor(rows)] - local) / (tau[:, None] * spec.lr)
            delta = new - clients.variates[idx]
            clients.variates[idx] = new
        pos = 0
        for gid in live:
            g, alive = groups[gid], alive_of[gid]
            if alive is None:
                if gid not in full_weights:
                    full_weights[gid] = torch.as_tensor(g.n_samples / g.n_samples.sum(), dtype=local.dtype)
                w = full_weights[gid]
            else:
                n = g.n_samples[alive]
                w = torch.as_tensor(n / n.sum(), dtype=local.dtype)
            x[gid] = w @ local[pos:pos + len(w)]          # Line 14 over the survivors
            if scaffold:   # the survivors' changes over all members (a dropped member: no change)
                n = torch.as_tensor(g.n_samples, dtype=torch.float64)
                share = (n / n.sum())[torch.as_tensor(alive)] if alive is not None else n / n.sum()
                control[gid] = control[gid] + (share @ delta[pos:pos + len(w)].double()).to(delta.dtype)
            pos += len(w)
    return x


def aggregate_control(c: torch.Tensor, variates: torch.Tensor, before: torch.Tensor, sampled: np.ndarray,
                      n_samples: np.ndarray) -> torch.Tensor:
    """The cloud's SCAFFOLD variate after a round (SCAFFOLD Alg. 1, server update, by samples):
    c + Σ_{i∈S} (n_i/n) (c_i⁺ − c_i), with S the clients of the sampled groups, ``before`` their
    variates c_i when the round started (rows in the order of ``sampled``), ``variates`` every
    client's after it, and n the samples of all N clients (``n_samples``). Keeps c the
    sample-weighted mean of every client's c_i."""
    idx = torch.as_tensor(np.asarray(sampled, dtype=np.int64))
    share = torch.as_tensor(n_samples[sampled] / n_samples.sum(), dtype=torch.float64)
    return c + (share @ (variates[idx] - before).double()).to(c.dtype)
