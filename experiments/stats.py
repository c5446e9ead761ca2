"""Statistics over seeds: means with 95 % t intervals, paired differences, curves on a cost grid.

A study's unit of replication is the seed: within one seed every arm shares the data placement,
topology and costs, so arms are compared by their per-seed differences (a paired t interval).

A study makes many comparisons (every arm against the first, on every metric); each ends in a
decision (higher, lower, equivalent within the metric's margin, or undecided) from
:mod:`groupfel.experiments.sequential`: t-tests (and TOST) per look, alpha spending where seeds were
added, Holm's step-down over all of them (family-wise error 5 %), beside each difference's
unadjusted 95 % interval. Fewer than 3 pairs, or pairs whose differences are all equal, have no
test: two seeds have one degree of freedom (t = 12.7), and a zero spread is no evidence of a zero
variance. Intervals of bounded metrics (accuracy in [0, 1], costs and times >= 0) are clipped to
the bounds, and the tables say so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .sequential import RARE_Z

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
# Metrics a study compares where its runs measured them (cost.energy; cost.carbon_intensity*):
# the clients' joules and grams CO2e at each run's end, in the same paired tests and verdicts.
OPTIONAL_METRICS = {"energy_j": "energy (J), all clients", "carbon_g": "carbon (g CO2e), all clients"}
ALL_METRICS = {**METRICS, **OPTIONAL_METRICS}
# The range each metric can take: its intervals are clipped to it.
BOUNDS = {"final_acc": (0.0, 1.0), "acc_at_common_cost": (0.0, 1.0), "cost_to_target": (0.0, np.inf),
          "sim_time_s": (0.0, np.inf), "accuracy": (0.0, 1.0), "loss": (0.0, np.inf), "cost": (0.0, np.inf),
          "round_time_s": (0.0, np.inf),
          # per-group mode's local test error over clients (HCCT Table 5)
          **{f"local_error_{k}": (0.0, 1.0) for k in ("mean", "std", "min", "max")},
          **{f"local_error_best_{k}": (0.0, 1.0) for k in ("mean", "std", "min", "max")},
          # FedCollab Eqs. 11-12: IPR is a share of clients, RSD a standard deviation
          "ipr": (0.0, 1.0), "rsd": (0.0, np.inf), "energy_j": (0.0, np.inf), "carbon_g": (0.0, np.inf)}
MIN_PAIRS = 3
# Equivalence margins δ (metric -> size, relative to the reference arm's mean?): a difference
# inside ±δ counts as none. One accuracy point, and 5 % of a cost or time; a config's [margins]
# table sets its own (docs/statistics-and-safety.md says where the defaults come from).
MARGINS: dict[str, tuple[float, bool]] = {"final_acc": (0.01, False), "acc_at_common_cost": (0.01, False),
                                          "cost_to_target": (0.05, True), "sim_time_s": (0.05, True),
                                          "energy_j": (0.05, True), "carbon_g": (0.05, True)}
# Paired differences at least this skewed (|G1|) are flagged beside their decision: the
# simulations (benchmarks/sequential.py) hold 5 % up to a skewness of about 3 but not beyond, and a
# single extreme seed among 10 to 20 gives a sample skewness of 2.5 to 4.
SKEW_WARN = 2.0
RARE_NOTE = (f"'rests on one rare seed': one seed's paired difference lies {RARE_Z:g} sd or more from the "
             "others'; no test can say how often such seeds come, so the decision's 5 % rests on it")
# A Holm p within this factor of the line (0.025 to 0.1 at 95 %) is called close to it.
CLOSE = 2.0
TOO_FEW = "too few seeds"
# The conclusion counts the undecided comparisons a fixed design would decide with at most this
# many seeds at the observed spread.
CONTINUE_CAP = 50
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


def add_verdicts(summary: pd.DataFrame, metrics=None, level: float = LEVEL, history: dict | None = None,
                 looks: list[int] | None = None) -> pd.DataFrame:
    """One decision per comparison (every row's paired difference from its reference on every
    metric in ``metrics``, default all with a test), over one family: ``<m>_diff_p_holm`` and
    ``<m>_eq_p_holm`` (Holm-Shaffer adjusted, :func:`groupfel.experiments.sequential.step_down`),
    ``<m>_decision`` (higher, lower, equivalent, undecided; not measured or no spread where there is
    no test) and ``<m>_verdict`` (in words). ``history``: (row, metric) -> (repeated p of the
    difference, of equivalence, mean difference, skewness of the differences) after each of the
    ``looks`` (seeds) of a study that added seeds; the step-down runs at every look, a decision once
    made is kept (``<m>_seeds``: the seeds after which it was made) and each adjusted p-value is the
    smallest of its looks'. Without it, one look at ``<m>_diff_p`` and ``<m>_eq_p``. Where the
    summary's ``withhold_skew`` is set, a look makes no decision on differences whose |skewness| is
    at least it (``<m>_withheld``: the comparison stays open, and a study that adds seeds goes on)."""
    from .sequential import NAMES, UNDECIDED, decide, keep, step_down

    metrics = [m for m in (metrics or ALL_METRICS) if f"{m}_diff_p" in summary]
    cells = [(i, m) for i in range(len(summary)) for m in metrics if np.isfinite(summary[f"{m}_diff_n"].iloc[i])]
    if history is None:
        history = {(i, m): [(summary[f"{m}_diff_p"].iloc[i],
                             summary[f"{m}_eq_p"].iloc[i] if f"{m}_eq_p" in summary else np.nan,
                             summary[f"{m}_diff_mean"].iloc[i], summary.get(f"{m}_diff_skew", pd.Series(
                                 np.nan, index=summary.index)).iloc[i])] for i, m in cells}
    withhold = float(summary["withhold_skew"].max()) if "withhold_skew" in summary else np.nan
    k = len(cells)
    n_looks = len(next(iter(history.values()))) if k else 1
    adjusted = np.full(2 * k, np.nan)
    decisions = np.full(k, UNDECIDED)
    first = np.full(k, n_looks - 1)
    withheld = np.zeros(k, bool)
    for look in range(n_looks):
        q = np.array([history[c][look][0] for c in cells] + [history[c][look][1] for c in cells], dtype=float)
        adj = step_down(q, np.tile(np.arange(k), 2)) if k else q
        now = decide(np.array([history[c][look][2] for c in cells], dtype=float), adj[:k], adj[k:], 1 - level)
        skew = np.array([history[c][look][3] if len(history[c][look]) > 3 else np.nan for c in cells], dtype=float)
        withheld = (decisions == UNDECIDED) & (now != UNDECIDED) & (np.abs(skew) >= withhold)
        now = np.where(withheld, UNDECIDED, now)
        first = np.where((decisions == UNDECIDED) & (now != UNDECIDED), look, first)
        decisions = keep(decisions, now)
        adjusted = np.fmin(adjusted, adj)
    out = summary.copy()
    for m in metrics:
        out[f"{m}_diff_p_holm"] = np.nan
        out[f"{m}_eq_p_holm"] = np.nan
        out[f"{m}_decision"] = ""
        out[f"{m}_verdict"] = ""
    seeds = looks
    for j, (i, m) in enumerate(cells):
        r = out.iloc[i]
        qd, qe = adjusted[j], adjusted[k + j]
        tested = np.isfinite(qd) or np.isfinite(qe)
        decision = NAMES[int(decisions[j])] if tested else untested(r, m)
        out.iat[i, out.columns.get_loc(f"{m}_diff_p_holm")] = qd
        out.iat[i, out.columns.get_loc(f"{m}_eq_p_holm")] = qe
        out.iat[i, out.columns.get_loc(f"{m}_decision")] = decision
        if withheld[j] and decisions[j] == UNDECIDED:
            if f"{m}_withheld" not in out:
                out[f"{m}_withheld"] = False
            out.iat[i, out.columns.get_loc(f"{m}_withheld")] = True
            r = out.iloc[i]
        if seeds and n_looks > 1:
            if f"{m}_seeds" not in out:
                out[f"{m}_seeds"] = np.nan
            out.iat[i, out.columns.get_loc(f"{m}_seeds")] = seeds[first[j]]
            r = out.iloc[i]
        out.iat[i, out.columns.get_loc(f"{m}_verdict")] = decision_words(r, m, decision, qd, qe, level)
    out.attrs.update(summary.attrs)
    out.attrs["comparisons"] = int(sum(np.isfinite(adjusted[j]) or np.isfinite(adjusted[k + j]) for j in range(k)))
    return out


# Decisions of a comparison that has no test: no value in any seed (no target set, or never
# reached), or paired differences without spread.
NOT_MEASURED, NO_SPREAD = "not measured", "no spread"
UNITS = {"sim_time_s": " s"}


def untested(r, m: str) -> str:
    """The decision of a comparison without a test: not measured, no spread, or undecided (fewer
    than MIN_PAIRS pairs: more seeds may give it a test)."""
    from .sequential import no_spread

    n = int(r[f"{m}_diff_n"])
    if n == 0:
        return NOT_MEASURED
    if n >= MIN_PAIRS and bool(no_spread(r.get(f"{m}_diff_sd", np.nan), r[f"{m}_diff_mean"])):
        return NO_SPREAD
    return "undecided"


def is_open(r, m: str) -> bool:
    """Whether comparison ``m`` of row ``r`` has a test and is undecided: only such a comparison
    keeps a study adding seeds (one without a test would wait for nothing: see untested)."""
    return r.get(f"{m}_decision", "") == "undecided" and (
        np.isfinite(r.get(f"{m}_diff_p_holm", np.nan)) or np.isfinite(r.get(f"{m}_eq_p_holm", np.nan)))


def any_open(summary: pd.DataFrame) -> bool:
    """Whether any comparison of ``summary`` has a test and is undecided (:func:`is_open`)."""
    return any(is_open(r, m) for _, r in summary.iloc[1:].iterrows() for m in ALL_METRICS if f"{m}_decision" in r)


def heading_nowhere(summary: pd.DataFrame) -> bool:
    """Whether a study that adds seeds can stop before its maximum with comparisons open: every
    open comparison (:func:`is_open`) is, at this look, unlikely to be decided by ``max_seeds``
    (:func:`groupfel.experiments.sequential.futile`: predictive power of a difference and of
    equivalence both below :data:`~groupfel.experiments.sequential.design.FUTILITY`)."""
    from .sequential import futile

    if "max_seeds" not in summary:
        return False
    open_ = [(r, m) for _, r in summary.iloc[1:].iterrows() for m in ALL_METRICS if f"{m}_decision" in r and is_open(r, m)]
    n_max = int(summary["max_seeds"].max())
    return bool(open_) and all(
        bool(futile(r[f"{m}_diff_mean"], r[f"{m}_diff_sd"], int(r[f"{m}_diff_n"]), n_max, r[f"{m}_margin"], len(open_)))
        for r, m in open_)


def decision_words(r, m: str, decision: str, qd: float, qe: float, level: float = LEVEL) -> str:
    """A decision in words: the adjusted p-value behind it, the margin of an equivalence, the seeds
    it took when a study added seeds; for an undecided comparison, why, and about how many seeds a
    fixed design would need at the observed spread; for one without a test, what the seeds show."""
    n = int(r[f"{m}_diff_n"])
    after = f" after {int(r[f'{m}_seeds'])} seeds" if r.get("looks", 1) > 1 and np.isfinite(r.get(f"{m}_seeds", np.nan)) else ""
    skew = r.get(f"{m}_diff_skew", np.nan)
    flag = f"; skewness {skew:+.1f}: 5 % not held" if np.isfinite(skew) and abs(skew) >= SKEW_WARN else ""
    z = r.get(f"{m}_rare_z", np.nan)
    if decision in ("higher", "lower", "equivalent") and np.isfinite(z) and z >= RARE_Z:
        after += f"; seed {int(r[f'{m}_rare_seed'])} lies {z:.1f} sd from the others: rests on one rare seed"
    after += flag
    if decision in ("higher", "lower"):
        return f"{decision} (Holm p = {_p(qd)}{_close(qd, level)}{after})"
    if decision == "equivalent":
        return f"equivalent (within {margin_text(r, m)}: Holm p = {_p(qe)}{after})"
    if decision == NOT_MEASURED:
        return f"{NOT_MEASURED} (no value in any seed: no test)"
    if decision == NO_SPREAD:
        d = r[f"{m}_diff_mean"]
        if d == 0:
            return f"identical in every seed ({n} pairs: no test)"
        return f"constant difference {'+' if d > 0 else ''}{_fmt(d)}{UNITS.get(m, '')} in every seed ({n} pairs: no test)"
    if not (np.isfinite(qd) or np.isfinite(qe)):
        return f"undecided: {TOO_FEW} ({n} pair{'s' if n != 1 else ''})"
    need, cap = r.get(f"{m}_seeds_needed", np.nan), r.get("max_seeds", np.nan)
    more = "" if not np.isfinite(need) else (
        f"; fixed design: ~{int(need)} seeds" if not (np.isfinite(cap) and need > cap) else
        f"; fixed design: ~{int(need)} seeds, more than this study's {int(cap)}")
    if bool(r.get(f"{m}_withheld", False)):
        flag = f"; withheld: skewness {skew:+.1f}, |skewness| >= {r['withhold_skew']:g}"
    return f"undecided (Holm p = {_p(qd)}{_close(qd, level)}{more}{flag})"


def margin_text(r, m: str) -> str:
    """The margin of metric ``m`` as the user set it: ±0.01, or ±5 % of the reference (±275)."""
    size, relative = r[f"{m}_margin"], MARGINS[m][1]
    return f"±{_fmt(size)}" if not relative else f"±{r[f'{m}_margin_share']:.0%} (±{_fmt(size)})".replace("%", " %")


def accuracy_at_cost(df: pd.DataFrame, cost: float) -> float:
    """The accuracy of the last evaluation at or below ``cost``; NaN where the run's first row
    already costs more (an arm that charges up-front work, e.g. FedCollab's discriminators)."""
    reached = df.loc[df["cost"] <= cost + 1e-9, "accuracy"]
    return float(reached.iloc[-1]) if len(reached) else float("nan")


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
                         "acc_at_common_cost": accuracy_at_cost(df, common),
                         "cost_to_target": float(hit.iloc[0]) if len(hit) else float("nan"),
                         "sim_time_s": float(df["sim_time_s"].iloc[-1]), "cost": float(df["cost"].iloc[-1]),
                         **({"energy_j": float(df["energy_j"].iloc[-1])} if "energy_j" in df else {}),
                         **({"carbon_g": float(df["carbon_g"].iloc[-1])} if "carbon_g" in df else {}),
                         **({"energy_accounting": df["energy_accounting"].iloc[-1]}
                            if "energy_accounting" in df else {}),
                         "common_cost": float(common)})
    return pd.DataFrame(rows)


