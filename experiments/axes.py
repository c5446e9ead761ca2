"""A sweep compares along its axes: for each arm, each point against the reference point (every
axis at its reference value: the axis's first value, or ``reference = {...}`` in the sweep file).

The comparisons are paired by seed (the same seed shares data placement, topology and costs at
every point), on the headline metrics of the arm comparisons (:data:`groupfel.experiments.stats.METRICS`),
with accuracy at equal cost taken at the smaller final cost of the two runs of each seed. Their
verdicts use Holm's correction over the family of every axis comparison on every metric.

Axis names and units, for plots and sentences, come from :data:`AXIS_NAMES` (the last part of the
dotted path), else the path itself with "(as configured)".
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# last part of a dotted config path -> (short name, unit)
AXIS_NAMES = {
    "min_group_size": ("MinGS", "clients"), "max_cov": ("max CoV", "σ/μ of label counts"),
    "alpha": ("Dirichlet α", "no unit"), "clients_per_edge": ("clients per edge", "clients"),
    "edges": ("edges", "edge servers"), "budget": ("budget", "Eq. 5 device s"), "rounds": ("rounds", "global rounds"),
    "group_rounds": ("group rounds K", "per global round"), "local_epochs": ("local epochs E", "epochs"),
    "lr": ("learning rate", "no unit"), "batch_size": ("batch size", "samples"),
    "groups_per_round": ("groups per round S", "groups"), "data_fraction": ("data fraction", "share of samples"),
    "mu": ("FedProx μ", "no unit"), "min_samples": ("min samples", "samples per client"),
    "max_samples": ("max samples", "samples per client"), "regroup_every": ("regroup every", "global rounds"),
    "dropout": ("dropout", "probability"), "n_clusters": ("clusters", "clusters"),
}


def axis_name(path: str) -> tuple[str, str]:
    """(short name, unit) of a sweep axis."""
    return AXIS_NAMES.get(path.rsplit(".", 1)[-1], (path, "as configured"))


def axis_label(path: str) -> str:
    name, unit = axis_name(path)
    return f"{name} ({unit}; {path})" if name != path else f"{path} ({unit})"


def reference_point(points: list[dict[str, Any]], reference: dict[str, Any]) -> int:
    """The index of the point whose every axis is at its reference value (zip mode: the point whose
    axes given in ``reference`` match)."""
    for i, p in enumerate(points):
        if all(p[k] == v for k, v in reference.items()):
            return i
    return 0


def compare_along_axes(runs: pd.DataFrame, per_point: dict[str, Any], ref: str, arms_of: dict[str, list[str]],
                       target: float | None) -> pd.DataFrame:
    """One row per (point, arm) other than the reference point: ``<m>_vs_ref_mean``,
    ``_ci95_low/high``, ``_p``, ``_p_holm``, ``_verdict`` and ``_n`` for each headline metric.
    ``runs``: every evaluation row with columns point, seed, arm, cost, accuracy, sim_time_s."""
    from .stats import METRICS, holm, paired_diff, paired_p, per_seed_metrics, verdict

    rows = []
    for point in per_point:
        if point == ref:
            continue
        for arm in arms_of[point]:
            if arm not in arms_of[ref]:
                continue
            pair = runs[(runs["arm"] == arm) & runs["point"].isin([ref, point])]
            pair = pair.assign(arm=np.where(pair["point"] == ref, "ref", "pt"))
            seeds = sorted(set(pair.loc[pair["arm"] == "ref", "seed"]) & set(pair.loc[pair["arm"] == "pt", "seed"]))
            wide = per_seed_metrics(pair[pair["seed"].isin(seeds)], target)
            row: dict[str, Any] = {"point": point, "arm": arm, "ref_point": ref}
            for m in METRICS:
                w = wide.pivot(index="seed", columns="arm", values=m)
                d, lo, hi, _ = paired_diff(w["ref"], w["pt"])
                p, n = paired_p(w["ref"], w["pt"])
                row.update({f"{m}_vs_ref_mean": d, f"{m}_vs_ref_ci95_low": lo, f"{m}_vs_ref_ci95_high": hi,
                            f"{m}_vs_ref_p": p, f"{m}_vs_ref_n": n})
            rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    cells = [(i, m) for i in range(len(out)) for m in METRICS]
    adjusted = holm([out[f"{m}_vs_ref_p"].iloc[i] for i, m in cells])
    for m in METRICS:
        out[f"{m}_vs_ref_p_holm"] = np.nan
        out[f"{m}_vs_ref_verdict"] = ""
    for (i, m), q in zip(cells, adjusted):
        out.iat[i, out.columns.get_loc(f"{m}_vs_ref_p_holm")] = q
        out.iat[i, out.columns.get_loc(f"{m}_vs_ref_verdict")] = verdict(
            out[f"{m}_vs_ref_mean"].iloc[i], q, int(out[f"{m}_vs_ref_n"].iloc[i]))
    out.attrs["axis_comparisons"] = int(np.isfinite(adjusted).sum())
    return out


def opening_sentence(summary: pd.DataFrame, axes: list[str], reference: dict[str, Any]) -> str:
    """The sweep's answer in one sentence: accuracy at equal cost of the first arm from the reference
    point to the point farthest along the first axis, with its paired 95 % interval and Holm verdict."""
    col = "acc_at_common_cost_vs_ref_mean"
    if col not in summary or summary[col].notna().sum() == 0:
        return ("The sweep has one point per arm, so nothing is compared along its axes; give an axis at least "
                "two values.")
    axis = axes[0]
    arm = summary["arm"].iloc[0]
    rows = summary[(summary["arm"] == arm) & summary[col].notna()]
    last = rows.iloc[-1]
    name, unit = axis_name(axis)
    d, lo, hi = (100 * last[col], 100 * last["acc_at_common_cost_vs_ref_ci95_low"],
                 100 * last["acc_at_common_cost_vs_ref_ci95_high"])
    moved = "rises" if d > 0 else "falls" if d < 0 else "stays level"
    others = [a for a in axes[1:] if last[a] != reference.get(a)]
    more = f" (with {', '.join(f'{axis_name(a)[0]} {last[a]}' for a in others)})" if others else ""
    ci = f" [95 % CI {lo:+.1f}, {hi:+.1f}]" if np.isfinite(lo) else ""
    verdict = last["acc_at_common_cost_vs_ref_verdict"] or "no verdict"
    by = f" by {abs(d):.1f} points{ci}" if d else ""
    return (f"For {arm}, accuracy at equal cost {moved} from {name} {reference[axis]} to {last[axis]}{more}"
            f"{by} ({verdict}; paired by seed, Holm over the sweep's {int(summary.attrs.get('axis_comparisons', 0))} "
            f"axis comparisons; unit of {name}: {unit}).")
