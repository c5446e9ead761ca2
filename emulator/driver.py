"""The one arm driver (Alg. 1's outer loop) and the single entry point of ``experiments/``.

:func:`plan_arms` validates every arm of a config against its world (policies, mode, budget)
before anything is written; :func:`run_arm` runs (or resumes) one arm in either mode. The loop
here is the same for both modes: membership changes, the cloud's sample, the budget, one round of
compute and simulated time, evaluation, checkpoints and the arm's files. What differs between
global mode (one model aggregated by the cloud) and per-group mode (every group keeps its own
model) is a :class:`RoundStrategy` (:mod:`emulator.rounds`); the loop names no policy and no
algorithm: it reads their declarations (:class:`policies.GroupingPolicy`,
:class:`emulator.algorithms.Algorithm`).

Randomness is drawn from named streams (:mod:`emulator.rng`) keyed by (seed, stream, round, ...)
rather than from one running generator, so a run resumed from a checkpoint draws exactly what an
uninterrupted run draws and the result tables match.
"""
from __future__ import annotations

import json
import pickle
import platform
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from policies import AggregationRule, GroupingPolicy, SamplingPolicy, aggregations, groupings, samplings

from .config import ArmConfig, config_warnings
from .errors import DivergenceError, InputError, InputWarning
from .federation import Environment, Federation, Group, RoundContext
from . import numerics
from .io import atomic_write, write_json
from .ledger import CostLedger
from .rng import rng
from .world import World

CHECKPOINT = "checkpoint.pt"
OnRound = Callable[[int, float, float | None], None]
# What each mode's round strategy can run of a policy's declared regroup kind (GroupingPolicy.regroup)
REGROUP_KINDS = {"global": ("interval", "cluster"),
                 "per-group": ("interval", "cluster", "every-round", "merge", "split", "nearest")}


@dataclass
class ArmPlan:
    arm: ArmConfig
    grouping: GroupingPolicy
    sampling: SamplingPolicy | None
    aggregation: AggregationRule | None
    mode: str = "global"

    @property
    def regroup(self) -> str:
        """How the arm's membership changes (the grouping policy's declaration in this mode)."""
        return self.grouping.regroup_in(self.mode)


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
    s = arm.sampler.model_dump(exclude={"policy", "groups_per_round", "data_fraction"})
    sampling = samplings.make(arm.sampler.policy, s, f"{where}.sampling")
    aggregation = aggregations.make(arm.aggregation, None, f"{where}.aggregation")
    plan = ArmPlan(arm, grouping, sampling, aggregation, cfg.mode)
    _check_mode(world, plan, where)
    from .rounds import STRATEGIES   # the strategies import this module

    STRATEGIES[cfg.mode].check(world, plan, where)
    return plan


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


def norm_growth(growth: float) -> str:
    """How the global model's norm changed in a round, in words ("grew infx" says nothing)."""
    return f"grew {growth:.3g}x" if np.isfinite(growth) else "became infinite or NaN (not a number)"


def budget_error(budget: float, first: float, where: str) -> InputError:
    return InputError(f"train.budget: {budget:g} is less than what the first round of {where} costs ({first:.6g}, "
                      f"Eq. 5 with its grouping and sampling), so no round would run; raise it to at least "
                      f"{first:.6g} or make rounds cheaper (fewer groups_per_round, group_rounds, local_epochs)")


def sample_groups(world: World, plan: ArmPlan, groups: list[Group], t: int) -> tuple[int, np.ndarray, np.ndarray]:
    """S, the log sampling masses of ``groups`` and the indices the cloud samples in round t (the
    ``sampling`` stream of round t, so a resume draws the same)."""
    from policies import groups_per_round, sample_without_replacement

    s = plan.arm.sampler
    log_p = plan.sampling.log_masses(np.array([g.cov for g in groups]))
    S = groups_per_round(len(groups), np.array([g.total_samples for g in groups]),
                         groups=s.groups_per_round, data_fraction=s.data_fraction)
    return S, log_p, sample_without_replacement(log_p, S, rng(world.config.seed, "sampling", t))


def new_federation(world: World, env: Environment, ledger: CostLedger) -> Federation:
    cfg, tc = world.config, world.config.train
    return Federation(RoundContext(env, world.engine.model_bytes, world.cost, ledger, world.topology, cfg.seed,
                                   tc.group_rounds, tc.local_epochs, cfg.faults, world.algorithm.training_passes))


# -- state --------------------------------------------------------------------------------------