def summarize_seeds(per_seed: pd.DataFrame, arms: list[str], level: float = LEVEL, margins: dict | None = None,
                    looks: list[int] | None = None, max_seeds: int | None = None,
                    seed_batch: int | None = None, withhold_skew: float | None = None) -> pd.DataFrame:
    """One row per arm: for each headline metric ``<m>_mean``, ``<m>_ci95_low/high`` over seeds,
    the paired difference from the first arm ``<m>_diff_mean``, ``<m>_diff_ci95_low/high``, and its
    decision (:func:`add_verdicts`). ``target_reached`` counts the seeds whose run reached the
    target accuracy. ``looks``: the numbers of seeds (first ones, in seed order) at which a study
    that adds seeds looked, on its schedule planned up to ``max_seeds`` with a look every
    ``seed_batch`` seeds (default: the step between its first two looks, else 2); default one look
    at every seed (a fixed design). ``margins``: metric -> δ (a share of the reference's mean for
    costs and times; :data:`MARGINS`). ``withhold_skew``: no decision on differences whose |sample
    skewness| is at least this at a look (:func:`add_verdicts`)."""
    from .sequential import fixed_seeds_needed, look_pvalues, rare_seed, repeated_p_path, skewness, untested

    metrics = [m for m in ALL_METRICS if m in METRICS or m in per_seed]
    wide = {m: per_seed.pivot(index="seed", columns="arm", values=m).sort_index() for m in metrics}
    n_seeds = len(wide["final_acc"])
    looks = [n for n in (looks or [n_seeds]) if n <= n_seeds] or [n_seeds]
    sequential = max_seeds is not None
    batch = seed_batch or (looks[1] - looks[0] if len(looks) > 1 else 2)
    margins = {m: (margins or {}).get(m, MARGINS[m][0]) for m in metrics}
    rows = []
    history = {}   # (row, metric) -> [(q_diff, q_eq, mean) after each look]
    for arm in arms:
        row = {"arm": arm, "seeds": int(wide["final_acc"][arm].notna().sum()),
               "target_reached": int(wide["cost_to_target"][arm].notna().sum()), "looks": len(looks)}
        if sequential:
            row["max_seeds"] = int(max_seeds)
        if withhold_skew is not None:
            row["withhold_skew"] = float(withhold_skew)
        for m in metrics:
            mean, lo, hi = mean_ci(wide[m][arm], level)
            lo, hi, clipped = clip(lo, hi, BOUNDS.get(m))
            row[f"{m}_mean"], row[f"{m}_ci95_low"], row[f"{m}_ci95_high"] = mean, lo, hi
            row[f"{m}_ci95_clipped"] = clipped
            if arm == arms[0]:   # the reference arm: no comparison
                row.update({f"{m}_diff_mean": np.nan, f"{m}_diff_ci95_low": np.nan, f"{m}_diff_ci95_high": np.nan,
                            f"{m}_diff_p": np.nan, f"{m}_eq_p": np.nan, f"{m}_diff_n": np.nan})
                continue
            ref, other = wide[m][arms[0]].to_numpy(float), wide[m][arm].to_numpy(float)
            d, lo, hi, n = paired_diff(ref, other, level)
            row[f"{m}_diff_mean"], row[f"{m}_diff_ci95_low"], row[f"{m}_diff_ci95_high"] = d, lo, hi
            row[f"{m}_diff_n"] = n
            ok = np.isfinite(ref) & np.isfinite(other)
            row[f"{m}_diff_sd"] = float(np.std(other[ok] - ref[ok], ddof=1)) if n > 1 else np.nan
            share, relative = margins[m], MARGINS[m][1]
            # one test per planned look (NaN: none there), so a repeated p-value reads every look
            # against the same schedule whatever pairs are missing
            p = np.full((3, len(looks)), np.nan)
            means, skews = [], []
            delta = share
            labels = wide[m].index.to_numpy()
            for k, n_look in enumerate(looks):
                okk = ok[:n_look]
                diffs = (other[:n_look] - ref[:n_look])[okk]
                delta = share * abs(float(ref[:n_look][okk].mean())) if relative and okk.any() else share
                means.append(float(diffs.mean()) if len(diffs) else np.nan)
                skews.append(skewness(diffs))
                if len(diffs) >= MIN_PAIRS:
                    p[:, k] = look_pvalues(diffs, delta, seeds=labels[:n_look][okk])
                    if sequential and untested(len(diffs), max_seeds, n_look):   # pending: no evidence yet
                        p[:, k] = np.where(np.isnan(p[:, k]), np.nan, 1.0)
                    elif sequential and untested(len(diffs), max_seeds, n_look, equivalence=True):
                        p[1:, k] = np.where(np.isnan(p[1:, k]), np.nan, 1.0)
            row[f"{m}_margin"] = delta
            row[f"{m}_diff_skew"] = skewness(other[ok] - ref[ok])
            row[f"{m}_rare_seed"], row[f"{m}_rare_z"] = rare_seed(other[ok] - ref[ok], labels[ok])
            n_max = max_seeds if sequential else looks[-1]
            qd = repeated_p_path(p[0], tuple(looks), n_max, True, batch)
            qe = np.maximum(repeated_p_path(p[1], tuple(looks), n_max, False, batch),
                            repeated_p_path(p[2], tuple(looks), n_max, False, batch))
            after = [(float(qd[k]), float(qe[k]), means[k], skews[k]) for k in range(len(looks))]
            row[f"{m}_margin_share"] = share
            row[f"{m}_diff_p"], row[f"{m}_eq_p"] = after[-1][:2]
            history[(len(rows), m)] = after
        rows.append(row)
    out = pd.DataFrame(rows)
    if "energy_j" in per_seed:
        if "energy_accounting" in per_seed:     # which joules these are (cost.energy_accounting)
            out["energy_accounting"] = per_seed["energy_accounting"].iloc[0]
    out = add_verdicts(out, level=level, history=history, looks=looks)
    m_family = max(int(out.attrs.get("comparisons", 1)), 1)
    for m in metrics:
        if f"{m}_diff_sd" not in out:
            continue
        out[f"{m}_seeds_needed"] = [
            fixed_seeds_needed(r[f"{m}_diff_sd"], r[f"{m}_diff_mean"], r[f"{m}_margin"], m_family, 1 - level)
            if is_open(r, m) else np.nan for _, r in out.iterrows()]
    return add_verdicts(out, level=level, history=history, looks=looks)   # again: the words name the seeds needed


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
    if any(bool((summary.get(f"{m}_rare_z", pd.Series(dtype=float)) >= RARE_Z).any()) for m in metrics):
        out.append(RARE_NOTE)
    return out


