"""Where (seed, arm) tasks run: ``local`` (a process pool, one worker per core, one torch thread
per worker) or ``ray`` (Ray tasks on a local instance or the cluster at ``address``).

A task carries its config (JSON): the worker builds the world, so the dataset loads inside the
worker (or, with ``ship_data``, comes from the driver through Ray's object store). Every task runs
with one torch thread on either backend, so both give the same numbers. Both run a shard of tasks
as one unit (:func:`shards`): alone with ``--stack 1``, else trained together in one process
(:func:`groupfel.experiments.tasks.execute_stack`).

The local pool's workers write into the run directory. A Ray task never touches the driver's disk:
it runs its arms in private temporary directories, streams every checkpoint back to the driver as
it is written, and returns the arm's files (results, ledger, manifest) at the end; the driver writes
them all. So no node needs a shared file system, and a killed driver resumes from the checkpoints it
holds. The code travels to the workers through Ray's ``runtime_env`` (``py_modules``): groupfel
need not be installed on the nodes.

A task whose worker or node dies is run again from the driver's latest copy of its checkpoint; the
run loop's randomness is derived from (seed, round), so the rerun gives the numbers an undisturbed
run gives, and a loss costs at most the rounds since the last checkpoint (``train.eval_every``).
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from groupfel.emulator import numerics, procs
from groupfel.errors import DivergenceError, InputError, WorkerLostError
from groupfel.emulator.io import atomic_write, exit_with_parent, remove_checkpoint

from . import pool_worker
from .pool_worker import STARTUP_ERRORS
from .tasks import MANIFEST, execute, execute_stack

BACKENDS = ("local", "ray")
PACKAGES = ("emulator", "experiments", "policies", "cost_models", "topologies")
# Large committed outputs that no worker imports.
EXCLUDES = ["__pycache__", "*.pyc", "experiments/reproductions", "reproductions"]
# How many times one task may lose its worker (killed, node gone) before the run stops.
MAX_LOSSES = 3
CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class RayOptions:
    """How ``--backend ray`` runs: the cluster, the resources of a task, what travels to the nodes."""
    address: str | None = None        # None: RAY_ADDRESS if set, else a new local instance
    gpus_per_task: float = 0.0        # > 0: tasks ask Ray for GPUs and train on CUDA
    ship_data: bool = False           # send the dataset through the object store (nodes lack its files)
    py_modules: tuple[str, ...] = ()  # plug-in modules or packages (paths) the workers import
    max_losses: int = MAX_LOSSES

    def __post_init__(self):
        g = self.gpus_per_task
        if g < 0 or (g > 1 and g != int(g)):
            raise InputError(f"--gpus-per-task: {g:g} is not a GPU share Ray accepts; give a fraction in (0, 1] "
                             f"(tasks share a GPU) or a whole number of GPUs")
        for path in self.py_modules:
            if not Path(path).exists():
                raise InputError(f"--py-module {path}: no such file or directory; give the path of a plug-in "
                                 f"module (.py) or package directory")


# ---- one task, on whichever worker (its body: groupfel.experiments.tasks.execute) ----------------------

def run_task(config_json: str, run_dir: str, arm: int) -> str:
    """A local pool task: run (or resume) one arm in ``run_dir``; returns the arm directory."""
    return str(execute(config_json, Path(run_dir), arm))


def run_shard(shard: tuple, width: int) -> None:
    """A local pool task of a shard: its arms alone (width 1) or stacked."""
    if width == 1:
        (task,) = shard
        run_task(task.config_json, task.run_dir, task.arm)
    else:
        execute_stack([(t.config_json, Path(t.run_dir), t.arm) for t in shard], width)


# Runs that train together by default (``train.stack`` unset), per device type: what measured
# fastest (benchmarks/campaign.py, docs/benchmarks.md).
AUTO_STACK = {"cpu": 8, "cuda": 8}


def stack_width(config_json: str, stack: int | None) -> int:
    """The stack width of a task: ``--stack``, else its ``train.stack``, else the device's default."""
    train = json.loads(config_json)["train"]
    if stack is None:
        stack = train.get("stack")
    if stack is None:
        from groupfel.emulator.devices import resolve

        stack = AUTO_STACK.get(resolve(train.get("device", "cpu")).split(":")[0], 1)
    return stack


