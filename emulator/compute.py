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
c_i⁺ = c_i − c_g + (x_g − y_i) / (τ_i·lr) (τ_i its local steps) and c_g moves by the
sample-weighted mean of its survivors' c_i⁺ − c_i, next to x_g. The cloud aggregates the c_g with
the same weights as the models (:func:`aggregate_control`).
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
                     control: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """K group rounds of round ``t`` for every group in ``groups``, each from its own start model
    (global mode: x_t for every group; per-group mode: each group's own). Returns each group's
    model x^g_{t,K}. SCAFFOLD: ``control`` holds each group's starting variate and is updated in
    place to its c_g after the K group rounds; ``clients.variates`` are updated."""
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
            if scaffold:
                control[gid] = control[gid] + w @ delta[pos:pos + len(w)]
            pos += len(w)
    return x


def aggregate_control(c: torch.Tensor, control: dict[int, torch.Tensor], chosen: np.ndarray,
                      weights: np.ndarray) -> torch.Tensor:
    """The cloud's SCAFFOLD variate: c moves by the aggregation-weighted changes of the groups'
    variates (the weights of Line 15 / Eq. 4 / Eq. 39, as for the models)."""
    return c + sum(float(w) * (control[int(g)] - c) for w, g in zip(weights, chosen))