def render_summary(summary: pd.DataFrame, target: float | None) -> str:
    """The printed study table: mean [95 % CI] per arm and metric, then each arm's paired
    difference from the first arm, in words."""
    metrics = [m for m in ALL_METRICS if (m != "cost_to_target" or target is not None)
               and (m in METRICS or f"{m}_mean" in summary)]
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
    if "energy_accounting" in summary and "energy_j" in metrics:     # which joules (and grams) these are
        lines.append(f"energy_j: the clients' joules, {summary['energy_accounting'].iloc[0]} accounting"
                     + ("; carbon_g: their grams CO2e" if "carbon_g" in metrics else ""))
    first = summary["arm"].iloc[0]
    summary = _decided(summary, metrics)
    rows = []
    for _, r in summary.iloc[1:].iterrows():
        for m in metrics:
            rows.append({"arm": r["arm"], "metric": m, f"difference from {first}{' [95 % CI]' if ci else ''}":
                         _ci(r, m, "diff_", intervals=ci),
                         "decision": r[f"{m}_verdict"]})
    if rows:
        k = comparisons(summary)
        lines += ["", f"paired difference from {first} (same seeds: same data, topology and costs):",
                  pd.DataFrame(rows).to_string(index=False),
                  f"decision: higher or lower (a difference the seeds support), equivalent (inside the margin: "
                  f"{_margins_said(summary, metrics)}) or undecided; Holm's correction over the {k} comparison"
                  f"{'s' if k != 1 else ''} above with a test (family-wise 5 %), the interval beside it unadjusted; "
                  f"fixed design: the seeds that would decide it with 80 % power at the observed difference and spread"
                  if k else f"decision: undecided, {TOO_FEW} to test any difference (fewer than {MIN_PAIRS} paired seeds)"]
        looks = int(summary["looks"].max()) if "looks" in summary else 1
        if looks > 1 or "max_seeds" in summary:
            lines.append(f"seeds added until decided: {stopped(summary)}; O'Brien-Fleming-type alpha spending over "
                         f"the planned looks (docs: statistics-and-safety); a fixed-seed table of the same seeds "
                         f"read beside these decisions would be a second test")
        lines.append(tests_note(summary))
        said = false_equivalent_note(summary, metrics)
        lines += [said] if said else []
        if target is not None:
            lines.append(f"cost_to_target: over the seeds where both arms reached accuracy {target:g}")
    return "\n".join(lines)


