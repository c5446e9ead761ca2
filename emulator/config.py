"""Run configuration: TOML -> validated dataclasses (pydantic), one-line errors naming the field."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import InputError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClientTypeConfig(_Strict):
    """One client type of a label/feature/concept-shift scenario (FedCollab Sec. 5.1): how many
    clients it has, optionally a fixed sample count per client (FedCollab's large/small quantity
    shift) and what makes it differ: label weights (label-shift), a rotation in degrees
    (feature-shift) or a label permutation (concept-shift)."""

    clients: int = Field(ge=1)
    samples: int | None = Field(None, ge=2)           # per client, train + local test; default: [data] sizes
    label_weights: list[float] | None = None          # label-shift: the type's label distribution
    rotation: float | None = None                      # feature-shift: degrees, counter-clockwise
    permutation: list[int] | None = None               # concept-shift: label c becomes permutation[c]


class DataConfig(_Strict):
    dataset: Literal["digits", "fashion-mnist", "fsdd", "cifar10", "speech-commands"] = "digits"
    path: str | None = None
    # dirichlet: Group-FEL; shards: HCCT's CIFAR-10; label/feature/concept-shift: FedCollab Sec. 5.1
    partition: Literal["dirichlet", "shards", "label-shift", "feature-shift", "concept-shift"] = "dirichlet"
    alpha: float = Field(0.1, gt=0)
    # dirichlet: exactly n_i samples per client, or floor(q_ic·n_i) per class (the authors' code)
    dirichlet_counts: Literal["exact", "floor"] = "exact"
    n_shards: int = Field(100, ge=1)                   # shards: label shards over all clients
    # client sample counts: normal (Group-FEL paper), uniform (randint(min, max + 1), the Group-FEL
    # authors' code), half-normal (HCCT's H(1), scaled to mean_samples)
    sizes: Literal["normal", "uniform", "half-normal"] = "normal"
    min_samples: int = Field(20, ge=1)
    max_samples: int = Field(200, ge=1)
    mean_samples: float | None = Field(None, gt=0)   # default: midpoint of [min, max]
    std_samples: float | None = Field(None, ge=0)    # default: (max - min) / 4
    types: list[ClientTypeConfig] | None = None      # label/feature/concept-shift; default: FedCollab's four
    # share of each client's samples held out as its local test split (same distribution, disjoint
    # from its training samples); default: 0.2 in per-group mode, none in global mode
    test_fraction: float | None = Field(None, ge=0, lt=1)

    @model_validator(mode="after")
    def _range(self):
        if self.max_samples < self.min_samples:
            raise ValueError("max_samples must be >= min_samples")
        if self.types is not None and self.partition not in SHIFTS:
            raise ValueError(f"types: only used by partition = {' | '.join(SHIFTS)}; remove it or change partition")
        field = SHIFTS.get(self.partition)
        for i, t in enumerate(self.types or []):
            if field and getattr(t, field) is None:
                raise ValueError(f"types[{i}].{field}: required for partition = \"{self.partition}\"")
        return self


# the ClientTypeConfig field that defines each shift scenario
SHIFTS = {"label-shift": "label_weights", "feature-shift": "rotation", "concept-shift": "permutation"}


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
    engine: Literal["sequential", "batched"] = "batched"   # batched measured faster for every model (README)
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
    # None: global mode samples 4 groups a round; per-group mode trains every group every round.
    # (None rather than a default object, so that "not set" survives a dump and re-parse.)
    sampling: SamplingConfig | None = None
    aggregation: str = "biased"
    regroup_every: int | None = Field(None, ge=1)  # Sec. 5.2

    @property
    def sampler(self) -> SamplingConfig:
        """The sampling in effect (global mode's default when ``sampling`` is not set)."""
        return self.sampling if self.sampling is not None else SamplingConfig(groups_per_round=4)


class StragglerConfig(_Strict):
    """Compute slowdown factor (≥ 1) of a client in one group round: ``lognormal`` draws
    max(1, exp(N(0, sigma²))) (half the clients at nominal speed, the rest slower); ``pareto``
    draws 1 + Lomax(shape) (a heavy tail: a few clients very slow)."""

    distribution: Literal["lognormal", "pareto"] = "lognormal"
    sigma: float = Field(0.5, gt=0)
    shape: float = Field(3.0, gt=0)


class FaultsConfig(_Strict):
    # probability a client drops per group round; 1 would drop every client of every group round
    dropout: float = Field(0.0, ge=0, le=1)
    straggler: StragglerConfig | None = None
    # recovery per dropped member when a profile has no "<op>-recovery" curve:
    # recovery_multiple × O_op(|g|) / |g| per survivor (see cost_models.model.CostModel.recovery)
    recovery_multiple: float = Field(1.0, ge=0)


class RunConfig(_Strict):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.+-]+$")
    # global: Group-FEL's one cloud model; per-group: every group keeps its own model (HCCT,
    # FedCollab), evaluated on the clients' local test splits
    mode: Literal["global", "per-group"] = "global"
    seed: int = Field(0, ge=0)
    seeds: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1)   # several seeds: every arm runs on each
    output_dir: str = "results"
    data: DataConfig = DataConfig()
    topology: TopologyConfig = TopologyConfig()
    cost: CostConfig = CostConfig()
    train: TrainConfig = TrainConfig()
    faults: FaultsConfig = FaultsConfig()
    arms: list[ArmConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _arms(self):
        if self.mode == "per-group" and (self.train.algorithm == "scaffold" or self.train.client_state == "persistent"):
            raise ValueError("per-group mode runs fedavg and fedprox with fresh client state; use mode = \"global\" "
                             "for train.algorithm = \"scaffold\" or train.client_state = \"persistent\"")
        if self.faults.dropout >= 1:
            raise ValueError("faults.dropout = 1 drops every client of every group round: nothing would train, "
                             "and every round's cost would buy nothing; use a value below 1")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arm names must be unique")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        return self

    @property
    def test_fraction(self) -> float:
        """The local test share in effect (DataConfig.test_fraction's mode-dependent default)."""
        f = self.data.test_fraction
        return f if f is not None else (0.2 if self.mode == "per-group" else 0.0)

    @property
    def seed_list(self) -> list[int]:
        """The seeds to run: ``seeds`` when given, else the single ``seed``."""
        return list(self.seeds) if self.seeds is not None else [self.seed]


_FIX = {
    "extra_forbidden": "unknown key; remove it or check its spelling",
    "missing": "required; add it",
}


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = _FIX.get(err["type"]) or err["msg"].removeprefix("Value error, ")
    return f"config: {loc}: {msg}" if loc else f"config: {msg}"


def parse_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(_one_line(exc)) from None


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """A user's TOML file as a dict; unreadable, binary or invalid files are one-line errors."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror}); check the path") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path}: not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset "
                         f"{exc.start}); give a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what} {path}: not valid TOML ({exc})") from None


def load_config(path: str | Path) -> RunConfig:
    """A user's run config. Config files the tool writes (config.json, holding both ``seed`` and
    ``seeds``) are read with :func:`parse_config`, which does not apply the checks below."""
    data = read_toml(path, "config file")
    if "arms" not in data and ("axes" in data or "base" in data):
        raise InputError(f"config file {path}: this is a sweep file (it has {'axes' if 'axes' in data else 'base'}), "
                         f"not a run config; run it with 'groupfel sweep {path}'")
    if "seed" in data and "seeds" in data:
        raise InputError(f"config file {path}: seed = {data['seed']!r} and seeds = {data['seeds']!r} are both set, "
                         f"which is ambiguous; keep seeds (every arm runs on each) or seed (one run)")
    return parse_config(data)


def config_warnings(config: RunConfig) -> list[str]:
    """Accepted-but-adjusted settings of a config (see :class:`InputWarning`)."""
    out = []
    shares = config.topology.devices
    total = sum(shares.values())
    if shares and total > 0 and abs(total - 1.0) > 1e-9:
        used = ", ".join(f"{k} = {v / total:.4g}" for k, v in sorted(shares.items()))
        out.append(f"topology.devices: shares sum to {total:g}, not 1; normalised to {used}")
    return out
