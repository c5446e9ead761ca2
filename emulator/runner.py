"""The run loop of one arm (Alg. 1): grouping, sampling, SimPy global rounds, evaluation,
checkpoints, and the arm's result files.

Randomness is drawn from seeds derived from (seed, purpose, round, ...) rather than from one
running generator, so a run resumed from a checkpoint draws exactly what an uninterrupted run
draws and the result tables match.
"""
from __future__ import annotations

import json
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cost_models import TRAINING
from policies import (AggregationRule, EdgeView, GroupingPolicy, SamplingPolicy, aggregations,
                      groupings, groups_per_round, sample_without_replacement, samplings)
from policies.cov import cov_of_counts

from .compute import ClientState, LocalSpec, aggregate_control, run_group_rounds
from .config import ArmConfig, config_warnings
from .discriminator import DiscriminatorSpec, discriminator_distances, discriminator_features
from .errors import DivergenceError, InputError, InputWarning
from .fedclar import global_mode_groups
from .federation import Federation, Group, RoundContext
from .io import atomic_write, write_json
from .ledger import CostLedger
from .world import World

CHECKPOINT = "checkpoint.pt"
# A global model whose norm grows this much in one round has diverged (Sec. 5.3).
DIVERGENCE_GROWTH = 100.0


@dataclass
class ArmPlan:
    arm: ArmConfig
    grouping: GroupingPolicy
    sampling: SamplingPolicy
    aggregation: AggregationRule


def plan_arm(world: World, index: int) -> ArmPlan:
    """Validate one arm's policies against the world (before anything is written)."""
    arm = world.config.arms[index]
    where = f"arms[{index}]"
    params = dict(arm.grouping)
    name = params.pop("policy", None)
    if name is None:
        raise InputError(f"{where}.grouping.policy: required; e.g. policy = \"covg\"")
    grouping = groupings.make(name, params, f"{where}.grouping")
    for j in range(world.topology.n_edges):
        n = len(world.topology.clients_of(j))
        if grouping.min_group_size > n:
            raise InputError(f"{where}.grouping.min_group_size: {grouping.min_group_size} exceeds the {n} "
                             f"clients of edge {j}; lower it or raise topology.clients_per_edge")
    s = arm.sampling.model_dump(exclude={"policy", "groups_per_round", "data_fraction"})
    sampling = samplings.make(arm.sampling.policy, s, f"{where}.sampling")
    aggregation = aggregations.make(arm.aggregation, None, f"{where}.aggregation")
    plan = ArmPlan(arm, grouping, sampling, aggregation)
    _check_budget(world, plan, f"arm {arm.name!r}")
    return plan


def _needs_training(plan: ArmPlan) -> bool:
    """Whether forming the groups trains (HCCT's gradient probe, FedCollab's discriminators)."""
    return bool(getattr(plan.grouping, "needs_gradients", False) or getattr(plan.grouping, "needs_distances", False))


def _choose(world: World, plan: ArmPlan, groups: list[Group], log_p: np.ndarray, t: int) -> tuple[int, np.ndarray]:
    """S and the groups the cloud samples in round index t (seeded by t, so a resume draws the same)."""
    s = plan.arm.sampling
    S = groups_per_round(len(groups), np.array([g.total_samples for g in groups]),
                         groups=s.groups_per_round, data_fraction=s.data_fraction)
    return S, sample_without_replacement(log_p, S, np.random.default_rng((world.config.seed, 1, t)))


def _budget_error(budget: float, first: float, where: str) -> InputError:
    return InputError(f"train.budget: {budget:g} is less than what the first round of {where} costs ({first:.6g}, "
                      f"Eq. 5 with its grouping and sampling), so no round would run; raise it to at least "
                      f"{first:.6g} or make rounds cheaper (fewer groups_per_round, group_rounds, local_epochs)")


