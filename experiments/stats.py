"""Statistics over seeds: means with 95 % t intervals, paired differences, curves on a cost grid.

A study's unit of replication is the seed: within one seed every arm shares the data placement,
topology and costs, so arms are compared by their per-seed differences (a paired t interval).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.95
# Headline metrics of one (seed, arm): name -> what it is.
METRICS = {
    "final_acc": "final test accuracy",
    "acc_at_common_cost": "accuracy at the common cost",
    "cost_to_target": "Eq. 5 cost to reach the target accuracy",
    "sim_time_s": "simulated wall-clock time",
}


def mean_ci(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high): Student-t interval of the mean over the finite ``values``.
    Fewer than 2 values give a NaN interval (no spread to estimate); equal values a zero-width one."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    sem = float(stats.sem(x))
    if sem == 0:
        return mean, mean, mean
    low, high = stats.t.interval(level, len(x) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def paired_diff(a, b, level: float = LEVEL) -> tuple[float, float, float, int]:
    """Mean and CI of b − a over the pairs where both are finite, and the number of such pairs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    return (*mean_ci(b[ok] - a[ok], level), int(ok.sum()))


def supported(low: float, high: float) -> str:
    """Words for a difference's interval: does it exclude 0?"""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "no CI (fewer than 2 paired seeds)"
    if low > 0:
        return "higher (supported: CI excludes 0)"
    if high < 0:
        return "lower (supported: CI excludes 0)"
    return "not supported (CI includes 0)"


def per_seed_metrics(results: pd.DataFrame, target: float | None) -> pd.DataFrame:
    """One row per (seed, arm) with the headline metrics. ``acc_at_common_cost`` is the accuracy
    at the smallest final cost of any arm of the same seed (arms paired within a seed);
    ``cost_to_target`` is NaN in a seed that never reached ``target``."""
    rows = []
    for seed, by_seed in results.groupby("seed", sort=True):
        common = by_seed.groupby("arm", sort=False)["cost"].max().min()
        for arm, df in by_seed.groupby("arm", sort=False):
            hit = df.loc[df["accuracy"] >= target, "cost"] if target is not None else pd.Series(dtype=float)
            rows.append({"seed": seed, "arm": arm, "final_acc": float(df["accuracy"].iloc[-1]),
                         "acc_at_common_cost": float(df.loc[df["cost"] <= common + 1e-9, "accuracy"].iloc[-1]),
                         "cost_to_target": float(hit.iloc[0]) if len(hit) else float("nan"),
                         "sim_time_s": float(df["sim_time_s"].iloc[-1]), "cost": float(df["cost"].iloc[-1]),
                         "common_cost": float(common)})
    return pd.DataFrame(rows)


def summarize_seeds(per_seed: pd.DataFrame, arms: list[str], level: float = LEVEL) -> pd.DataFrame:
    """One row per arm: for each headline metric ``<m>_mean``, ``<m>_ci95_low/high`` over seeds,
    and the paired difference from the first arm ``<m>_diff_mean``, ``<m>_diff_ci95_low/high``.
    ``target_reached`` counts the seeds whose run reached the target accuracy."""
    wide = {m: per_seed.pivot(index="seed", columns="arm", values=m) for m in METRICS}
    rows = []
    for arm in arms:
        row = {"arm": arm, "seeds": int(wide["final_acc"][arm].notna().sum()),
               "target_reached": int(wide["cost_to_target"][arm].notna().sum())}
        for m in METRICS:
            row[f"{m}_mean"], row[f"{m}_ci95_low"], row[f"{m}_ci95_high"] = mean_ci(wide[m][arm], level)
            d, lo, hi, _ = paired_diff(wide[m][arms[0]], wide[m][arm], level) if arm != arms[0] \
                else (np.nan, np.nan, np.nan, 0)
            row[f"{m}_diff_mean"], row[f"{m}_diff_ci95_low"], row[f"{m}_diff_ci95_high"] = d, lo, hi
        rows.append(row)
    return pd.DataFrame(rows)


