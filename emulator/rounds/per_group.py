"""Per-group mode (cross-silo; HCCT Alg. 1, FedCollab's training stage): every group keeps its own
model and there is no cloud aggregation across groups. Each client is evaluated on its own local
test split with the model of its group; a row reports the mean, std, min and max of the clients'
local test error (HCCT Table 5) and IPR and RSD (FedCollab Eqs. 11-12) against independent local
training, which the run trains once per seed and caches in the run directory
(``local-reference-seed<seed>.pt``)."""
from __future__ import annotations

import csv
import hashlib
import json
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch

from groupfel.cost_models import TRAINING
from groupfel.errors import DivergenceError, InputError
from groupfel.policies.cov import cov_of_counts
from groupfel.policies.grouping import EdgeView
from groupfel.userfile import check_file

from ..algorithms import Algorithm, FedAvg
from ..arm import ArmPlan, ArmState, RoundStrategy, input_warnings, new_federation, online_groups, sample_groups
from ..compute import run_group_rounds
from ..config import arrival_rounds
from ..federation import Federation, Group
from ..io import atomic_write
from ..ledger import CostLedger
from ..membership import (GroupingResult, charge_client_work, cluster_clients, form_groups, probe_models,
                          probe_work)
from ..models import model_layers, trainable_mask
from ..rng import key, rng, seed_of
from ..world import World
from .common import FORWARD_FRACTION, ArmTraining, LocalData, local_spec, round_lr

# the regroup kinds that place every client every round, so can take clients joining mid-run
ARRIVAL_KINDS = ("merge", "every-round")
REFERENCE = "local-reference-seed{seed}.pt"


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


def edge_groups(world: World) -> GroupingResult:
    """Every edge's clients one group (the HCCT authors' epoch 0: one FedAvg of all clients)."""
    topo = world.topology
    groups = [Group(j, c, topo.n_samples[c], float(cov_of_counts(topo.label_counts[c].sum(axis=0), "std")))
              for j in range(topo.n_edges) if len(c := topo.clients_of(j))]
    return GroupingResult(groups, 0, 0)


def _summary(world: World, state: ArmState, base: dict) -> dict:
    groups = list(current_groups(world, state).values())
    sizes = np.array([g.size for g in groups])
    return {**base, "n_groups": len(groups), "size_min": int(sizes.min()), "size_max": int(sizes.max()),
            "size_mean": float(sizes.mean()), "cov_mean": float(np.mean([g.cov for g in groups])),
            "groups": [{"edge": g.edge, "clients": g.clients.tolist(), "size": g.size,
                        "samples": g.total_samples, "cov": g.cov} for g in groups]}


