"""What the arm driver (:mod:`groupfel.emulator.driver`) and its round strategies
(:mod:`groupfel.emulator.rounds`) share: an arm's plan, its state across rounds, the round
strategy interface, and the helpers both use (the cloud's sample, a new federation, budget and
divergence messages). The driver imports the strategies; both import this module, so neither
imports the other."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from groupfel.errors import InputError
from groupfel.policies import AggregationRule, GroupingPolicy, SamplingPolicy

from .config import ArmConfig, config_warnings
from .federation import Environment, Federation, Group, RoundContext
from .ledger import CostLedger
from .rng import rng
from .world import World


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



def norm_growth(growth: float) -> str:
    """How the global model's norm changed in a round, in words ("grew infx" says nothing)."""
    return f"grew {growth:.3g}x" if np.isfinite(growth) else "became infinite or NaN (not a number)"


def budget_error(budget: float, first: float, where: str) -> InputError:
    return InputError(f"train.budget: {budget:g} is less than what the first round of {where} costs ({first:.6g}, "
                      f"Eq. 5 with its grouping and sampling), so no round would run; raise it to at least "
                      f"{first:.6g} or make rounds cheaper (fewer groups_per_round, group_rounds, local_epochs)")


def energy_budget_error(budget: float, first: float, where: str) -> InputError:
    return InputError(f"train.energy_budget: {budget:g} J is below the first round's {first:.6g} J ({where}); "
                      f"raise it to at least that")


def sample_groups(world: World, plan: ArmPlan, groups: list[Group], t: int) -> tuple[int, np.ndarray, np.ndarray]:
    """S, the log sampling masses of ``groups`` and the indices the cloud samples in round t (the
    ``sampling`` stream of round t, so a resume draws the same)."""
    from groupfel.policies import SamplingPolicy, groups_per_round, sample_successive, sample_without_replacement
    from groupfel.policies.sampling import cov_zero_first

    from .contracts import calling, check_weights, spec_of

    s = plan.arm.sampler
    covs = np.array([g.cov for g in groups])
    spec = spec_of(plan.sampling)
    # the plug-in's own return is checked before our code touches it (the base class's log_masses
    # calls log_weights, then gives CoV 0 its infinite weight)
    own = type(plan.sampling).log_masses is not SamplingPolicy.log_masses
    hook = "log_masses()" if own else "log_weights()"
    with calling("sampling.policy", spec, hook), np.errstate(divide="ignore"):
        log_p = (plan.sampling.log_masses if own else plan.sampling.log_weights)(covs)
    log_p = check_weights(log_p, len(groups), "sampling.policy", spec, "sampling", hook, allow_inf=covs == 0)
    if not own:
        log_p = cov_zero_first(covs, log_p)
    S = groups_per_round(len(groups), np.array([g.total_samples for g in groups]),
                         groups=s.groups_per_round, data_fraction=s.data_fraction,
                         total_samples=float(world.topology.n_samples.sum()) if s.fraction_of == "all-clients" else None)
    draw = sample_successive if s.draw == "successive" else sample_without_replacement
    return S, log_p, draw(log_p, S, rng(world.config.seed, "sampling", t))


def aggregation_weights(plan: ArmPlan, n_g: np.ndarray, log_pi: np.ndarray, n_total: float) -> np.ndarray:
    """The aggregation rule's weights of the sampled groups, checked: one finite weight per group."""
    from .contracts import calling, check_weights, spec_of

    spec = spec_of(plan.aggregation)
    with calling("aggregation", spec, "weights()"):
        w = plan.aggregation.weights(n_g, log_pi, n_total)
    check_weights(w, len(n_g), "aggregation", spec, "aggregation", "weights()")
    return w


def new_federation(world: World, env: Environment, ledger: CostLedger, stats: list | None = None) -> Federation:
    """The round's processes: shared edges where a topology key asks for them (``stats``
    receives their per-round makespan, utilisation and bytes), else dedicated links."""
    cfg, tc = world.config, world.config.train
    ctx = RoundContext(env, world.engine.model_bytes, world.cost, ledger, world.topology, cfg.seed,
                       tc.group_rounds, tc.local_epochs, cfg.faults, world.algorithm.training_passes)
    ledger.power = getattr(world, "power", None)
    network = getattr(world, "network", None)
    if network is None:
        return Federation(ctx)
    from .network import ContendedFederation

    return ContendedFederation(ctx, network, stats)


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
    policy_memo: dict = field(default_factory=dict)   # edge -> what the grouping policy keeps there (EdgeView.memo)
    trained_groups: list[dict] = field(default_factory=list)   # every round's groups that trained (groups.csv)
    best_accuracy: np.ndarray | None = None  # each client's best local test accuracy over evaluations at t >= 1
    network: list[dict] = field(default_factory=list)   # shared edges: each round's makespan, utilisation, bytes
    # not checkpointed: recomputed each session
    groups_per_round: int | None = None     # S of the last round
    warnings: list[str] = field(default_factory=list)   # input accepted with an adjustment
    stop_message: str | None = None         # why the run stopped early (availability, batteries)


TRANSIENT = ("groups_per_round", "warnings", "stop_message")


# -- the round strategy interface ------------------------------------------------------------------

class RoundStrategy(ABC):
    """What one mode does in the driver's loop (:mod:`groupfel.emulator.rounds` has both)."""

    mode: str

    def __init__(self, world: World, plan: ArmPlan, arm_dir: Path, state: ArmState):
        self.world, self.plan, self.arm_dir, self.state = world, plan, arm_dir, state
        self.env = Federation.environment(state.sim_time)
        self.fed = new_federation(world, self.env, state.ledger, state.network)

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

    def members(self) -> np.ndarray | None:
        """The clients a round can sample (None: every client)."""
        return None

    def manifest(self) -> dict:
        """The mode's own manifest entries."""
        return {}

    def write_outputs(self) -> None:
        """Files besides results, ledger and manifest."""


def online_groups(fed: Federation, groups: list[Group]) -> np.ndarray:
    """Indices of the groups with a member online at the clock's time (every group where
    availability and batteries do not apply): FedScale samples only the clients online then."""
    online = fed.online_now()
    if online is None:
        return np.arange(len(groups))
    return np.flatnonzero([online[g.clients].any() for g in groups])


def input_warnings(world: World, plan: ArmPlan, n_groups: int) -> list[str]:
    """What the run accepts but adjusts: printed once (as :class:`InputWarning`) and kept in the manifest."""
    out = config_warnings(world.config) + world.cost_warnings
    S = plan.arm.sampler.groups_per_round if plan.arm.sampling is not None or plan.mode == "global" else None
    if S is not None and S > n_groups:
        out.append(f"{plan.arm.name}: sampling.groups_per_round = {S} exceeds the {n_groups} groups formed; "
                   f"every round samples all {n_groups}")
    return out
