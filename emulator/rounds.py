"""The two round strategies of the arm driver (:mod:`emulator.driver`).

**Global mode** (Group-FEL Alg. 1): the cloud samples groups, each sampled group runs K group
rounds from the global model x_t, and the cloud aggregates their models into x_{t+1} with the
arm's aggregation rule (Line 15, Eq. 4 / Eq. 39) through the training algorithm's hooks. The
global model is evaluated on the held-out test set.

**Per-group mode** (cross-silo; HCCT Alg. 1, FedCollab's training stage): every group keeps its
own model and there is no cloud aggregation across groups. Each round every group (or the groups
an arm's ``sampling`` picks) runs K group rounds from its own model, through the same
:class:`~emulator.federation.Federation` processes, so Eq. 5 is charged to the same ledger and
simulated time is the same model. Each client is evaluated on its own local test split with the
model of its group; a row reports the mean, std, min and max of the clients' local test error
(HCCT Table 5) and IPR and RSD (FedCollab Eqs. 11-12) against independent local training, which
the run trains once per seed and caches in the run directory (``local-reference-seed<seed>.pt``).

Membership follows the grouping policy's declared ``regroup`` kind
(:class:`policies.GroupingPolicy`), never its name:

* ``"interval"``: the groups of :meth:`~policies.GroupingPolicy.group`; global mode forms them
  again every ``regroup_every`` rounds (Sec. 5.2).
* ``"cluster"`` (FedCLAR): at the policy's ``cluster_round`` every client trains one probe epoch
  from its current model and each edge clusters the updates (:meth:`cluster`); every cluster then
  keeps and trains its own model (:mod:`emulator.membership`).
* ``"every-round"`` (IFCA; per-group mode): ``n_clusters`` models per edge, each from its own
  initialisation; before every round each client evaluates every model of its edge on its
  training data and joins the one :meth:`assign` picks (charged as a third of a training pass
  per model, :data:`FORWARD_FRACTION`).
* ``"merge"`` (HCCT Alg. 1; per-group mode): at t = 0 every client is its own group; at the
  start of every epoch t ≥ 1 :meth:`repartition` (Alg. 2) merges the current groups on the
  clients' gradients. Those gradients are the ones the clients uploaded while training (each
  client's last update, start − trained model, over the round's lr): Alg. 1 partitions at epoch
  t on g_i^t, which a client only has once it has trained, so we use its latest upload, the
  previous epoch's, and charge nothing (HCCT Sec. 5.1: the partition "does not incur any
  additional cost for clients"). A client with no upload yet (its group was not sampled, or it
  dropped out every time) runs a probe epoch from its current model instead, which *is* charged.
* ``"split"`` (CFL / FedCluster; per-group mode): before every round t ≥ 1, each group whose
  members all trained in round t − 1 gives their updates of that round (trained − start model,
  what they uploaded; nothing extra is charged) to :meth:`split`; each part keeps a copy of the
  group's model.
* ``"nearest"`` (FeSEM; per-group mode): ``n_clusters`` centre models per edge. Before round 0
  every client trains one charged probe epoch from the initial model, its first local model;
  :meth:`initial_centers` may seed the centres with some clients' probe models (else each centre
  has its own initialisation, as IFCA's). Before every round each client joins the centre
  :meth:`assign` picks from the L2 distances between its latest local model (its model after
  the last group round it trained in) and its edge's centres; training then makes each centre
  its members' average (the M-step). The distances are the edge server's work, not charged.

The work clients do for membership (probes, loss evaluations) is charged as training with group
and group_round −1.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from cost_models import TRAINING
from policies.cov import cov_of_counts
from policies.grouping import EdgeView

from .algorithms import Algorithm, AlgorithmContext, AlgorithmState, FedAvg
from .compute import LocalSpec, run_group_rounds
from .config import arrival_rounds
from .driver import (ArmPlan, ArmState, RoundStrategy, aggregation_weights, budget_error, input_warnings,
                     new_federation, norm_growth, sample_groups)
from .errors import DivergenceError, InputError
from .federation import Federation, Group
from .io import atomic_write
from .ledger import CostLedger
from .membership import (GroupingResult, charge_client_work, cluster_clients, cluster_groups, clusters_global_model,
                         form_groups, layer_slices, probe_models, probe_work)
from .rng import key, rng, seed_of
from .training import load_flat
from .world import World

# A global model whose norm grows this much in one round has diverged (Sec. 5.3).
DIVERGENCE_GROWTH = 100.0
# A model that learned and then lost it has collapsed (Sec. 5.3's unbiased aggregation can do this
# without a norm jump): over the last COLLAPSE_EVALS evaluations in a row, either the accuracy is
# back at chance (≤ 1/num_classes + CHANCE_MARGIN) after an earlier one reached 1/num_classes +
# LEARNED_MARGIN, or the test loss is ≥ LOSS_BLOWUP × the best earlier loss and worse than a
# uniform guess (ln num_classes). Several evaluations, so one noisy evaluation is not a collapse.
COLLAPSE_EVALS = 3
CHANCE_MARGIN = 0.05
LEARNED_MARGIN = 0.2
LOSS_BLOWUP = 3.0
# A forward pass costs about a third of a training step (forward + backward ≈ 3 forwards), so
# evaluating k cluster models on n_i samples ("every-round" regrouping) is charged k·H_i(n_i)/3.
FORWARD_FRACTION = 1.0 / 3.0
# the regroup kinds that place every client every round, so can take clients joining mid-run
ARRIVAL_KINDS = ("merge", "every-round")
REFERENCE = "local-reference-seed{seed}.pt"


def _lr(world: World, t: int) -> float:
    tc = world.config.train
    return tc.lr * tc.lr_decay ** t


def _spec(world: World, t: int) -> LocalSpec:
    cfg, tc = world.config, world.config.train
    return LocalSpec(cfg.seed, tc.group_rounds, tc.local_epochs, _lr(world, t), cfg.faults)


class _Training:
    """The training algorithm's state of an arm, kept in :attr:`ArmState.algorithm`."""

    def __init__(self, world: World, state: ArmState, fresh: bool, start: torch.Tensor,
                 algorithm: Algorithm | None = None):
        self.algorithm = algorithm or world.algorithm
        if fresh:
            tc = world.config.train
            if tc.client_state == "persistent" and tc.momentum > 0:
                state.momentum = torch.zeros(world.topology.n_clients, world.engine.n_params)
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