def train_groups(world: World, fed: Federation, t: int, starts: dict[int, torch.Tensor], groups: dict[int, Group],
                 training: ArmTraining | None = None, uploads: dict[int, torch.Tensor] | None = None,
                 momentum: torch.Tensor | None = None,
                 trained: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """Round t for the groups in ``starts`` ({group id: start model}): K group rounds each,
    computed by :func:`~groupfel.emulator.compute.run_group_rounds`, then timed and charged by ``fed``;
    returns {group id: model}. ``uploads`` receives each client's gradient (its last update / lr),
    ``trained`` each client's local model."""
    lr = round_lr(world, t)
    run = {g: groups[g] for g in starts}
    algorithm = alg_state = scratch = None
    if training is not None:
        algorithm, alg_state = training.algorithm, training.state
        members = np.concatenate([g.clients for g in run.values()]) if run else np.empty(0, dtype=np.int64)
        scratch = algorithm.begin_round(alg_state, list(run), members)
    offline = fed.offline(t, [(g, groups[g]) for g in starts])
    models = run_group_rounds(world.engine, starts, run, t, local_spec(world, t, offline), algorithm, alg_state, scratch,
                              momentum, uploads, trained)
    if uploads is not None:
        for c in uploads:
            uploads[c] = uploads[c] / lr
    fed.run_round(t, [(g, groups[g]) for g in starts])
    if training is not None:
        training.charge_scoring(fed.ctx.ledger, fed.ctx.env, t)
    return models


def _reference_key(world: World) -> str:
    """What the local-training reference depends on: everything but the arms, the names and the
    training algorithm, which the reference does not run; of the algorithm only FedProx's μ
    reaches the engine's local SGD, so it stays. Sweep points that differ only in their
    algorithm share one reference."""
    cfg = json.loads(world.config.model_dump_json(exclude={"arms", "name", "output_dir"}))
    del cfg["train"]["algorithm"], cfg["train"]["algorithm_params"]
    cfg["engine_mu"] = world.algorithm.proximal_mu
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def _data_digest(world: World) -> str:
    """The data the reference trains and tests on, by content: each client's training and local
    test samples and labels, in order. Runs of a stack place their data each on its own (label
    shift and domain tests copy the arrays), so equal data is found by content, not identity."""
    x, y = world.dataset.x_train, world.dataset.y_train
    h = hashlib.sha256(f"{x.dtype}{x.shape[1:]}{y.dtype}".encode())
    for parts in (world.topology.client_samples, world.local_test):
        h.update(np.int64(len(parts)).tobytes())
        for idx in parts:
            h.update(np.int64(len(idx)).tobytes())
            h.update(np.ascontiguousarray(x[idx]))
            h.update(np.ascontiguousarray(y[idx]))
    return h.hexdigest()


# references being computed by a thread of this process: (reference key, data digest) -> result
_SHARED: dict[tuple[str, str], Future] = {}
_SHARED_LOCK = threading.Lock()


def local_reference(world: World, run_dir: Path, test_data: LocalData) -> torch.Tensor:
    """Each client's local test accuracy under independent training after 0..T rounds
    ((T + 1) × clients), trained once per seed and cached in ``run_dir``. Local training is
    the engine's local SGD (FedAvg on a group of one; FedCollab's "Local Train"), not the arms'
    training algorithm's own steps, so the personalised algorithms' IPR and RSD compare with plain
    local training. (FedProx's μ lives in the engine and still applies.)"""
    path = Path(run_dir) / REFERENCE.format(seed=world.config.seed)
    key_ = _reference_key(world)
    if path.exists():
        try:   # a cache: one that is not a regular file or does not load is computed again
            check_file(path, str(path), "a cache file", "run")
            blob = torch.load(path, weights_only=True, map_location="cpu")
        except Exception:
            blob = None
        if isinstance(blob, dict) and blob.get("key") == key_:
            return blob["accuracy"]
    # The runs of a seed that train at once in one process (a stack's arms and sweep points, on
    # equal data) share one computation; a run that waits for it leaves its stack meanwhile, so
    # that its partners, the computing run among them, train on.
    here = (key_, _data_digest(world))
    with _SHARED_LOCK:
        shared = _SHARED.get(here)
        owner = shared is None
        if owner:
            shared = _SHARED[here] = Future()
    if owner:
        try:
            shared.set_result(_train_reference(world, test_data))
        except BaseException as exc:
            shared.set_exception(exc)
            raise
        finally:
            with _SHARED_LOCK:
                del _SHARED[here]
    else:
        with world.engine.waiting():
            failed = shared.exception()
        if failed is not None:   # the computing run failed: this one tries itself
            return local_reference(world, run_dir, test_data)
    acc = shared.result()
    atomic_write(path, lambda p: torch.save({"key": key_, "accuracy": acc}, p))
    return acc


def _train_reference(world: World, test_data: LocalData) -> torch.Tensor:
    cfg = world.config
    state = ArmState()
    _start_models(world, state, singletons(world), None)
    fed = new_federation(world, Federation.environment(), CostLedger())
    rows = [test_data.evaluate(state.models, state.assign, state.models[0])[0]]
    training = ArmTraining(world, state, True, state.models[0], FedAvg())
    for t in range(cfg.train.rounds):
        groups = current_groups(world, state)
        models = train_groups(world, fed, t, {g: state.models[g] for g in range(len(state.models))}, groups, training)
        for g, x in models.items():
            state.models[g] = x
        rows.append(test_data.evaluate(state.models, state.assign, state.models[0])[0])
    return torch.as_tensor(np.stack(rows), device="cpu")


def _start_models(world: World, state: ArmState, grouping: GroupingResult, per_edge: int | None,
                  shared: bool = False) -> None:
    """The models training starts from: ``per_edge`` models on every edge, each from its own
    initialisation ("every-round" regrouping) or all from the initial model (``shared``), else
    the initial model for every group."""
    cfg, n = world.config, world.topology.n_clients
    state.assign = np.full(n, -1)
    if per_edge is not None:
        state.model_edge = [j for j in range(world.topology.n_edges) for _ in range(per_edge)]
        seeds = [seed_of(key(cfg.seed, "cluster-init", m)) if not shared else cfg.seed
                 for m in range(len(state.model_edge))]
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
        self.reference = (local_reference(world, Path(arm_dir).parent, self.test_data)
                          if world.config.train.local_reference else None)
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
            self.training = ArmTraining(world, state, False, state.models[0])
        else:
            merge = self.kind == "merge"   # HCCT Alg. 1: t = 0, every client its own group, nothing probed
            first = edge_groups if getattr(plan.grouping, "first", "alone") == "global" else singletons
            grouping = first(world) if merge else form_groups(world, plan.grouping, 0)
            per_edge = plan.grouping.n_clusters if self.kind in ("every-round", "nearest") else None
            _start_models(world, state, grouping, per_edge, getattr(plan.grouping, "init", None) == "shared")
            state.assign[self.arrival > 0] = -1   # not arrived yet: in no group
            if self.kind in ("merge", "split", "nearest"):   # each client's latest upload
                state.gradients = state.models.new_zeros(world.topology.n_clients, world.engine.n_params)
                state.uploaded = np.zeros(world.topology.n_clients, dtype=bool)
            self.training = ArmTraining(world, state, True, state.models[0])
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

    def members(self) -> np.ndarray:
        return np.flatnonzero(self.state.assign >= 0)

    def select(self, t: int) -> list[Group]:
        world, plan, state = self.world, self.plan, self.state
        self.groups = current_groups(world, state)
        ids = sorted(self.groups)
        pool = online_groups(self.fed, [self.groups[g] for g in ids])   # availability: a member online now
        if len(pool) < len(ids):
            ids = [ids[i] for i in pool]
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
        self._record(t)
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
        here = self.arrival <= state.t   # the clients that have joined (all, without topology.arrivals)
        acc, loss = acc[here], loss[here]
        ref = (np.full(len(acc), np.nan) if self.reference is None
               else self.reference[min(state.t, len(self.reference) - 1)].numpy()[here])
        if not np.isfinite(loss).all():   # run.md: a non-finite test loss stops the run, as in global mode
            bad = int((~np.isfinite(loss)).sum())
            raise DivergenceError(f"round {state.t}: the local test loss of {bad} of {len(loss)} clients is not "
                                  f"finite under {world.algorithm.name} with {plan.grouping.name} groups; lower "
                                  f"train.lr or the algorithm's step sizes (train.algorithm_params)")
        ipr, rsd = ipr_rsd(acc, ref) if self.reference is not None else (np.nan, np.nan)
        led, err = state.ledger, 1.0 - acc
        training = led.by_component.get(TRAINING, 0.0)
        groups = current_groups(world, state)
        state.rows.append({
            "arm": plan.arm.name, "seed": world.config.seed, "round": state.t, "cost": led.total,
            "training_cost": training, "overhead_cost": led.total - training, **led.energy_row(),
            "sim_time_s": state.sim_time,
            "round_time_s": state.round_time, "accuracy": float(acc.mean()), "loss": float(loss.mean()),
            "groups_sampled": len(sampled),
            "clients_sampled": int(sum(groups[g].size for g in sampled if g in groups)),
            "avg_sampled_cov": float(np.mean([groups[g].cov for g in sampled])) if sampled else np.nan,
            "local_error_mean": float(err.mean()), "local_error_std": float(err.std()),
            "local_error_min": float(err.min()), "local_error_max": float(err.max()),
            "local_accuracy_reference": float(ref.mean()), "ipr": ipr, "rsd": rsd})
        state.rows[-1].update(self.training.algorithm.round_metrics(self.training.state))
        if world.config.train.report_best:
            state.rows[-1].update(self._best(acc, here))
        return float(acc.mean())

    def _best(self, acc: np.ndarray, here: np.ndarray) -> dict:
        """Each client's best local test accuracy over the evaluations after round 0 (the HCCT
        authors' ``acc_best_dict``: they evaluate after every epoch's training), as error columns."""
        state = self.state
        state.best_accuracy = (np.full(len(here), np.nan) if state.best_accuracy is None
                               else np.asarray(state.best_accuracy, dtype=np.float64))   # a tensor after a resume
        if state.t >= 1:
            got = state.best_accuracy[here]
            state.best_accuracy[here] = np.where(np.isnan(got), acc, np.fmax(got, acc))
        err = 1.0 - state.best_accuracy[here]
        if np.isnan(err).all():
            return {f"local_error_best_{k}": np.nan for k in ("mean", "std", "min", "max")}
        return {"local_error_best_mean": float(np.nanmean(err)), "local_error_best_std": float(np.nanstd(err)),
                "local_error_best_min": float(np.nanmin(err)), "local_error_best_max": float(np.nanmax(err))}

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
        """"cluster": cluster the clients' probes from their group models; each cluster becomes
        a group starting from its members' sample-weighted mean model (``cluster_start =
        "probed"``: the mean of their probed models)."""
        world, state, topo = self.world, self.state, self.world.topology
        clients = np.flatnonzero(state.assign >= 0)
        starts = state.models[state.assign[clients]]
        clusters, work, means = cluster_clients(world, self.plan.grouping, clients, starts, t)
        probed = self.plan.grouping.cluster_start == "probed"
        models, assign = [], np.full(topo.n_clients, -1)
        for (_, members), mean in zip(clusters, means):
            if not probed:
                n = torch.as_tensor(topo.n_samples[members], dtype=starts.dtype, device=starts.device)
                mean = (n / n.sum()) @ state.models[state.assign[members]]
            models.append(mean)
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
        re-partitions the clients on their latest uploaded gradients; a new group starts from
        the sample-weighted mean of its members' models (Alg. 1 line 15). A client without
        an upload runs a charged probe epoch first."""
        world, state, topo = self.world, self.state, self.world.topology
        missing = np.flatnonzero(~state.uploaded & (state.assign >= 0))
        work = []
        lr = round_lr(world, t)
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
        slices = model_layers(world.engine)
        for j in range(topo.n_edges):
            clients = topo.clients_of(j)
            local = {int(c): i for i, c in enumerate(clients)}
            current = [np.array([local[int(c)] for c in np.flatnonzero(state.assign == m)])
                       for m in range(len(state.models)) if state.model_edge[m] == j and (state.assign == m).any()]
            if not current:   # nobody on this edge has joined yet
                continue
            view = EdgeView(topo.label_counts[clients], state.gradients[clients].cpu().numpy().astype(np.float64),
                            slices, memo=state.policy_memo.setdefault(int(j), {}), trainable=trainable_mask(world.engine))
            for group in self.plan.grouping.repartition(view, current):
                members = clients[group]
                old = np.unique(state.assign[members])
                brought = self.training.algorithm.member_models(self.training.state, members, state.models[state.assign[members]])
                if brought is not None:   # the members' own models (HCCT-P's classifiers, regroup = "own")
                    n = torch.as_tensor(topo.n_samples[members], dtype=state.models.dtype, device=state.models.device)
                    models.append((n / n.sum()) @ brought)
                elif len(old) == 1:
                    models.append(state.models[old[0]])
                else:   # Alg. 1 line 15: Σ D_i w_i / D̂_k, w_i the model of client i's old group
                    n = torch.as_tensor([topo.n_samples[members[state.assign[members] == m]].sum() for m in old],
                                        dtype=state.models.dtype, device=state.models.device)
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
        total, slices = 0.0, model_layers(world.engine)
        for j in range(topo.n_edges):
            clients = topo.clients_of(j)
            clients = clients[state.assign[clients] >= 0]
            if not len(clients):
                continue
            local = {int(c): i for i, c in enumerate(clients)}
            groups = [np.array([local[int(c)] for c in g]) for g in
                      (np.flatnonzero(state.assign == m) for m in np.unique(state.assign[clients]))]
            view = EdgeView(topo.label_counts[clients], state.gradients[clients].cpu().numpy().astype(np.float64),
                            slices, memo=dict(state.policy_memo.get(int(j), {})), trainable=trainable_mask(world.engine))
            value = self.plan.grouping.objective(view, groups)
            if value is None:
                return None
            total += value
        return total

    def _split(self, t: int) -> None:
        """"split" (CFL): every group whose members all trained in round t − 1 may split
        (:meth:`split` on their updates of that round); each part keeps a copy of its model."""
        world, state, topo = self.world, self.state, self.world.topology
        lr = round_lr(world, t - 1)   # gradients hold update / lr: back to the update Δθ
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
                state.models[rows[:len(seeds)]] = local[torch.as_tensor(seeds, device=local.device)]
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

    def _record(self, t: int) -> None:
        """The groups that trained in round t, numbered as results.csv numbers the evaluation after
        it (t + 1), with what the grouping policy notes of its edge's latest partition."""
        memo = self.state.policy_memo
        for g in self.ids:
            group = self.groups[g]
            self.state.trained_groups.append({
                "round": t + 1, "edge": int(group.edge), "group": int(g),
                "clients": " ".join(str(int(c)) for c in group.clients),
                **self.plan.grouping.notes(memo.get(int(group.edge), {}))})

    def write_outputs(self) -> None:
        state = self.state
        # groups.csv: every round's groups (and, for HCCT-E, the layer each partition compared)
        columns = list(dict.fromkeys(["round", "edge", "group", "clients"] + [k for r in state.trained_groups for k in r]))

        def write(path):
            with open(path, "w", newline="") as f:
                out = csv.DictWriter(f, columns)
                out.writeheader()
                out.writerows(state.trained_groups)

        atomic_write(self.arm_dir / "groups.csv", write)
        atomic_write(self.arm_dir / "models.pt", lambda p: torch.save(
            {"models": state.models.cpu(), "client_model": torch.as_tensor(state.assign, device="cpu")}, p))
