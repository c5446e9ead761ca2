"""The one arm driver (Alg. 1's outer loop) and the single entry point of ``experiments/``.

:func:`plan_arms` validates every arm of a config against its world (policies, mode, budget)
before anything is written; :func:`run_arm` runs (or resumes) one arm in either mode. The loop
here is the same for both modes: membership changes, the cloud's sample, the budget, one round of
compute and simulated time, evaluation, checkpoints and the arm's files. What differs between
global mode (one model aggregated by the cloud) and per-group mode (every group keeps its own
model) is a :class:`RoundStrategy` (:mod:`groupfel.emulator.rounds`); the loop names no policy and no
algorithm: it reads their declarations (:class:`groupfel.policies.GroupingPolicy`,
:class:`groupfel.emulator.algorithms.Algorithm`).

Randomness is drawn from named streams (:mod:`groupfel.emulator.rng`) keyed by (seed, stream, round, ...)
rather than from one running generator, so a run resumed from a checkpoint draws exactly what an
uninterrupted run draws and the result tables match.
"""
from __future__ import annotations

import json
import pickle
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from groupfel.errors import DivergenceError, InputError, InputWarning
from groupfel.policies import aggregations, groupings, samplings
from groupfel.userfile import check_file

from . import numerics
from .arm import (TRANSIENT, ArmPlan, ArmState, RoundStrategy, aggregation_weights, budget_error, energy_budget_error,
                  sample_groups)
from .io import CHECKPOINT, atomic_write, read_checkpoint, remove_checkpoint, remove_inside, write_checkpoint, write_json
from .ledger import CostLedger
from .eq5 import cost_record
from .membership import write_distances
from .rounds import STRATEGIES
from .world import World

OnRound = Callable[[int, float, float | None], None]
# What each mode's round strategy can run of a policy's declared regroup kind (GroupingPolicy.regroup)
REGROUP_KINDS = {"global": ("interval", "cluster"),
                 "per-group": ("interval", "cluster", "every-round", "merge", "split", "nearest")}


def plan_arm(world: World, index: int) -> ArmPlan:
    """Validate one arm's policies against the world and the mode (before anything is written)."""
    cfg, arm = world.config, world.config.arms[index]
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
        for key in ("n_clusters", "n_groups"):   # a model (or cluster) per group: never more than clients
            k = getattr(grouping, key, None)
            if isinstance(k, int) and k > n:
                raise InputError(f"{where}.grouping.{key}: {k:,} exceeds the {n} clients of edge {j}, so most "
                                 f"clusters would hold no client; give at most {n}")
    k, n = getattr(world.algorithm, "n_clusters", None), world.topology.n_clients
    if isinstance(k, int) and k > n:
        raise InputError(f"train.algorithm_params.n_clusters: {k:,} exceeds the run's {n} clients, so most "
                         f"cluster models would train on no client; give at most {n}")
    s = arm.sampler.model_dump(exclude={"policy", "groups_per_round", "data_fraction", "draw", "fraction_of"})
    sampling = samplings.make(arm.sampler.policy, s, f"{where}.sampling")
    aggregation = aggregations.make(arm.aggregation, None, f"{where}.aggregation")
    plan = ArmPlan(arm, grouping, sampling, aggregation, cfg.mode)
    _check_mode(world, plan, where)
    STRATEGIES[cfg.mode].check(world, plan, where)
    _try_plugins(world, plan, where, name)
    return plan


def _try_plugins(world: World, plan: ArmPlan, where: str, name: object) -> None:
    """A plug-in policy's contracts at plan time, where its first call is cheap: the first grouping
    of a policy that needs only label counts (the same stream as round 0 draws, so nothing
    changes), then the sampling and aggregation weights of those groups. What is found only in
    round 1 stops the run there (:func:`run_arm`)."""
    from groupfel.policies import aggregations as aggs, groupings as grps, samplings as sams

    from .membership import form_groups

    plug = {"grouping": isinstance(name, str) and name not in grps,
            "sampling": plan.sampling is not None and plan.arm.sampler.policy not in sams,
            "aggregation": plan.aggregation is not None and plan.arm.aggregation not in aggs}
    if not any(plug.values()):
        return
    policy = plan.grouping
    if policy.needs_gradients or policy.needs_distances or plan.regroup not in ("interval", "split"):
        return
    with _in_arm(where):
        groups = form_groups(world, policy, 0).groups
        if plan.sampling is not None and groups:
            _, log_p, chosen = sample_groups(world, plan, groups, 0)
            if plan.aggregation is not None:
                from groupfel.policies import inclusion_log_probabilities

                S = len(chosen)
                log_pi = inclusion_log_probabilities(log_p, S)
                aggregation_weights(plan, np.array([groups[g].total_samples for g in chosen]), log_pi[chosen],
                                    float(sum(g.total_samples for g in groups)))