def _check_budget(world: World, plan: ArmPlan, where: str) -> None:
    """Refuse a budget below the first round's exact cost, before anything runs. The first round
    is known before training when grouping needs none: group, sample and price it as run_arm
    will. (Where grouping trains, run_arm makes the same check once the groups exist.)"""
    tc = world.config.train
    if tc.budget is None or _needs_training(plan):
        return
    grouping = form_groups(world, plan, 0)
    log_p = plan.sampling.log_probabilities(np.array([g.cov for g in grouping.groups]))
    _, chosen = _choose(world, plan, grouping.groups, log_p, 0)
    cfg = world.config
    fed = Federation(RoundContext(Federation.environment(), world.engine.model_bytes, world.cost, CostLedger(), world.topology,
                                  cfg.seed, tc.group_rounds, tc.local_epochs, cfg.faults))
    first = fed.round_cost(0, [grouping.groups[g] for g in chosen])
    if first > tc.budget:
        raise _budget_error(tc.budget, first, where)


def input_warnings(world: World, plan: ArmPlan, n_groups: int) -> list[str]:
    """What the run accepts but adjusts: printed once (as :class:`InputWarning`) and kept in the manifest."""
    out = config_warnings(world.config)
    S = plan.arm.sampling.groups_per_round
    if S is not None and S > n_groups:
        out.append(f"{plan.arm.name}: sampling.groups_per_round = {S} exceeds the {n_groups} groups formed; "
                   f"every round samples all {n_groups}")
    return out


@dataclass
class GroupingResult:
    groups: list[Group]
    dropped: int
    leftover_clients: int
    # (edge, clients, cost of each) of client work a policy needs: HCCT probe, FedCollab discriminators
    probe: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def probe_cost(self) -> float:
        return float(sum(amounts.sum() for _, _, amounts in self.probe))

    def summary(self) -> dict:
        sizes = np.array([g.size for g in self.groups])
        covs = np.array([g.cov for g in self.groups])
        return {"n_groups": len(self.groups), "size_min": int(sizes.min()), "size_max": int(sizes.max()),
                "size_mean": float(sizes.mean()), "cov_mean": float(covs.mean()),
                "clients_dropped": self.dropped, "clients_touched_by_leftover_rule": self.leftover_clients,
                "gradient_probe_training_cost": self.probe_cost,
                "groups": [{"edge": g.edge, "clients": g.clients.tolist(), "size": g.size,
                            "samples": g.total_samples, "cov": g.cov} for g in self.groups]}


def _layer_slices(engine) -> tuple[slice, ...] | None:
    """Parameter ranges of each layer (weight and bias of one module) in the flat weight vector."""
    model = getattr(engine, "model", None)
    if model is None:
        return None
    bounds: dict[str, list[int]] = {}
    offset = 0
    for name, p in model.named_parameters():
        span = bounds.setdefault(name.rsplit(".", 1)[0], [offset, offset])
        offset += p.numel()
        span[1] = offset
    return tuple(slice(a, b) for a, b in bounds.values())


def _probe_gradients(world: World, members: np.ndarray, edge: int) -> np.ndarray:
    """Gradients for HCCT (HCCT Alg. 1, t = 0): one local epoch of every client from the initial
    model; gradient ≈ start − trained. Regrouping probes from the initial model again."""
    start = world.engine.initial_weights(world.config.seed)
    seeds = [int(s) for s in np.random.default_rng((world.config.seed, 5, edge)).integers(2**31, size=len(members))]
    trained = world.engine.train(start, [int(c) for c in members], 1, seeds)
    return (start[None, :] - trained).cpu().numpy().astype(np.float64)


