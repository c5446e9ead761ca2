"""What both round strategies use: the training algorithm's state of an arm, a round's learning
rate and local-training spec, and each client's local data on the engine's device."""
from __future__ import annotations

import numpy as np
import torch

from .. import tables
from ..algorithms import Algorithm, AlgorithmContext, AlgorithmState
from ..arm import ArmState
from ..compute import LocalSpec
from ..ledger import CostLedger
from ..membership import charge_client_work
from ..training import load_flat
from ..world import World

# A forward pass costs about a third of a training step (forward + backward ≈ 3 forwards), so
# evaluating k cluster models on n_i samples ("every-round" regrouping) is charged k·H_i(n_i)/3.
FORWARD_FRACTION = 1.0 / 3.0

def round_lr(world: World, t: int) -> float:
    tc = world.config.train
    drops = t if tc.lr_decay_every is None else (t + 1) // tc.lr_decay_every
    return tc.lr * tc.lr_decay ** drops


def start_round_state(world: World, state: ArmState, t: int) -> None:
    """``client_state = "per-rate"``: every client's optimiser state starts afresh in a round whose
    learning rate differs from the last round's (the Group-FEL authors build a new optimiser)."""
    if (state.momentum is not None and world.config.train.client_state == "per-rate" and t > 0
            and round_lr(world, t) != round_lr(world, t - 1)):
        state.momentum.zero_()


def local_spec(world: World, t: int, offline: frozenset = frozenset()) -> LocalSpec:
    cfg, tc = world.config, world.config.train
    return LocalSpec(cfg.seed, tc.group_rounds, tc.local_epochs, round_lr(world, t), cfg.faults, offline)


class ArmTraining:
    """The training algorithm's state of an arm, kept in :attr:`ArmState.algorithm`."""

    def __init__(self, world: World, state: ArmState, fresh: bool, start: torch.Tensor,
                 algorithm: Algorithm | None = None):
        self.algorithm = algorithm or world.algorithm
        if fresh:
            tc = world.config.train
            if tc.client_state != "fresh" and world.engine.state_width:
                state.momentum = tables.empty((world.topology.n_clients, world.engine.state_width), torch.get_default_dtype(),
                                              world.engine.device).zero_()
            state.algorithm = self.algorithm.init_state(world.topology.n_clients, start).state()
        self.state = AlgorithmState.from_state(state.algorithm)
        self.world = world
        self.scored = np.zeros(world.topology.n_clients)   # forward passes over each client's data, not yet charged
        train_data: list[LocalData] = []

        def score_train(weights: torch.Tensor, clients) -> tuple[np.ndarray, np.ndarray]:
            if not train_data:   # built on first use: most algorithms never score
                train_data.append(LocalData(world, world.topology.client_samples))
            clients = np.asarray(clients)
            np.add.at(self.scored, clients, 1.0)
            return train_data[0].score(weights, clients)
        self.algorithm.bind(AlgorithmContext(world.engine, world.topology.n_samples, score_train, world.config.seed))

    def charge_scoring(self, ledger: CostLedger, env, t: int) -> None:
        """Charge the forward passes the algorithm ran through ``score_train`` since the last
        charge (FedFA's accuracies, MAXFL's and FLSC's losses, a plug-in's), each
        :data:`FORWARD_FRACTION` × H_i(n_i) of Eq. 5 training as IFCA's, as client work."""
        if not self.scored.any():
            return
        topo, work = self.world.topology, []
        for j in range(topo.n_edges):
            members = topo.clients_of(j)
            members = members[self.scored[members] > 0]
            if len(members):
                devices = [topo.client_device[c] for c in members]
                work.append((j, members, self.scored[members] * FORWARD_FRACTION
                             * self.world.cost.training_cost(devices, topo.n_samples[members], 1)))
        self.scored[:] = 0.0
        charge_client_work(ledger, env, topo, t, work)

    def save(self, state: ArmState) -> None:
        state.algorithm = self.state.state()


class LocalData:
    """Samples of each client (its local test split, or its training set for loss-based
    regrouping) on the engine's device, scored with ``engine.model``."""

    def __init__(self, world: World, parts: list[np.ndarray]):
        self.engine = world.engine
        device = next(world.engine.model.parameters()).device
        self.sizes = np.array([len(p) for p in parts])
        idx = np.concatenate(parts) if parts else np.empty(0, dtype=int)
        self.x = torch.from_numpy(world.dataset.x_train[idx]).to(device)
        self.y = torch.from_numpy(world.dataset.y_train[idx]).to(device)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])

    @torch.no_grad()
    def score(self, weights: torch.Tensor, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(accuracy, mean cross-entropy) of one model on each given client's samples."""
        model = self.engine.model
        load_flat(list(model.parameters()), weights)
        model.eval()
        acc, loss = np.zeros(len(clients)), np.zeros(len(clients))
        for r, c in enumerate(clients):
            a, b = self.offsets[c], self.offsets[c + 1]
            logits = model(self.x[a:b])
            y = self.y[a:b]
            acc[r] = float((logits.argmax(1) == y).float().mean())
            loss[r] = float(torch.nn.functional.cross_entropy(logits, y))
        return acc, loss

    def evaluate(self, models: torch.Tensor, assign: np.ndarray, fallback: torch.Tensor,
                 personal=None) -> tuple[np.ndarray, np.ndarray]:
        """Each client's (accuracy, loss) with the model of its group (``fallback``: no group), or
        with ``personal(client, group model)`` where given."""
        acc, loss = np.zeros(len(assign)), np.zeros(len(assign))
        for m in np.unique(assign):
            clients = np.flatnonzero(assign == m)
            model = models[m] if m >= 0 else fallback
            if personal is None:
                acc[clients], loss[clients] = self.score(model, clients)
                continue
            for c in clients:
                acc[c:c + 1], loss[c:c + 1] = self.score(personal(int(c), model), np.array([c]))
        return acc, loss