def stopped(summary: pd.DataFrame) -> str:
    """How a study that added seeds ended: every comparison decided at a look, or at its maximum
    with some open."""
    n, looks = int(summary["seeds"].max()), int(summary["looks"].max()) if "looks" in summary else 1
    planned = int(summary["max_seeds"].max()) if "max_seeds" in summary else n
    open_ = sum(is_open(r, m) for _, r in summary.iloc[1:].iterrows() for m in ALL_METRICS if f"{m}_decision" in r)
    if open_ and n >= planned:
        return f"ran to its maximum ({planned} seeds) with {open_} comparison{'s' if open_ != 1 else ''} open"
    if open_ and heading_nowhere(summary):
        from .sequential.design import FUTILITY

        return (f"stopped at look {looks}, after {n} of at most {planned} seeds, with {open_} comparison"
                f"{'s' if open_ != 1 else ''} open and heading nowhere (each under {FUTILITY:.0%} predictive power "
                f"of a decision by {planned} seeds)")
    if open_:
        return f"look {looks}, after {n} of at most {planned} seeds, {open_} comparison{'s' if open_ != 1 else ''} open"
    return f"every comparison with a test decided at look {looks}, after {n} of at most {planned} seeds"


# False `equivalent` measured where it can happen, a true difference exactly at the margin (one arm,
# paired sd 1.5 δ, max 20 seeds; 10,000 simulated studies a row, generator seed 1,
# benchmarks/sequential.py): (skewness of the paired differences, rate). Not monotone in the skewness.
FALSE_EQUIVALENT = ((0.0, 0.0463), (1.4, 0.0644), (2.9, 0.0401))