def form_groups(world: World, plan: ArmPlan, epoch: int) -> GroupingResult:
    """Each edge groups its own clients (Alg. 1, Lines 2-3); groups never cross edges.

    A policy with ``needs_gradients`` (HCCT) gets each client's gradient from a probe epoch; one
    with ``needs_distances`` (FedCollab, discriminator distances) gets the distances of the clients'
    discriminators (FedCollab Alg. 1). :func:`run_arm` charges that client work to the ledger as
    training (group and group_round -1).
    """
    topo, groups, dropped, touched, probe = world.topology, [], 0, 0, []
    norm = getattr(plan.grouping, "normalization", "std")
    for j in range(topo.n_edges):
        members = topo.clients_of(j)
        labels = topo.label_counts[members]
        view = EdgeView(labels)
        devices = [topo.client_device[c] for c in members]
        if getattr(plan.grouping, "needs_gradients", False):
            view = EdgeView(labels, _probe_gradients(world, members, j), _layer_slices(world.engine))
            probe.append((j, members, world.cost.training_cost(devices, topo.n_samples[members], 1)))
        if getattr(plan.grouping, "needs_distances", False):
            spec = DiscriminatorSpec(rounds=plan.grouping.discriminator_rounds)
            features = discriminator_features(world.dataset.x_train, world.dataset.y_train, world.dataset.num_classes)
            D, m = discriminator_distances(features, [topo.client_samples[c] for c in members],
                                           (world.config.seed, epoch, j), spec)
            view = EdgeView(labels, distances=D)
            # Each client trains |edge| − 1 discriminators: rounds × local_steps passes over m
            # samples, priced by its training curve scaled by discriminator / model parameters.
            scale = (len(members) - 1) * spec.rounds * spec.local_steps * spec.n_params(features.shape[1]) \
                / world.engine.n_params
            probe.append((j, members, scale * world.cost.training_cost(devices, np.full(len(members), m), 1)))
        result = plan.grouping.group(view, np.random.default_rng((world.config.seed, 3, epoch, j)))
        dropped += len(result.dropped)
        touched += result.leftover_clients
        for local in result.groups:
            clients = members[np.sort(local)]
            groups.append(Group(j, clients, topo.n_samples[clients],
                                float(cov_of_counts(topo.label_counts[clients].sum(axis=0), norm))))
    return GroupingResult(groups, dropped, touched, probe)