class _in_arm:
    """Prefix a contract error raised without its arm (``grouping.policy: ...``) with the arm's
    config path (``arms[i].``)."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, InputError) and str(exc).startswith(("grouping.", "sampling.", "aggregation:")):
            exc.args = (f"{self.where}.{exc.args[0]}", *exc.args[1:])
        return False


def plan_arms(world: World, only: int | None = None) -> list[ArmPlan]:
    """Every arm's plan (or only arm ``only``'s), checked against the world and the run mode."""
    return [plan_arm(world, i) for i in (range(len(world.config.arms)) if only is None else [only])]


def _check_mode(world: World, plan: ArmPlan, where: str) -> None:
    """Refuse a policy or algorithm in a mode it does not declare, from the declarations."""
    mode, policy, algorithm = world.config.mode, plan.grouping, world.algorithm
    if mode not in policy.modes:
        raise InputError(f"{where}.grouping.policy: {policy.name!r} needs mode = \"{policy.modes[0]}\" at the top "
                         f"of the config (it is mode = \"{mode}\")")
    if mode not in algorithm.modes:
        raise InputError(f"train.algorithm: {algorithm.name!r} runs in mode = \"{algorithm.modes[0]}\" only "
                         f"(this config has mode = \"{mode}\")")
    kind = plan.regroup
    if kind not in REGROUP_KINDS[mode]:
        hint = policy.mode_hint(mode)
        if hint:
            raise InputError(f"{where}.grouping.{hint}")
        other = "per-group" if mode == "global" else "global"
        raise InputError(f"{where}.grouping: {policy.name!r} regroups by {kind!r}, which mode = \"{mode}\" does not "
                         f"run; use mode = \"{other}\"")
    if kind != "interval" and plan.arm.regroup_every is not None:
        raise InputError(f"{where}.regroup_every: {policy.name!r} changes its groups on its own schedule "
                         f"({kind!r}); remove it")


def _plain(obj):
    """Checkpoint contents that ``torch.load(weights_only=True)`` accepts: tensors, python scalars,
    str, None and lists/dicts of them (numeric arrays become tensors, string arrays lists)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist() if obj.dtype == object else torch.tensor(obj, device="cpu")
    if isinstance(obj, torch.Tensor):
        return obj.cpu()   # a checkpoint resumes on any device
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def save_checkpoint(path: Path, state: ArmState) -> None:
    """Write an arm's state as tensors and plain containers (see :func:`load_checkpoint`)."""
    blob = {f.name: getattr(state, f.name) for f in fields(state) if f.name not in TRANSIENT}
    blob["ledger"] = state.ledger.state()
    write_checkpoint(path, _plain(blob))


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> ArmState:
    """A checkpoint holds only tensors and plain containers: loading one from an untrusted run
    directory cannot run code (``weights_only=True`` refuses anything else). Its model tables
    (:data:`MODEL_TABLES`) go to ``device``, the engine's, whichever device wrote them."""
    check_file(path, str(path), "the checkpoint groupfel wrote (or delete it to restart the arm from scratch)", "run")
    try:
        blob = read_checkpoint(path)
    except InputError:   # a side file refused by the gate of users' files: its own line
        raise
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc):   # random bytes, not a pickle at all
            raise InputError(f"{path} is not a readable checkpoint (UnpicklingError); delete it to restart the "
                             f"arm from scratch") from None
        # torch's refusal of a class it would have to import; its text suggests weights_only=False, we never do
        raise InputError(f"{path} holds objects other than tensors and plain containers, so it does not load "
                         f"safely and is refused; delete it to restart the arm from scratch") from None
    except Exception as exc:   # truncated or not a torch file at all
        raise InputError(f"{path} is not a readable checkpoint ({type(exc).__name__}); delete it to "
                         f"restart the arm from scratch") from None
    names = {f.name for f in fields(ArmState)} - set(TRANSIENT)
    if isinstance(blob, dict):
        blob.setdefault("network", [])   # checkpoints from before the shared-edge model
        blob.setdefault("policy_memo", {})   # ... and from before policies kept memos and best accuracies
        blob.setdefault("best_accuracy", None)
        blob.setdefault("trained_groups", [])   # ... and from before groups.csv (it then starts where they resume)
    if not isinstance(blob, dict) or set(blob) != names:
        raise InputError(f"{path} is a checkpoint of another groupfel version; delete it to restart "
                         f"the arm from scratch")
    led = blob["ledger"]
    columns = {c: np.asarray(v, dtype=object) if isinstance(v, list) else v.numpy()
               for c, v in led["columns"].items()}
    blob["ledger"] = CostLedger.from_state({**led, "columns": columns})
    for name in MODEL_TABLES:
        blob[name] = _to(blob[name], device)
    return ArmState(**blob)


