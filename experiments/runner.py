"""Run every arm of a config into one run directory, then the comparison table and plot.

Layout of a single-seed run directory (config ``seed = 0``)::

    config.json            the resolved config (a resume reads it back)
    <arm>/results.csv      one row per evaluation (also .parquet)
    <arm>/ledger.parquet   every Eq. 5 charge
    <arm>/manifest.json    config, seed, versions, grouping summary, stop reason
    <arm>/checkpoint.pt    only while the arm is unfinished
    summary.csv            one row per arm
    accuracy_vs_cost.png

With ``seeds = [0, 1, 2]`` every seed is a complete single-seed run directory of its own, and the
top level aggregates them::

    config.json            the resolved multi-seed config
    seed-<s>/              a single-seed run directory (config.json with seed = s, <arm>/, summary.csv)
    runs.csv               every evaluation of every seed and arm (also runs.parquet)
    per_seed.csv           the headline metrics of each (seed, arm)
    summary.csv            one row per arm: mean and 95 % CI over seeds, paired difference from arm 1
    curves.csv             accuracy on a common cost grid per arm: mean and band
    accuracy_vs_cost.png   mean curve with its 95 % band; accuracy_vs_time.png likewise (and
                           accuracy_vs_energy.png where the run measures energy: cost.energy)

The (seed, arm) pairs run as independent tasks (:mod:`groupfel.experiments.tasks`) on a backend
(:mod:`groupfel.experiments.backends`: a local process pool or Ray); each arm checkpoints, so ``--resume``
continues every unfinished one. A single-seed run, a task and validation all plan their arms with
:func:`groupfel.experiments.tasks.plan_world` and run them with :func:`groupfel.emulator.driver.run_arm`.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from groupfel.emulator import numerics
from groupfel.emulator.config import RunConfig, load_config, parse_config
from groupfel.errors import InputError
from groupfel.policies.plugins import upgrade_saved
from groupfel.userfile import read_json
from groupfel.emulator.io import atomic_write, remove_inside, run_lock, write_json

from .stats import (accuracy_at_cost, any_open, comparisons, curves_on_grid, heading_nowhere, per_seed_metrics,
                    summarize_seeds)
from .tasks import Task, arm_complete, plan_world


def default_config() -> RunConfig:
    import tomllib

    text = resources.files(__package__).joinpath("configs", "default.toml").read_text()
    return parse_config(tomllib.loads(text))


def config_from_run_dir(run_dir: Path) -> RunConfig:
    from groupfel.emulator.runfiles import load_json

    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise InputError(f"--resume {run_dir}: no config.json there; give the directory a run was started in")
    return parse_config(load_json(path, damaged_config_fix(run_dir)))


def damaged_config_fix(run_dir: Path) -> str:
    """What to do about a run directory's damaged config.json (followed, it works: see check_dir)."""
    return (f"restore it from a copy, or rerun from the config file with 'groupfel run CONFIG --output {run_dir}' "
            f"(finished arms whose files are intact are kept)")


def seed_config(config: RunConfig, seed: int) -> RunConfig:
    """The single-seed config of one seed of a multi-seed config."""
    return parse_config({**json.loads(config.model_dump_json()), "seed": seed, "seeds": None,
                         "max_seeds": None})


