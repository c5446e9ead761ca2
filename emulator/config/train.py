"""The `[train]` section: model, engine, device, algorithm, optimiser, rounds and budgets."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import PartName, _Strict, path_of
from .limits import Count, Rounds
from groupfel.userfile import short


# the shipped models that convolve (C, H, W) images: not for raw waveforms (data.audio)
IMAGE_MODELS = ("cnn", "audio-cnn", "digit-bn-cnn", "resnet-1", "resnet-3")


class TrainConfig(_Strict):
    model: PartName = Field(
        "cnn", description="The model every client trains: mlp, mlp3, cnn, audio-cnn, audio-m5 (raw waveforms), "
        "digit-bn-cnn, resnet-1, resnet-3 (see "
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
    autotune: bool = Field(
        False, description="cuDNN autotuning of the stacked step's convolutions, among deterministic algorithms "
        "(a GPU's; the batched engine's stacked formulation). A run repeats its numbers within a process; another "
        "process may time another algorithm fastest, so runs of one seed then agree within float rounding, not "
        "bitwise. A CPU run refuses it. See Benchmarks: the physical limit.")
    channels_last: bool | None = Field(
        None, description="The stacked step's memory layout: channels-last (true) or NCHW (false); unset: "
        "channels-last on a CPU (oneDNN's fast grouped kernels), NCHW on a GPU. Other kernels sum in another order: "
        "a run's numbers change with it, within float rounding. NCHW on a CPU is faster for the ResNets in wide "
        "stacks (GroupNorm's channels-last CPU kernel is slow) but a client's numbers then depend on its stack's "
        "width within float rounding, not bitwise. No effect on the per-client loop (a CPU's `--stack "
        "1`: always channels-last) nor on a plug-in model stepped through vmap.")
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
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd", description="The clients' local optimiser: sgd (torch's SGD, with train.momentum) or adam "
        "(torch's Adam: β = (0.9, 0.999), ε = 1e-8, train.weight_decay as an L2 term in the gradient, as "
        "torch.optim.Adam's weight_decay; the Group-FEL authors' Speech Commands clients).")
    lr: float = Field(0.05, gt=0, le=10, description="The clients' learning rate (SGD's or Adam's).")
    lr_decay: float = Field(1.0, gt=0, le=1, description="The learning rate in global round t (from 0) is "
                            "lr × lr_decay^t; with lr_decay_every, lr × lr_decay^⌊(t + 1) / lr_decay_every⌋.")
    lr_decay_every: int | None = Field(
        None, ge=2, le=10**6, description="Drop the learning rate by lr_decay once every this many rounds, "
        "at the start of rounds N − 1, 2N − 1, … (from 0), as the Group-FEL authors' lr_interval; unset: "
        "every round, lr × lr_decay^t.")
    momentum: float = Field(0.0, ge=0, lt=1, description="Momentum of SGD's steps, 0 with optimizer = \"adam\" "
                            "(the Group-FEL authors: 0.9).")
    weight_decay: float = Field(0.0, ge=0, le=1, description="Weight decay, an L2 term in the gradient (the "
                                "Group-FEL authors: 1e-4).")
    client_state: Literal["fresh", "persistent", "per-rate"] = Field(
        "fresh", description="The clients' optimiser state (SGD's momentum buffers, Adam's moments and step "
        "count): fresh: new every round; persistent: each client keeps its own across rounds; per-rate: kept "
        "across rounds and started afresh whenever the learning rate drops (the Group-FEL authors' code: each "
        "client keeps its optimiser, and Client.set_lr builds a new one at each drop).")
    batch_size: Count = Field(32, description="Local mini-batch size.")
    group_rounds: int = Field(5, ge=1, le=10**4, description="K: group rounds per global round.")
    local_epochs: int = Field(2, ge=1, le=10**4, description="E: local epochs per group round.")
    rounds: Rounds | None = Field(100, description="T: the most global rounds (100 when left out); with a budget "
                               "the run stops at whichever comes first. From Python, None: run until the "
                               "budget is spent.")
    budget: float | None = Field(None, gt=0, le=1e300, description="Eq. 5 cost budget (the paper: 1e6): a round that "
                                 "would cross it is not run; an error if the first round would.")
    energy_budget: float | None = Field(None, gt=0, le=1e300, description="Energy budget of the run in joules "
                                        "(needs cost.energy), never overshot in any cost.energy_accounting: each "
                                        "round's joules are priced before it runs (played on a scratch clock, "
                                        "full-fleet idle included), and a round that would cross the budget is "
                                        "not run, so the run ends at or below it; an error if the first round "
                                        "would cross it.")
    client_energy_budget: float | None = Field(None, gt=0, le=1e300, description="Each client's battery in joules "
                                               "(needs cost.energy): a client whose spent energy reaches it goes "
                                               "offline (checked at each group round's start, as "
                                               "topology.availability; turns on the shared-edge model).")
    client_charge_w: float | None = Field(None, gt=0, le=1e6, description="Batteries that charge (needs "
                                          "client_energy_budget): each client's charging power in watts while it "
                                          "charges (always, client_charging_file's intervals, or topology."
                                          "availability's online intervals). A client found empty at a check is "
                                          "offline until charged to client_resume_share of its battery. Unset: "
                                          "batteries only drain, and an empty client is off for good.")
    client_charging_file: path_of("CSV file") | None = Field(
        None, description="The intervals each client charges in (needs client_charge_w), a CSV client, "
        "start_s, end_s (as topology.availability.file); unset: always plugged in.")
    client_charging_from_availability: bool = Field(
        False, description="A client charges while topology.availability says it is online (needs "
        "client_charge_w; FedScale reads its behaviour trace's online intervals as charging).")
    client_resume_share: float = Field(1.0, gt=0, le=1.0, description="An empty client comes back once its "
                                       "battery holds this share of its capacity (needs client_charge_w; 1: full).")
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
        from ..devices import HELP, PATTERN

        if not PATTERN.match(value):
            raise ValueError(f"{short(value)} is not a device; give {HELP}")
        return value

    @model_validator(mode="after")
    def _charging(self):
        if self.client_charge_w is not None and self.client_energy_budget is None:
            raise ValueError("client_charge_w charges batteries: set client_energy_budget (each battery's joules), "
                             "or remove it")
        if self.client_charge_w is None and (self.client_charging_file is not None
                                             or self.client_charging_from_availability):
            raise ValueError("client_charging_file and client_charging_from_availability need client_charge_w "
                             "(the charging power, W)")
        if self.client_charging_file is not None and self.client_charging_from_availability:
            raise ValueError("give client_charging_file or client_charging_from_availability, not both")
        return self

    @model_validator(mode="after")
    def _adam(self):
        if self.optimizer == "adam" and self.momentum:
            raise ValueError("momentum is SGD's; Adam keeps its own moments: set momentum = 0, or optimizer = "
                             "\"sgd\"")
        return self

    @model_validator(mode="after")
    def _stop(self):
        if self.rounds is None and self.budget is None and self.energy_budget is None:
            raise ValueError("set rounds or budget (or both) so the run can stop")
        return self