def _on_gpu(task) -> bool:
    from groupfel.emulator.devices import resolve

    return resolve(json.loads(task.config_json)["train"].get("device", "cpu")).startswith("cuda")


def _stack_key(task) -> tuple:
    """What must match for runs to share a stack (the worker splits finer, emulator.stacking). The
    training algorithm, μ and momentum need not: they are per-row inputs of a stacked call, and
    the sweep points of a seed that differ only in them stack together and share one
    local-training reference (per-group mode)."""
    raw = json.loads(task.config_json)
    t = raw["train"]
    return (json.dumps(raw["data"], sort_keys=True), t.get("device"), t.get("engine"), t.get("model"),
            t.get("batch_size"), t.get("weight_decay"), t.get("precision"), t.get("autotune"), t.get("channels_last"))


def shards(tasks: Sequence, stack: int | None, slots: int) -> list[tuple[tuple, int]]:
    """The tasks in shards of at most their stack width, each (tasks, width): runs of one stack key
    split evenly over at least ``slots`` shards (every worker gets work), each at most the width,
    a seed's runs next to each other (in one shard where the width allows)."""
    groups: dict[tuple, list] = {}
    for task in tasks:
        width = stack_width(task.config_json, stack)
        groups.setdefault((width, *(_stack_key(task) if width > 1 else (id(task),))), []).append(task)
    out = []
    for (width, *_), group in groups.items():
        group.sort(key=lambda task: json.loads(task.config_json).get("seed", 0))
        n = max(-(-len(group) // width), min(slots, len(group)))
        size, extra = divmod(len(group), n)
        start = 0
        for i in range(n):
            end = start + size + (i < extra)
            out.append((tuple(group[start:end]), width))
            start = end
    return out


def task_device(configured: str, gpus_per_task: float, gpu_ids: Sequence, cuda: bool, node: str) -> str | None:
    """The torch device of a Ray task: CUDA where it asked for GPUs and Ray assigned some (Ray sets
    CUDA_VISIBLE_DEVICES, so the first visible one is the task's); else the config's (None)."""
    if not gpus_per_task:
        return None
    if not gpu_ids or not cuda:
        what = "Ray assigned it no GPU" if not gpu_ids else "torch there has no CUDA"
        raise InputError(f"--gpus-per-task: the task on node {node} asked for GPUs but {what}; install a CUDA "
                         f"build of torch on the GPU nodes or drop --gpus-per-task")
    return "cuda"


def _node() -> str:
    import socket

    try:
        import ray

        return f"{ray.util.get_node_ip_address()} ({socket.gethostname()})"
    except Exception:   # outside Ray
        return socket.gethostname()


def _pack(root: Path, since: dict[str, int] | None = None) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes); with ``since``, only those whose
    modification stamp changed (``since`` is updated)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith("."):   # skip atomic_write's temporaries
            continue
        rel = path.relative_to(root).as_posix()
        if since is not None:
            stamp = path.stat().st_mtime_ns
            if since.get(rel) == stamp:
                continue
            since[rel] = stamp
        out[rel] = path.read_bytes()
    return out


def _unpack(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = (root / rel).resolve()
        if not path.is_relative_to(root.resolve()):
            raise ValueError(f"{rel}: a task file outside its run directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _writable(dataset):
    """The object store hands out read-only arrays; the engine wants its own."""
    import numpy as np

    return dataclasses.replace(dataset, **{f.name: np.array(getattr(dataset, f.name))
                                           for f in dataclasses.fields(dataset)
                                           if isinstance(getattr(dataset, f.name), np.ndarray)})


def ray_task(jobs: Sequence[tuple[str, int, dict[str, bytes], object]], width: int, gpus_per_task: float
             ) -> Iterator[tuple[str, int, dict[str, bytes]]]:
    """A Ray task (a generator) of a shard of runs, each (config, arm, files, dataset): run them
    (alone with ``width`` 1, else stacked) in private temporary directories, each seeded with the
    driver's copy of its run (``files``: a checkpoint to resume from, caches); yield ("checkpoint",
    i, changed files) after every round of run ``i`` that wrote some, then ("done", i, every file)."""
    import torch

    node = _node()
    gpu_ids = __import__("ray").get_gpu_ids() if gpus_per_task else []
    device = task_device(json.loads(jobs[0][0])["train"].get("device", "cpu"), gpus_per_task, gpu_ids,
                         torch.cuda.is_available(), node)
    with tempfile.TemporaryDirectory(prefix="groupfel-task-") as tmp:
        dirs = [Path(tmp) / str(i) for i in range(len(jobs))]
        stamps: list[dict[str, int]] = []
        for run_dir, (_, _, files, _) in zip(dirs, jobs):
            _unpack(run_dir, files)
            stamps.append({})
            _pack(run_dir, stamps[-1])   # what the driver already holds
        messages: queue.Queue = queue.Queue()
        lock = threading.Lock()

        def on_round(i, t, cost, acc):
            with lock:   # the runs of a stack report from their threads
                changed = _pack(dirs[i], stamps[i])
            if changed:
                messages.put(("checkpoint", i, changed))

        def work():
            try:
                # refs nested in the shard's list are not resolved by Ray as a task's own arguments are
                ray = __import__("ray")
                datasets = [_writable(ray.get(d) if isinstance(d, ray.ObjectRef) else d) if d is not None else None
                            for *_, d in jobs]
                if width == 1:
                    (config_json, arm, _, _), = jobs
                    execute(config_json, dirs[0], arm, dataset=datasets[0], device=device,
                            on_round=lambda t, cost, acc: on_round(0, t, cost, acc))
                else:
                    execute_stack([(c, d, arm) for (c, arm, _, _), d in zip(jobs, dirs)], width, datasets=datasets,
                                  device=device, on_round=on_round)
                messages.put(("done", None, None))
            except BaseException as exc:   # handed to the generator, which raises it in Ray's thread
                messages.put(("error", None, exc))

        # The runs go on in a thread so this generator can stream their checkpoints as they appear.
        thread = threading.Thread(target=work, name="groupfel-arm", daemon=True)
        thread.start()
        while True:
            kind, i, payload = messages.get()
            if kind == "checkpoint":
                yield kind, i, payload
            elif kind == "error":
                thread.join()
                if isinstance(payload, InputError):   # e.g. a dataset this node lacks: name the node
                    hint = "; or pass --ship-data to send the dataset from the driver" if "data." in str(payload) else ""
                    raise InputError(f"on node {node}: {payload}{hint}") from None
                raise payload
            else:
                break
        thread.join()
        for i, run_dir in enumerate(dirs):
            yield "done", i, _pack(run_dir)


# ---- the local process pool --------------------------------------------------------------------

# The run pool's workers record an error before their task loop (:mod:`.pool_hook`).
procs.preload("groupfel.experiments.pool_hook", "groupfel.experiments.backends")


# What a pool worker runs first (tests replace it with one that fails, to see the error reported).
WORKER_SETUP = exit_with_parent


def _startup_error(directory: Path) -> str | None:
    """The first start-up error a worker of this run recorded (:mod:`.pool_worker`)."""
    found = sorted(directory.iterdir()) if directory.is_dir() else []
    return found[0].read_text().strip() if found else None


def _startup_errors_dir() -> Path:
    """This process's directory for its workers' start-up errors, empty. Set in the environment
    before the first pool so the forkserver (started once per process) and its workers see it."""
    directory = os.environ.get(STARTUP_ERRORS)
    if not directory or not os.path.isdir(directory):
        directory = tempfile.mkdtemp(prefix="groupfel-workers-")
        os.environ[STARTUP_ERRORS] = directory
    for old in Path(directory).iterdir():
        old.unlink(missing_ok=True)
    return Path(directory)


def default_jobs(n_tasks: int) -> int:
    return max(1, min(n_tasks, len(os.sched_getaffinity(0))))


def _label(task) -> str:
    raw = json.loads(task.config_json)
    return f"seed {raw['seed']} arm {raw['arms'][task.arm]['name']!r} ({task.run_dir})"


def _note(text: str) -> None:
    print(f"groupfel: warning: {text}", file=sys.stderr, flush=True)


def _lost(task, losses: dict, limit: int, why: str, resume: str) -> None:
    """Count one loss of ``task``; past ``limit`` the run stops with one line saying how to resume."""
    losses[id(task)] = losses.get(id(task), 0) + 1
    if losses[id(task)] > limit:
        raise WorkerLostError(f"{_label(task)}: {why} {losses[id(task)]} times; finished arms and checkpoints are "
                              f"kept, so {resume}")


def check_backend(backend: str, jobs: int | None = None, address: str | None = None,
                  ray: RayOptions | None = None, *, connect: bool = True) -> RayOptions:
    """Refuse bad backend flags, and with Ray connect and check the cluster has the GPUs asked
    for, before anything is written; returns the Ray options in effect."""
    if backend not in BACKENDS:
        raise InputError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {jobs}")
    options = ray or RayOptions()
    if address:
        options = dataclasses.replace(options, address=address)
    if backend == "local" and options != RayOptions():
        raise InputError("--address, --gpus-per-task, --ship-data and --py-module need --backend ray")
    if backend == "ray" and connect:
        _check_gpus(start_ray(jobs, options), options)
    return options


def run_tasks(tasks: Sequence, *, backend: str = "local", jobs: int | None = None, address: str | None = None,
              ray: RayOptions | None = None, on_start: Callable | None = None,
              on_done: Callable | None = None, stack: int | None = None) -> None:
    """Run every task (an object with ``config_json``, ``run_dir``, ``arm``); ``on_start(task)``
    and ``on_done(task)`` report progress in this process (each once per task, retries included).
    ``stack``: at most this many runs train together (default: each task's ``train.stack``, else
    :data:`AUTO_STACK`); the local pool runs each shard of runs as one task."""
    if not tasks:
        check_backend(backend, jobs, address, ray, connect=False)
        return
    options = check_backend(backend, jobs, address, ray)
    on_start = on_start or (lambda task: None)
    on_done = on_done or (lambda task: None)
    if backend == "ray":
        _run_ray(tasks, jobs, options, on_start, on_done, stack)
        return
    if jobs is None and any(stack_width(t.config_json, stack) > 1 and _on_gpu(t) for t in tasks):
        jobs = 1   # one stacked task per GPU
    jobs = jobs or default_jobs(len(tasks))
    units = shards(tasks, stack, jobs)
    if jobs == 1:
        for shard, width in units:
            for task in shard:
                on_start(task)
            run_shard(shard, width)
            for task in shard:
                on_done(task)
        return
    _run_pool(units, jobs, on_start, on_done)


def _run_pool(units: Sequence, jobs: int, on_start: Callable, on_done: Callable) -> None:
    """The process pool, one shard of runs per task. A worker the OS kills (kill -9, the
    out-of-memory killer) breaks the pool: the shards it held are submitted again to a new pool
    and resume from their checkpoints."""
    queue_, started, losses = list(units), set(), {}
    errors = _startup_errors_dir()   # in the environment before the forkserver starts: its workers see it
    while queue_:
        with ProcessPoolExecutor(jobs, mp_context=procs.worker_context(), initializer=pool_worker.start,
                                 initargs=(os.getpid(), WORKER_SETUP, str(errors))) as pool:
            pending, broken = {}, False
            while (queue_ or pending) and not broken:
                while queue_ and len(pending) < jobs:     # submit as workers free up: on_start is honest
                    unit = queue_.pop(0)
                    for task in unit[0]:
                        if id(task) not in started:
                            started.add(id(task))
                            on_start(task)
                    pending[pool.submit(run_shard, *unit)] = unit
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    try:
                        fut.result()          # re-raise a worker's error here
                    except BrokenProcessPool:
                        broken = True
                        continue
                    for task in pending.pop(fut)[0]:
                        on_done(task)
            if broken:
                error = _startup_error(errors)
                if error:
                    raise WorkerLostError(f"a worker process failed at start-up: {error}")
                lost = list(pending.values())
                for task in (task for unit in lost for task in unit[0]):
                    _lost(task, losses, MAX_LOSSES, "lost its worker process (killed, e.g. by the out-of-memory "
                          "killer)", "rerun the same command to resume")
                _note(f"a worker process died (killed, e.g. out of memory); running its {sum(len(u[0]) for u in lost)} "
                      f"unfinished task(s) again from their checkpoints")
                queue_ = lost + queue_


# ---- Ray ---------------------------------------------------------------------------------------

@cache
def package_dir() -> Path:
    """The ``groupfel`` package as one directory, which Ray ships to the nodes under its name. An
    installed wheel already is one; a source checkout (an editable install) keeps the subpackages
    at the repository's root, so they are copied beneath a staged ``groupfel/`` once per process."""
    top = Path(find_spec("groupfel").submodule_search_locations[0])
    if all((top / name).is_dir() for name in PACKAGES):
        return top
    stage = Path(tempfile.mkdtemp(prefix="groupfel-ray-"))
    atexit.register(shutil.rmtree, stage, True)
    skip = shutil.ignore_patterns(*EXCLUDES)
    shutil.copytree(top, stage / "groupfel", ignore=skip)
    for name in PACKAGES:
        source = find_spec(f"groupfel.{name}").submodule_search_locations[0]
        shutil.copytree(source, stage / "groupfel" / name, ignore=skip)
    return stage / "groupfel"


def runtime_env(options: RayOptions) -> dict:
    """The code the workers import: groupfel as this driver has it, and any plug-ins."""
    modules = [str(package_dir())] + [str(Path(p).resolve()) for p in options.py_modules]
    return {"py_modules": modules, "excludes": EXCLUDES}


def start_ray(jobs: int | None, options: RayOptions | str | None = None):
    """Connect to the cluster at ``options.address`` (or $RAY_ADDRESS), else start a private local
    instance: never a cluster found on this machine that nobody asked for."""
    if not isinstance(options, RayOptions):
        options = RayOptions(address=options)
    try:
        import ray
    except ImportError:
        raise InputError("--backend ray: Ray is not installed; pip install 'groupfel[ray]'") from None
    if ray.is_initialized():
        return ray
    address = options.address or os.environ.get("RAY_ADDRESS")
    env = runtime_env(options)
    # The driver reports a task's error itself, in one line; Ray would log the same error again for
    # the tasks still in flight when the run stops.
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if address:
        _reachable(address)
    try:
        if address:
            ray.init(address=address, runtime_env=env, log_to_driver=False, logging_level=logging.WARNING)
        else:   # "local": a new instance even when /tmp/ray/ray_current_cluster names a running one
            ray.init(address="local", num_cpus=jobs or len(os.sched_getaffinity(0)), runtime_env=env,
                     log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    except getattr(ray.exceptions, "AuthenticationError", ()):   # token auth: Ray >= 2.5x
        raise InputError(f"--address {address}: the cluster wants its token; set RAY_AUTH_TOKEN (or "
                         f"RAY_AUTH_TOKEN_PATH) to the token printed by 'ray get-auth-token' on the head node"
                         ) from None
    except ConnectionError as exc:
        raise InputError(f"--address {address}: cannot connect ({str(exc).splitlines()[0]}); check the address "
                         f"that 'ray start --head' printed and that the head node is running") from None
    return ray


# How long a cluster's head node may take to accept a TCP connection: ray.init itself retries an
# unreachable address for minutes, so the address is tried first.
CONNECT_TIMEOUT_S = 10.0


def _reachable(address: str, timeout: float = None) -> None:
    """One line, within ``CONNECT_TIMEOUT_S``, when nothing listens at ``address`` (host:port, or
    ray://host:port); "auto" and other forms are left to Ray."""
    import re
    import socket

    m = re.fullmatch(r"(ray://)?\[?([^\]/]+?)\]?:(\d+)", address.strip())
    if m is None:
        return
    host, port = m[2], int(m[3])
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        why = f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise InputError(f"--address {address}: cannot reach {host}:{port} ({why}); check the address that 'ray "
                         f"start --head' printed and that the head node is running") from None


def _check_gpus(ray, options: RayOptions) -> None:
    have = ray.cluster_resources().get("GPU", 0)
    if options.gpus_per_task and have < options.gpus_per_task:
        raise InputError(f"--gpus-per-task {options.gpus_per_task:g}: the cluster has {have:g} GPUs; start GPU "
                         f"nodes with 'ray start --num-gpus N' or drop --gpus-per-task")


def _driver_files(task) -> dict[str, bytes]:
    """What a task needs from the driver's copy of its run directory: the arm's files (a
    checkpoint to resume from) and the seed's caches (*.pt beside the arms)."""
    run_dir = Path(task.run_dir)
    name = json.loads(task.config_json)["arms"][task.arm]["name"]
    files = {f"{name}/{rel}": data for rel, data in _pack(run_dir / name).items()} if (run_dir / name).is_dir() else {}
    files.update({p.name: p.read_bytes() for p in run_dir.glob("*.pt")})
    return files


def land(run_dir: Path, files: dict[str, bytes], final: bool) -> None:
    """Write a task's files into the driver's run directory, each atomically and the manifest (which
    marks the arm complete) last; a finished arm's checkpoint is removed, as the arm did its own."""
    run_dir = Path(run_dir)
    # a checkpoint after its side files (it names them), the manifest last
    for rel in sorted(files, key=lambda r: (r.endswith("/" + MANIFEST), r.endswith("/" + CHECKPOINT))):
        path = (run_dir / rel).resolve()
        if not path.is_relative_to(run_dir.resolve()):
            raise ValueError(f"{rel}: a task file outside its run directory")
        atomic_write(path, lambda p, data=files[rel]: p.write_bytes(data))
    if final:
        for rel in files:
            if rel.endswith("/" + MANIFEST):
                remove_checkpoint((run_dir / rel).parent.joinpath(CHECKPOINT))


def _run_ray(tasks: Sequence, jobs: int | None, options: RayOptions, on_start: Callable, on_done: Callable,
             stack: int | None) -> None:
    """One Ray task per shard of runs: a cluster runs a campaign in shards, one per Ray slot (a
    GPU share with --gpus-per-task, else a CPU), each shard's runs stacked."""
    ray = start_ray(jobs, options)
    from groupfel.emulator.config import RunConfig
    from groupfel.emulator.world import load_data

    data: dict = {}   # (dataset, path) -> object ref, with ship_data

    def dataset_ref(task):
        if not options.ship_data:
            return None
        config = RunConfig.model_validate_json(task.config_json)
        key = (config.data.dataset, config.data.path)
        if key not in data:   # a shipped dataset or a plug-in's, loaded once on the driver
            data[key] = ray.put(load_data(config))
        return data[key]

    remote = ray.remote(ray_task)
    placement = {"num_cpus": 1, "num_gpus": options.gpus_per_task, "max_retries": 0}
    resources = ray.cluster_resources()
    slots = jobs or int(resources.get("GPU", 0) // options.gpus_per_task if options.gpus_per_task
                        else resources.get("CPU", 1))
    running: dict = {}    # generator -> [its shard's tasks, their width, which are done]
    losses: dict = {}

    def submit(shard, width):
        # the numerics' variables reach the worker process when Ray starts it, before it loads torch
        mode = json.loads(shard[0].config_json)["train"].get("numerics", "portable")
        env = numerics.env(mode)
        pinned = remote.options(**placement, **({"runtime_env": {"env_vars": env}} if env else {}))
        jobs_ = [(t.config_json, t.arm, _driver_files(t), dataset_ref(t)) for t in shard]
        running[pinned.remote(jobs_, width, options.gpus_per_task)] = (shard, width, set())

    for shard, width in shards(tasks, stack, max(1, slots)):
        for task in shard:
            on_start(task)
        submit(shard, width)
    while running:
        ready, _ = ray.wait(list(running), num_returns=1)
        for gen in ready:
            shard, width, done = running[gen]
            try:
                kind, i, files = ray.get(next(gen))
            except StopIteration:    # every run of the shard has landed
                running.pop(gen)
                continue
            except ray.exceptions.RayTaskError as exc:   # a run's own error: stop, as the local pool does
                running.pop(gen)
                cause = exc.cause
                if isinstance(cause, (InputError, DivergenceError, WorkerLostError)):
                    raise cause from None
                raise exc.as_instanceof_cause() from None
            except ray.exceptions.RayError as exc:   # its worker or node died
                running.pop(gen)
                left = tuple(t for k, t in enumerate(shard) if k not in done)
                for task in left:
                    _lost(task, losses, options.max_losses, "lost its Ray worker or node",
                          "rerun the same command to resume from the checkpoints this machine holds")
                _note(f"{_label(left[0])}{' and its stack' if len(left) > 1 else ''}: its Ray worker or node died "
                      f"({type(exc).__name__}); running it again from its last checkpoint")
                submit(left, width)
                continue
            task = shard[i]
            land(Path(task.run_dir), files, final=kind == "done")
            if kind == "done":
                done.add(i)
                on_done(task)


# ---- command line ------------------------------------------------------------------------------

def add_device_argument(parser) -> None:
    """--device: the torch device every run trains on (overrides train.device)."""
    from groupfel.emulator.devices import HELP

    parser.add_argument("--device", metavar="DEVICE",
                        help=f"train on {HELP}; default: the config's train.device (cpu). A killed run resumes on "
                             f"any device")


def add_stack_argument(parser) -> None:
    from . import flags

    parser.add_argument("--stack", type=flags.STACK, metavar="N",
                        help="at most N runs train together in one process, their clients in the same stacked steps "
                             "(1: each run alone; default: the config's train.stack, else the device's fastest, "
                             "recorded in each manifest)")


def add_backend_arguments(parser, what: str) -> None:
    """--backend, --jobs and the Ray options of a command that runs ``what`` as tasks."""
    from . import flags

    add_device_argument(parser)
    parser.add_argument("--backend", default="local", choices=list(BACKENDS),
                        help=f"where {what} go: local, a process pool, one worker per core (default); ray: Ray tasks")
    parser.add_argument("--jobs", type=flags.JOBS, help=f"parallel {what} (default: one per core; with ray, its CPUs)")
    add_stack_argument(parser)
    parser.add_argument("--address", help="with --backend ray: a cluster's address, e.g. 10.0.0.5:6379 (default: "
                                          "$RAY_ADDRESS, else a new local instance); see docs/cluster.md")
    parser.add_argument("--gpus-per-task", type=flags.Number(float, 1e-4, 64, "GPUs"), default=0.0, metavar="G",
                        help="with --backend ray: GPUs each task asks for (0.5: two tasks share one); tasks then "
                             "train on CUDA (default 0: no GPUs)")
    parser.add_argument("--ship-data", action="store_true",
                        help="with --backend ray: send the dataset to the nodes through Ray's object store "
                             "(default: each node reads its own copy at the config's path)")
    parser.add_argument("--py-module", action="append", default=[], metavar="PATH",
                        help="with --backend ray: a plug-in module or package the workers need (repeatable)")


def ray_options(args) -> RayOptions:
    return RayOptions(address=args.address, gpus_per_task=args.gpus_per_task, ship_data=args.ship_data,
                      py_modules=tuple(args.py_module))