def finished(config: RunConfig, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run of ``config`` whose every arm's files are intact."""
    run_dir = Path(run_dir)
    saved = run_dir / "config.json"
    if not saved.exists() or _saved_config(saved) != config:
        return False
    dirs = [run_dir] if config.seeds is None else [seed_dir(run_dir, s) for s in config.seed_list]
    if config.seeds is not None and not all(_saved_config(seed_dir(run_dir, s) / "config.json") == seed_config(config, s)
                                            for s in config.seed_list):
        return False   # a seed's config.json damaged or missing: the rerun writes it again
    return all(arm_complete(d / a.name) for d in dirs for a in config.arms)


def saved_summary(config: RunConfig, run_dir: Path) -> pd.DataFrame | None:
    """A finished multi-seed run's summary.csv as :func:`finish` returned it (None where it or
    per_seed.csv does not parse): a rerun need not recompute intervals (nor import scipy)."""
    from groupfel.emulator.runfiles import csv_intact, parquet_intact

    run_dir = Path(run_dir)
    if not (csv_intact(run_dir / "summary.csv") and csv_intact(run_dir / "per_seed.csv")
            and csv_intact(run_dir / "runs.csv") and parquet_intact(run_dir / "runs.parquet")
            and csv_intact(run_dir / "curves.csv")
            and all((run_dir / f"accuracy_vs_{x}.png").is_file() for x in ("cost", "time", "energy")[:2 + config.cost.energy])):
        return None   # a table missing or damaged (or finish() killed before its last): it writes them all again
    summary = pd.read_csv(run_dir / "summary.csv")
    per_seed = pd.read_csv(run_dir / "per_seed.csv")
    summary.attrs["target"] = config.train.target_accuracy
    summary.attrs["common_cost"] = per_seed.groupby("seed")["common_cost"].first().tolist()
    summary.attrs["comparisons"] = comparisons(summary)
    return summary


def seed_dir(run_dir: Path, seed: int) -> Path:
    return Path(run_dir) / f"seed-{seed}"


def validate(config: RunConfig, run_dir: Path, *, force: bool = False, where: str = "") -> None:
    """Every input error of ``config`` (policies against the topology and the mode, the data, the
    directory) surfaces here, before anything is written."""
    try:
        plan_world(seed_config(config, config.seed_list[0]))
    except InputError as exc:   # keeps its kind (a plug-in's own error keeps its traceback)
        if where:
            exc.args = (f"{where}{exc.args[0]}", *exc.args[1:])
        raise
    check_dir(config, run_dir, force=force, where=where)


def check_dir(config: RunConfig, run_dir: Path, *, force: bool = False, where: str = "") -> None:
    saved = Path(run_dir) / "config.json"
    if saved.exists() and not force and _damaged_json(saved) and _seeds_agree(config, Path(run_dir)):
        return   # the rerun from the config writes config.json again and keeps the intact arms
    if saved.exists() and not force:
        _same_schedule(_saved_config(saved), config, run_dir, where)
    if saved.exists() and not force and not _same_run(_saved_config(saved), config):
        raise InputError(f"{where}output: {run_dir} holds a run of a different config; pass --force to replace "
                         f"it, or change 'name'/'output_dir'")


def _same_run(saved: RunConfig | None, config: RunConfig) -> bool:
    """The same run, wherever it trains: it may resume under other numerics (``--numerics``; it
    warns then, see :func:`groupfel.emulator.numerics.check_resume`) or on another device
    (``--device``: checkpoints load onto any device) or in other stacks (``--stack``). A multi-seed run may also continue with other
    seeds (``--seeds auto``): a seed's runs do not depend on the others, so finished seeds are kept."""
    if saved is None:
        return False
    train = saved.train.model_copy(update={k: getattr(config.train, k) for k in ("numerics", "device", "stack")})
    update = {"train": train}
    if saved.seeds is not None and config.seeds is not None:
        update.update({k: getattr(config, k) for k in ("seeds", "max_seeds", "seed_batch")})
    return saved.model_copy(update=update) == config


def _same_schedule(saved: RunConfig | None, config: RunConfig, run_dir: Path, where: str) -> None:
    """A study that adds seeds continues only on the schedule it was planned with: its decisions
    spend their 5 % over exactly those looks, and another max_seeds or seed_batch chosen after
    looking would spend it again. A finished fixed-seed study does not continue: its table spent the
    whole 5 % at its one look, so more seeds, fixed or added until decided, would be a second test."""
    if saved is None or config.seeds is None:
        return
    if isinstance(saved.seeds, list):
        finished = (Path(run_dir) / "summary.csv").exists()
        if config.seeds == "auto" and finished:
            raise InputError(f"{where}--seeds auto: {run_dir} holds a finished study of {len(saved.seed_list)} fixed "
                             f"seeds whose table spent the whole 5 % on them; a study that adds seeds would count "
                             f"that table as its first look with nothing left to spend, and run anyway it is a "
                             f"second test ({CONTINUED_RATE} false decisions with the table's, simulated, not 5 %); "
                             f"decide the rest on other seeds in a new study, planned before it looks")
        if config.seeds != "auto" and sorted(saved.seed_list) != sorted(config.seed_list) and finished:
            raise InputError(f"{where}{len(config.seed_list)} seeds: {run_dir} holds a finished study of "
                             f"{len(saved.seed_list)} fixed seeds whose decisions were tested at 5 %, and testing "
                             f"again on other seeds would be a second test at 5 % (false decisions add up); decide "
                             f"the rest on other seeds in a new study, planned before it looks")
        return
    if saved.seeds != "auto":
        return
    plan = (saved.seed_cap, saved.seed_batch)
    if config.seeds == "auto" and (config.seed_cap, config.seed_batch) == plan:
        return
    asked = (f"--seeds {len(config.seed_list)}" if config.seeds != "auto" else
             f"max_seeds = {config.seed_cap}, seed_batch = {config.seed_batch}")
    raise InputError(f"{where}{asked}: {run_dir} holds a study planned with max_seeds = {plan[0]} and seed_batch = "
                     f"{plan[1]}, whose decisions hold for that schedule only; continue it with --seeds auto "
                     f"--max-seeds {plan[0]} (its config's seed_batch), or start a new study in another directory")


def _damaged_json(path: Path) -> bool:
    """Whether ``path`` no longer holds a JSON object (a copy or sync tool broke it), as opposed to
    holding a config that differs or no longer parses."""
    try:
        return not isinstance(read_json(path, str(path), kind="run"), dict)
    except ValueError:   # JSONDecodeError and UnicodeDecodeError
        return True


def _seeds_agree(config: RunConfig, run_dir: Path) -> bool:
    """Whether every readable seed-N/config.json of ``run_dir`` is ``config``'s for seed N: the
    evidence, when the top-level config.json is damaged, that ``config`` is the run's."""
    for d in run_dir.glob("seed-*"):
        saved = d / "config.json"
        if not d.name.removeprefix("seed-").isdigit() or not saved.exists() or _damaged_json(saved):
            continue
        if config.seeds is None or not _same_run(_saved_config(saved), seed_config(config, int(d.name[5:]))):
            return False
    return True


def _saved_config(path: Path) -> RunConfig | None:
    """The config a run directory was started with (compared as a config, so keys added to the
    schema since, at their defaults, do not count as a change); None if it no longer parses."""
    try:
        return parse_config(upgrade_saved(read_json(path, str(path), kind="run")))
    except (InputError, ValueError):   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def prepare(config: RunConfig, run_dir: Path, *, force: bool = False) -> list[Task]:
    """Write the config files of a validated multi-seed run; its (seed, arm) tasks, done ones included."""
    run_dir = Path(run_dir)
    if force:
        for s in config.seed_list:
            remove_inside(seed_dir(run_dir, s), run_dir)
    write_json(run_dir / "config.json", json.loads(config.model_dump_json()))
    return _seed_tasks(config, run_dir)


def _study_marker(folder: Path) -> Path | None:
    """``folder``'s config.json or sweep.json when groupfel wrote it there (a run's or a sweep's
    folder): a JSON object with a run's ``arms`` or a sweep's ``sweep``, or one too damaged to
    tell beside a run's other files. A project's own config.json of another tool is not one."""
    for name, key in (("config.json", "arms"), ("sweep.json", "sweep")):
        f = folder / name
        if f.is_file():
            try:
                data = read_json(f, str(f), kind="run")
            except ValueError:        # damaged: a run's if a run's files lie beside it
                if (folder / "summary.csv").exists() or next(folder.glob("*/manifest.json"), None) \
                        or next(folder.glob("seed-*"), None):
                    return f
                continue
            if isinstance(data, dict) and key in data:
                return f
    return None


def check_own_place(run_dir: Path, where: str = "output") -> None:
    """Refuse a run or sweep folder that lies inside another run's or sweep's folder, or that
    holds one without being one itself: its files would land among the other's (a run named
    ``seed-1`` in a multi-seed run's folder would replace that run's seed 1), ``--force`` or not."""
    run_dir = Path(run_dir)
    real = run_dir.resolve()
    for parent in real.parents:
        marker = _study_marker(parent)
        if marker is not None:
            raise InputError(f"{where}: {run_dir} lies inside the run or sweep {parent} ({marker.name}), whose "
                             f"files it would mix with or replace; give a folder outside it (change 'name' or "
                             f"'output_dir', or --output)")
    if not real.is_dir() or _study_marker(real) is not None:
        return
    for depth in ("*", "*/*", "*/*/*"):
        for sub in sorted(real.glob(depth)):
            marker = _study_marker(sub) if sub.is_dir() and not sub.is_symlink() else None
            if marker is not None:
                raise InputError(f"{where}: {run_dir} holds the run or sweep {sub} ({marker.name}); a run there "
                                 f"would mix its files with it; give an empty or new folder (change 'name' or "
                                 f"'output_dir', or --output)")


NEST_WAIT_S = 10.0   # how long a run waits for a run starting inside its folder to give way


def check_alone(run_dir: Path, where: str = "output") -> None:
    """Under ``run_dir``'s lock: no run or sweep lies around or inside it, as :func:`check_own_place`
    found before the lock, nor is another process writing a folder around or inside it. Two runs
    started at the same instant, one inside the other, both pass the first check; each then holds
    its lock and sees the other's: the inner one gives way at once, the outer one waits (up to
    :data:`NEST_WAIT_S`) for it to, so exactly one runs."""
    import time

    from groupfel.emulator.io import LOCK_NAME, held_elsewhere

    run_dir = Path(run_dir)
    real = run_dir.resolve()
    for parent in real.parents:
        pid = held_elsewhere(parent)
        if pid is not None:
            raise InputError(f"{where}: {run_dir} lies inside {parent}, which another groupfel process (PID {pid}) "
                             f"is writing; give a folder outside it (change 'name' or 'output_dir', or --output)")
    deadline = time.monotonic() + NEST_WAIT_S
    while True:
        inside = [(lock.parent, pid) for depth in ("*/", "*/*/", "*/*/*/") for lock in real.glob(depth + LOCK_NAME)
                  if (pid := held_elsewhere(lock.parent)) is not None]
        if not inside:
            break
        if time.monotonic() > deadline:
            folder, pid = inside[0]
            raise InputError(f"{where}: another groupfel process (PID {pid}) is writing {folder}, inside {run_dir}; "
                             f"wait for it to finish, or give a folder that holds no run")
        time.sleep(0.05)
    check_own_place(run_dir, where)


# What a run's manifest.json holds (the config, power sources, numerics) besides a few hundred
# bytes a round (the shared edges' stats: a few hundred more per edge): what it reads back at its end
MANIFEST_BASE = 16 * 1024
MANIFEST_ROUND = 256
MANIFEST_EDGE_ROUND = 512


def check_file_limit(config: RunConfig, run_dir: Path) -> None:
    """Where GROUPFEL_MAX_FILE_MB is set: before any work, the run's files (those already in
    ``run_dir`` and the manifest each arm will write, which the run reads back at its end) fit
    under it; else one line naming the file and the setting."""
    import os

    from groupfel.userfile import ENV_LIMIT, check_file, limit_of

    if not os.environ.get(ENV_LIMIT, "").strip():
        return
    limit = limit_of("run")
    if Path(run_dir).is_dir():
        for path in sorted(Path(run_dir).rglob("*")):
            if path.is_file() and not path.is_symlink() and path.name != ".groupfel.lock" and path.suffix != ".png":
                check_file(path, str(path), "a file within the limit", "run")
    rounds = config.train.rounds if config.train.rounds is not None else 1000
    per_round = MANIFEST_ROUND + (MANIFEST_EDGE_ROUND * config.topology.edges if config.topology.contended else 0)
    need = MANIFEST_BASE + 2 * len(config.model_dump_json()) + rounds * per_round
    if need > limit:
        raise InputError(f"{ENV_LIMIT}={os.environ[ENV_LIMIT].strip()}: each arm's manifest.json of this run holds "
                         f"about {need / 1024:,.0f} KB, which the run reads back when it ends, more than the "
                         f"{limit / 1024:,.1f} KB the setting allows a file; set {ENV_LIMIT} to at least "
                         f"{-(-need * 10 // 2**20) / 10:g}, or unset it")


def _where(config: RunConfig, run_dir: Path) -> str:
    """How the user named the run's folder."""
    return "--output" if Path(run_dir) != Path(config.output_dir) / config.name else "output_dir/name"


def run_experiment(config: RunConfig, run_dir: Path | None = None, *, force: bool = False,
                   progress: bool = True, jobs: int | None = None, backend: str = "local",
                   address: str | None = None, ray=None, track=None) -> pd.DataFrame:
    """Validate everything, then run (or resume) each arm of each seed; returns the summary table.
    A config with ``seeds`` runs its (seed, arm) tasks on ``backend`` with ``jobs`` workers
    (``ray``: :class:`groupfel.experiments.backends.RayOptions`). ``track``: log to TensorBoard or
    MLflow as the runs go, over the config's ``[track]`` (:func:`groupfel.experiments.track.resolve`)."""
    from .track import open_session, study_text

    numerics.apply(config.train.numerics)    # before torch loads (a TensorBoard writer imports it)
    run_dir = Path(run_dir) if run_dir else Path(config.output_dir) / config.name
    session = open_session(track, config.track, run_dir, force=force)   # an unreachable tracker: before any work
    config = config.model_copy(update={"track": None})
    if session is None:
        return _run_experiment(config, run_dir, force=force, progress=progress, jobs=jobs, backend=backend,
                               address=address, ray=ray)
    with session:
        summary = _run_experiment(config, run_dir, force=force, progress=progress, jobs=jobs, backend=backend,
                                  address=address, ray=ray)
    session.finish(summary, study_text(summary, config))
    return summary


def _run_experiment(config: RunConfig, run_dir: Path, *, force, progress, jobs, backend, address, ray) -> pd.DataFrame:
    numerics.apply(config.train.numerics)    # before torch loads here and in the workers
    check_own_place(run_dir, _where(config, run_dir))
    check_file_limit(config, run_dir)
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {jobs}")
    if config.seeds == "auto":
        from .backends import check_backend, run_tasks

        validate(config, run_dir, force=force)
        check_backend(backend, jobs, address, ray)
        return _locked(config, run_dir, force, lambda: _run_auto(
            config, run_dir, force=force, progress=progress, jobs=jobs, backend=backend, address=address, ray=ray,
            run_tasks=run_tasks))
    if not force and finished(config, run_dir):
        # a rerun of a finished run: nothing to plan, no engine to build; the tables are recomputed
        # from the intact results, the plots kept
        with run_lock(run_dir):
            check_alone(run_dir, _where(config, run_dir))
            tidy(run_dir)
            if config.seeds is None:
                return finish_seed(config, run_dir, replot=False)
            saved = saved_summary(config, run_dir)
            return saved if saved is not None else finish(config, run_dir, replot=False)
    if config.seeds is None:
        return _run_single(config, run_dir, force=force, progress=progress)
    from .backends import check_backend, run_tasks

    validate(config, run_dir, force=force)
    check_backend(backend, jobs, address, ray)   # a cluster without the GPUs asked for: before any file
    return _locked(config, run_dir, force, lambda: _run_seeds(
        config, run_dir, force=force, progress=progress, jobs=jobs, backend=backend, address=address, ray=ray,
        run_tasks=run_tasks))


def _locked(config: RunConfig, run_dir: Path, force: bool, run: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """``run()`` under the run directory's lock, after the checks a writer before us may have
    changed the answer to; a run stopped by bad input in its first round leaves nothing behind."""
    created = _created(run_dir)
    try:
        with run_lock(run_dir):
            check_alone(run_dir, _where(config, run_dir))
            check_dir(config, run_dir, force=force)
            tidy(run_dir)
            if not force:
                numerics.check_resume(run_dir, config.train.numerics)
            return run()
    except InputError:
        _drop_if_empty(run_dir, created)
        raise


def tidy(run_dir: Path) -> None:
    """What a writer killed between two steps left (called under the run's lock): its temporary
    files, and the checkpoint of an arm it finished but had not removed yet."""
    from groupfel.emulator.io import CHECKPOINT, remove_checkpoint, remove_stale
    from groupfel.emulator.runfiles import complete_manifest

    remove_stale(run_dir)
    for side in Path(run_dir).rglob(f"{CHECKPOINT}*"):
        if complete_manifest(side.parent) is not None:
            remove_checkpoint(side.parent / CHECKPOINT)


def _run_seeds(config, run_dir, *, force, progress, jobs, backend, address, ray, run_tasks) -> pd.DataFrame:
    tasks = prepare(config, run_dir, force=force)
    todo = [t for t in tasks if not t.done]
    with tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"{config.name}: seed x arm runs",
              unit="run", disable=not progress, dynamic_ncols=True) as bar:
        run_tasks(todo, backend=backend, jobs=jobs, address=address, ray=ray, on_done=lambda _task: bar.update())
    return finish(config, run_dir)


def _run_auto(config, run_dir, *, force, progress, jobs, backend, address, ray, run_tasks) -> pd.DataFrame:
    """Seeds 0, 1, 2, ... in batches, a look after each, until every comparison is decided or
    ``max_seeds`` (:mod:`groupfel.experiments.sequential`). Each look's decisions are computed from
    the finished seeds alone, so a resumed study repeats the same looks and adds no seed twice."""
    from .sequential import looks

    if force:
        for d in Path(run_dir).glob("seed-*"):
            remove_inside(d, run_dir)
    write_json(run_dir / "config.json", json.loads(config.model_dump_json()))
    schedule = looks(3, config.seed_batch, config.seed_cap)
    for k, n in enumerate(schedule):
        fixed = config.model_copy(update={"seeds": list(range(n)), "max_seeds": None})
        tasks = _seed_tasks(fixed, run_dir)
        todo = [t for t in tasks if not t.done]
        with tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"{config.name}: {n} seeds x arms",
                  unit="run", disable=not progress, dynamic_ncols=True) as bar:
            run_tasks(todo, backend=backend, jobs=jobs, address=address, ray=ray, on_done=lambda _task: bar.update())
        write_json(run_dir / LOOKS_FILE, {"looks": schedule[:k + 1], "max_seeds": config.seed_cap})
        per_seed = per_seed_metrics(load_runs(fixed, run_dir), config.train.target_accuracy)
        summary = summarize_seeds(per_seed, [a.name for a in config.arms], **_sequential(config, schedule[:k + 1]))
        if k == len(schedule) - 1 or not any_open(summary) or heading_nowhere(summary):
            return finish(fixed, run_dir, sequential=(config, schedule[:k + 1]))
    raise AssertionError("unreachable: the last look returns")