def curves_on_grid(results: pd.DataFrame, x: str = "cost", y: str = "accuracy", points: int = 200,
                   level: float = LEVEL) -> pd.DataFrame:
    """Mean curve and band per arm on a common ``x`` grid: each seed's curve is interpolated
    (np.interp) onto the grid, from 0 to the smallest final ``x`` of that arm's seeds (where every
    seed has data), then averaged at each grid point — never rows that only share a round number."""
    out = []
    for arm, df in results.groupby("arm", sort=False):
        seeds = [s for _, s in df.groupby("seed", sort=True)]
        end = min(float(s[x].max()) for s in seeds)
        start = max(float(s[x].min()) for s in seeds)
        grid = np.linspace(start, end, points)
        ys = np.stack([np.interp(grid, s[x].to_numpy(float), s[y].to_numpy(float)) for s in seeds])
        mean = ys.mean(axis=0)
        if len(seeds) > 1:
            sem = stats.sem(ys, axis=0)
            half = np.where(sem > 0, stats.t.ppf(0.5 + level / 2, len(seeds) - 1) * sem, 0.0)
        else:
            half = np.full_like(mean, np.nan)
        out.append(pd.DataFrame({"arm": arm, x: grid, f"{y}_mean": mean, f"{y}_ci95_low": mean - half,
                                 f"{y}_ci95_high": mean + half, "seeds": len(seeds)}))
    return pd.concat(out, ignore_index=True)


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "nan"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _ci(row, m: str, kind: str = "") -> str:
    mean, lo, hi = row[f"{m}_{kind}mean"], row[f"{m}_{kind}ci95_low"], row[f"{m}_{kind}ci95_high"]
    sign = "+" if kind and np.isfinite(mean) and mean > 0 else ""
    if not np.isfinite(lo):
        return f"{sign}{_fmt(mean)}"
    return f"{sign}{_fmt(mean)} [{_fmt(lo)}, {_fmt(hi)}]"


def render_summary(summary: pd.DataFrame, target: float | None) -> str:
    """The printed study table: mean [95 % CI] per arm and metric, then each arm's paired
    difference from the first arm, in words."""
    metrics = [m for m in METRICS if m != "cost_to_target" or target is not None]
    n = int(summary["seeds"].max())
    table = pd.DataFrame({"arm": summary["arm"],
                          **{c: summary[c] for c in ("groups", "group_size", "avg_cov", "rounds", "overhead_share") if c in summary},
                          **{m: [_ci(r, m) for _, r in summary.iterrows()] for m in metrics}})
    if target is not None:
        table["target_reached"] = [f"{k}/{n}" for k in summary["target_reached"]]
    lines = [f"mean [95 % CI] over {n} seed{'s' if n > 1 else ''}:",
             table.to_string(index=False, float_format=lambda v: f"{v:.4g}")]
    if n < 2:
        lines.append("one seed: no confidence intervals (give seeds = [0, 1, 2] for them)")
    first = summary["arm"].iloc[0]
    rows = []
    for _, r in summary.iloc[1:].iterrows():
        for m in metrics:
            rows.append({"arm": r["arm"], "metric": m, f"difference from {first}": _ci(r, m, "diff_"),
                         "verdict": supported(r[f"{m}_diff_ci95_low"], r[f"{m}_diff_ci95_high"])})
    if rows:
        lines += ["", f"paired difference from {first} (same seeds: same data, topology and costs):",
                  pd.DataFrame(rows).to_string(index=False)]
        if target is not None:
            lines.append(f"cost_to_target: over the seeds where both arms reached accuracy {target:g}")
    return "\n".join(lines)


def conclusion(summary: pd.DataFrame, target: float | None) -> str:
    """One sentence, computed from the summary: the most accurate arm at equal cost, whether its
    lead over the first arm is supported, the cheapest arm to the target, and which paired
    differences from the first arm (accuracy at equal cost, cost to target) the seeds support."""
    n = int(summary["seeds"].max())
    best = summary.loc[summary["acc_at_common_cost_mean"].idxmax()]
    first = summary.iloc[0]
    text = (f"Over {n} seeds, at equal cost the most accurate arm is {best['arm']} "
            f"({_ci(best, 'acc_at_common_cost')})")
    if best["arm"] != first["arm"]:
        verdict = supported(best["acc_at_common_cost_diff_ci95_low"], best["acc_at_common_cost_diff_ci95_high"])
        text += (f", {_ci(best, 'acc_at_common_cost', 'diff_')} over {first['arm']}, "
                 f"{'a supported difference' if 'supported:' in verdict else 'a difference the seeds do not support'}")
    if target is not None and summary["target_reached"].max() > 0:
        reached = summary[summary["target_reached"] > 0]
        cheap = reached.loc[reached["cost_to_target_mean"].idxmin()]
        text += (f"; the cheapest to reach accuracy {target:g} is {cheap['arm']} (Eq. 5 cost "
                 f"{_ci(cheap, 'cost_to_target')}, reached in {int(cheap['target_reached'])}/{n} seeds)")
    elif target is not None:
        text += f"; no arm reached accuracy {target:g}"
    words = {"acc_at_common_cost": "accuracy at equal cost", "cost_to_target": "cost to the target"}
    found = [f"{r['arm']} {words[m]} {_ci(r, m, 'diff_')}" for _, r in summary.iloc[1:].iterrows() for m in words
             if (m != "cost_to_target" or target is not None)
             and "supported:" in supported(r[f"{m}_diff_ci95_low"], r[f"{m}_diff_ci95_high"])]
    if n > 1:
        text += (f"; differences from {first['arm']} the seeds support: {', '.join(found)}" if found else
                 f"; no arm differs from {first['arm']} in {' or '.join(words if target is not None else list(words)[:1])} "
                 f"beyond the seeds' noise")
    return text + "."