def false_equivalent_note(summary: pd.DataFrame, metrics) -> str | None:
    """The measured false-`equivalent` rate for paired differences as skewed as this table's: the
    largest of :data:`FALSE_EQUIVALENT` up to the first measured skewness at or beyond the largest
    |skewness| among the comparisons with a test (None: none has one)."""
    skews = [abs(r.get(f"{m}_diff_skew", np.nan)) for _, r in summary.iterrows() for m in metrics
             if np.isfinite(r.get(f"{m}_diff_p_holm", np.nan)) or np.isfinite(r.get(f"{m}_eq_p_holm", np.nan))]
    skews = [s for s in skews if np.isfinite(s)]
    if not skews:
        return None
    top = max(skews)
    rows = [rate for k, (skew, rate) in enumerate(FALSE_EQUIVALENT) if k == 0 or FALSE_EQUIVALENT[k - 1][0] < top]
    known = top <= FALSE_EQUIVALENT[-1][0]
    return (f"false equivalent, simulated where it can happen (a true difference at the margin): "
            f"{'up to ' if len(rows) > 1 else ''}{max(rows):.1%} for paired differences as skewed as these "
            f"(|skewness| up to {top:.1f})".replace("%", " %")
            + ("" if known else f"; not measured beyond skewness {FALSE_EQUIVALENT[-1][0]:g}"))