@dataclass
class ArmState:
    """Everything an arm carries across rounds; all of it is checkpointed (tensors and plain
    containers) except the fields named in :data:`TRANSIENT`."""

    t: int = 0
    sim_time: float = 0.0
    round_time: float = 0.0                 # simulated duration of the last round
    ledger: CostLedger = field(default_factory=CostLedger)
    rows: list[dict] = field(default_factory=list)
    initial_grouping: dict | None = None    # the manifest's summary of the first grouping
    algorithm: dict | None = None           # the training algorithm's AlgorithmState.state()
    momentum: torch.Tensor | None = None    # every client's optimiser momentum (client_state = "persistent")
    # global mode
    weights: torch.Tensor | None = None     # the global model
    grouping: dict | None = None            # summary of the grouping in use, formed at round grouping_epoch
    grouping_epoch: int = 0
    cluster_models: torch.Tensor | None = None   # after a "cluster" regroup: one model per cluster
    # per-group mode
    models: torch.Tensor | None = None      # (models, P): one per group / cluster
    model_edge: list[int] = field(default_factory=list)
    assign: torch.Tensor | None = None      # client -> model row (−1: in no group)
    # each client's latest upload (N, P): its gradient ("merge", "split") or local model ("nearest")
    gradients: torch.Tensor | None = None
    uploaded: torch.Tensor | None = None    # ... and whether it has one
    # not checkpointed: recomputed each session
    groups_per_round: int | None = None     # S of the last round
    warnings: list[str] = field(default_factory=list)   # input accepted with an adjustment


TRANSIENT = ("groups_per_round", "warnings")


def _plain(obj):
    """Checkpoint contents that ``torch.load(weights_only=True)`` accepts: tensors, python scalars,
    str, None and lists/dicts of them (numeric arrays become tensors, string arrays lists)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist() if obj.dtype == object else torch.tensor(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def save_checkpoint(path: Path, state: ArmState) -> None:
    """Write an arm's state as tensors and plain containers (see :func:`load_checkpoint`)."""
    blob = {f.name: getattr(state, f.name) for f in fields(state) if f.name not in TRANSIENT}
    blob["ledger"] = state.ledger.state()
    blob = _plain(blob)
    atomic_write(path, lambda p: torch.save(blob, p))


def load_checkpoint(path: Path) -> ArmState:
    """A checkpoint holds only tensors and plain containers: loading one from an untrusted run
    directory cannot run code (``weights_only=True`` refuses anything else)."""
    try:
        blob = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:   # torch's refusal; its text suggests weights_only=False, we never do
        raise InputError(f"--resume: {path} holds objects other than tensors and plain containers, so it "
                         f"does not load safely and is refused; delete it to restart the arm from scratch") from None
    except Exception as exc:   # truncated or not a torch file at all
        raise InputError(f"--resume: {path} is not a readable checkpoint ({type(exc).__name__}); delete it to "
                         f"restart the arm from scratch") from None
    names = {f.name for f in fields(ArmState)} - set(TRANSIENT)
    if not isinstance(blob, dict) or set(blob) != names:
        raise InputError(f"--resume: {path} is a checkpoint of another groupfel version; delete it to restart "
                         f"the arm from scratch")
    led = blob["ledger"]
    columns = {c: np.asarray(v, dtype=object) if isinstance(v, list) else v.numpy()
               for c, v in led["columns"].items()}
    blob["ledger"] = CostLedger.from_state({**led, "columns": columns})
    return ArmState(**blob)


# -- the round strategy interface ------------------------------------------------------------------