LOOKS_FILE = "looks.json"
# False decisions of a fixed table of 3 seeds and a study that then adds seeds to it, read together
# (identical arms, one comparison, normal seeds; benchmarks/sequential.py --continuation).
CONTINUED_RATE = "about 8 %"


def _sequential(config: RunConfig, done: list[int]) -> dict:
    return {"margins": config.margins.model_dump(), "looks": done, "max_seeds": config.seed_cap,
            "seed_batch": config.seed_batch, "withhold_skew": config.withhold_skew}


def resolved_config(run_dir: Path) -> RunConfig:
    """The config of a run directory, a study with seeds = "auto" given the seeds it ran (its
    looks file); for reading a finished run (a resume reads the config as saved)."""
    from groupfel.emulator.runfiles import load_json

    config = parse_config(load_json(Path(run_dir) / "config.json", damaged_config_fix(run_dir)))
    if config.seeds == "auto":
        path = Path(run_dir) / LOOKS_FILE
        done = load_json(path)["looks"] if path.exists() else config.seed_list
        config = config.model_copy(update={"seeds": list(range(done[-1] if path.exists() else len(done))),
                                           "max_seeds": None})
    return config


def _seed_tasks(config: RunConfig, run_dir: Path) -> list[Task]:
    """Each seed's config file and its (seed, arm) tasks, done ones included."""
    tasks = []
    for s in config.seed_list:
        cfg = seed_config(config, s)
        resolved = json.loads(cfg.model_dump_json())
        write_json(seed_dir(run_dir, s) / "config.json", resolved)
        tasks += [Task(json.dumps(resolved), str(seed_dir(run_dir, s)), i) for i in range(len(cfg.arms))]
    return tasks


