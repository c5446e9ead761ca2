"""Sweeps: one multi-seed run per point of a grid over config axes, on a process pool or Ray.

Sweep file (TOML)::

    name = "group-size"
    base = "base.toml"        # a run config, relative to this file
    seeds = [0, 1, 2]
    mode = "product"          # product (default): every combination; zip: the i-th values together
    reference = { "arms.0.grouping.min_group_size" = 5 }   # optional; default: each axis's first value
    [axes]                    # dotted paths into the run config; list items by index; no value twice
    "arms.0.grouping.min_group_size" = [5, 10, 20]
    "data.alpha" = [0.1, 1.0]

Layout of a sweep directory (default ``<base output_dir>/<name>``)::

    sweep.json             the sweep and its points (axis values of each)
    points.csv             point -> axis values
    p00/, p01/, ...        one multi-seed run directory per point (see groupfel.experiments.runner)
    runs.csv / .parquet    every evaluation: point, axes (one column per dotted path), seed, arm, ...
    summary.csv            one row per point x arm: axes, mean and 95 % CI of each headline metric,
                           paired difference from the first arm, and ``<metric>_vs_ref_*``: the
                           paired-by-seed difference from the same arm at the reference point
                           (Holm over the sweep's axis comparisons; :mod:`groupfel.experiments.axes`)
    <metric>_vs_<axis>.png each headline metric against each axis, one line per arm (error bars: CI)

Every point is validated before any work starts. The (point, seed, arm) tasks then run on the
backend; an arm whose results exist is skipped and a half-run one resumes from its checkpoint, so
rerunning a killed sweep with the same command finishes it and loses nothing.
"""
from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from tqdm import tqdm

from groupfel.emulator.config import FolderName, RunConfig, _one_line, check_modes, parse_config, read_toml
from groupfel.errors import InputError
from groupfel.emulator.io import atomic_write, check_writable, run_lock, write_json

from .stats import METRICS, add_verdicts


AUTO_IN_A_SWEEP = ("seeds = \"auto\" runs one config until decided; a sweep runs a list of seeds at every point: "
                   "give seeds = [0, 1, 2, ...], or run a point's config with 'groupfel run CONFIG --seeds auto'")


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: FolderName
    base: str
    seeds: list[Annotated[int, Field(strict=True)]] = Field(min_length=1)   # '0' is text, not a seed
    mode: Literal["product", "zip"] = "product"
    output_dir: str | None = None          # default: the base config's output_dir
    axes: dict[str, list[Any]] = Field(min_length=1)
    # the point every other point is compared with, per axis (default: each axis's first value)
    reference: dict[str, Any] | None = None

    @field_validator("seeds", mode="before")
    @classmethod
    def _fixed_seeds(cls, value):
        if value == "auto":   # one family over all points needs every point's looks together: not yet
            raise ValueError(AUTO_IN_A_SWEEP)
        return value

    @model_validator(mode="after")
    def _axes(self):
        for path, values in self.axes.items():
            if not values:
                raise ValueError(f"axes.{path!r}: give at least one value")
            seen: dict[str, int] = {}
            for i, v in enumerate(values if self.mode == "product" else []):   # zip: points checked below
                key = json.dumps(v, sort_keys=True)
                if key in seen:
                    raise ValueError(f"axes.{path!r}: the value {v!r} appears twice (items {seen[key]} and {i}); "
                                     f"each point must differ, so remove one")
                seen[key] = i
        if self.mode == "zip":   # an axis may repeat a value while another moves; a point may not repeat
            seen = {}
            for i, combo in enumerate(zip(*self.axes.values())):
                key = json.dumps(combo, sort_keys=True)
                if key in seen:
                    raise ValueError(f"points {seen[key]} and {i} of the zipped axes are the same "
                                     f"({', '.join(f'{p}={v!r}' for p, v in zip(self.axes, combo))}); remove one")
                seen[key] = i
        for path, v in (self.reference or {}).items():
            if path not in self.axes:
                raise ValueError(f"reference.{path!r}: not an axis; use one of {list(self.axes)}")
            if v not in self.axes[path]:
                raise ValueError(f"reference.{path!r}: {v!r} is not one of the axis's values {self.axes[path]}")
        if self.mode == "zip" and len({len(v) for v in self.axes.values()}) > 1:
            lengths = ", ".join(f"{p!r}: {len(v)}" for p, v in self.axes.items())
            raise ValueError(f"mode = \"zip\" needs axes of equal length ({lengths})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        return self


def points(sweep: SweepConfig) -> list[dict[str, Any]]:
    """The sweep's points, each {dotted path: value}: the cartesian product of the axes, or with
    ``mode = "zip"`` their i-th values together."""
    paths = list(sweep.axes)
    combos = zip(*sweep.axes.values()) if sweep.mode == "zip" else itertools.product(*sweep.axes.values())
    return [dict(zip(paths, combo)) for combo in combos]


def set_path(config: dict, path: str, value: Any) -> None:
    """Set a dotted path (list items by index) in a raw config dict; missing tables are created."""
    node: Any = config
    parts = path.split(".")
    for i, key in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[:i + 1])
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise InputError(f"sweep axes.{path!r}: {where} indexes a list of {len(node)} items; "
                                 f"use an index 0..{len(node) - 1}")
            key = int(key)
        elif not isinstance(node, dict):
            raise InputError(f"sweep axes.{path!r}: {'.'.join(parts[:i])} is a value, not a table or list")
        if last:
            node[key] = value
        else:
            if isinstance(node, dict) and key not in node:
                node[key] = {}
            node = node[key]