def tests_note(summary: pd.DataFrame) -> str:
    """Which test each look ran: a bootstrap-t from BOOT_MIN pairs on (a skewed law of the
    differences included), a t-test below it (near-normal differences assumed)."""
    from .sequential.design import BOOT_MIN

    few = int(summary["seeds"].max()) < BOOT_MIN
    return (f"tests: paired t-tests (with fewer than {BOOT_MIN} pairs they assume near-normal differences: one "
            f"skewed seed breaks them); from {BOOT_MIN} pairs on, bootstrap-t" if few else
            f"tests: bootstrap-t from {BOOT_MIN} pairs on, each tail at least the t-test's (paired t-tests below); "
            f"'skewness' beside a decision: its paired differences are skewed (|skewness| >= {SKEW_WARN:g}) beyond "
            f"what keeps 5 %")


def _decided(summary: pd.DataFrame, metrics) -> pd.DataFrame:
    """``summary`` with its decisions: as computed when it was made (a study's looks are not in the
    table), else computed here (a table of one look)."""
    if all(f"{m}_decision" in summary for m in metrics if f"{m}_diff_p" in summary):
        return summary
    return add_verdicts(summary, metrics)


def comparisons(summary: pd.DataFrame) -> int:
    """The comparisons Holm's correction ran over: as computed, or (a summary read back from
    summary.csv, the HTML report's) counted from its adjusted p-values."""
    k = summary.attrs.get("comparisons")
    if k is None:
        k = int(sum(summary[c].notna().sum() for c in summary if c.endswith("_diff_p_holm")))
    return k


