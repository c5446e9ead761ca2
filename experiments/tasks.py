"""One (seed, arm) task and the one place ``experiments`` assembles a run: :func:`plan_world`
builds the world and plans its arms (every input error surfaces there), :func:`execute` is a
task's body on any backend. Both go through :mod:`groupfel.emulator.driver` (``plan_arms``, ``run_arm``),
the emulator's single entry point.

The run commands (:mod:`groupfel.experiments.runner`, :mod:`groupfel.experiments.sweep`) make tasks and the backends
(:mod:`groupfel.experiments.backends`) run them; both import this module, which imports neither of them.
Heavy imports (torch, the emulator's engine) stay inside the functions: a command that trains
nothing does not pay for them.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from groupfel.errors import DivergenceError
from groupfel.emulator.io import atomic_write

if TYPE_CHECKING:
    from groupfel.emulator.config import RunConfig
    from groupfel.emulator.driver import ArmPlan
    from groupfel.emulator.world import Dataset, World

MANIFEST = "manifest.json"


def arm_complete(arm_dir: Path) -> bool:
    """Finished, with every file intact (a damaged one makes a rerun redo this arm only)."""
    from groupfel.emulator.runfiles import intact_arm

    return intact_arm(Path(arm_dir))


@dataclass(frozen=True)
class Task:
    """One arm of one seed: the unit a backend runs (the data loads inside the worker)."""
    config_json: str    # a single-seed config
    run_dir: str        # its single-seed run directory
    arm: int

    @property
    def done(self) -> bool:
        name = json.loads(self.config_json)["arms"][self.arm]["name"]
        return arm_complete(Path(self.run_dir) / name)


def plan_world(config: RunConfig, dataset: Dataset | None = None,
               only: int | None = None) -> tuple[World, list[ArmPlan]]:
    """The world of a single-seed ``config`` and the plans of its arms (or of arm ``only``),
    checked against the world and the run mode: every input error of the arms surfaces here,
    before anything is written."""
    from groupfel.emulator.driver import plan_arms
    from groupfel.emulator.world import build_world

    world = build_world(config, dataset=dataset)
    return world, plan_arms(world, only)


def execute(config_json: str, run_dir: Path, arm: int, *, dataset=None, device: str | None = None,
            on_round: Callable | None = None) -> Path:
    """The body of a task on any backend: run (or resume) one arm of one single-seed config into
    ``run_dir/<arm>``. A diverged arm is a result (its manifest says so, see
    :func:`groupfel.experiments.runner.diverged_runs`), not an error that stops the other tasks."""
    import torch

    from groupfel.emulator.config import parse_config
    from groupfel.emulator.driver import run_arm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # one worker per core; the same arithmetic on every backend
    try:
        raw = json.loads(config_json)
        # the backend already runs one task per core: the batched engine forks no workers of its own
        train = {**raw["train"], "workers": 1, **({"device": device} if device else {})}
        config = parse_config({**raw, "train": train})
        world, (plan,) = plan_world(config, dataset, only=arm)
        arm_dir = Path(run_dir) / plan.arm.name
        try:
            run_arm(world, plan, arm_dir, on_round)
        except DivergenceError:
            pass   # the arm wrote its tables with stop reason "diverged"; the other tasks go on
        record_device(arm_dir, config.train.device)
        return arm_dir
    finally:
        torch.set_num_threads(threads)


def record_device(arm_dir: Path, device: str) -> None:
    """The hardware the arm trained on, in its manifest: in words, and its GPU, driver, CUDA and
    cuDNN versions and determinism settings (:func:`groupfel.emulator.devices.describe`)."""
    from groupfel.emulator.devices import describe, resolve
    from groupfel.emulator.runfiles import complete_manifest

    path = Path(arm_dir) / MANIFEST
    manifest = complete_manifest(Path(arm_dir))
    if manifest is not None:
        manifest["device"], manifest["device_details"] = describe(resolve(device))
        atomic_write(path, lambda p: p.write_text(json.dumps(manifest, indent=2, default=str) + "\n"))