def _read_toml(path: Path, what: str) -> dict:
    return read_toml(path, what)


def load_sweep(path: str | Path) -> tuple[SweepConfig, dict]:
    """The sweep file and its base run config (raw dict; ``base`` is relative to the sweep file)."""
    path = Path(path)
    try:
        sweep = SweepConfig.model_validate(_read_toml(path, "sweep file"))
    except ValidationError as exc:
        raise InputError(f"sweep file {path}: {_one_line(exc).removeprefix('config: ')}") from None
    return sweep, _read_toml(path.parent / sweep.base, f"sweep file {path}: base")


def reference_of(sweep: SweepConfig) -> dict[str, Any]:
    """Every axis's reference value (``reference`` in the sweep file, else the axis's first value);
    in zip mode the values of the reference point."""
    from .axes import reference_point

    pts = points(sweep)
    given = dict(sweep.reference or {})
    if sweep.mode == "zip":
        return pts[reference_point(pts, given)]
    return {a: given.get(a, values[0]) for a, values in sweep.axes.items()}


def point_name(i: int) -> str:
    return f"p{i:02d}"


def point_configs(sweep: SweepConfig, base: dict) -> list[RunConfig]:
    """One multi-seed run config per point; a bad point fails with its name and field."""
    # one rule for a sweep file's seeds and its base's (reproduce --set included): the sweep's list runs
    if base.get("seeds") == "auto":
        raise InputError(f"config: seeds: {AUTO_IN_A_SWEEP}")
    for key in ("max_seeds", "seed_batch"):
        if key in base:
            raise InputError(f"config: {key}: only used with seeds = \"auto\", which a sweep does not run "
                             f"(it runs the sweep's seeds at every point); remove {key}")
    out = []
    for i, point in enumerate(points(sweep)):
        raw = copy.deepcopy(base)
        label = f"sweep point {point_name(i)} ({', '.join(f'{p}={v!r}' for p, v in point.items())})"
        try:
            for path, value in point.items():
                set_path(raw, path, value)
            raw.pop("seed", None)
            raw.update(name=f"{sweep.name}-{point_name(i)}", seeds=list(sweep.seeds))
            out.append(check_modes(raw, parse_config(raw)))
        except InputError as exc:   # the field first, then where it was set
            raise InputError(f"{exc} (in {label})") from None
    return out


def run_sweep(path: str | Path, *, backend: str = "local", jobs: int | None = None, address: str | None = None,
              output: str | Path | None = None, force: bool = False, progress: bool = True,
              ray=None, device: str | None = None, stack: int | None = None, track=None) -> pd.DataFrame:
    """Validate every point, run every unfinished (point, seed, arm) task, write the sweep tables
    (``ray``: :class:`groupfel.experiments.backends.RayOptions`; ``device``: every point's
    train.device; ``stack``: every point's train.stack; ``track``: log to TensorBoard or MLflow, over
    the base config's ``[track]``)."""
    sweep, base = load_sweep(path)
    if stack:
        base.setdefault("train", {})["stack"] = stack
    if device is not None:
        from groupfel.emulator.devices import check

        base.setdefault("train", {})["device"] = check(device, "--device")
    return run_loaded_sweep(sweep, base, backend=backend, jobs=jobs, address=address, output=output, force=force,
                            progress=progress, ray=ray, track=track)


