"""The whole run config: its top-level keys (name, mode, seeds, margins) and one table per section."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .arms import ArmConfig
from .base import FolderName, _Strict, path_of
from .cost import CostConfig
from .data import DataConfig
from .faults import FaultsConfig
from .limits import DEFAULT_MAX_SEEDS, INT64, MIN_MARGIN
from .topology import TopologyConfig, arrival_rounds
from .track import TrackConfig
from .train import IMAGE_MODELS, TrainConfig
from groupfel.userfile import short


class MarginsConfig(_Strict):
    """Equivalence margins δ: a difference from the reference arm inside ±δ counts as none."""
    final_acc: float = Field(0.01, ge=MIN_MARGIN, le=1, description="Final accuracy, absolute (0.01: one accuracy "
                             "point; at least 1e-4, the step of a 10,000-sample test split).")
    acc_at_common_cost: float = Field(0.01, ge=MIN_MARGIN, le=1, description="Accuracy at the common cost, absolute.")
    cost_to_target: float = Field(0.05, ge=MIN_MARGIN, le=1, description="Eq. 5 cost to the target, as a share of the "
                                  "reference arm's mean (0.05: 5 %).")
    sim_time_s: float = Field(0.05, ge=MIN_MARGIN, le=1, description="Simulated time, as a share of the reference "
                              "arm's mean.")


class RunConfig(_Strict):
    name: FolderName = Field("run", description="The run directory is "
                      "`<output_dir>/<name>`.")
    mode: Literal["global", "per-group"] = Field(
        "global", description="global: Group-FEL's one cloud model; per-group: every group keeps its own "
        "model (HCCT, FedCollab), evaluated on the clients' local test splits.")
    seed: int = Field(0, ge=0, le=INT64, description="The seed of a single-seed run: same config and seed give the same "
                      "tables.")
    world_seed: int | None = Field(
        None, ge=0, le=INT64, description="The seed of the world every seed of the run shares: the clients' data "
        "(partition, placement, local test splits), their devices and links, and FedCollab's discriminator "
        "distances; training, sampling and grouping follow the run's seed. Unset: the run's seed draws both, so "
        "each seed is a new world. Set it to vary only training, as scripts that fix the data partition do.")
    seeds: list[Annotated[int, Field(ge=0, le=INT64)]] | Literal["auto"] | None = Field(
        None, description="Instead of seed: every arm runs on each seed; means with 95 % confidence intervals. "
        "\"auto\": seeds 0, 1, 2, ... are added until every comparison is decided, or max_seeds.")
    max_seeds: int | None = Field(None, ge=3, le=10000, description="With seeds = \"auto\": the most seeds a "
                                  f"study runs (default {DEFAULT_MAX_SEEDS}).")
    seed_batch: int = Field(2, ge=1, le=10000, description="With seeds = \"auto\": seeds added between two looks "
                            "(the first look is after 3).")
    margins: MarginsConfig = Field(MarginsConfig(), description="The `[margins]` table: equivalence margins per metric.")
    withhold_skew: float | None = Field(
        None, gt=0, le=100, description="With seeds = [...] or seeds = \"auto\": make no decision on a comparison "
        "whose paired differences' sample skewness is this far from 0 or further (1.5: the rates and power it costs "
        "are in the statistics docs); it stays undecided, and a study that adds seeds goes on.")
    output_dir: path_of("output folder") = Field("results", description="Where run directories go.")
    data: DataConfig = Field(DataConfig(), description="The `[data]` table.")
    topology: TopologyConfig = Field(TopologyConfig(), description="The `[topology]` table.")
    cost: CostConfig = Field(CostConfig(), description="The `[cost]` table.")
    train: TrainConfig = Field(TrainConfig(), description="The `[train]` table.")
    faults: FaultsConfig = Field(FaultsConfig(), description="The `[faults]` table.")
    arms: list[ArmConfig] = Field(min_length=1, description="One or more `[[arms]]`; all share data, "
                                  "topology and costs.")
    # changes no result, so never saved in config.json (a tracked run and an untracked one are the same run)
    track: TrackConfig | None = Field(None, exclude=True, description="The `[track]` table: log the run to "
                                      "TensorBoard or MLflow as it goes (see the guide's track page).")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_word(cls, value):
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"{short(value)} is neither a list of seeds nor \"auto\"; give seeds = [0, 1, 2] or "
                             f"seeds = \"auto\" (seeds added until decided)")
        return value

    @model_validator(mode="after")
    def _arms(self):
        if self.mode == "per-group" and self.train.rounds is None:
            raise ValueError("train.rounds: per-group mode needs a number of rounds (the local-training reference "
                             "trains that many); set it")
        if self.mode == "per-group" and self.train.client_state != "fresh":
            raise ValueError("per-group mode runs with fresh client state; use mode = \"global\" "
                             f"for train.client_state = \"{self.train.client_state}\"")
        if self.faults.dropout >= 1:
            raise ValueError("faults.dropout = 1 drops every client of every group round: nothing would train, "
                             "and every round's cost would buy nothing; use a value below 1")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arm names must be unique")
        if isinstance(self.seeds, list) and not self.seeds:
            raise ValueError("seeds: give at least one seed, or seeds = \"auto\"")
        if isinstance(self.seeds, list) and len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        if self.max_seeds is not None and self.seeds != "auto":
            raise ValueError(f"max_seeds = {self.max_seeds} needs seeds = \"auto\" (seeds added until decided); "
                             f"remove max_seeds or set seeds = \"auto\"")
        for key in ("energy_budget", "client_energy_budget"):
            if getattr(self.train, key) is not None and not self.cost.energy:
                raise ValueError(f"train.{key} is in joules and needs cost.energy = true; set it or remove "
                                 f"train.{key}")
        if self.cost.energy_accounting != "group-rounds" and not self.cost.energy:
            raise ValueError(f"cost.energy_accounting = \"{self.cost.energy_accounting}\" says what cost.energy "
                             f"counts, and cost.energy is off, so it would change nothing; set cost.energy = true, "
                             f"or remove cost.energy_accounting")
        self._check_audio()
        self._check_arrivals()
        return self

    def _check_audio(self) -> None:
        waveform = self.data.audio == "waveform"
        if self.train.model == "audio-m5" and not waveform:
            raise ValueError("train.model = \"audio-m5\" reads raw waveforms; set data.audio = \"waveform\" "
                             "(with data.dataset = \"fsdd\" or \"speech-commands\")")
        if waveform and self.train.model in IMAGE_MODELS:
            raise ValueError(f"train.model = \"{self.train.model}\" convolves images, and data.audio = \"waveform\" "
                             f"gives 1×1×8000 signals; use train.model = \"audio-m5\" (or data.audio = \"log-mel\")")

    def _check_arrivals(self) -> None:
        a, n = self.topology.arrivals, sum(self.topology.sizes)
        if a is None:
            return
        if self.mode != "per-group":
            raise ValueError("topology.arrivals: clients join mid-run in per-group mode only; set mode = "
                             "\"per-group\" or remove topology.arrivals")
        if a.initial > n:
            raise ValueError(f"topology.arrivals.initial: {a.initial} is more than the topology's {n} clients; "
                             f"lower it or add clients")
        if n > a.initial:
            if a.per_arrival == 0:
                raise ValueError(f"topology.arrivals.per_arrival: 0 means no client joins, but the topology has "
                                 f"{n - a.initial} clients beyond the initial {a.initial}; set clients_per_edge to "
                                 f"{a.initial} or per_arrival >= 1")
            last = int(arrival_rounds(a, n)[-1])
            rounds = self.train.rounds
            if rounds is not None and last >= rounds:
                raise ValueError(f"topology.arrivals: the last of {n} clients would join at round {last}, after "
                                 f"the {rounds} rounds; raise train.rounds above {last} or use fewer clients")

    @property
    def test_fraction(self) -> float:
        """The local test share in effect (DataConfig.test_fraction's mode-dependent default)."""
        f = self.data.test_fraction
        return f if f is not None else (0.2 if self.mode == "per-group" else 0.0)

    @property
    def world_rng_seed(self) -> int:
        """The seed of the world's draws (``world_seed``, else the run's seed)."""
        return self.seed if self.world_seed is None else self.world_seed

    @property
    def seed_list(self) -> list[int]:
        """The seeds to run: ``seeds`` when given, else the single ``seed``; with ``"auto"``, the
        seeds of the first look (the runner adds the others)."""
        if self.seeds == "auto":
            return list(range(min(3, self.seed_cap)))
        return list(self.seeds) if self.seeds is not None else [self.seed]

    @property
    def seed_cap(self) -> int:
        """The most seeds a study with seeds = "auto" runs."""
        return self.max_seeds if self.max_seeds is not None else DEFAULT_MAX_SEEDS


def parts(config: RunConfig) -> list[tuple[str, str, Any]]:
    """(config field, kind, name) of every part a config names: its dataset, model and each arm's
    grouping, sampling and aggregation (any of which may be a plug-in, see :mod:`groupfel.policies.plugins`)."""
    out: list[tuple[str, str, Any]] = [("data.dataset", "dataset", config.data.dataset),
                                       ("train.model", "model", config.train.model),
                                       ("train.algorithm", "algorithm", config.train.algorithm)]
    for i, arm in enumerate(config.arms):
        out += [(f"arms[{i}].grouping.policy", "grouping", arm.grouping.get("policy")),
                (f"arms[{i}].sampling.policy", "sampling", arm.sampler.policy),
                (f"arms[{i}].aggregation", "aggregation", arm.aggregation)]
    return out


def config_warnings(config: RunConfig) -> list[str]:
    """Accepted-but-adjusted settings of a config (see :class:`InputWarning`)."""
    out = []
    shares = config.topology.devices
    total = sum(shares.values())
    if shares and total > 0 and abs(total - 1.0) > 1e-9:
        used = ", ".join(f"{k} = {v / total:.4g}" for k, v in sorted(shares.items()))
        out.append(f"topology.devices: shares sum to {total:g}, not 1; normalised to {used}")
    t = config.topology
    if t.edge_cores is not None and t.edge_profile is None:
        out.append(f"topology.edge_cores = {t.edge_cores} without topology.edge_profile: aggregation takes no time, "
                   f"so no group waits for a core; name an edge profile with aggregation or secagg-server curves")
    tr = config.train
    if tr.optimizer == "adam" and tr.algorithm == "scaffold":
        out.append("train.optimizer = \"adam\" with SCAFFOLD: its variates (option II, (x − y_i) / (K·lr)) read "
                   "the mean gradient off SGD's steps; Adam's steps are not SGD's, so the corrections take another "
                   "scale and can make the run diverge")
    return out