def _run_single(config: RunConfig, run_dir: Path, *, force: bool, progress: bool) -> pd.DataFrame:
    """The arms of one seed, one after another in this process, with a progress bar per arm."""
    world, plans = plan_world(config)   # all input errors surface here
    check_dir(config, run_dir, force=force)
    return _locked(config, run_dir, force, lambda: _run_arms(config, run_dir, world, plans, force=force,
                                                             progress=progress))


def _drop_if_empty(run_dir: Path, created: Path | None) -> None:
    """After a plug-in broke its contract in round 1 (every started arm removed its own directory):
    a directory this run created that holds only config files and the lock goes too, with the
    folders above it this run created (``created``: the highest) where nothing else is in them,
    so nothing half-written is left behind."""
    if created is None or not run_dir.exists():
        return
    left = [p for p in run_dir.rglob("*") if p.is_file() and p.name not in ("config.json", "numerics.json", ".groupfel.lock")]
    if left:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if not parent.is_relative_to(created):
            break
        try:
            parent.rmdir()   # only an empty one
        except OSError:
            break


def _created(run_dir: Path) -> Path | None:
    """The highest folder of ``run_dir``'s path that does not exist yet (None: it exists)."""
    if run_dir.exists():
        return None
    top = run_dir
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top


def _run_arms(config, run_dir, world, plans, *, force, progress) -> pd.DataFrame:
    from groupfel.emulator.driver import run_arm

    if force:
        for plan in plans:
            remove_inside(run_dir / plan.arm.name, run_dir)
    write_json(run_dir / "config.json", json.loads(config.model_dump_json()))
    for plan in plans:
        arm_dir = run_dir / plan.arm.name
        if arm_complete(arm_dir):
            continue
        # A budgeted run is tracked by the budget spent, since its number of rounds is unknown.
        by_cost = config.train.budget is not None
        bar = tqdm(total=config.train.budget if by_cost else config.train.rounds, desc=plan.arm.name,
                   unit="cost" if by_cost else "round", disable=not progress, leave=True, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n:.4g}/{total:.4g} {unit} [{elapsed}<{remaining}{postfix}]")
        last_acc: list[float] = []   # the last evaluated accuracy; none shown before the first

        def tick(t, cost, acc, bar=bar):
            bar.n = cost if by_cost else t
            if acc is not None:
                last_acc[:] = [acc]
            bar.set_postfix(round=t, **({"acc": f"{last_acc[0]:.3f}"} if last_acc else {}), refresh=False)
            bar.refresh()

        try:
            with numerics.threads(config.train.numerics):
                run_arm(world, plan, arm_dir, tick)
        finally:
            bar.close()
    return finish_seed(config, run_dir)


