"""Statistics over seeds: means with 95 % t intervals, paired differences, curves on a cost grid.

A study's unit of replication is the seed: within one seed every arm shares the data placement,
topology and costs, so arms are compared by their per-seed differences (a paired t interval).

A study makes many comparisons (every arm against the first, on every metric), so its verdicts
use Holm's step-down correction over all of them (family-wise error 5 %), beside each
difference's unadjusted 95 % interval. Fewer than 3 pairs, or pairs whose differences are all
equal, give "too few seeds": two seeds have one degree of freedom (t = 12.7), and a zero spread
is no evidence of a zero variance. Intervals of bounded metrics (accuracy in [0, 1], costs and
times >= 0) are clipped to the bounds, and the tables say so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

LEVEL = 0.95


def _stats():
    """scipy.stats, imported when first needed (the command line's parser must not pay for it)."""
    from scipy import stats

    return stats

# Headline metrics of one (seed, arm): name -> what it is.
METRICS = {
    "final_acc": "final test accuracy",
    "acc_at_common_cost": "accuracy at the common cost",
    "cost_to_target": "Eq. 5 cost to reach the target accuracy",
    "sim_time_s": "simulated wall-clock time",
}
# The range each metric can take: its intervals are clipped to it.
BOUNDS = {"final_acc": (0.0, 1.0), "acc_at_common_cost": (0.0, 1.0), "cost_to_target": (0.0, np.inf),
          "sim_time_s": (0.0, np.inf), "accuracy": (0.0, 1.0), "loss": (0.0, np.inf), "cost": (0.0, np.inf),
          "round_time_s": (0.0, np.inf),
          # per-group mode's local test error over clients (HCCT Table 5)
          **{f"local_error_{k}": (0.0, 1.0) for k in ("mean", "std", "min", "max")}}
MIN_PAIRS = 3
# A Holm p within this factor of the line (0.025 to 0.1 at 95 %) is called close to it.
CLOSE = 2.0
TOO_FEW = "too few seeds"
CLIPPED_NOTE = "†: interval clipped to the metric's range (accuracy in [0, 1], costs and times >= 0)"
TWO_SEEDS_NOTE = ("with 2 seeds each interval uses t = 12.7 (1 degree of freedom): too wide to inform; "
                  "run 3 or more seeds")


def clip(low: float, high: float, bounds: tuple[float, float] | None) -> tuple[float, float, bool]:
    """(low, high) inside ``bounds``, and whether either end moved."""
    if bounds is None or not (np.isfinite(low) and np.isfinite(high)):
        return low, high, False
    lo, hi = max(low, bounds[0]), min(high, bounds[1])
    return float(lo), float(hi), bool(lo != low or hi != high)


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
    sem = float(_stats().sem(x))
    if sem == 0:
        return mean, mean, mean
    low, high = _stats().t.interval(level, len(x) - 1, loc=mean, scale=sem)
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


def paired_p(a, b) -> tuple[float, int]:
    """Two-sided paired t-test p-value of b − a, and the number of finite pairs; NaN with fewer
    than ``MIN_PAIRS`` pairs or differences without spread (no test is meaningful there)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    d = b[ok] - a[ok]
    if len(d) < MIN_PAIRS or np.ptp(d) == 0:
        return float("nan"), int(len(d))
    t = d.mean() / (d.std(ddof=1) / np.sqrt(len(d)))
    return float(2 * _stats().t.sf(abs(t), len(d) - 1)), int(len(d))


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN entries are not in the family and stay NaN):
    the k-th smallest of m p-values is multiplied by m − k + 1, kept monotone, capped at 1."""
    p = np.asarray(p, dtype=float)
    out = np.full(len(p), np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m = len(order)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out


def verdict(diff: float, p_holm: float, n_pairs: int, level: float = LEVEL) -> str:
    """Words for one comparison: Holm-adjusted, or "too few seeds"."""
    if not np.isfinite(p_holm):
        return f"{TOO_FEW} ({n_pairs} pair{'s' if n_pairs != 1 else ''}" + \
            (", no spread)" if n_pairs >= MIN_PAIRS else ")")
    if p_holm < 1 - level:
        return f"{'higher' if diff > 0 else 'lower'} (supported: Holm p = {_p(p_holm)}{_close(p_holm, level)})"
    return f"not supported (Holm p = {_p(p_holm)}{_close(p_holm, level)})"


def _close(p_holm: float, level: float = LEVEL) -> str:
    """A note for a Holm p within a factor of CLOSE of the line: one changed test sample in one
    seed (another CPU's rounding, another seed) can move it across, so the verdict is fragile."""
    line = round(1 - level, 12)
    return f": close to the {line:.0%} line".replace("%", " %") if line / CLOSE <= p_holm < line * CLOSE else ""


def _p(p: float) -> str:
    """A p-value in 2 significant digits, or 3 where 2 would print a value below 0.05 as 0.05."""
    return f"{p:.2g}" if float(f"{p:.2g}") < 0.05 or p >= 0.05 else f"{p:.3g}"


def add_verdicts(summary: pd.DataFrame, metrics=None, level: float = LEVEL) -> pd.DataFrame:
    """``<m>_diff_p_holm`` and ``<m>_verdict`` over every comparison in ``summary`` (one family:
    every row's paired difference on every metric in ``metrics``, default all with a p-value)."""
    metrics = [m for m in (metrics or METRICS) if f"{m}_diff_p" in summary]
    cells = [(i, m) for i in range(len(summary)) for m in metrics]
    adjusted = holm([summary[f"{m}_diff_p"].iloc[i] for i, m in cells])
    out = summary.copy()
    for m in metrics:
        out[f"{m}_diff_p_holm"] = np.nan
        out[f"{m}_verdict"] = ""
    for (i, m), q in zip(cells, adjusted):
        r = out.iloc[i]
        out.iat[i, out.columns.get_loc(f"{m}_diff_p_holm")] = q
        if np.isfinite(r[f"{m}_diff_n"]):
            out.iat[i, out.columns.get_loc(f"{m}_verdict")] = verdict(r[f"{m}_diff_mean"], q, int(r[f"{m}_diff_n"]), level)
    out.attrs.update(summary.attrs)
    out.attrs["comparisons"] = int(np.isfinite(adjusted).sum())
    return out


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
            mean, lo, hi = mean_ci(wide[m][arm], level)
            lo, hi, clipped = clip(lo, hi, BOUNDS.get(m))
            row[f"{m}_mean"], row[f"{m}_ci95_low"], row[f"{m}_ci95_high"] = mean, lo, hi
            row[f"{m}_ci95_clipped"] = clipped
            d, lo, hi, _ = paired_diff(wide[m][arms[0]], wide[m][arm], level) if arm != arms[0] \
                else (np.nan, np.nan, np.nan, 0)
            row[f"{m}_diff_mean"], row[f"{m}_diff_ci95_low"], row[f"{m}_diff_ci95_high"] = d, lo, hi
            row[f"{m}_diff_p"], row[f"{m}_diff_n"] = paired_p(wide[m][arms[0]], wide[m][arm]) if arm != arms[0] \
                else (np.nan, np.nan)   # the reference arm: no comparison
        rows.append(row)
    return add_verdicts(pd.DataFrame(rows), level=level)


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
            sem = _stats().sem(ys, axis=0)
            half = np.where(sem > 0, _stats().t.ppf(0.5 + level / 2, len(seeds) - 1) * sem, 0.0)
        else:
            half = np.full_like(mean, np.nan)
        lo_bound, hi_bound = BOUNDS.get(y, (-np.inf, np.inf))   # a band never leaves the metric's range
        low, high = np.maximum(mean - half, lo_bound), np.minimum(mean + half, hi_bound)
        out.append(pd.DataFrame({"arm": arm, x: grid, f"{y}_mean": mean, f"{y}_ci95_low": low,
                                 f"{y}_ci95_high": high, "seeds": len(seeds),
                                 "clipped": bool(np.any(low != mean - half) or np.any(high != mean + half))}))
    return pd.concat(out, ignore_index=True)


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "nan"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _ci(row, m: str, kind: str = "", intervals: bool = True) -> str:
    mean, lo, hi = row[f"{m}_{kind}mean"], row[f"{m}_{kind}ci95_low"], row[f"{m}_{kind}ci95_high"]
    sign = "+" if kind and np.isfinite(mean) and mean > 0 else ""
    if not intervals or not np.isfinite(lo):
        return f"{sign}{_fmt(mean)}"
    mark = "†" if not kind and bool(row.get(f"{m}_ci95_clipped", False)) else ""
    return f"{sign}{_fmt(mean)} [{_fmt(lo)}, {_fmt(hi)}]{mark}"


def notes(summary: pd.DataFrame, metrics) -> list[str]:
    """The footnotes a table of ``summary`` needs: clipped intervals, two seeds."""
    out = []
    if any(bool(summary.get(f"{m}_ci95_clipped", pd.Series(dtype=bool)).any()) for m in metrics):
        out.append(CLIPPED_NOTE)
    if int(summary["seeds"].max()) == 2:
        out.append(TWO_SEEDS_NOTE)
    return out


def render_summary(summary: pd.DataFrame, target: float | None) -> str:
    """The printed study table: mean [95 % CI] per arm and metric, then each arm's paired
    difference from the first arm, in words."""
    metrics = [m for m in METRICS if m != "cost_to_target" or target is not None]
    n = int(summary["seeds"].max())
    ci = n >= MIN_PAIRS     # fewer seeds: intervals too wide (or of zero width) to print
    table = pd.DataFrame({"arm": summary["arm"],
                          **{c: summary[c] for c in ("groups", "group_size", "avg_cov", "rounds", "overhead_share") if c in summary},
                          **{m: [_ci(r, m, intervals=ci) for _, r in summary.iterrows()] for m in metrics}})
    if target is not None:
        table["target_reached"] = [f"{k}/{n}" for k in summary["target_reached"]]
    lines = [f"mean [95 % CI] over {n} seeds:" if ci else
             f"mean over {n} seed{'s' if n > 1 else ''} (fewer than {MIN_PAIRS}: no confidence intervals; give "
             f"seeds = [0, 1, 2] for them):",
             table.to_string(index=False, float_format=lambda v: f"{v:.4g}")]
    lines += notes(summary, metrics) if ci else []   # both notes concern intervals
    first = summary["arm"].iloc[0]
    summary = add_verdicts(summary, metrics)
    rows = []
    for _, r in summary.iloc[1:].iterrows():
        for m in metrics:
            rows.append({"arm": r["arm"], "metric": m, f"difference from {first}{' [95 % CI]' if ci else ''}":
                         _ci(r, m, "diff_", intervals=ci),
                         "verdict": r[f"{m}_verdict"]})
    if rows:
        k = summary.attrs.get("comparisons", 0)
        lines += ["", f"paired difference from {first} (same seeds: same data, topology and costs):",
                  pd.DataFrame(rows).to_string(index=False),
                  f"verdict: Holm's correction over the {k} comparison{'s' if k != 1 else ''} above with a test "
                  f"(family-wise 5 %); the interval beside it is unadjusted. {TOO_FEW}: fewer than "
                  f"{MIN_PAIRS} paired seeds, or no spread" if k else
                  f"verdict: {TOO_FEW} to test any difference (fewer than {MIN_PAIRS} paired seeds)"]
        if target is not None:
            lines.append(f"cost_to_target: over the seeds where both arms reached accuracy {target:g}")
    return "\n".join(lines)


def conclusion(summary: pd.DataFrame, target: float | None) -> str:
    """One sentence, computed from the summary: the most accurate arm at equal cost, whether its
    lead over the first arm is supported, the cheapest arm to the target, and which paired
    differences from the first arm (accuracy at equal cost, cost to target) the seeds support."""
    n = int(summary["seeds"].max())
    summary = add_verdicts(summary, [m for m in METRICS if m != "cost_to_target" or target is not None])
    best = summary.loc[summary["acc_at_common_cost_mean"].idxmax()]
    first = summary.iloc[0]
    text = (f"Over {n} seeds, at equal cost the most accurate arm is {best['arm']} "
            f"({_ci(best, 'acc_at_common_cost')})")
    if best["arm"] != first["arm"]:
        said = best["acc_at_common_cost_verdict"]
        q = best["acc_at_common_cost_diff_p_holm"]
        holm_said = f"Holm p = {_p(q)}{_close(q)}" if _close(q) else "Holm"
        text += (f", {_ci(best, 'acc_at_common_cost', 'diff_')} over {first['arm']}, "
                 + (f"a supported difference ({holm_said})" if "supported:" in said else
                    "too few seeds to tell" if said.startswith(TOO_FEW) else
                    f"a difference the seeds do not support ({holm_said})"))
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
             and "supported:" in r[f"{m}_verdict"]]
    if n > 1:
        text += (f"; differences from {first['arm']} the seeds support: {', '.join(found)}" if found else
                 f"; no arm differs from {first['arm']} in {' or '.join(words if target is not None else list(words)[:1])} "
                 f"beyond the seeds' noise")
    return text + "."


def compact_summary(summary: pd.DataFrame, keys: list[str], with_target: bool) -> pd.DataFrame:
    """A sweep's summary as a reader wants it: ``keys`` (point and axis values), arm, the headline
    metrics as mean [95 % CI] and the verdict on accuracy at equal cost against the point's
    first arm (Holm over the sweep)."""
    metrics = [m for m in ("final_acc", "acc_at_common_cost", "cost_to_target")
               if m != "cost_to_target" or with_target]
    out = summary[[*keys, "arm", "seeds"]].copy()
    for m in metrics:
        out[m] = [_ci(r, m).replace("nan", "–") for _, r in summary.iterrows()]
    if with_target:
        out["target_reached"] = [f"{k}/{n}" for k, n in zip(summary["target_reached"], summary["seeds"])]
    first = summary.groupby("point", sort=False)["arm"].transform("first") if "point" in summary else summary["arm"].iloc[0]
    verdicts = summary.get("acc_at_common_cost_verdict", pd.Series([""] * len(summary))).fillna("")
    out["verdict"] = [   # accuracy at equal cost against the point's first arm
        "reference" if a == f else (f"{v.split(' (')[0]} than {f}" if "supported:" in v else v)
        for a, f, v in zip(summary["arm"], first if isinstance(first, pd.Series) else [first] * len(summary), verdicts)]
    return out

