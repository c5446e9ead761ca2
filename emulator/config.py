"""Run configuration: TOML -> validated dataclasses (pydantic), one-line errors naming the field."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import InputError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Strict):
    dataset: Literal["digits", "fashion-mnist", "fsdd", "cifar10", "speech-commands"] = "digits"
    path: str | None = None
    partition: Literal["dirichlet"] = "dirichlet"
    alpha: float = Field(0.1, gt=0)
    min_samples: int = Field(20, ge=1)
    max_samples: int = Field(200, ge=1)
    mean_samples: float | None = Field(None, gt=0)   # default: midpoint of [min, max]
    std_samples: float | None = Field(None, ge=0)    # default: (max - min) / 4

    @model_validator(mode="after")
    def _range(self):
        if self.max_samples < self.min_samples:
            raise ValueError("max_samples must be >= min_samples")
        return self


class LinkConfig(_Strict):
    bandwidth_mbps: float = Field(gt=0)
    latency_s: float = Field(ge=0)


class TopologyConfig(_Strict):
    edges: int = Field(3, ge=1)
    clients_per_edge: int | list[int] = 100
    devices: dict[str, float] = Field(default_factory=lambda: {"raspberry-pi-4": 1.0})
    client_link: LinkConfig = LinkConfig(bandwidth_mbps=20.0, latency_s=0.02)
    edge_link: LinkConfig = LinkConfig(bandwidth_mbps=1000.0, latency_s=0.01)

    @model_validator(mode="after")
    def _sizes(self):
        sizes = self.sizes
        if len(sizes) != self.edges:
            raise ValueError(f"clients_per_edge lists {len(sizes)} edges but edges = {self.edges}")
        if min(sizes) < 1:
            raise ValueError("clients_per_edge must be >= 1 for every edge")
        return self

    @property
    def sizes(self) -> list[int]:
        c = self.clients_per_edge
        return [c] * self.edges if isinstance(c, int) else list(c)


class CostConfig(_Strict):
    task: str = "cifar10-resnet"
    # None: the algorithm's curve (train.algorithm: fedprox, scaffold) where every profile has one, else sgd
    training: str | None = None
    # None: ["secagg"], or ["scaffold-secagg"] (model + variates, twice the parameters) under scaffold
    group_operations: list[str] | None = None
    profiles_file: str | None = None  # a CSV of extra profiles (same columns as the shipped one)


class TrainConfig(_Strict):
    model: Literal["mlp", "mlp3", "cnn", "audio-cnn", "resnet-1", "resnet-3"] = "cnn"
    # batched: a whole group round per engine call; sequential: one client after another (reference)
    engine: Literal["sequential", "batched", "fused"] = "sequential"   # fused: batched's old name
    workers: int | None = Field(None, ge=1)                # batched engine's processes (None: one per core)
    device: str = "cpu"                                    # a torch device, e.g. "cuda"
    algorithm: Literal["fedavg", "fedprox", "scaffold"] = "fedavg"
    mu: float = Field(0.0, ge=0)                           # FedProx proximal weight (0 = FedAvg)
    lr: float = Field(0.05, gt=0)
    lr_decay: float = Field(1.0, gt=0, le=1)               # lr × lr_decay^t in global round t
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    client_state: Literal["fresh", "persistent"] = "fresh"  # persistent: clients keep momentum buffers
    batch_size: int = Field(32, ge=1)
    group_rounds: int = Field(5, ge=1)     # K
    local_epochs: int = Field(2, ge=1)     # E
    rounds: int | None = Field(100, ge=1)  # T; None = until the budget is spent
    budget: float | None = Field(None, gt=0)  # Eq. 5 cost budget (the paper: 1e6)
    eval_every: int = Field(1, ge=1)
    target_accuracy: float | None = Field(None, gt=0, le=1)  # summary: cost to first reach it

    @model_validator(mode="after")
    def _stop(self):
        if self.rounds is None and self.budget is None:
            raise ValueError("set rounds or budget (or both) so the run can stop")
        if self.mu and self.algorithm != "fedprox":
            raise ValueError(f"mu is FedProx's; set algorithm = \"fedprox\" or drop mu (algorithm is {self.algorithm!r})")
        return self


class SamplingConfig(_Strict):
    policy: str = "random"
    groups_per_round: int | None = Field(None, ge=1)
    data_fraction: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _one(self):
        if (self.groups_per_round is None) == (self.data_fraction is None):
            raise ValueError("set exactly one of groups_per_round or data_fraction")
        return self


class ArmConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.+-]+$")
    grouping: dict[str, Any] = Field(default_factory=lambda: {"policy": "covg"})
    sampling: SamplingConfig = SamplingConfig(groups_per_round=4)
    aggregation: str = "biased"
    regroup_every: int | None = Field(None, ge=1)  # Sec. 5.2


class StragglerConfig(_Strict):
    """Compute slowdown factor (≥ 1) of a client in one group round: ``lognormal`` draws
    max(1, exp(N(0, sigma²))) (half the clients at nominal speed, the rest slower); ``pareto``
    draws 1 + Lomax(shape) (a heavy tail: a few clients very slow)."""

    distribution: Literal["lognormal", "pareto"] = "lognormal"
    sigma: float = Field(0.5, gt=0)
    shape: float = Field(3.0, gt=0)


class FaultsConfig(_Strict):
    dropout: float = Field(0.0, ge=0, le=1)          # probability a client drops per group round
    straggler: StragglerConfig | None = None
    # recovery per dropped member when a profile has no "<op>-recovery" curve:
    # recovery_multiple × O_op(|g|) / |g| per survivor (see cost_models.model.CostModel.recovery)
    recovery_multiple: float = Field(1.0, ge=0)


class RunConfig(_Strict):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.+-]+$")
    seed: int = 0
    output_dir: str = "results"
    data: DataConfig = DataConfig()
    topology: TopologyConfig = TopologyConfig()
    cost: CostConfig = CostConfig()
    train: TrainConfig = TrainConfig()
    faults: FaultsConfig = FaultsConfig()
    arms: list[ArmConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _arms(self):
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arm names must be unique")
        return self


_FIX = {
    "extra_forbidden": "unknown key; remove it or check its spelling",
    "missing": "required; add it",
}


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "config"
    msg = _FIX.get(err["type"]) or err["msg"].removeprefix("Value error, ")
    return f"config: {loc}: {msg}"


def parse_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(_one_line(exc)) from None


def load_config(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"config file {path}: cannot read ({exc.strerror}); check the path") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"config file {path}: not valid TOML ({exc})") from None
    return parse_config(data)