def finish_seed(config: RunConfig, run_dir: Path, replot: bool = True) -> pd.DataFrame:
    """summary.csv and the plot of a single-seed run whose arms are all complete (``replot``
    False: an existing plot is kept)."""
    from groupfel.emulator.runfiles import load_csv

    results = pd.concat([load_csv(run_dir / a.name / "results.csv") for a in config.arms], ignore_index=True)
    summary = summarize(results, run_dir, config.train.target_accuracy)
    atomic_write(run_dir / "summary.csv", lambda p: summary.to_csv(p, index=False))
    if replot or not (run_dir / "accuracy_vs_cost.png").exists():
        from .plots import plot_curves

        plot_curves(results, run_dir / "accuracy_vs_cost.png", title=config.name)
        if "energy_j" in results:
            from .plots import energy_label

            plot_curves(results, run_dir / "accuracy_vs_energy.png", x="energy_j", title=config.name,
                        xlabel=energy_label(config.cost.energy_accounting))
    return summary


def assumed_powers(root: Path) -> str | None:
    """One line naming the assumed powers (``power_assumed``) of every arm under ``root``, None
    where every power is measured or the run measured no energy."""
    from groupfel.cost_models.power import assumed_line
    from groupfel.emulator.runfiles import load_json

    merged: dict[str, list[str]] = {}
    for path in sorted(Path(root).rglob("manifest.json")):
        manifest = load_json(path)
        for device, states in (manifest.get("power_assumed") or {}).items() if isinstance(manifest, dict) else ():
            merged[device] = sorted(set(merged.get(device, [])) | set(states), key=states_order)
    return assumed_line(merged)