# -- global mode ---------------------------------------------------------------------------------

class GlobalRounds(RoundStrategy):
    """Global mode: one model, aggregated by the cloud from the sampled groups."""

    mode = "global"

    @classmethod
    def check(cls, world: World, plan: ArmPlan, where: str) -> None:
        """Refuse a budget below the first round's exact cost, before anything runs. The first
        round is known before training when grouping needs none: group, sample and price it as
        the run will. (Where grouping trains, the driver makes the same check once the groups exist.)"""
        tc = world.config.train
        if tc.budget is None or plan.grouping.needs_gradients or plan.grouping.needs_distances:
            return
        grouping = form_groups(world, plan.grouping, 0)
        _, _, chosen = sample_groups(world, plan, grouping.groups, 0)
        fed = new_federation(world, Federation.environment(), CostLedger())
        first = fed.round_cost(0, [grouping.groups[g] for g in chosen])
        if first > tc.budget:
            raise budget_error(tc.budget, first, f"arm {plan.arm.name!r}")

    def start(self, fresh: bool) -> None:
        world, plan, state = self.world, self.plan, self.state
        if fresh:
            state.weights = world.engine.initial_weights(world.config.seed)
        self.training = _Training(world, state, fresh, state.weights)
        self.every = plan.arm.regroup_every
        self.cluster_round = plan.grouping.cluster_round if plan.regroup == "cluster" else None
        every, clar = self.every, self.cluster_round
        epoch = (state.t // every) * every if every else 0
        if state.grouping is not None and state.grouping_epoch == epoch:   # a resume: the grouping in use
            grouping = GroupingResult.from_summary(world, state.grouping)
        elif clar is not None and state.t > clar:                            # a resume past it: its clusters
            epoch = clar
            grouping = GroupingResult(cluster_groups(world, plan.grouping, None, clar, self.arm_dir)[0], 0, 0)
        else:
            grouping = form_groups(world, plan.grouping, epoch, state.weights)
            state.grouping, state.grouping_epoch = grouping.summary(), epoch
        self._use(grouping)
        self.epoch, self.ran = epoch, []
        n_groups0 = state.initial_grouping["n_groups"] if state.initial_grouping else len(grouping.groups)
        state.warnings = input_warnings(world, plan, n_groups0)
        if fresh:   # results' round 0: the initial model, before anything is charged
            state.initial_grouping = grouping.summary()
            self.evaluate()
        if epoch == state.t:        # a fresh start, or a resume just before a regrouping
            charge_client_work(state.ledger, self.env, world.topology, state.t, grouping.probe)

    def _use(self, grouping: GroupingResult) -> None:
        self.grouping = grouping
        self.n_total = float(sum(g.total_samples for g in grouping.groups))

    def before_round(self, t: int) -> None:
        every, state = self.every, self.state
        if not ((every and t > 0 and t % every == 0 and t != self.epoch) or t == self.cluster_round):
            return
        self.epoch = t
        world, policy = self.world, self.plan.grouping
        if t == self.cluster_round:
            groups, work = cluster_groups(world, policy, state.weights, t, self.arm_dir)
            grouping = GroupingResult(groups, 0, 0, work)
            state.cluster_models = state.weights.repeat(len(groups), 1)   # every cluster starts from x_t
        else:
            grouping = form_groups(world, policy, t, state.weights)       # Sec. 5.2
        state.grouping, state.grouping_epoch = grouping.summary(), t
        charge_client_work(state.ledger, self.env, world.topology, t, grouping.probe)
        self._use(grouping)

    def select(self, t: int) -> list[Group]:
        S, self.log_p, self.chosen = sample_groups(self.world, self.plan, self.grouping.groups, t)
        self.state.groups_per_round = self.S = S
        return [self.grouping.groups[g] for g in self.chosen]

    def train(self, t: int) -> None:
        from policies import inclusion_log_probabilities

        world, plan, state, chosen = self.world, self.plan, self.state, self.chosen
        groups = self.grouping.groups
        log_pi = inclusion_log_probabilities(self.log_p, self.S)
        weights = aggregation_weights(plan, np.array([groups[g].total_samples for g in chosen]), log_pi[chosen],
                                      self.n_total)
        sampled = {int(g): groups[g] for g in chosen}
        members = np.concatenate([g.clients for g in sampled.values()])
        algorithm, alg_state = self.training.algorithm, self.training.state
        scratch = algorithm.begin_round(alg_state, list(sampled), members)
        clustered = state.cluster_models is not None   # after a "cluster" regroup: each cluster its own model
        starts = {g: state.cluster_models[g] if clustered else state.weights for g in sampled}
        models = run_group_rounds(world.engine, starts, sampled, t, _spec(world, t), algorithm, alg_state, scratch,
                                  state.momentum)                                  # compute, then time:
        self.fed.run_round(t, list(sampled.items()))
        self.training.charge_scoring(state.ledger, self.env, t)
        x = algorithm.aggregate_cloud(alg_state, scratch, weights, [models[int(g)] for g in chosen], members,
                                      world.topology.n_samples)               # Line 15 / Eq. 4 / Eq. 39
        if clustered:
            x = clusters_global_model(state.cluster_models, models, groups)
        self.training.save(state)
        growth = float(torch.linalg.vector_norm(x) / torch.linalg.vector_norm(state.weights))
        if not (np.isfinite(growth) and growth < DIVERGENCE_GROWTH):
            raise DivergenceError(
                f"round {t + 1}: the global model's norm {norm_growth(growth)} in one round under "
                f"{plan.aggregation.name} aggregation with {plan.sampling.name} sampling (largest weight "
                f"{weights.max():.3g}, sum {weights.sum():.3g}); use aggregation = \"stabilized\" (Eq. 39), a "
                f"flatter sampling policy, or a lower train.lr")
        state.weights, self.ran = x, chosen

    def evaluate(self, final: bool = False) -> float:
        world, plan, state = self.world, self.plan, self.state
        sampled = self.ran if state.t > 0 else []
        acc, loss = world.engine.evaluate(state.weights)
        if not np.isfinite(loss):
            raise DivergenceError(f"round {state.t}: test loss is {loss} under {plan.aggregation.name} aggregation "
                                  f"with {plan.sampling.name} sampling; lower train.lr or use aggregation = "
                                  f"\"stabilized\"")
        led, groups = state.ledger, self.grouping.groups
        training = led.by_component.get(TRAINING, 0.0)
        state.rows.append({
            "arm": plan.arm.name, "seed": world.config.seed,
            "round": state.t, "cost": led.total, "training_cost": training,
            "overhead_cost": led.total - training, "sim_time_s": state.sim_time,
            "round_time_s": state.round_time, "accuracy": acc, "loss": loss,
            "groups_sampled": len(sampled),
            "clients_sampled": int(sum(groups[g].size for g in sampled)),
            "avg_sampled_cov": float(np.mean([groups[g].cov for g in sampled])) if len(sampled) else np.nan})
        collapse = collapsed(state.rows, world.dataset.num_classes)
        if collapse:
            raise DivergenceError(
                f"round {state.t}: the model collapsed: {collapse}, under {plan.aggregation.name} aggregation with "
                f"{plan.sampling.name} sampling of {plan.grouping.name} groups; use aggregation = \"stabilized\" "
                f"(Eq. 39) or \"biased\", a flatter sampling policy, or a lower train.lr")
        return acc

    def manifest(self) -> dict:
        plan, state, every = self.plan, self.state, self.every
        return {"aggregation": plan.aggregation.description, "grouping_policy": plan.grouping.name,
                "sampling_policy": plan.sampling.name, "groups_per_round": state.groups_per_round,
                "warnings": state.warnings, "grouping": state.initial_grouping,
                "regroupings": (state.t - 1) // every if every and state.t else 0}


def collapsed(rows: list[dict], num_classes: int) -> str | None:
    """What collapsed, if the last ``COLLAPSE_EVALS`` evaluations show a collapse (see the constants)."""
    if len(rows) <= COLLAPSE_EVALS:
        return None
    before, recent = rows[:-COLLAPSE_EVALS], rows[-COLLAPSE_EVALS:]
    chance = 1.0 / num_classes
    best_acc = max(r["accuracy"] for r in before)
    if best_acc >= chance + LEARNED_MARGIN and all(r["accuracy"] <= chance + CHANCE_MARGIN for r in recent):
        accs = ", ".join(f"{r['accuracy']:.3f}" for r in recent)
        return (f"accuracy {accs} in the last {COLLAPSE_EVALS} "
                f"evaluations is back at chance ({chance:.3f}) after reaching {best_acc:.3f}")
    best_loss = min(r["loss"] for r in before)
    floor = max(LOSS_BLOWUP * best_loss, float(np.log(num_classes)))
    if all(r["loss"] >= floor for r in recent):
        losses = ", ".join(f"{r['loss']:.3g}" for r in recent)
        return (f"test loss {losses} in the last {COLLAPSE_EVALS} "
                f"evaluations is over {LOSS_BLOWUP:g}x its best ({best_loss:.3g}) and worse than a uniform guess")
    return None


# -- per-group mode --------------------------------------------------------------------------------

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


def ipr_rsd(acc: np.ndarray, local_acc: np.ndarray) -> tuple[float, float]:
    """FedCollab Eq. 11: IPR = share of clients whose accuracy beats local training's; Eq. 12:
    RSD = standard deviation (population, ddof = 0) of those accuracy gains."""
    gain = np.asarray(acc, dtype=float) - np.asarray(local_acc, dtype=float)
    return float(np.mean(gain > 0)), float(np.std(gain))


def current_groups(world: World, state: ArmState) -> dict[int, Group]:
    """The groups of the current assignment: model row -> its members."""
    topo = world.topology
    out = {}
    for m in np.unique(state.assign[state.assign >= 0]):
        clients = np.flatnonzero(state.assign == m)
        out[int(m)] = Group(state.model_edge[m], clients, topo.n_samples[clients],
                            float(cov_of_counts(topo.label_counts[clients].sum(axis=0), "std")))
    return out


def singletons(world: World) -> GroupingResult:
    """Every client its own group (local training; HCCT Alg. 1 at t = 0)."""
    topo = world.topology
    groups = [Group(j, np.array([c]), topo.n_samples[[c]],
                    float(cov_of_counts(topo.label_counts[[c]].sum(axis=0), "std")))
              for j in range(topo.n_edges) for c in topo.clients_of(j)]
    return GroupingResult(groups, 0, 0)


def _summary(world: World, state: ArmState, base: dict) -> dict:
    groups = list(current_groups(world, state).values())
    sizes = np.array([g.size for g in groups])
    return {**base, "n_groups": len(groups), "size_min": int(sizes.min()), "size_max": int(sizes.max()),
            "size_mean": float(sizes.mean()), "cov_mean": float(np.mean([g.cov for g in groups])),
            "groups": [{"edge": g.edge, "clients": g.clients.tolist(), "size": g.size,
                        "samples": g.total_samples, "cov": g.cov} for g in groups]}


def train_groups(world: World, fed: Federation, t: int, starts: dict[int, torch.Tensor], groups: dict[int, Group],
                 training: _Training | None = None, uploads: dict[int, torch.Tensor] | None = None,
                 momentum: torch.Tensor | None = None,
                 trained: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """Round t for the groups in ``starts`` ({group id: start model}): K group rounds each,
    computed by :func:`~emulator.compute.run_group_rounds`, then timed and charged by ``fed``;
    returns {group id: model}. ``uploads`` receives each client's gradient (its last update / lr),
    ``trained`` each client's local model."""
    lr = _lr(world, t)
    run = {g: groups[g] for g in starts}
    algorithm = alg_state = scratch = None
    if training is not None:
        algorithm, alg_state = training.algorithm, training.state
        members = np.concatenate([g.clients for g in run.values()]) if run else np.empty(0, dtype=np.int64)
        scratch = algorithm.begin_round(alg_state, list(run), members)
    models = run_group_rounds(world.engine, starts, run, t, _spec(world, t), algorithm, alg_state, scratch,
                              momentum, uploads, trained)
    if uploads is not None:
        for c in uploads:
            uploads[c] = uploads[c] / lr
    fed.run_round(t, [(g, groups[g]) for g in starts])
    if training is not None:
        training.charge_scoring(fed.ctx.ledger, fed.ctx.env, t)
    return models


def _reference_key(world: World) -> str:
    """What the local-training reference depends on: everything but the arms and the names."""
    cfg = json.loads(world.config.model_dump_json(exclude={"arms", "name", "output_dir"}))
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def local_reference(world: World, run_dir: Path, test_data: LocalData) -> torch.Tensor:
    """Each client's local test accuracy under independent training after 0..T rounds
    ((T + 1) × clients), trained once per seed and cached in ``run_dir``. Local training is
    the engine's local SGD (FedAvg on a group of one; FedCollab's "Local Train"), not the arms'
    training algorithm's own steps, so the personalised algorithms' IPR and RSD compare with plain
    local training. (FedProx's μ lives in the engine and still applies.)"""
    cfg = world.config
    path = Path(run_dir) / REFERENCE.format(seed=cfg.seed)
    key_ = _reference_key(world)
    if path.exists():
        blob = torch.load(path, weights_only=True)
        if blob["key"] == key_:
            return blob["accuracy"]
    state = ArmState()
    _start_models(world, state, singletons(world), None)
    fed = new_federation(world, Federation.environment(), CostLedger())
    rows = [test_data.evaluate(state.models, state.assign, state.models[0])[0]]
    training = _Training(world, state, True, state.models[0], FedAvg())
    for t in range(cfg.train.rounds):
        groups = current_groups(world, state)
        models = train_groups(world, fed, t, {g: state.models[g] for g in range(len(state.models))}, groups, training)
        for g, x in models.items():
            state.models[g] = x
        rows.append(test_data.evaluate(state.models, state.assign, state.models[0])[0])
    acc = torch.as_tensor(np.stack(rows))
    atomic_write(path, lambda p: torch.save({"key": key_, "accuracy": acc}, p))
    return acc


def _start_models(world: World, state: ArmState, grouping: GroupingResult, per_edge: int | None) -> None:
    """The models training starts from: ``per_edge`` models on every edge, each from its own
    initialisation ("every-round" regrouping), else the initial model for every group."""
    cfg, n = world.config, world.topology.n_clients
    state.assign = np.full(n, -1)
    if per_edge is not None:
        state.model_edge = [j for j in range(world.topology.n_edges) for _ in range(per_edge)]
        seeds = [seed_of(key(cfg.seed, "cluster-init", m)) for m in range(len(state.model_edge))]
        state.models = torch.stack([world.engine.initial_weights(s) for s in seeds])
    else:
        x0 = world.engine.initial_weights(cfg.seed)
        state.models = x0.repeat(len(grouping.groups), 1)
        state.model_edge = [g.edge for g in grouping.groups]
        for m, g in enumerate(grouping.groups):
            state.assign[g.clients] = m


class PerGroupRounds(RoundStrategy):
    """Per-group mode: every group keeps and trains its own model."""

    mode = "per-group"

    @classmethod
    def check(cls, world: World, plan: ArmPlan, where: str) -> None:
        cfg = world.config
        if cfg.test_fraction == 0:
            raise InputError("data.test_fraction: per-group mode evaluates on the clients' local test splits; "
                             "set it > 0 (or leave it out: 0.2)")
        if plan.arm.regroup_every is not None:
            raise InputError(f"{where}.regroup_every: per-group mode keeps its groups and their models (a policy "
                             f"re-partitions on its own schedule); remove it")
        if cfg.train.rounds is None:
            raise InputError("train.rounds: per-group mode needs a number of rounds (the local-training "
                             "reference trains that many); set it")
        if cfg.topology.arrivals is not None and plan.regroup not in ARRIVAL_KINDS:
            raise InputError(f"{where}.grouping: {plan.grouping.name!r} regroups by {plan.regroup!r}, so it cannot "
                             f"place clients that join mid-run (topology.arrivals); use a policy that places every "
                             f"client every round (e.g. hcct with schedule = \"alg1\", ifca) or remove "
                             f"topology.arrivals")

    def __init__(self, world: World, plan: ArmPlan, arm_dir: Path, state: ArmState):
        super().__init__(world, plan, arm_dir, state)
        self.kind = plan.regroup
        self.test_data = LocalData(world, world.local_test)
        self.reference = local_reference(world, Path(arm_dir).parent, self.test_data)
        self.train_data = LocalData(world, world.topology.client_samples) if self.kind == "every-round" else None
        self.fallback = world.engine.initial_weights(world.config.seed)
        self.ids: list[int] = []
        self.arrival = arrival_rounds(world.config.topology.arrivals, world.topology.n_clients)
        algorithm = world.algorithm
        self.personal = None   # evaluate with the group's model, unless the algorithm personalises it
        if type(algorithm).personal_model is not Algorithm.personal_model:
            self.personal = lambda c, model: algorithm.personal_model(self.training.state, c, model)

    def start(self, fresh: bool) -> None:
        world, plan, state = self.world, self.plan, self.state
        if not fresh:
            state.assign = np.asarray(state.assign)
            state.uploaded = None if state.uploaded is None else np.asarray(state.uploaded)
            self.training = _Training(world, state, False, state.models[0])
        else:
            merge = self.kind == "merge"   # HCCT Alg. 1: t = 0, every client its own group, nothing probed
            grouping = singletons(world) if merge else form_groups(world, plan.grouping, 0)
            per_edge = plan.grouping.n_clusters if self.kind in ("every-round", "nearest") else None
            _start_models(world, state, grouping, per_edge)
            state.assign[self.arrival > 0] = -1   # not arrived yet: in no group
            if self.kind in ("merge", "split", "nearest"):   # each client's latest upload
                state.gradients = state.models.new_zeros(world.topology.n_clients, world.engine.n_params)
                state.uploaded = np.zeros(world.topology.n_clients, dtype=bool)
            self.training = _Training(world, state, True, state.models[0])
            work = self._first_local_models() if self.kind == "nearest" else []
            charge_client_work(state.ledger, self.env, world.topology, 0, grouping.probe + work)
            state.sim_time = float(self.env.now)
            base = {k: v for k, v in grouping.summary().items() if k not in ("n_groups", "groups")}
            state.initial_grouping = _summary(world, state, base) if per_edge is None else grouping.summary()
            self.evaluate()
        state.warnings = input_warnings(world, plan, len(current_groups(world, state)))

    def before_round(self, t: int) -> None:
        if t > 0 and self.kind == "merge":
            self._arrive(t)
        if self.kind == "cluster" and t == self.plan.grouping.cluster_round:
            self._cluster(t)
        elif self.kind == "every-round":
            self._reassign(t)
        elif self.kind == "merge" and t > 0:
            self._merge(t)
        elif self.kind == "split" and t > 0:
            self._split(t)
        elif self.kind == "nearest":
            self._nearest(t)

    def select(self, t: int) -> list[Group]:
        world, plan, state = self.world, self.plan, self.state
        self.groups = current_groups(world, state)
        ids = sorted(self.groups)
        if plan.arm.sampling is not None:
            S, _, chosen = sample_groups(world, plan, [self.groups[g] for g in ids], t)
            ids = [ids[i] for i in chosen]
        self.ids = ids
        return [self.groups[g] for g in ids]

    def train(self, t: int) -> None:
        state = self.state
        uploads: dict[int, torch.Tensor] | None = {} if self.kind in ("merge", "split") else None
        trained: dict[int, torch.Tensor] | None = {} if self.kind == "nearest" else None
        models = train_groups(self.world, self.fed, t, {g: state.models[g] for g in self.ids}, self.groups,
                              self.training, uploads, state.momentum, trained)
        self.training.save(state)
        for g, x in models.items():
            state.models[g] = x
        for got in (uploads, trained):   # "merge", "split": gradients; "nearest": local models
            if got:
                clients = np.array(sorted(got))
                state.gradients[clients] = torch.stack([got.pop(c) for c in clients])
                state.uploaded[clients] = True

    def evaluate(self, final: bool = False) -> float:
        world, plan, state = self.world, self.plan, self.state
        sampled = [] if final or state.t == 0 else self.ids
        acc, loss = self.test_data.evaluate(state.models, state.assign, self.fallback, self.personal)
        self._charge_evaluation()
        ref = self.reference[min(state.t, len(self.reference) - 1)].numpy()
        here = self.arrival <= state.t   # the clients that have joined (all, without topology.arrivals)
        acc, loss, ref = acc[here], loss[here], ref[here]
        ipr, rsd = ipr_rsd(acc, ref)
        led, err = state.ledger, 1.0 - acc
        training = led.by_component.get(TRAINING, 0.0)
        groups = current_groups(world, state)
        state.rows.append({
            "arm": plan.arm.name, "seed": world.config.seed, "round": state.t, "cost": led.total,
            "training_cost": training, "overhead_cost": led.total - training, "sim_time_s": state.sim_time,
            "round_time_s": state.round_time, "accuracy": float(acc.mean()), "loss": float(loss.mean()),
            "groups_sampled": len(sampled),
            "clients_sampled": int(sum(groups[g].size for g in sampled if g in groups)),
            "avg_sampled_cov": float(np.mean([groups[g].cov for g in sampled])) if sampled else np.nan,
            "local_error_mean": float(err.mean()), "local_error_std": float(err.std()),
            "local_error_min": float(err.min()), "local_error_max": float(err.max()),
            "local_accuracy_reference": float(ref.mean()), "ipr": ipr, "rsd": rsd})
        return float(acc.mean())

    def _charge_evaluation(self) -> None:
        """The client training an evaluation's personal models take (the algorithm's
        ``evaluation_passes`` × H_i(n_i): Finetune's fine-tuning, Per-FedAvg's adaptation step),
        charged as client work like a probe, at every evaluation that computes them; then the
        forward passes with which the personal models were chosen (MAXFL's, FLSC's)."""
        world, state, topo = self.world, self.state, self.world.topology
        passes = world.algorithm.evaluation_passes
        if passes:
            work = []
            for j in range(topo.n_edges):
                members = topo.clients_of(j)
                members = members[self.arrival[members] <= state.t]
                devices = [topo.client_device[c] for c in members]
                work.append((j, members, passes * world.cost.training_cost(devices, topo.n_samples[members], 1)))
            charge_client_work(state.ledger, self.env, topo, state.t, work)
        self.training.charge_scoring(state.ledger, self.env, state.t)
        state.sim_time = float(self.env.now)

    # -- membership, by the policy's declared regroup kind --------------------------------------------

    def _reassign(self, t: int) -> None:
        """"every-round": each client joins the model of its edge :meth:`assign` picks from the
        models' losses on its training data."""
        world, state, topo, work = self.world, self.state, self.world.topology, []
        for j in range(topo.n_edges):
            members = topo.clients_of(j)
            members = members[self.arrival[members] <= t]
            if not len(members):
                continue
            rows = [m for m, e in enumerate(state.model_edge) if e == j]
            losses = np.stack([self.train_data.score(state.models[m], members)[1] for m in rows], axis=1)
            state.assign[members] = np.array(rows)[self.plan.grouping.assign(losses)]
            devices = [topo.client_device[c] for c in members]
            work.append((j, members, len(rows) * FORWARD_FRACTION
                         * world.cost.training_cost(devices, topo.n_samples[members], 1)))
        charge_client_work(state.ledger, self.env, topo, t, work)

    def _cluster(self, t: int) -> None:
        """"cluster": cluster the clients' one-epoch updates from their group models; each
        cluster becomes a group starting from its members' sample-weighted mean model."""
        world, state, topo = self.world, self.state, self.world.topology
        clients = np.flatnonzero(state.assign >= 0)
        starts = state.models[state.assign[clients]]
        clusters, work = cluster_clients(world, self.plan.grouping, clients, starts, t)
        models, assign = [], np.full(topo.n_clients, -1)
        for _, members in clusters:
            n = torch.as_tensor(topo.n_samples[members], dtype=starts.dtype)
            models.append((n / n.sum()) @ state.models[state.assign[members]])
            assign[members] = len(models) - 1
        state.models, state.model_edge, state.assign = torch.stack(models), [j for j, _ in clusters], assign
        charge_client_work(state.ledger, self.env, topo, t, work)

    def _arrive(self, t: int) -> None:
        """The clients that join at round t (``topology.arrivals``, HCCT Sec. 7.3): each its own
        group from the initial model, without an upload, so that :meth:`_merge` probes it and
        Alg. 2 places it by the utility of Eqs. 15-16 in the same round."""
        state, topo = self.state, self.world.topology
        new = np.flatnonzero(self.arrival == t)
        if not len(new):
            return
        state.models = torch.cat([state.models, self.fallback.expand(len(new), -1)])
        for c in new:
            state.model_edge.append(int(topo.client_edge[c]))
            state.assign[c] = len(state.model_edge) - 1
        state.uploaded[new] = False

    def _merge(self, t: int) -> None:
        """"merge" (HCCT Alg. 1 line 6 at epoch t ≥ 1): on each edge, :meth:`repartition` (Alg. 2)
        merges the current groups on the clients' latest uploaded gradients; a merged group
        starts from its members' sample-weighted mean model (Alg. 1 line 15). A client without
        an upload runs a charged probe epoch first."""
        world, state, topo = self.world, self.state, self.world.topology
        missing = np.flatnonzero(~state.uploaded & (state.assign >= 0))
        work = []
        lr = _lr(world, t)
        for j in np.unique(topo.client_edge[missing]):
            members = missing[topo.client_edge[missing] == j]
            seeds = rng(world.config.seed, "probe", t, int(j)).integers(2**31, size=len(members))
            rows = state.assign[members]
            trained = world.engine.train(state.models, members.tolist(), 1, seeds.tolist(), lr=lr, rows=rows.tolist())
            state.gradients[members] = (state.models[rows] - trained) / lr
            state.uploaded[members] = True
            work.append(probe_work(world, int(j), members, 1))
        charge_client_work(state.ledger, self.env, topo, t, work)
        models, edges, assign = [], [], np.full(topo.n_clients, -1)
        slices = layer_slices(world.engine)
        for j in range(topo.n_edges):
            clients = topo.clients_of(j)
            local = {int(c): i for i, c in enumerate(clients)}
            current = [np.array([local[int(c)] for c in np.flatnonzero(state.assign == m)])
                       for m in range(len(state.models)) if state.model_edge[m] == j and (state.assign == m).any()]
            if not current:   # nobody on this edge has joined yet
                continue
            view = EdgeView(topo.label_counts[clients], state.gradients[clients].cpu().numpy().astype(np.float64),
                            slices)
            for group in self.plan.grouping.repartition(view, current):
                members = clients[group]
                old = np.unique(state.assign[members])
                if len(old) == 1:
                    models.append(state.models[old[0]])
                else:
                    n = torch.as_tensor([topo.n_samples[state.assign == m].sum() for m in old], dtype=state.models.dtype)
                    models.append((n / n.sum()) @ state.models[old])
                edges.append(j)
                assign[members] = len(models) - 1
        state.models, state.model_edge, state.assign = torch.stack(models), edges, assign

    def manifest(self) -> dict:
        plan, state = self.plan, self.state
        return {"aggregation": "none (per-group mode: every group keeps its own model)",
                "grouping_policy": plan.grouping.name,
                "sampling_policy": plan.sampling.name if plan.arm.sampling is not None else "all groups",
                "groups_per_round": None, "grouping": state.initial_grouping,
                "final_grouping": _summary(self.world, state, {"objective": self._objective()}),
                "regroupings": max(state.t - 1, 0) if self.kind == "merge" else 0}

    def _objective(self) -> float | None:
        """The policy's objective (:meth:`GroupingPolicy.objective`) of the final groups on the
        clients' last uploads, summed over edges; None without uploads or an objective."""
        world, state, topo = self.world, self.state, self.world.topology
        if state.gradients is None:
            return None
        total, slices = 0.0, layer_slices(world.engine)
        for j in range(topo.n_edges):
            clients = topo.clients_of(j)
            clients = clients[state.assign[clients] >= 0]
            if not len(clients):
                continue
            local = {int(c): i for i, c in enumerate(clients)}
            groups = [np.array([local[int(c)] for c in g]) for g in
                      (np.flatnonzero(state.assign == m) for m in np.unique(state.assign[clients]))]
            view = EdgeView(topo.label_counts[clients], state.gradients[clients].cpu().numpy().astype(np.float64),
                            slices)
            value = self.plan.grouping.objective(view, groups)
            if value is None:
                return None
            total += value
        return total

    def _split(self, t: int) -> None:
        """"split" (CFL): every group whose members all trained in round t − 1 may split
        (:meth:`split` on their updates of that round); each part keeps a copy of its model."""
        world, state, topo = self.world, self.state, self.world.topology
        lr = _lr(world, t - 1)   # gradients hold update / lr: back to the update Δθ
        models, edges, assign = [], [], np.full(topo.n_clients, -1)
        for m in range(len(state.models)):
            members = np.flatnonzero(state.assign == m)
            if not len(members):
                continue
            parts = [np.arange(len(members))]
            if state.uploaded[members].all():
                updates = (state.gradients[members] * lr).cpu().numpy().astype(np.float64)
                parts = self.plan.grouping.split(updates, topo.n_samples[members])
            for part in parts:
                models.append(state.models[m])
                edges.append(state.model_edge[m])
                assign[members[part]] = len(models) - 1
        state.models, state.model_edge, state.assign = torch.stack(models), edges, assign
        state.uploaded[:] = False   # the next decision waits for the next round's updates

    def _first_local_models(self) -> list:
        """"nearest", before round 0: every client's probe epoch from the initial model (its first
        local model); the centres :meth:`initial_centers` picks take those models. Returns the work."""
        world, state, topo, work = self.world, self.state, self.world.topology, []
        x0 = world.engine.initial_weights(world.config.seed)
        for j in range(topo.n_edges):
            members = topo.clients_of(j)
            local = probe_models(world, members, x0.expand(len(members), -1), 0, j)
            state.gradients[members] = local
            state.uploaded[members] = True
            work.append(probe_work(world, j, members, 1))
            seeds = self.plan.grouping.initial_centers(local.cpu().numpy().astype(np.float64),
                                                       rng(world.config.seed, "grouping", 0, j))
            if seeds is not None:
                rows = [m for m, e in enumerate(state.model_edge) if e == j]
                state.models[rows[:len(seeds)]] = local[torch.as_tensor(seeds)]
        return work

    def _nearest(self, t: int) -> None:
        """"nearest" (FeSEM's E-step): each client joins the centre of its edge :meth:`assign`
        picks from the L2 distances between its latest local model and the centres."""
        state, topo = self.state, self.world.topology
        for j in range(topo.n_edges):
            members = topo.clients_of(j)
            members = members[state.uploaded[members]]   # a client with a local model (all, after round 0's probe)
            rows = [m for m, e in enumerate(state.model_edge) if e == j]
            local = state.gradients[members].double()
            dist = torch.stack([torch.linalg.vector_norm(local - state.models[m].double(), dim=1) for m in rows], 1)
            state.assign[members] = np.array(rows)[self.plan.grouping.assign(dist.cpu().numpy())]

    def write_outputs(self) -> None:
        state = self.state
        atomic_write(self.arm_dir / "models.pt", lambda p: torch.save(
            {"models": state.models, "client_model": torch.as_tensor(state.assign)}, p))


STRATEGIES: dict[str, type[RoundStrategy]] = {"global": GlobalRounds, "per-group": PerGroupRounds}