class RoundStrategy(ABC):
    """What one mode does in the driver's loop (:mod:`emulator.rounds` has both)."""

    mode: str

    def __init__(self, world: World, plan: ArmPlan, arm_dir: Path, state: ArmState):
        self.world, self.plan, self.arm_dir, self.state = world, plan, arm_dir, state
        self.env = Federation.environment(state.sim_time)
        self.fed = new_federation(world, self.env, state.ledger)

    @classmethod
    def check(cls, world: World, plan: ArmPlan, where: str) -> None:
        """Mode-specific input checks, before anything is written."""

    @abstractmethod
    def start(self, fresh: bool) -> None:
        """Set up the first grouping and models (``fresh``) or what a resumed run recomputes."""

    @abstractmethod
    def before_round(self, t: int) -> None:
        """Membership changes before round t (the policy's declared regroup kind), charged."""

    @abstractmethod
    def select(self, t: int) -> list[Group]:
        """The groups that run round t (the cloud's sample)."""

    @abstractmethod
    def train(self, t: int) -> None:
        """Round t of the selected groups: compute, simulated time and charges, aggregation."""

    @abstractmethod
    def evaluate(self, final: bool = False) -> float:
        """Append the result row of the current state; returns its accuracy (``final``: after the
        loop, the last round not evaluated yet)."""

    def manifest(self) -> dict:
        """The mode's own manifest entries."""
        return {}

    def write_outputs(self) -> None:
        """Files besides results, ledger and manifest."""


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("groupfel", "torch", "numpy", "simpy", "pandas", "networkx"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def input_warnings(world: World, plan: ArmPlan, n_groups: int) -> list[str]:
    """What the run accepts but adjusts: printed once (as :class:`InputWarning`) and kept in the manifest."""
    out = config_warnings(world.config) + world.cost_warnings
    S = plan.arm.sampler.groups_per_round if plan.arm.sampling is not None or plan.mode == "global" else None
    if S is not None and S > n_groups:
        out.append(f"{plan.arm.name}: sampling.groups_per_round = {S} exceeds the {n_groups} groups formed; "
                   f"every round samples all {n_groups}")
    return out


def run_arm(world: World, plan: ArmPlan, arm_dir: Path, on_round: OnRound | None = None) -> pd.DataFrame:
    """Run (or resume) one arm; write results.{csv,parquet}, ledger.parquet and manifest.json.

    A diverged or collapsed arm still writes them (results up to its last evaluation, the ledger
    of all work done, the manifest with stop reason "diverged" and the message), then raises the
    :class:`DivergenceError`."""
    from .rounds import STRATEGIES

    cfg = world.config
    arm_dir = Path(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    ckpt = arm_dir / CHECKPOINT
    wall0 = time.perf_counter()
    fresh = not ckpt.exists()
    state = ArmState() if fresh else load_checkpoint(ckpt)
    if fresh:
        (arm_dir / numerics.SESSIONS).unlink(missing_ok=True)   # a restarted arm: its old sessions are gone
    recorded = numerics.session(arm_dir, cfg.train.numerics)
    strategy: RoundStrategy = STRATEGIES[cfg.mode](world, plan, arm_dir, state)
    diverged = None
    try:
        stop_reason = _rounds(strategy, fresh, ckpt, on_round)
    except DivergenceError as exc:
        stop_reason, diverged = "diverged", exc
    df = write_results(arm_dir, state)
    atomic_write(arm_dir / "ledger.parquet", lambda p: state.ledger.frame().to_parquet(p, index=False))
    strategy.write_outputs()
    write_json(arm_dir / "manifest.json", {
        "arm": plan.arm.name, "seed": cfg.seed, **({"mode": "per-group"} if cfg.mode == "per-group" else {}),
        "complete": True, "stop_reason": stop_reason, **({"message": str(diverged)} if diverged else {}),
        "rounds_run": state.t, "total_cost_eq5": state.ledger.total, "sim_time_s": state.sim_time,
        **strategy.manifest(), "algorithm": world.algorithm.name,
        "model_parameters": world.engine.n_params, "wall_seconds_last_session": time.perf_counter() - wall0,
        "versions": _versions(), **recorded, "plugins": world.plugins, "config": json.loads(cfg.model_dump_json())})
    ckpt.unlink(missing_ok=True)
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
        strategy.before_round(t)
        groups = strategy.select(t)
        if tc.budget is not None:
            cost = strategy.fed.round_cost(t, groups)
            if state.ledger.total + cost > tc.budget:
                if t == 0:   # only reachable where grouping trains (else plan_arm refused the budget)
                    raise budget_error(tc.budget, state.ledger.total + cost, f"arm {plan.arm.name!r}")
                stop = "budget"
                break
        before = state.sim_time
        strategy.train(t)
        state.round_time = float(strategy.env.now) - before
        state.t, state.sim_time = t + 1, float(strategy.env.now)
        acc = None
        if state.t % tc.eval_every == 0 or state.t == tc.rounds:
            acc = strategy.evaluate(final=False)
            save_checkpoint(ckpt, state)
            write_results(ckpt.parent, state)
        if on_round:
            on_round(state.t, state.ledger.total, acc)
    if state.rows[-1]["round"] != state.t:
        strategy.evaluate(final=True)
    return stop


def write_results(arm_dir: Path, state: ArmState) -> pd.DataFrame:
    df = pd.DataFrame(state.rows)
    atomic_write(arm_dir / "results.csv", lambda p: df.to_csv(p, index=False))
    atomic_write(arm_dir / "results.parquet", lambda p: df.to_parquet(p, index=False))
    return df

