"""Run every arm of a config into one run directory, then the comparison table and plot.

Layout of a run directory::

    config.json            the resolved config (a resume reads it back)
    <arm>/results.csv      one row per evaluation (also .parquet)
    <arm>/ledger.parquet   every Eq. 5 charge
    <arm>/manifest.json    config, seed, versions, grouping summary, stop reason
    <arm>/checkpoint.pt    only while the arm is unfinished
    summary.csv            one row per arm
    accuracy_vs_cost.png
"""
from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from emulator.config import RunConfig, load_config, parse_config
from emulator.errors import InputError
from emulator.io import atomic_write, write_json
from emulator.pergroup import check_mode, run_pergroup_arm
from emulator.runner import plan_arm, run_arm
from emulator.world import build_world

from .plots import plot_curves


def default_config() -> RunConfig:
    import tomllib

    text = resources.files(__package__).joinpath("configs", "default.toml").read_text()
    return parse_config(tomllib.loads(text))


def config_from_run_dir(run_dir: Path) -> RunConfig:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise InputError(f"--resume {run_dir}: no config.json there; give the directory a run was started in")
    return parse_config(json.loads(path.read_text()))


def run_experiment(config: RunConfig, run_dir: Path | None = None, *, force: bool = False,
                   progress: bool = True) -> pd.DataFrame:
    """Validate everything, then run (or resume) each arm; returns the summary table."""
    run_dir = Path(run_dir) if run_dir else Path(config.output_dir) / config.name
    world = build_world(config)
    plans = [plan_arm(world, i) for i in range(len(config.arms))]   # all input errors surface here
    for i, plan in enumerate(plans):
        check_mode(world, plan, i)
    run = run_pergroup_arm if config.mode == "per-group" else run_arm
    resolved = json.loads(config.model_dump_json())
    saved = run_dir / "config.json"
    if saved.exists() and json.loads(saved.read_text()) != resolved and not force:
        raise InputError(f"output: {run_dir} holds a run of a different config; pass --force to replace it, "
                         f"or change 'name'/'output_dir'")
    if force:
        for plan in plans:
            shutil.rmtree(run_dir / plan.arm.name, ignore_errors=True)
    write_json(saved, resolved)
    frames = []
    for plan in plans:
        arm_dir = run_dir / plan.arm.name
        manifest = arm_dir / "manifest.json"
        if manifest.exists() and json.loads(manifest.read_text()).get("complete"):
            frames.append(pd.read_csv(arm_dir / "results.csv"))
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
            frames.append(run(world, plan, arm_dir, tick))
        finally:
            bar.close()
    results = pd.concat(frames, ignore_index=True)
    summary = summarize(results, run_dir, config.train.target_accuracy)
    atomic_write(run_dir / "summary.csv", lambda p: summary.to_csv(p, index=False))
    plot_curves(results, run_dir / "accuracy_vs_cost.png", title=config.name)
    return summary


def summarize(results: pd.DataFrame, run_dir: Path, target: float | None = None) -> pd.DataFrame:
    """One row per arm; ``acc_at_common_cost`` compares arms at the smallest final cost of any arm,
    ``cost_to_target`` is the cost at the first evaluation reaching ``target`` accuracy (NaN: never)."""
    common = results.groupby("arm", sort=False)["cost"].max().min()
    rows = []
    for arm, df in results.groupby("arm", sort=False):
        manifest = json.loads((run_dir / str(arm) / "manifest.json").read_text())
        g = manifest["grouping"]
        last = df.iloc[-1]
        rows.append({
            "arm": arm, "grouping": manifest["grouping_policy"], "sampling": manifest["sampling_policy"],
            "groups": g["n_groups"], "group_size": f"[{g['size_min']}, {g['size_max']}] ({g['size_mean']:.2f})",
            "avg_cov": round(g["cov_mean"], 3), "rounds": int(last["round"]), "cost": float(last["cost"]),
            "sim_time_s": float(last["sim_time_s"]), "final_acc": float(last["accuracy"]),
            "best_acc": float(df["accuracy"].max()),
            "acc_at_common_cost": float(df.loc[df["cost"] <= common + 1e-9, "accuracy"].iloc[-1]),
            "stop": manifest["stop_reason"]})
        if target is not None:
            hit = df.loc[df["accuracy"] >= target, "cost"]
            rows[-1]["cost_to_target"] = float(hit.iloc[0]) if len(hit) else float("nan")
    out = pd.DataFrame(rows)
    out.attrs["common_cost"] = float(common) if np.isfinite(common) else None
    return out


__all__ = ["default_config", "config_from_run_dir", "load_config", "run_experiment", "summarize"]