def stop_messages(root: Path) -> list[str]:
    """'stopped early: <arm dir>: <why>' for every arm under ``root`` that stopped because nobody
    was online any more (availability, batteries)."""
    from groupfel.emulator.runfiles import load_json

    out = []
    for path in sorted(Path(root).rglob("manifest.json")):
        manifest = load_json(path)
        if isinstance(manifest, dict) and manifest.get("stop_message"):
            out.append(f"stopped early: {path.parent.relative_to(root)}: {manifest['stop_message']}")
    return out


def states_order(state: str) -> int:
    from groupfel.cost_models.power import STATES

    return STATES.index(state) if state in STATES else len(STATES)


def diverged_runs(root: Path) -> list[str]:
    """'<arm dir>: <message>' for every arm under ``root`` (a run, multi-seed run or sweep) that
    stopped because its model diverged or collapsed."""
    out = []
    from groupfel.emulator.runfiles import load_json

    for path in sorted(Path(root).rglob("manifest.json")):
        manifest = load_json(path)
        if isinstance(manifest, dict) and manifest.get("stop_reason") == "diverged":
            out.append(f"{path.parent.relative_to(root)}: {manifest.get('message', '')}")
    return out


def report_diverged(root: Path) -> int:
    """The exit code of a finished multi-run command: 1 (after one line per diverged arm on
    stderr) when any arm under ``root`` diverged, else 0. Diverged arms stay in the tables."""
    import sys

    runs = diverged_runs(root)
    for line in runs:
        print(f"groupfel: training diverged: {line}", file=sys.stderr)
    if runs:
        print(f"groupfel: {len(runs)} arm run(s) diverged; their rows up to the divergence are in the tables "
              f"(manifest stop_reason = \"diverged\")", file=sys.stderr)
    return 1 if runs else 0