@dataclass
class ArmState:
    t: int = 0
    weights: torch.Tensor | None = None
    sim_time: float = 0.0
    round_time: float = 0.0   # simulated duration of the last global round
    ledger: CostLedger = field(default_factory=CostLedger)
    rows: list[dict] = field(default_factory=list)
    initial_grouping: dict | None = None   # the manifest's summary of the round-0 grouping
    clients: ClientState | None = None      # SCAFFOLD variates, persistent momentum buffers
    control: torch.Tensor | None = None     # SCAFFOLD's server variate c


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("groupfel", "torch", "numpy", "simpy", "pandas", "networkx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _save_checkpoint(path: Path, state: ArmState) -> None:
    blob = {"t": state.t, "weights": state.weights, "sim_time": state.sim_time, "round_time": state.round_time,
            "ledger": state.ledger.state(), "rows": state.rows, "initial_grouping": state.initial_grouping,
            "clients": state.clients.state() if state.clients else None, "control": state.control}
    atomic_write(path, lambda p: torch.save(blob, p))


def _load_checkpoint(path: Path) -> ArmState:
    blob = torch.load(path, weights_only=False)
    return ArmState(blob["t"], blob["weights"], blob["sim_time"], blob["round_time"],
                    CostLedger.from_state(blob["ledger"]), blob["rows"], blob["initial_grouping"],
                    ClientState.from_state(blob["clients"]) if blob["clients"] else None, blob["control"])


def run_arm(world: World, plan: ArmPlan, arm_dir: Path,
            on_round: Callable[[int, float, float | None], None] | None = None) -> pd.DataFrame:
    """Run (or resume) one arm; write results.{csv,parquet}, ledger.parquet and manifest.json."""
    cfg, arm, topo = world.config, plan.arm, world.topology
    tc = cfg.train
    arm_dir.mkdir(parents=True, exist_ok=True)
    ckpt = arm_dir / CHECKPOINT
    wall0 = time.perf_counter()
    state = _load_checkpoint(ckpt) if ckpt.exists() else ArmState()

    regroup = arm.regroup_every
    epoch = (state.t // regroup) * regroup if regroup else 0
    grouping = form_groups(world, plan, epoch)
    clar = getattr(plan.grouping, "cluster_round", None)   # FedCLAR: regroup once, by clustering
    if clar is not None and state.t > clar:                  # a resume past it: the saved clusters
        grouping = GroupingResult(global_mode_groups(world, plan.grouping, None, clar, arm_dir)[0], 0, 0)
    n_total = float(sum(g.total_samples for g in grouping.groups))
    n_groups0 = state.initial_grouping["n_groups"] if state.initial_grouping else len(grouping.groups)
    notes = input_warnings(world, plan, n_groups0)
    for note in notes:
        warnings.warn(note, InputWarning, stacklevel=2)

    fresh = state.weights is None
    scaffold = tc.algorithm == "scaffold"
    if fresh:
        state.weights = world.engine.initial_weights(cfg.seed)
        persistent = tc.client_state == "persistent" and tc.momentum > 0
        if scaffold or persistent:
            state.clients = ClientState.create(topo.n_clients, world.engine.n_params, scaffold, persistent)
        if scaffold:
            state.control = torch.zeros_like(state.weights)
    env = Federation.environment(state.sim_time)
    fed = Federation(RoundContext(env, world.engine.model_bytes, world.cost, state.ledger, topo, cfg.seed,
                                  tc.group_rounds, tc.local_epochs, cfg.faults))

    def charge_probe(t: int, grouping: GroupingResult) -> None:
        """A gradient probe (HCCT) is training: charge it, and let the clients run it in parallel."""
        for j, members, amounts in grouping.probe:
            state.ledger.charge(round=t, edge=j, group=-1, group_round=-1, clients=members,
                                devices=[topo.client_device[c] for c in members], component=TRAINING,
                                amounts=amounts, start=np.full(len(members), env.now), end=env.now + amounts)
        if grouping.probe:
            env.run(until=env.now + max(float(a.max()) for _, _, a in grouping.probe))

    if fresh:   # results' round 0: the initial model, before anything is charged
        state.initial_grouping = grouping.summary()
        _evaluate(world, plan, state, grouping, sampled=[])
    if epoch == state.t:        # a fresh start, or a resume just before a regrouping
        charge_probe(state.t, grouping)

    log_p = plan.sampling.log_probabilities(np.array([g.cov for g in grouping.groups]))
    stop_reason, S, ran = "rounds", None, []   # ran: the groups of the last round run
    while tc.rounds is None or state.t < tc.rounds:
        t = state.t
        if (regroup and t > 0 and t % regroup == 0 and t != epoch) or t == clar:   # Sec. 5.2; FedCLAR
            epoch = t
            if t == clar:
                groups, work = global_mode_groups(world, plan.grouping, state.weights, t, arm_dir)
                grouping = GroupingResult(groups, 0, 0, work)
            else:
                grouping = form_groups(world, plan, epoch)
            charge_probe(t, grouping)
            log_p = plan.sampling.log_probabilities(np.array([g.cov for g in grouping.groups]))
            n_total = float(sum(g.total_samples for g in grouping.groups))
        S, chosen = _choose(world, plan, grouping.groups, log_p, t)
        if tc.budget is not None:
            cost = fed.round_cost(t, [grouping.groups[g] for g in chosen])
            if state.ledger.total + cost > tc.budget:
                if t == 0:   # only reachable where grouping trains (else plan_arm refused the budget)
                    raise _budget_error(tc.budget, state.ledger.total + cost, f"arm {arm.name!r}")
                stop_reason = "budget"
                break
        weights = plan.aggregation.weights(np.array([grouping.groups[g].total_samples for g in chosen]),
                                           log_p[chosen], n_total)
        if not np.all(np.isfinite(weights)):
            raise DivergenceError(
                f"round {t + 1}: {plan.aggregation.name} aggregation weight 1/(p_g·S) overflowed (smallest sampled "
                f"p_g = {np.exp(log_p[chosen].min()):.3g}); use aggregation = \"stabilized\" (Eq. 39) or a "
                f"flatter sampling policy")
        sampled = {int(g): grouping.groups[g] for g in chosen}
        spec = LocalSpec(cfg.seed, tc.group_rounds, tc.local_epochs, tc.lr * tc.lr_decay ** t, tc.algorithm,
                         cfg.faults)
        control = {g: state.control for g in sampled} if scaffold else None
        models = run_group_rounds(world.engine, {g: state.weights for g in sampled}, sampled, t, spec,
                                  state.clients, control)                   # compute, then time:
        fed.run_round(t, list(sampled.items()))
        x = sum(float(w) * models[int(g)] for w, g in zip(weights, chosen))   # Line 15 / Eq. 4 / Eq. 39
        if scaffold:
            state.control = aggregate_control(state.control, control, chosen, weights)
        growth = float(torch.linalg.vector_norm(x) / torch.linalg.vector_norm(state.weights))
        if not (np.isfinite(growth) and growth < DIVERGENCE_GROWTH):
            raise DivergenceError(
                f"round {t + 1}: the global model's norm grew {growth:.3g}x in one round under {plan.aggregation.name} "
                f"aggregation (largest weight {weights.max():.3g}, sum {weights.sum():.3g}); use aggregation = "
                f"\"stabilized\" (Eq. 39), a flatter sampling policy, or a lower train.lr")
        state.round_time = float(env.now) - state.sim_time
        state.weights, state.t, state.sim_time, ran = x, t + 1, float(env.now), chosen
        acc = None
        if state.t % tc.eval_every == 0:
            acc = _evaluate(world, plan, state, grouping, chosen)
            _save_checkpoint(ckpt, state)
            _write_results(arm_dir, state)
        if on_round:
            on_round(state.t, state.ledger.total, acc)
    if state.rows[-1]["round"] != state.t:
        _evaluate(world, plan, state, grouping, ran)
    df = _write_results(arm_dir, state)
    atomic_write(arm_dir / "ledger.parquet", lambda p: state.ledger.frame().to_parquet(p, index=False))
    write_json(arm_dir / "manifest.json", {
        "arm": arm.name, "seed": cfg.seed, "complete": True, "stop_reason": stop_reason,
        "rounds_run": state.t, "total_cost_eq5": state.ledger.total, "sim_time_s": state.sim_time,
        "aggregation": plan.aggregation.description, "grouping_policy": plan.grouping.name,
        "sampling_policy": plan.sampling.name, "groups_per_round": S,
        "warnings": notes, "grouping": state.initial_grouping, "regroupings": (state.t - 1) // regroup if regroup and state.t else 0,
        "model_parameters": world.engine.n_params, "wall_seconds_last_session": time.perf_counter() - wall0,
        "versions": _versions(), "config": json.loads(cfg.model_dump_json())})
    ckpt.unlink(missing_ok=True)
    return df


def _evaluate(world: World, plan: ArmPlan, state: ArmState, grouping: GroupingResult, sampled) -> float:
    acc, loss = world.engine.evaluate(state.weights)
    if not np.isfinite(loss):
        raise DivergenceError(f"round {state.t}: test loss is {loss} under {plan.aggregation.name} aggregation; "
                              f"lower train.lr or use aggregation = \"stabilized\"")
    led = state.ledger
    training = led.by_component.get(TRAINING, 0.0)
    state.rows.append({
        "arm": plan.arm.name, "round": state.t, "cost": led.total, "training_cost": training,
        "overhead_cost": led.total - training, "sim_time_s": state.sim_time,
        "round_time_s": state.round_time, "accuracy": acc, "loss": loss,
        "groups_sampled": len(sampled),
        "clients_sampled": int(sum(grouping.groups[g].size for g in sampled)),
        "avg_sampled_cov": float(np.mean([grouping.groups[g].cov for g in sampled])) if len(sampled) else np.nan})
    return acc


def _write_results(arm_dir: Path, state: ArmState) -> pd.DataFrame:
    df = pd.DataFrame(state.rows)
    atomic_write(arm_dir / "results.csv", lambda p: df.to_csv(p, index=False))
    atomic_write(arm_dir / "results.parquet", lambda p: df.to_parquet(p, index=False))
    return df