def run_loaded_sweep(sweep: SweepConfig, base: dict, *, backend: str = "local", jobs: int | None = None,
                     address: str | None = None, output: str | Path | None = None, force: bool = False,
                     progress: bool = True, before_write: Callable[[Path], None] | None = None,
                     ray=None, track=None) -> pd.DataFrame:
    """:func:`run_sweep` of a parsed sweep; ``before_write(root)`` runs once every point is valid,
    under the directory's lock, before anything else is written."""
    from .backends import BACKENDS

    if backend not in BACKENDS:
        raise InputError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {jobs}")
    configs = point_configs(sweep, base)
    from groupfel.emulator import numerics

    numerics.apply(configs[0].train.numerics)    # before validation loads torch here and in the workers
    root = Path(output) if output else Path(sweep.output_dir or configs[0].output_dir) / sweep.name
    check_writable(root, "dir", "--output" if output else "sweep output_dir/name =")
    from .runner import check_own_place

    where = "--output" if output else "sweep output_dir/name"
    check_own_place(root, where)
    from .track import open_session, sweep_text

    session = open_session(track, configs[0].track, root, force=force)   # an unreachable tracker: before any work
    configs = [c.model_copy(update={"track": None}) for c in configs]
    if session is None:
        return _sweep(sweep, configs, root, where=where, backend=backend, jobs=jobs, address=address, force=force,
                      progress=progress, before_write=before_write, ray=ray)
    with session:
        summary = _sweep(sweep, configs, root, where=where, backend=backend, jobs=jobs, address=address, force=force,
                         progress=progress, before_write=before_write, ray=ray)
    session.finish(summary, sweep_text(summary))
    return summary


def _sweep(sweep, configs, root, *, where, backend, jobs, address, force, progress, before_write, ray) -> pd.DataFrame:
    from .backends import check_backend
    from .runner import check_alone, check_file_limit, finished, tidy, validate

    pts = points(sweep)
    for i, config in enumerate(configs):
        check_file_limit(config, root / point_name(i))

    if not force and (root / "sweep.json").exists() and all(finished(c, root / point_name(i))
                                                            for i, c in enumerate(configs)):
        # a rerun of a finished sweep: nothing to plan, no engine to build; tables recomputed, plots kept
        with run_lock(root):
            check_alone(root, where)
            tidy(root)
            summary = _saved_sweep_summary(sweep, root)
            if summary is None:
                summary = finish_sweep(sweep, configs, root, replot=False)
        summary.attrs["root"] = str(root)
        return summary
    for i, (config, point) in enumerate(zip(configs, pts)):
        label = f"sweep point {point_name(i)} ({', '.join(f'{p}={v!r}' for p, v in point.items())}): "
        validate(config, root / point_name(i), force=force, where=label)
    check_backend(backend, jobs, address, ray)   # a cluster without the GPUs asked for: before any file
    with run_lock(root):
        check_alone(root, where)   # a run or sweep started inside it, or around it, since the first check
        tidy(root)
        return _run_points(sweep, configs, pts, root, backend=backend, jobs=jobs, address=address, force=force,
                           progress=progress, before_write=before_write, ray=ray)


def _run_points(sweep, configs, pts, root, *, backend, jobs, address, force, progress, before_write, ray):
    from .backends import run_tasks
    from .runner import check_dir, prepare

    for i, config in enumerate(configs):   # again under the lock: a writer before us may have changed them
        check_dir(config, root / point_name(i), force=force, where=f"sweep point {point_name(i)}: ")
    if before_write is not None:
        before_write(root)
    write_json(root / "sweep.json", {"sweep": json.loads(sweep.model_dump_json()),
                                     "points": {point_name(i): p for i, p in enumerate(pts)}})
    table = pd.DataFrame([{"point": point_name(i), **p} for i, p in enumerate(pts)])
    atomic_write(root / "points.csv", lambda p: table.to_csv(p, index=False))
    tasks = {point_name(i): prepare(c, root / point_name(i), force=force) for i, c in enumerate(configs)}
    left = {name: sum(not t.done for t in ts) for name, ts in tasks.items()}
    todo = [t for ts in tasks.values() for t in ts if not t.done]
    point_of = {id(t): name for name, ts in tasks.items() for t in ts}
    running: list[str] = []

    with tqdm(total=len(pts), initial=sum(n == 0 for n in left.values()), desc=f"sweep {sweep.name}",
              unit="point", disable=not progress, dynamic_ncols=True) as bar:
        def on_start(task):
            running.append(point_of[id(task)])
            bar.set_postfix_str(f"running {running[0]}")

        def on_done(task):
            name = point_of[id(task)]
            running.remove(name)
            left[name] -= 1
            if left[name] == 0:
                bar.update()
            bar.set_postfix_str(f"running {running[0]}" if running else "")

        run_tasks(todo, backend=backend, jobs=jobs, address=address, ray=ray, on_start=on_start, on_done=on_done)
    summary = finish_sweep(sweep, configs, root)
    summary.attrs["root"] = str(root)
    return summary