def finish(config: RunConfig, run_dir: Path, replot: bool = True,
           sequential: tuple[RunConfig, list[int]] | None = None) -> pd.DataFrame:
    """The tables and plots of a multi-seed run whose (seed, arm) tasks are all complete
    (``replot`` False: existing plots are kept; ``sequential``: the study's own config with
    seeds = "auto" and the looks it made)."""
    run_dir = Path(run_dir)
    per_seed_summaries = [finish_seed(seed_config(config, s), seed_dir(run_dir, s), replot) for s in config.seed_list]
    results = load_runs(config, run_dir)
    atomic_write(run_dir / "runs.csv", lambda p: results.to_csv(p, index=False))
    atomic_write(run_dir / "runs.parquet", lambda p: results.to_parquet(p, index=False))
    arms = [a.name for a in config.arms]
    per_seed = per_seed_metrics(results, config.train.target_accuracy)
    atomic_write(run_dir / "per_seed.csv", lambda p: per_seed.to_csv(p, index=False))
    summary = summarize_seeds(per_seed, arms, **(_sequential(*sequential) if sequential else
                                                  {"margins": config.margins.model_dump(),
                                                   "withhold_skew": config.withhold_skew}))
    # Grouping and cost facts of each arm, averaged over seeds (each seed's are in its directory);
    # overhead_share: the group operations' part of the Eq. 5 cost.
    first = pd.concat(per_seed_summaries, ignore_index=True).groupby("arm", sort=False)
    summary.insert(1, "grouping", first["grouping"].first().reindex(arms).to_numpy())
    summary.insert(2, "sampling", first["sampling"].first().reindex(arms).to_numpy())
    last = results.groupby(["arm", "seed"], sort=False).last()
    share = (last["overhead_cost"] / last["cost"]).groupby(level="arm", sort=False).mean()
    facts = {"groups": first["groups"].mean(), "group_size": first["size_mean"].mean().round(2),
             "avg_cov": first["avg_cov"].mean().round(3), "rounds": first["rounds"].mean(),
             "cost": first["cost"].mean(), "overhead_share": share.round(3)}
    for i, (name, values) in enumerate(facts.items()):
        summary.insert(3 + i, name, values.reindex(arms).to_numpy())
    atomic_write(run_dir / "summary.csv", lambda p: summary.to_csv(p, index=False))
    curves = curves_on_grid(results, "cost", "accuracy")
    atomic_write(run_dir / "curves.csv", lambda p: curves.to_csv(p, index=False))
    energy = (("accuracy_vs_energy.png", "energy_j"),) if "energy_j" in results else ()
    for name, x in (("accuracy_vs_cost.png", "cost"), ("accuracy_vs_time.png", "sim_time_s"), *energy):
        if replot or not (run_dir / name).exists():
            from .plots import energy_label, plot_bands

            plot_bands({config.name: results}, run_dir / name, x=x, title=config.name,
                       xlabel=energy_label(config.cost.energy_accounting) if x == "energy_j" else None)
    summary.attrs["target"] = config.train.target_accuracy
    summary.attrs["common_cost"] = per_seed.groupby("seed")["common_cost"].first().tolist()
    return summary


