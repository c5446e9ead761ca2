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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from groupfel.errors import DivergenceError
from groupfel.emulator.io import atomic_write

if TYPE_CHECKING:
    from groupfel.emulator.config import RunConfig
    from groupfel.emulator.driver import ArmPlan
    from groupfel.emulator.stacking import Stacks
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


def plan_world(config: RunConfig, dataset: Dataset | None = None, only: int | None = None,
               stacks: Stacks | None = None) -> tuple[World, list[ArmPlan]]:
    """The world of a single-seed ``config`` and the plans of its arms (or of arm ``only``),
    checked against the world and the run mode: every input error of the arms surfaces here,
    before anything is written. ``stacks``: the run trains in a stack (:func:`execute_stack`)."""
    from groupfel.emulator.driver import plan_arms
    from groupfel.emulator.world import build_world

    world = build_world(config, dataset=dataset, stacks=stacks)
    return world, plan_arms(world, only)


def task_config(config_json: str, device: str | None = None) -> RunConfig:
    """A task's single-seed config as its worker runs it: the backend already runs one task per
    core, so the batched engine starts no worker processes of its own."""
    from groupfel.emulator.config import parse_config

    raw = json.loads(config_json)
    train = {**raw["train"], "workers": 1, **({"device": device} if device else {})}
    return parse_config({**raw, "train": train})


def execute(config_json: str, run_dir: Path, arm: int, *, dataset=None, device: str | None = None,
            on_round: Callable | None = None) -> Path:
    """The body of a task on any backend: run (or resume) one arm of one single-seed config into
    ``run_dir/<arm>``. A diverged arm is a result (its manifest says so, see
    :func:`groupfel.experiments.runner.diverged_runs`), not an error that stops the other tasks."""
    import torch

    from groupfel.emulator.driver import run_arm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # one worker per core; the same arithmetic on every backend
    try:
        config = task_config(config_json, device)
        world, (plan,) = plan_world(config, dataset, only=arm)
        arm_dir = Path(run_dir) / plan.arm.name
        try:
            run_arm(world, plan, arm_dir, on_round)
        except DivergenceError:
            pass   # the arm wrote its tables with stop reason "diverged"; the other tasks go on
        record_device(arm_dir, config.train.device, {"width": 1})
        return arm_dir
    finally:
        torch.set_num_threads(threads)


def execute_stack(jobs: Sequence[tuple[str, Path, int]], width: int, *, datasets: Sequence | None = None,
                  device: str | None = None, on_round: Callable | None = None) -> list[Path]:
    """The body of a stacked task: run (or resume) the arms ``jobs`` ((config, run directory, arm)
    each) together, each arm's loop in a thread of its own, their training in shared stacked
    calls (:mod:`groupfel.emulator.stacking`). ``on_round(i, t, cost, acc)`` reports job ``i``'s
    rounds. Every arm runs to its end; then the first error of any arm is raised."""
    import threading

    import torch

    from groupfel.emulator.driver import run_arm
    from groupfel.emulator.stacking import Stacks
    from groupfel.emulator.world import load_data

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stacks, loaded, runs = Stacks(), {}, []
        for i, (config_json, run_dir, arm) in enumerate(jobs):
            config = task_config(config_json, device)
            dataset = datasets[i] if datasets is not None else None
            if dataset is None:   # every run of a dataset shares its arrays (once in memory, once in the stack)
                key = (config.data.dataset, config.data.path)
                dataset = loaded[key] if key in loaded else loaded.setdefault(key, load_data(config))
            world, (plan,) = plan_world(config, dataset, only=arm, stacks=stacks)
            runs.append((config, world, plan, Path(run_dir) / plan.arm.name))
        errors: list[BaseException | None] = [None] * len(runs)

        def work(i: int) -> None:
            config, world, plan, arm_dir = runs[i]
            try:
                run_arm(world, plan, arm_dir, on_round and (lambda t, cost, acc: on_round(i, t, cost, acc)))
            except DivergenceError:
                pass
            except BaseException as exc:   # raised below, once every partner has finished
                errors[i] = exc
                return
            finally:
                world.engine.batcher.leave(world.engine.run)
            # at once, not after the partners: a run stopped while they still train resumes only
            # the unfinished arms, so a finished arm's record is written now or never
            try:
                engine = world.engine.batcher.engine
                record_device(arm_dir, config.train.device, {
                    "width": width, "runs": len(runs), "formulation": getattr(engine, "formulation", "sequential")})
            except BaseException as exc:
                errors[i] = exc

        workers = [threading.Thread(target=work, args=(i,), name=f"groupfel-run-{i}") for i in range(len(runs))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [arm_dir for *_, arm_dir in runs]
    finally:
        torch.set_num_threads(threads)


def record_device(arm_dir: Path, device: str, stack: dict) -> None:
    """The hardware the arm trained on, in its manifest: in words, and its GPU, driver, CUDA and
    cuDNN versions and determinism settings (:func:`groupfel.emulator.devices.describe`); and the
    stack it trained in (``width``: the most runs that train together; ``runs``: its shard's)."""
    from groupfel.emulator.devices import describe, resolve
    from groupfel.emulator.runfiles import complete_manifest

    path = Path(arm_dir) / MANIFEST
    manifest = complete_manifest(Path(arm_dir))
    if manifest is not None:
        manifest["device"], manifest["device_details"] = describe(resolve(device))
        manifest["stack"] = stack
        atomic_write(path, lambda p: p.write_text(json.dumps(manifest, indent=2, default=str) + "\n"))