def finish_sweep(sweep: SweepConfig, configs: list[RunConfig], root: Path, replot: bool = True) -> pd.DataFrame:
    """runs.csv/.parquet, summary.csv and the metric-against-axis plots of a finished sweep
    (``replot`` False: existing plots are kept)."""
    from .runner import finish, load_runs

    axes = list(sweep.axes)
    runs, summaries = [], []
    for i, (config, point) in enumerate(zip(configs, points(sweep))):
        d = root / point_name(i)
        summary = finish(config, d, replot)
        cols = {"point": point_name(i), **{p: _cell(v) for p, v in point.items()}}
        summaries.append(summary.assign(**cols)[[*cols, *summary.columns]])
        r = load_runs(config, d)
        runs.append(r.assign(**cols)[[*cols, *r.columns]])
    runs_df = pd.concat(runs, ignore_index=True)
    summary_df = add_verdicts(pd.concat(summaries, ignore_index=True))   # Holm over the whole sweep
    summary_df = _along_axes(sweep, configs, runs_df, summary_df)
    atomic_write(root / "runs.csv", lambda p: runs_df.to_csv(p, index=False))
    atomic_write(root / "runs.parquet", lambda p: runs_df.to_parquet(p, index=False))
    atomic_write(root / "summary.csv", lambda p: summary_df.to_csv(p, index=False))
    # zipped axes move together: one plot per metric against the first, the others named in its label
    plotted = [axes[0]] if sweep.mode == "zip" else axes
    for axis in plotted:
        for metric in METRICS:
            if not replot and (root / f"{metric}_vs_{axis}.png").exists():
                continue
            plot_metric_vs_axis(summary_df, [] if sweep.mode == "zip" else axes, axis, metric,
                                root / f"{metric}_vs_{axis}.png", zipped=axes[1:] if sweep.mode == "zip" else [])
    summary_df.attrs["axes"] = axes
    return summary_df


def _saved_sweep_summary(sweep: SweepConfig, root: Path) -> pd.DataFrame | None:
    """A finished sweep's summary.csv as :func:`finish_sweep` returned it (None where it does not
    parse or predates the axis comparisons): a rerun need not recompute intervals."""
    from groupfel.emulator.runfiles import csv_intact

    if not csv_intact(root / "summary.csv"):
        return None
    summary = pd.read_csv(root / "summary.csv")
    if "ref_point" not in summary:
        return None
    summary.attrs.update(axes=list(sweep.axes), reference=reference_of(sweep),
                         comparisons=int(sum(summary[c].notna().sum() for c in summary if c.endswith("_diff_p_holm"))),
                         axis_comparisons=int(sum(summary[c].notna().sum() for c in summary
                                                  if c.endswith("_vs_ref_p_holm"))))
    return summary


def _along_axes(sweep: SweepConfig, configs: list[RunConfig], runs: pd.DataFrame,
                summary: pd.DataFrame) -> pd.DataFrame:
    """summary.csv's comparisons of each point with the reference point, per arm
    (:mod:`groupfel.experiments.axes`)."""
    from .axes import compare_along_axes, reference_point

    pts = points(sweep)
    reference = reference_of(sweep)
    ref = point_name(reference_point(pts, reference))
    arms_of = {point_name(i): [a.name for a in c.arms] for i, c in enumerate(configs)}
    found = compare_along_axes(runs, arms_of, ref, arms_of, configs[0].train.target_accuracy)
    out = summary.merge(found.drop(columns="ref_point") if not found.empty else pd.DataFrame(columns=["point", "arm"]),
                        on=["point", "arm"], how="left")
    out["ref_point"] = ref
    for m in METRICS:
        col = f"{m}_vs_ref_verdict"
        if col in out:
            out.loc[out["point"] == ref, col] = "reference"
    out.attrs.update(summary.attrs)
    out.attrs["axis_comparisons"] = found.attrs.get("axis_comparisons", 0)
    out.attrs["reference"] = reference
    return out