# What lives on the engine's device: models and the state of their training. The rest of an arm's
# state (assignments, flags, the ledger) is bookkeeping on the CPU.
MODEL_TABLES = ("weights", "cluster_models", "models", "momentum", "gradients", "algorithm")


def _to(obj, device):
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj.to(device) if isinstance(obj, torch.Tensor) else obj


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("groupfel", "torch", "numpy", "simpy", "pandas", "networkx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def run_arm(world: World, plan: ArmPlan, arm_dir: Path, on_round: OnRound | None = None) -> pd.DataFrame:
    """Run (or resume) one arm; write results.{csv,parquet}, ledger.parquet and manifest.json.

    A diverged or collapsed arm still writes them (results up to its last evaluation, the ledger
    of all work done, the manifest with stop reason "diverged" and the message), then raises the
    :class:`DivergenceError`."""
    cfg = world.config
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    ckpt = arm_dir / CHECKPOINT
    wall0 = time.perf_counter()
    fresh = not ckpt.exists()
    try:
        state = ArmState() if fresh else load_checkpoint(ckpt, world.engine.device)
    except InputError as exc:
        if "is not a readable checkpoint" not in str(exc):
            raise   # unsafe or of another version: the user decides
        warnings.warn(f"{ckpt}: damaged (truncated or not a checkpoint); arm {plan.arm.name!r} restarts from "
                      f"round 0 (the other arms are kept)", InputWarning, stacklevel=2)
        remove_checkpoint(ckpt)
        fresh, state = True, ArmState()
    if fresh:
        (arm_dir / numerics.SESSIONS).unlink(missing_ok=True)   # a restarted arm: its old sessions are gone
    _trim_network(arm_dir, state.t)
    recorded = numerics.session(arm_dir, cfg.train.numerics)
    diverged = None
    index = next((i for i, a in enumerate(cfg.arms) if a.name == plan.arm.name), 0)
    try:
        with _in_arm(f"arms[{index}]"):
            strategy: RoundStrategy = STRATEGIES[cfg.mode](world, plan, arm_dir, state)
            stop_reason = _rounds(strategy, fresh, ckpt, on_round)
    except DivergenceError as exc:
        stop_reason, diverged = "diverged", exc
    except InputError:
        # a contract broken in the arm's first round: keep nothing half-written (a later round's
        # failure keeps its checkpoint, so the fixed plug-in resumes from there)
        if fresh and not ckpt.exists():
            remove_inside(arm_dir, arm_dir.parent)
        raise
    df = write_results(arm_dir, state)
    atomic_write(arm_dir / "ledger.parquet", lambda p: state.ledger.frame().to_parquet(p, index=False))
    energy = state.ledger.energy_frame()
    if energy is not None:
        atomic_write(arm_dir / "energy.parquet", lambda p: energy.to_parquet(p, index=False))
    sites = state.ledger.site_frame()
    if sites is not None:       # the edge servers' and the cloud's joules (cost.edge_power, cost.cloud_power)
        atomic_write(arm_dir / "server_energy.parquet", lambda p: sites.to_parquet(p, index=False))
    strategy.write_outputs()
    strategy.fed.write_outputs(arm_dir)
    write_distances(arm_dir, (state.initial_grouping or {}).get("distances"))
    write_json(arm_dir / "manifest.json", {
        "arm": plan.arm.name, "seed": cfg.seed, **({"mode": "per-group"} if cfg.mode == "per-group" else {}),
        "complete": True, "stop_reason": stop_reason, **({"message": str(diverged)} if diverged else {}),
        **({"stop_message": state.stop_message} if state.stop_message else {}),
        "rounds_run": state.t, "total_cost_eq5": state.ledger.total, "sim_time_s": state.sim_time,
        **{f"total_{k}_energy_j": v for k, v in state.ledger.site_energy.items()},
        **({"carbon": {**world.power.carbon.manifest(), "total_g": dict(state.ledger.carbon_g)}}
           if world.power is not None and world.power.carbon is not None else {}),
        **({"total_energy_j": state.ledger.energy_total, "power_sources": world.power.sources(),
            "power_assumed": world.power.assumed()}
           if world.power is not None else {}),
        **strategy.manifest(), **strategy.fed.manifest(state.ledger), "algorithm": world.algorithm.name,
        "cost_model": cost_record(world.cost), "model_parameters": world.engine.n_params,
        "wall_seconds_last_session": time.perf_counter() - wall0,
        "versions": _versions(), **recorded, "plugins": world.plugins, "config": json.loads(cfg.model_dump_json())})
    remove_checkpoint(ckpt)
    if diverged:
        raise diverged
    return df


def _rounds(strategy: RoundStrategy, fresh: bool, ckpt: Path, on_round: OnRound | None) -> str:
    """The rounds of one arm from its state on (Alg. 1); returns the stop reason."""
    world, plan, state = strategy.world, strategy.plan, strategy.state
    tc = world.config.train
    strategy.start(fresh)
    for note in state.warnings:
        warnings.warn(note, InputWarning, stacklevel=4)
    stop = "rounds"
    while tc.rounds is None or state.t < tc.rounds:
        t = state.t
        fleet = world.power is not None and world.power.accounting == "full-fleet"
        charged = state.ledger.seconds_of(world.topology.n_clients) if fleet else None
        start = float(strategy.env.now)
        strategy.before_round(t)
        nobody = strategy.fed.await_online(strategy.members())   # never a round with nobody
        if nobody is not None:
            stop, state.stop_message = nobody.split(":")[0], nobody
            break
        groups = strategy.select(t)
        if tc.budget is not None:
            cost = strategy.fed.round_cost(t, groups)
            if state.ledger.total + cost > tc.budget:
                if t == 0:   # only reachable where grouping trains (else plan_arm refused the budget)
                    raise budget_error(tc.budget, state.ledger.total + cost, f"arm {plan.arm.name!r}")
                stop = "budget"
                break
        if tc.energy_budget is not None:
            joules = strategy.fed.round_energy(t, groups)
            if state.ledger.energy_total + joules > tc.energy_budget:
                if t == 0:   # only reachable where grouping trains (else plan_arm refused the budget)
                    raise energy_budget_error(tc.energy_budget, joules, f"arm {plan.arm.name!r}")
                stop = "energy_budget"
                break
        before = state.sim_time
        strategy.train(t)
        if fleet:
            strategy.fed.charge_fleet_idle(t, start, charged)
        state.round_time = float(strategy.env.now) - before
        state.t, state.sim_time = t + 1, float(strategy.env.now)
        acc = None
        if state.t % tc.eval_every == 0 or state.t == tc.rounds:
            acc = strategy.evaluate(final=False)
            # The checkpoint commits the round: the files before it may run ahead of it (a resume
            # trims them back to it, see _trim_network), never behind
            write_results(ckpt.parent, state, parquet=False)   # results.parquet: at the arm's end
            strategy.fed.write_outputs(ckpt.parent)
            save_checkpoint(ckpt, state)
        if on_round:
            on_round(state.t, state.ledger.total, acc)
    if state.rows[-1]["round"] != state.t:
        strategy.evaluate(final=True)
    return stop


NETWORK = "network.parquet"


def _trim_network(arm_dir: Path, rounds: int) -> None:
    """Keep the first ``rounds`` rounds of the shared edges' trace (network.parquet, rounds
    numbered from 1), those the checkpoint this session starts from holds: a killed session may
    have written later rounds before its checkpoint, and this session plays them again."""
    from .runfiles import load_parquet

    path = arm_dir / NETWORK
    if not path.exists():
        return
    if rounds == 0:
        path.unlink()
        return
    trace = load_parquet(path)
    if "round" in trace and (trace["round"] > rounds).any():
        kept = trace[trace["round"] <= rounds].reset_index(drop=True)
        atomic_write(path, lambda p: kept.to_parquet(p, index=False))


def write_results(arm_dir: Path, state: ArmState, parquet: bool = True) -> pd.DataFrame:
    df = pd.DataFrame(state.rows)
    atomic_write(arm_dir / "results.csv", lambda p: df.to_csv(p, index=False))
    if parquet:
        atomic_write(arm_dir / "results.parquet", lambda p: df.to_parquet(p, index=False))
    return df

