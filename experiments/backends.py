"""Where (seed, arm) tasks run: ``local`` (a process pool, one worker per core, one torch thread
per worker) or ``ray`` (Ray tasks on a local instance or the cluster at ``address``).

A task carries only its config (JSON) and its run directory: the worker builds the world, so the
dataset loads inside the worker and is never shipped with the task. Every task runs with one torch
thread on either backend, so both give the same numbers. With Ray on a cluster, the run directory
must be on a file system every node sees, and groupfel installed on every node.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from emulator.errors import DivergenceError, InputError

BACKENDS = ("local", "ray")


def run_task(config_json: str, run_dir: str, arm: int) -> str:
    """Run (or resume) one arm of one single-seed config; returns the arm directory. A diverged
    arm is a result (its manifest says so, see :func:`experiments.runner.diverged_runs`), not an
    error that stops the other tasks."""
    import torch

    from emulator.config import parse_config
    from emulator.runner import plan_arm
    from emulator.world import build_world

    from .runner import arm_runner

    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # one worker per core; the same arithmetic on every backend
    try:
        raw = json.loads(config_json)
        # the backend already runs one task per core: the batched engine forks no workers of its own
        config = parse_config({**raw, "train": {**raw["train"], "workers": 1}})
        world = build_world(config)
        plan = plan_arm(world, arm)
        arm_dir = Path(run_dir) / plan.arm.name
        try:
            arm_runner(config)(world, plan, arm_dir)
        except DivergenceError:
            pass   # the arm wrote its tables with stop reason "diverged"; the other tasks go on
        return str(arm_dir)
    finally:
        torch.set_num_threads(threads)


def _context():
    """Workers fork from a server process that imported torch and the emulator but never ran a
    torch op: each worker starts without re-importing them (seconds each), and without the
    hazard of forking a process whose torch thread pool already ran (this one, after validation)."""
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["experiments.backends", "emulator.world", "emulator.runner"])
    return ctx


def default_jobs(n_tasks: int) -> int:
    return max(1, min(n_tasks, len(os.sched_getaffinity(0))))


def run_tasks(tasks: Sequence, *, backend: str = "local", jobs: int | None = None, address: str | None = None,
              on_start: Callable | None = None, on_done: Callable | None = None) -> None:
    """Run every task (an object with ``config_json``, ``run_dir``, ``arm``); ``on_start(task)``
    and ``on_done(task)`` report progress in this process."""
    if backend not in BACKENDS:
        raise InputError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {jobs}")
    if not tasks:
        return
    on_start = on_start or (lambda task: None)
    on_done = on_done or (lambda task: None)
    if backend == "ray":
        _run_ray(tasks, jobs, address, on_start, on_done)
        return
    jobs = jobs or default_jobs(len(tasks))
    if jobs == 1:
        for task in tasks:
            on_start(task)
            run_task(task.config_json, task.run_dir, task.arm)
            on_done(task)
        return
    with ProcessPoolExecutor(jobs, mp_context=_context()) as pool:
        pending, queue = {}, list(tasks)
        while queue or pending:
            while queue and len(pending) < jobs:     # submit as workers free up: on_start is honest
                task = queue.pop(0)
                on_start(task)
                pending[pool.submit(run_task, task.config_json, task.run_dir, task.arm)] = task
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                task = pending.pop(fut)
                fut.result()          # re-raise a worker's error here
                on_done(task)


def start_ray(jobs: int | None, address: str | None):
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray: Ray is not installed; pip install 'groupfel[ray]'") from None
    if not ray.is_initialized():
        root = str(Path(__file__).resolve().parents[1])
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}}
        if address:
            ray.init(address=address, runtime_env=env, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs or len(os.sched_getaffinity(0)), runtime_env=env, log_to_driver=False,
                     include_dashboard=False)
    return ray


def _run_ray(tasks, jobs, address, on_start, on_done) -> None:
    ray = start_ray(jobs, address)
    remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
    refs = {}
    for task in tasks:
        on_start(task)
        refs[remote.remote(task.config_json, task.run_dir, task.arm)] = task
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        for ref in ready:
            task = refs.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise exc.as_instanceof_cause() from None
            on_done(task)