def _margins_said(summary: pd.DataFrame, metrics) -> str:
    ref = summary.iloc[1] if len(summary) > 1 else summary.iloc[0]
    return ", ".join(f"{m} {margin_text(ref, m).split(' (')[0]}" for m in metrics if f"{m}_margin" in summary)


def conclusion(summary: pd.DataFrame, target: float | None) -> str:
    """Computed from the summary: the most accurate arm at equal cost and its decision against the
    first arm, the cheapest arm to the target, which comparisons are decided, which have no test,
    and what deciding the rest would take in a fixed design. A table's 5 % is spent on its seeds,
    so the rest are decided on other seeds (a fixed table continued on the same seeds would be a
    second test: the run refuses it)."""
    n = int(summary["seeds"].max())
    metrics = [m for m in ALL_METRICS if (m != "cost_to_target" or target is not None)
               and (m in METRICS or f"{m}_mean" in summary)]
    summary = _decided(summary, metrics)
    best = summary.loc[summary["acc_at_common_cost_mean"].idxmax()]
    first = summary.iloc[0]
    text = (f"Over {n} seeds, at equal cost the most accurate arm is {best['arm']} "
            f"({_ci(best, 'acc_at_common_cost')})")
    if best["arm"] != first["arm"]:
        text += (f", {_ci(best, 'acc_at_common_cost', 'diff_')} over {first['arm']}: "
                 f"{best['acc_at_common_cost_verdict'].split(' (')[0].split(':')[0]}")
    if target is not None and summary["target_reached"].max() > 0:
        reached = summary[summary["target_reached"] > 0]
        cheap = reached.loc[reached["cost_to_target_mean"].idxmin()]
        text += (f"; the cheapest to reach accuracy {target:g} is {cheap['arm']} (Eq. 5 cost "
                 f"{_ci(cheap, 'cost_to_target')}, reached in {int(cheap['target_reached'])}/{n} seeds)")
    elif target is not None:
        text += f"; no arm reached accuracy {target:g}"
    if n < 2:
        return text + "."
    cells = [(r, m) for _, r in summary.iloc[1:].iterrows() for m in metrics]
    decided = [f"{r['arm']} {m} {r[f'{m}_decision']}" for r, m in cells
               if r[f"{m}_decision"] in ("higher", "lower", "equivalent")]
    open_ = [(r, m) for r, m in cells if is_open(r, m)]
    bare = [f"{r['arm']} {m} {r[f'{m}_verdict'].split(' (')[0].replace('undecided: ', '')}" for r, m in cells
            if r[f"{m}_decision"] not in ("higher", "lower", "equivalent") and not is_open(r, m)]
    text += f". Decided: {len(decided)} of {len(cells)} comparisons" + (f" ({', '.join(decided)})" if decided else "")
    if bare:
        text += f"; without a test: {len(bare)} ({', '.join(bare)})"
    if not open_:
        return text + "."
    needs = [r.get(f"{m}_seeds_needed", np.nan) for r, m in open_]
    near = sorted(int(x) for x in needs if np.isfinite(x) and x <= CONTINUE_CAP)
    text += f"; undecided: {len(open_)}"
    if near:
        rest = len(open_) - len(near)
        text += (f", of which {len(near)} would take at most {near[-1]} seeds in a fixed design at the observed "
                 f"spread" + (f" ({rest} more than {CONTINUE_CAP}, or never)" if rest else ""))
    else:
        text += f", each needing more than {CONTINUE_CAP} seeds in a fixed design at the observed spread (or never)"
    planned = summary["max_seeds"].max() if "max_seeds" in summary else np.nan
    if np.isfinite(planned):        # a study that added seeds stopped with comparisons open
        text += (f"; this study {stopped(summary)}, and its 5 % is spent over them: deciding the rest takes a "
                 f"new study")
    else:
        text += ("; this table spent its 5 % on these seeds: deciding the rest takes other seeds, in a new study "
                 "planned before it looks")
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
    decisions = summary.get("acc_at_common_cost_decision", pd.Series([""] * len(summary))).fillna("")
    said = {"higher": "higher than", "lower": "lower than", "equivalent": "equivalent to"}
    out["verdict"] = [   # accuracy at equal cost against the point's first arm
        "reference" if a == f else (f"{said[d]} {f}" if d in said else v)
        for a, f, v, d in zip(summary["arm"], first if isinstance(first, pd.Series) else [first] * len(summary),
                              verdicts, decisions)]
    return out

