"""The Python API: everything the ``groupfel`` command does, from a script or a notebook.

```python
from groupfel.experiments import api

study = api.run("experiment.toml", "results/exp")      # or a dict, or a RunConfig
study.summary                                          # the tables, as DataFrames
study.plot()                                           # accuracy against Eq. 5 cost, per arm
study.report("exp.html")
```

The command line is a thin layer over these functions (``groupfel run`` calls :func:`run`), so a
run started here and one started from a shell are the same run: the same files, the same numbers,
and either can resume the other.

A class or function defined in a notebook can stand in a dict config wherever a config names a
part (``{"grouping": {"policy": MyPolicy, "min_group_size": 4}}``, ``train.model``,
``data.dataset``, sampling and aggregation). It runs in this process only (``jobs=1``, the local
backend); the run's manifest records its qualified name and the sha256 of its source, and resuming
the run needs the same class passed again. Everything else about plug-ins: :mod:`groupfel.policies.plugins`.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from groupfel.emulator.config import RunConfig, check_modes, check_user_config, load_config, parse_config
from groupfel.errors import InputError
from groupfel.policies.plugins import upgrade_saved
from groupfel.userfile import read_json
from groupfel.emulator.io import check_writable
from groupfel.emulator.runfiles import load_csv, load_json, load_parquet


__all__ = ["Study", "run", "load", "sweep", "whatif", "calibrate", "group"]


# -- configs given as objects --------------------------------------------------------------------

def _spec(obj: Any, where: str) -> str:
    """The import path of a class or function given in place of a name."""
    from groupfel.policies import plugins

    spec = plugins.spec_of(obj)
    if "<locals>" in spec:
        raise InputError(f"{where}: {spec!r} is defined inside a function; define it at the top level of the "
                         f"notebook or of a module so the run can find it again")
    return spec


def _named(node: Any, where: str, parent: str = "") -> Any:
    """``node`` with every class or function in a part's place replaced by its import path (a
    grouping policy instance by its import path and fields; a training algorithm instance by its
    import path, its fields going to ``train.algorithm_params``)."""
    from groupfel.policies import GroupingPolicy

    if isinstance(node, dict):
        algorithm = node.get("algorithm") if parent == "train" else None
        if dataclasses.is_dataclass(algorithm) and not isinstance(algorithm, type):   # an Algorithm instance
            fields = {f.name: getattr(algorithm, f.name) for f in dataclasses.fields(algorithm) if f.init}
            node = {**node, "algorithm": type(algorithm), "algorithm_params": {**fields, **node.get("algorithm_params", {})}}
        return {k: _named(v, f"{where}.{k}" if where else k, k) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_named(v, f"{where}[{i}]", parent) for i, v in enumerate(node)]
    if parent == "grouping" and isinstance(node, GroupingPolicy):
        fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(node) if f.init}
        return {"policy": _spec(type(node), where), **fields}
    if isinstance(node, type) or callable(node):
        return _spec(node, where)
    return node


def as_config(config: str | Path | dict | RunConfig) -> RunConfig:
    """A RunConfig from a TOML path, a dict (whose parts may be classes or functions) or a RunConfig."""
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, (str, Path)):
        return load_config(config)
    if isinstance(config, dict):
        check_user_config(config, "config")
        return check_modes(config, parse_config(_named(copy.deepcopy(config), "")))
    raise InputError(f"config: expected a TOML path, a dict or a RunConfig, got {type(config).__name__}")


def _in_process_parts(config: RunConfig) -> list[tuple[str, str]]:
    from groupfel.emulator.config import parts
    from groupfel.policies.plugins import IN_PROCESS

    return [(where, name) for where, _, name in parts(config)
            if isinstance(name, str) and name.partition(":")[0] == IN_PROCESS]


def _check_unchanged(config: RunConfig, run_dir: Path) -> None:
    """A resumed run must use the plug-ins it started with: same sha256 of module file (or source)."""
    started: dict[tuple[str, str], dict] = {}
    for path in sorted(Path(run_dir).rglob("manifest.json")):
        try:
            manifest = read_json(path, str(path), kind="run")
        except ValueError:   # damaged: that arm is redone (groupfel.emulator.runfiles.intact_arm)
            continue
        for rec in upgrade_saved((manifest.get("plugins") if isinstance(manifest, dict) else None) or []):
            started.setdefault((rec["kind"], rec["name"]), rec)
    if not started:
        return
    from groupfel.emulator.world import resolve_parts

    for rec in resolve_parts(config):
        old = started.get((rec["kind"], rec["name"]))
        ours = ((old or {}).get("distribution") or {}).get("name") == "groupfel"   # groupfel's own: its version decides
        if old and not ours and old.get("sha256") != rec["sha256"]:
            raise InputError(f"{rec['field']}: {rec['name']!r} is not the plug-in this run started with (sha256 "
                             f"{str(old.get('sha256'))[:12]}…, now {str(rec['sha256'])[:12]}…); restore it, or pass "
                             f"--force (force=True) to start the run over")


# -- runs ----------------------------------------------------------------------------------------

def run(config: str | Path | dict | RunConfig, output: str | Path | None = None, *, jobs: int | None = None,
        backend: str = "local", address: str | None = None, gpus_per_task: float = 0.0, ship_data: bool = False,
        py_modules: tuple[str, ...] = (), force: bool = False, progress: bool = True,
        stack: int | None = None, track: str | dict | None = None) -> "Study":
    """Run (or resume) every arm of every seed of ``config`` into ``output`` (default:
    ``output_dir/name``); every input error surfaces before anything is written.

    ``jobs`` and ``backend`` (``"local"`` process pool or ``"ray"`` at ``address``) place the
    (seed, arm) runs of a multi-seed config. On Ray, ``gpus_per_task`` asks each task for a GPU
    share, ``ship_data`` sends the dataset from here through the object store, and ``py_modules``
    (paths of plug-in modules or packages) travel to the workers with the code. ``stack``: at most
    this many runs train together (``train.stack``; default: the device's fastest). An existing run directory of the same config is
    resumed; ``force`` replaces one of a different config. ``track``: ``"tensorboard"``, ``"mlflow"``,
    a dict of ``[track]`` keys or ``"none"``, over the config's ``[track]`` (see the track guide)."""
    from .runner import run_experiment

    from groupfel.emulator import numerics

    cfg = as_config(config)
    if stack is not None:   # checked as train.stack is
        raw = json.loads(cfg.model_dump_json())
        cfg = parse_config({**raw, "train": {**raw["train"], "stack": stack}})
    numerics.apply(cfg.train.numerics)    # before anything below loads torch
    local = _in_process_parts(cfg)
    if local:
        where, name = local[0]
        if backend != "local" or (jobs or 1) > 1:
            raise InputError(f"{where}: {name!r} is defined in this process (a notebook or script), so it runs only "
                             f"here; pass jobs=1 with the local backend, or move it into a module on PYTHONPATH")
        jobs = 1
    run_dir = Path(output) if output else Path(cfg.output_dir) / cfg.name
    check_writable(run_dir, "dir", "output")
    if not force:
        _check_unchanged(cfg, run_dir)
    from .backends import RayOptions

    ray = RayOptions(address=address, gpus_per_task=gpus_per_task, ship_data=ship_data, py_modules=tuple(py_modules))
    summary = run_experiment(cfg, run_dir, force=force, progress=progress, jobs=jobs, backend=backend,
                             address=address, ray=ray, track=track)
    return Study(run_dir, cfg, summary)


def load(run_dir: str | Path) -> "Study":
    """The study of a finished run directory (reads its files; imports none of its plug-ins)."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.exists():
        raise InputError(f"run_dir: {run_dir} holds no config.json; give a directory a run was started in")
    from .runner import resolved_config

    study = Study(run_dir, resolved_config(run_dir))
    from groupfel.emulator import numerics

    first = study.arm_dir(study.seeds[0] if study.multi_seed else None, study.arms[0]) / "manifest.json"
    if first.exists():   # one line when it was made under other numerics or versions than this machine's
        numerics.check_loaded(run_dir, load_json(first))
    return study


@dataclasses.dataclass
class Study:
    """A run directory and its config; the tables are read from its files when asked for.

    ``summary``, ``per_seed``, ``runs`` and ``curves`` are the run's CSV tables (a single-seed run
    has only ``summary.csv`` and each arm's ``results.csv``: ``runs`` is those rows, ``per_seed`` and
    ``curves`` are computed from them as a multi-seed run computes its files)."""

    run_dir: Path
    config: RunConfig
    _summary: pd.DataFrame | None = dataclasses.field(default=None, repr=False)

    @property
    def multi_seed(self) -> bool:
        return self.config.seeds is not None

    @property
    def arms(self) -> list[str]:
        return [a.name for a in self.config.arms]

    @property
    def seeds(self) -> list[int]:
        return self.config.seed_list

    @property
    def summary(self) -> pd.DataFrame:
        """One row per arm (multi-seed: mean and 95 % CI over seeds, paired difference from arm 1)."""
        return self._summary if self._summary is not None else load_csv(self.run_dir / "summary.csv")

    @property
    def runs(self) -> pd.DataFrame:
        """Every evaluation row of every seed and arm."""
        if self.multi_seed:
            return load_csv(self.run_dir / "runs.csv")
        return pd.concat([load_csv(self.run_dir / a / "results.csv") for a in self.arms], ignore_index=True)

    @property
    def per_seed(self) -> pd.DataFrame:
        """The headline metrics of each (seed, arm)."""
        if self.multi_seed:
            return load_csv(self.run_dir / "per_seed.csv")
        from .stats import per_seed_metrics

        return per_seed_metrics(self.runs, self.config.train.target_accuracy)

    @property
    def curves(self) -> pd.DataFrame:
        """Accuracy on a common cost grid per arm: mean and 95 % band over seeds."""
        if self.multi_seed:
            return load_csv(self.run_dir / "curves.csv")
        from .stats import curves_on_grid

        return curves_on_grid(self.runs, "cost", "accuracy")

    def describe(self) -> str:
        """The comparison ``groupfel run`` prints for a multi-seed run: each metric's mean with its
        95 % CI, the paired differences from the first arm, and the one-sentence conclusion."""
        from .stats import conclusion, render_summary

        if not self.multi_seed:
            raise InputError("describe: intervals need several seeds; set seeds = [0, 1, 2] in the config")
        target = self.config.train.target_accuracy
        return f"{render_summary(self.summary, target)}\n\n{conclusion(self.summary, target)}"

    def arm_dir(self, seed: int | None, arm: str) -> Path:
        if arm not in self.arms:
            raise InputError(f"arm: {arm!r} is not an arm of this run; choose one of {self.arms}")
        seed = self.seeds[0] if seed is None and len(self.seeds) == 1 else seed
        if seed not in self.seeds:
            raise InputError(f"seed: {seed!r} is not a seed of this run; choose one of {self.seeds}")
        from .runner import seed_dir

        return (seed_dir(self.run_dir, seed) if self.multi_seed else self.run_dir) / arm

    def ledger(self, seed: int | None, arm: str) -> pd.DataFrame:
        """Every Eq. 5 charge of one (seed, arm) run."""
        return load_parquet(self.arm_dir(seed, arm) / "ledger.parquet")

    def manifest(self, seed: int | None, arm: str) -> dict:
        """The manifest of one (seed, arm) run: config, versions, grouping, plug-ins, stop reason."""
        return load_json(self.arm_dir(seed, arm) / "manifest.json")

    def plot(self, x: str = "cost", y: str = "accuracy", ax=None):
        """Mean curve per arm with its 95 % band over seeds, on ``ax`` (default: a new figure)."""
        import matplotlib.pyplot as plt

        from .plots import AXES
        from .stats import curves_on_grid

        runs = self.runs
        for flag, col in (("x", x), ("y", y)):
            if col not in runs:
                raise InputError(f"plot {flag}: no column {col!r}; choose one of {sorted(runs.columns)}")
        if ax is None:
            _, ax = plt.subplots(figsize=(6.8, 4.4))
        for arm, c in curves_on_grid(runs, x, y).groupby("arm", sort=False):
            n = int(c["seeds"].iloc[0])
            line, = ax.plot(c[x], c[f"{y}_mean"], label=f"{arm} (mean of {n} seeds)" if n > 1 else str(arm))
            if n > 1:
                ax.fill_between(c[x], c[f"{y}_ci95_low"], c[f"{y}_ci95_high"], color=line.get_color(), alpha=0.2,
                                linewidth=0)
        ax.set_xlabel(AXES.get(x, x))
        ax.set_ylabel(AXES.get(y, y))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        return ax

    def report(self, path: str | Path | None = None) -> Path:
        """The HTML report of the run (default ``<run_dir>/report.html``); returns its path."""
        from .report import build_report

        return build_report(self.run_dir, Path(path) if path else None)


def sweep(path: str | Path, output: str | Path | None = None, *, jobs: int | None = None, backend: str = "local",
          address: str | None = None, force: bool = False, progress: bool = True,
          track: str | dict | None = None) -> pd.DataFrame:
    """Run a sweep file (a base config and axes); its summary table, one row per (point, arm).
    ``track``: as :func:`run`'s, over the base config's ``[track]``."""
    from .sweep import run_sweep

    return run_sweep(path, backend=backend, jobs=jobs, address=address, output=output, force=force,
                     progress=progress, track=track)


# -- what the command's other tools do -----------------------------------------------------------

def whatif(group_sizes: Iterable[int] = range(2, 41), *, profile: str = "raspberry-pi-4/cifar10-resnet/secagg",
           training: str = "sgd", clients: int = 10_000, samples_mean: float = 50.0, rounds: int = 100,
           group_rounds: int = 5, local_epochs: int = 2, groups_per_round: int | None = None,
           participation: float = 0.1, seed: int = 0, profiles_file: str | None = None,
           access_mbps: float | Sequence[float] | None = None, edge_cores: int | None = None,
           edge_clients: int | None = None, edge_profile: str | None = None, model_mb: float = 1.0,
           client_mbps: float = 20.0, latency_s: float = 0.02, energy: bool = False,
           edge_power: str | None = None, carbon_intensity: float | None = None) -> pd.DataFrame:
    """Eq. 5 cost per global round across group sizes, without training (``groupfel whatif``):
    one row per group size with the training and group-operation cost of a round. Any of
    ``access_mbps`` (one capacity or several), ``edge_cores`` or ``edge_clients`` adds the round
    makespan of one shared edge (one row per size and capacity; see the whatif guide); ``energy``
    adds that round's joules (the profile device's power per state: see the Energy page), and
    ``edge_power`` (a server device, e.g. raspberry-pi-4-edge) its edge server's, and
    ``carbon_intensity`` (g/kWh) their grams CO2e."""
    from types import SimpleNamespace

    from groupfel.cost_models.whatif import Scenario, sweep as price

    from .cost_cli import _check_work, _wants_makespan, _whatif_curves, _with_makespan, whatif_values

    v = whatif_values(clients=clients, samples_mean=samples_mean, rounds=rounds, group_rounds=group_rounds,
                      local_epochs=local_epochs, groups_per_round=groups_per_round, participation=participation,
                      seed=seed, access_mbps=None if access_mbps is None else list(np.atleast_1d(access_mbps)),
                      edge_cores=edge_cores, edge_clients=edge_clients, model_mb=model_mb,
                      client_mbps=client_mbps, latency_s=latency_s)
    args = SimpleNamespace(profile=profile, training=training, profiles_file=profiles_file,
                           edge_profile=edge_profile, energy=bool(energy), edge_power=edge_power,
                           carbon_intensity=carbon_intensity, **{k: v.pop(k) for k in (
                               "access_mbps", "edge_cores", "edge_clients", "model_mb", "client_mbps", "latency_s")})
    prof, overhead = _whatif_curves(args)
    sc = Scenario(**v)
    sizes = [int(s) for s in group_sizes]
    _check_work(sc.rounds, [sc.clients // s for s in sizes if s >= 1], f"{len(sizes)} group size(s)")
    df = price(sizes, overhead, prof.training[training], sc)
    return _with_makespan(df, args, prof, overhead, sc) if _wants_makespan(args) else df


def calibrate(measurements: str | Path | Sequence[str | Path], out: str | Path | None = None, *,
              task: str = "custom") -> pd.DataFrame:
    """Fit O_g(|g|) and H(n) curves to on-device measurements (``groupfel calibrate``): one row per
    fitted curve; with ``out``, also the profile CSV (``out/profile.csv``) that ``cost.profiles_file``
    takes."""
    from groupfel.cost_models.calibrate import calibrate as fit, read_measurements

    from .cost_cli import write_profile

    paths = [measurements] if isinstance(measurements, (str, Path)) else list(measurements)
    fits = fit(read_measurements(paths))
    if out is not None:
        write_profile(fits, check_writable(out, "dir", "out") / "profile.csv", task)
    return pd.DataFrame([{"device": f.device, "operation": f.operation, "method": f.method, "x": f.x_name,
                          "coefficients": list(map(float, f.chosen)), "r2": f.r2, "rmse": f.rmse,
                          "outliers": int(f.outliers.sum())} for f in fits])


def group(label_matrix: str | Path | pd.DataFrame | np.ndarray, policy: Any = "covg", *,
          edges: Sequence[int] | None = None, seed: int = 0, **params: Any) -> pd.DataFrame:
    """Partition clients by their label counts with a grouping policy (``groupfel group``).

    ``label_matrix``: a CSV path (``groupfel group``'s format), a DataFrame (an optional ``edge``
    column, the rest label counts) or a clients × labels array. ``policy``: a shipped name, an
    installed plug-in's short name, ``"module:Class"``, a GroupingPolicy class (``params`` are its
    fields) or instance. One row per group: edge, size, samples, CoV, clients and label counts;
    ``.attrs["summary"]`` holds the summary ``groupfel group`` prints."""
    from groupfel.policies import GroupingPolicy

    from .group_cli import make_policy, read_label_matrix, run_grouping

    names: list[str]
    if isinstance(label_matrix, (str, Path)):
        counts, edge_of, names = read_label_matrix(label_matrix)
    else:
        frame = pd.DataFrame(label_matrix)
        edge_of = frame.pop("edge").to_numpy() if "edge" in frame else np.zeros(len(frame), dtype=np.int64)
        counts, names = frame.to_numpy(dtype=np.int64), [str(c) for c in frame.columns]
        if (counts < 0).any() or (counts.sum(axis=1) == 0).any():
            raise InputError("label_matrix: counts must be non-negative and every client must hold a sample")
    if edges is not None:
        edge_of = np.asarray(edges)
    if isinstance(policy, GroupingPolicy):
        pol = policy
    else:
        from groupfel.policies import groupings

        name = _spec(policy, "policy") if isinstance(policy, type) else policy
        pol = make_policy(name, params.pop("min_group_size", None), params.pop("max_cov", None))
        if params:
            fields = {f.name: getattr(pol, f.name) for f in dataclasses.fields(pol) if f.init}
            pol = groupings.make(name, {**fields, **params}, "group")
    result = run_grouping(np.asarray(counts), np.asarray(edge_of), pol, seed)
    rows = [{"edge": g["edge"], "group": i, "size": g["size"], "samples": g["samples"], "cov": g["cov"],
             "clients": g["clients"], **dict(zip(names, g["label_counts"]))} for i, g in enumerate(result["groups"])]
    df = pd.DataFrame(rows)
    df.attrs["summary"] = result["summary"]
    return df