def _cell(value: Any) -> Any:
    """An axis value as a table cell (lists and tables become JSON text)."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def plot_metric_vs_axis(summary: pd.DataFrame, axes: list[str], axis: str, metric: str, path: Path,
                        zipped: list[str] | None = None) -> None:
    """``metric`` (mean, 95 % CI error bars) against ``axis``: one line per arm and per value of
    the other axes (``zipped``: axes that move with ``axis``, named in the x label); more than
    ``SMALL_MULTIPLES`` lines become one panel each, on a shared y axis."""
    from .plots import SMALL_MULTIPLES, plt

    others = [a for a in axes if a != axis]
    values = list(dict.fromkeys(summary[axis]))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    series = list(summary.groupby(["arm", *others], sort=False))
    n = len(series)
    cols = min(n, 3) if n > SMALL_MULTIPLES else 1
    rows = -(-n // cols) if n > SMALL_MULTIPLES else 1
    fig, grid = plt.subplots(rows, cols, figsize=(6.4 if cols == 1 else 4.2 * cols, 4.2 if rows == 1 else 3.0 * rows),
                             dpi=110, sharey=True, squeeze=False)
    panels = list(grid.flat)
    for i, (key, df) in enumerate(series):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join([str(key[0])] + [f"{a}={v}" for a, v in zip(others, key[1:])])
        ax = panels[i] if n > SMALL_MULTIPLES else panels[0]
        xs = df[axis].to_numpy() if numeric else [values.index(v) for v in df[axis]]
        mean = df[f"{metric}_mean"].to_numpy(float)
        err = [mean - df[f"{metric}_ci95_low"].to_numpy(float), df[f"{metric}_ci95_high"].to_numpy(float) - mean]
        ax.errorbar(xs, mean, yerr=err, marker="o", ms=4, capsize=3, label=label,
                    color=f"C{i % 10}" if n > SMALL_MULTIPLES else None)
        if n > SMALL_MULTIPLES:
            ax.set_title(label, fontsize=8)
    from .axes import axis_label

    xlabel = axis_label(axis) + (f", with {', '.join(zipped)} zipped" if zipped else "")
    for j, ax in enumerate(panels):
        if j >= n:
            ax.set_visible(False)
            continue
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.grid(alpha=0.3)
        if j >= n - cols:
            ax.set_xlabel(xlabel, fontsize=8)
        if j % cols == 0:
            ax.set_ylabel(f"{METRICS[metric]}\n(mean, 95 % CI)", fontsize=8)
    if n <= SMALL_MULTIPLES:
        panels[0].legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)


def _cmd_sweep(args) -> int:
    from .backends import ray_options
    from .stats import compact_summary, false_equivalent_note, notes

    from .track import from_args

    summary = run_sweep(args.sweep, backend=args.backend, jobs=args.jobs, output=args.output, force=args.force,
                        progress=not args.quiet, ray=ray_options(args), device=args.device,
                        stack=args.stack, track=from_args(args))
    sweep, _ = load_sweep(args.sweep)
    root = summary.attrs["root"]
    with_target = bool(summary["target_reached"].sum() > 0 or summary["cost_to_target_mean"].notna().any())
    from .axes import opening_sentence

    print(opening_sentence(summary, summary.attrs["axes"], summary.attrs["reference"]) + "\n")
    print(compact_summary(summary, ["point", *summary.attrs["axes"]], with_target).to_string(index=False))
    for line in [*notes(summary, METRICS), false_equivalent_note(summary, METRICS)]:
        if line:
            print(line)
    k = summary.attrs.get("comparisons", 0)
    print(f"\nmean [95 % CI] over seeds {list(sweep.seeds)}; verdict: accuracy at equal cost against the point's "
          f"first arm, with Holm's correction over the sweep's {k} paired comparisons (every metric in summary.csv)")
    print(f"results: {root}/  (runs.csv, summary.csv, <point>/..., <metric>_vs_<axis>.png; groupfel report {root})")
    from .runner import report_diverged

    return report_diverged(Path(root))