def load_runs(config: RunConfig, run_dir: Path) -> pd.DataFrame:
    """Every evaluation row of every seed and arm of a multi-seed run."""
    from groupfel.emulator.runfiles import load_csv

    return pd.concat([load_csv(seed_dir(run_dir, s) / a.name / "results.csv")
                      for s in config.seed_list for a in config.arms], ignore_index=True)


def summarize(results: pd.DataFrame, run_dir: Path, target: float | None = None) -> pd.DataFrame:
    """One row per arm of a single-seed run; ``acc_at_common_cost`` compares arms at the smallest
    final cost of any arm, ``cost_to_target`` is the cost at the first evaluation reaching
    ``target`` accuracy (NaN: never)."""
    from groupfel.emulator.runfiles import load_json

    common = results.groupby("arm", sort=False)["cost"].max().min()
    rows = []
    for arm, df in results.groupby("arm", sort=False):
        manifest = load_json(run_dir / str(arm) / "manifest.json")
        g = manifest["grouping"]
        last = df.iloc[-1]
        rows.append({
            "arm": arm, "grouping": manifest["grouping_policy"], "sampling": manifest["sampling_policy"],
            "groups": g["n_groups"], "group_size": f"[{g['size_min']}, {g['size_max']}] ({g['size_mean']:.2f})",
            "size_mean": g["size_mean"],
            "avg_cov": round(g["cov_mean"], 3), "rounds": int(last["round"]), "cost": float(last["cost"]),
            "sim_time_s": float(last["sim_time_s"]),
            **({"energy_j": float(last["energy_j"])} if "energy_j" in df else {}),
            **({"energy_accounting": last["energy_accounting"]} if "energy_accounting" in df else {}),
            "final_acc": float(last["accuracy"]),
            "best_acc": float(df["accuracy"].max()),
            "acc_at_common_cost": accuracy_at_cost(df, common),
            "stop": manifest["stop_reason"]})
        if target is not None:
            hit = df.loc[df["accuracy"] >= target, "cost"]
            rows[-1]["cost_to_target"] = float(hit.iloc[0]) if len(hit) else float("nan")
    out = pd.DataFrame(rows)
    out.attrs["common_cost"] = float(common) if np.isfinite(common) else None
    return out


__all__ = ["default_config", "config_from_run_dir", "load_config", "run_experiment", "summarize", "finish",
           "prepare", "validate", "seed_config", "seed_dir", "Task"]
