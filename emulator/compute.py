"""The compute of global rounds, apart from simulated time.

A round's membership, dropouts and seeds are fixed before it runs (per-event seeds), so for each
group round k one engine call trains every surviving client of every sampled group, each from its
own group's model (Alg. 1, Lines 10-13) unless the algorithm gives it its own (``local_start``),
and the groups then aggregate over their survivors (Line 14). The SimPy processes of
:mod:`groupfel.emulator.federation` replay the same round's time and charges without touching torch. What
clients optimise and how models aggregate is the training algorithm's (:mod:`groupfel.emulator.algorithms`):
this module calls its hooks and names none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .algorithms import Algorithm, AlgorithmState, FedAvg, GroupUpdate
from .config import FaultsConfig
from .federation import Group, client_seeds, draw_faults
from .training import TrainingEngine


@dataclass(frozen=True)
class LocalSpec:
    """What every client does in a round (besides the engine's own lr, momentum, μ)."""

    seed: int
    group_rounds: int           # K
    local_epochs: int           # E
    lr: float                   # this round's learning rate (after train.lr_decay)
    faults: FaultsConfig | None = None
    offline: frozenset[tuple[int, int]] = frozenset()   # (group round, client): offline, left its group


def run_group_rounds(engine: TrainingEngine, starts: dict[int, torch.Tensor], groups: dict[int, Group], t: int,
                     spec: LocalSpec, algorithm: Algorithm | None = None, state: AlgorithmState | None = None,
                     scratch: Any = None, momentum: torch.Tensor | None = None,
                     uploads: dict[int, torch.Tensor] | None = None,
                     trained: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """K group rounds of round ``t`` for every group in ``groups``, each from its own start model
    (global mode: x_t for every group; per-group mode: each group's own). Returns each group's
    model x^g_{t,K}. ``algorithm`` (default FedAvg) with its ``state`` and this round's ``scratch``
    (from :meth:`Algorithm.begin_round`) corrects the clients' steps and aggregates the groups.
    ``momentum`` (N × P), if given, holds every client's optimiser momentum across rounds
    (``train.client_state = "persistent"``). ``uploads``, if given, receives each client's update
    (start − trained model) of the last group round it trained in: the gradient it uploaded (HCCT
    Alg. 1 lines 11, 18), up to the factor lr; ``trained``, if given, receives each client's model
    after the last group round it trained in (its local model, FeSEM's E-step)."""
    algorithm = algorithm or FedAvg()
    state = state or AlgorithmState()
    x = dict(starts)
    order = list(groups)
    full_weights: dict[int, torch.Tensor] = {}            # Line 14's weights with every member alive
    steps_of: dict[int, int] = {}                         # each client's τ_i this round
    starts_buf: torch.Tensor | None = None
    # the round's clients' momentum, gathered once and written back once (not at every group round)
    everyone = [int(c) for gid in order for c in groups[gid].clients]
    if momentum is not None:
        round_idx = torch.as_tensor(everyone, device=momentum.device)
        round_momentum = momentum.index_select(0, round_idx)
        row_in_round = {c: i for i, c in enumerate(everyone)}
    for k in range(spec.group_rounds):
        members, rows, group_of, alive_of = [], [], [], {}
        live, starts_k, row_of = [], [], {}               # groups with a survivor; distinct start models
        for gid in order:
            g = groups[gid]
            dropped, _ = draw_faults(spec.faults, spec.seed, t, k, g.clients)
            if spec.offline:
                dropped = dropped | np.array([(k, int(c)) in spec.offline for c in g.clients], dtype=bool)
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
            group_of.extend([gid] * n_alive)
            live.append(gid)
        if not members:
            continue
        seeds = client_seeds(spec.seed, t, k, np.asarray(members)).tolist()
        table = torch.stack(starts_k)
        dev = table.device
        idx = torch.as_tensor(members, device=dev)
        if type(algorithm).local_start is not Algorithm.local_start:   # one start model per client
            own = algorithm.local_start(state, scratch, idx, table[torch.as_tensor(rows, device=dev)], group_of)
            if own is not None:
                table, rows = own, list(range(len(members)))
        correction = algorithm.correction(state, scratch, idx, group_of)
        client_momentum, at = None, None
        if momentum is not None:
            if members == everyone:          # no one dropped: the round's rows, as they are
                client_momentum = round_momentum
            else:
                at = torch.as_tensor([row_in_round[c] for c in members], device=momentum.device)
                client_momentum = round_momentum.index_select(0, at)
        local = algorithm.local_update(engine, state, scratch, table, members, rows, spec.local_epochs, seeds,
                                       spec.lr, correction, client_momentum)
        if at is not None:
            round_momentum.index_copy_(0, at, client_momentum)
        if uploads is not None:
            for r, c in enumerate(members):
                uploads[c] = table[rows[r]] - local[r]
        if trained is not None:
            for r, c in enumerate(members):
                trained[c] = local[r].clone()
        if type(algorithm).after_local is not Algorithm.after_local:   # FedAvg skips the gather
            for c in members:
                if c not in steps_of:
                    steps_of[c] = engine.steps(c, spec.local_epochs)
            steps = torch.tensor([steps_of[c] for c in members], dtype=local.dtype, device=dev)
            # one start model (global mode's first group round): every row a view of it, not a copy
            if not algorithm.reads_starts:
                starts_k = None
            elif len(table) == 1:
                starts_k = table.expand(len(rows), -1)
            else:   # the round's one table of start rows, rewritten at each group round
                if starts_buf is None or len(starts_buf) < len(rows):
                    starts_buf = torch.empty((len(everyone), table.shape[1]), dtype=table.dtype, device=dev)
                starts_k = torch.index_select(table, 0, torch.as_tensor(rows, device=dev), out=starts_buf[:len(rows)])
            algorithm.after_local(state, scratch, idx, starts_k, local, steps, spec.lr, correction)
        pos = 0
        for gid in live:
            g, alive = groups[gid], alive_of[gid]
            if alive is None:
                if gid not in full_weights:
                    full_weights[gid] = torch.as_tensor(g.n_samples / g.n_samples.sum(), dtype=local.dtype, device=dev)
                w = full_weights[gid]
            else:
                n = g.n_samples[alive]
                w = torch.as_tensor(n / n.sum(), dtype=local.dtype, device=dev)
            rows_g = slice(pos, pos + len(w))
            x[gid] = algorithm.aggregate_group(state, scratch, GroupUpdate(gid, g.n_samples, alive, w, local[rows_g],
                                                                            rows_g, x[gid]))
            pos += len(w)
    if momentum is not None:
        momentum.index_copy_(0, round_idx, round_momentum)
    return x
