"""The reproductions README, rendered from the committed results (``groupfel reproduce --render``).

``experiments/reproductions/README.template.md`` is the README's text with every number taken
from a result file written as ``{{ expression }}``: a call of one of the functions below on a
reproduction's committed ``NAME/MODE/`` folder (``quick`` or ``full``): its table ``NAME.csv``, its
``sweep-summary.csv`` and every evaluation in ``runs.csv``. ``render()`` evaluates them, so the
README cannot quote a number its files do not hold; a test checks that the committed README is
the rendering of the committed files.

Accuracies are in %, formatted ``mean [95 % CI low, high]`` over seeds; paired differences are
per seed (same partition), arm minus reference. "At cost c" interpolates each run's accuracy
linearly between its evaluations (``np.interp`` on cost), then averages over seeds.
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .stats import BOUNDS, clip, mean_ci

ROOT = Path(__file__).parent / "reproductions"
TEMPLATE = ROOT / "README.template.md"
README = ROOT / "README.md"
EXPR = re.compile(r"\{\{(.*?)\}\}", re.S)


@cache
def _csv(name: str, mode: str, file: str) -> pd.DataFrame:
    # one pass over the whole file: a groups.csv's clients column mixes "8" and "0 4"
    return pd.read_csv(ROOT / name / mode / file, low_memory=False)


def _select(df: pd.DataFrame, arm: str | None, point: dict[str, Any]) -> pd.DataFrame:
    if arm is not None:
        df = df[df["arm"] == arm]
    for col, value in point.items():
        col = col if col in df else {"clients": "topology.clients_per_edge", "alpha": "data.alpha", "max_cov": "arms.0.grouping.max_cov",
               "regroup": "arms.0.regroup_every", "algorithm": "train.algorithm", "K": "train.group_rounds",
               "E": "train.local_epochs", "size": "arms.0.grouping.min_group_size",
               "partition": "data.partition", "n_new": "topology.arrivals.per_arrival"}.get(col, col)
        as_number = pd.to_numeric(df[col], errors="coerce")
        if isinstance(value, (int, float)) and as_number.notna().any():
            df = df[as_number == float(value)]
        else:
            df = df[df[col].astype(str) == str(value)]
    if df.empty:
        raise KeyError(f"no rows for arm={arm!r} {point}")
    return df


def fmt(value: float, digits: int = 2) -> str:
    return "—" if value != value else f"{value:,.{digits}f}"


def _ci(mean: float, low: float, high: float, digits: int) -> str:
    if low != low:
        return fmt(mean, digits)
    return f"{fmt(mean, digits)} [{fmt(low, digits)}, {fmt(high, digits)}]"


# ----------------------------------------------------------------------------- NAME.csv
def ours(name: str, mode: str, metric: str, arm: str | None = None, digits: int = 2, ci: bool = True,
         **point) -> str:
    """Ours from ``NAME.csv``: mean [95 % CI] of ``metric`` (the table's own unit)."""
    table = _csv(name, mode, f"{name}.csv")
    r = _select(table[table["metric"] == metric], arm, point).iloc[0]
    if not ci:
        return fmt(r["ours"], digits)
    # the metric's range (an IPR within [0, 100]) bounds its interval, as `groupfel reproduce` now writes it
    low, high, _ = clip(r["ci95_low"], r["ci95_high"], _bounds(name, metric))
    return _ci(r["ours"], low, high, digits)


@cache
def _bounds(name: str, metric: str) -> tuple[float, float] | None:
    from .reproduce import load

    return next((m.bounds for m in load(name).metrics if m.name == metric), None)


def paper(name: str, metric: str, arm: str | None = None, digits: int = 2, **point) -> str:
    """The paper's number from ``NAME/paper.csv``."""
    df = _select(pd.read_csv(ROOT / name / "paper.csv"), arm, point)
    return fmt(float(df[metric].iloc[0]), digits)


# ----------------------------------------------------------------------------- sweep-summary.csv
def summary(name: str, mode: str, column: str, arm: str | None = None, digits: int = 2, scale: float = 1.0,
            **point) -> str:
    """A ``sweep-summary.csv`` column (e.g. ``groups``, ``group_size``, ``rounds``,
    ``overhead_share``); for a ``_mean`` column with ``ci``, see :func:`summary_ci`."""
    r = _select(_csv(name, mode, "sweep-summary.csv"), arm, point).iloc[0]
    return fmt(float(r[column]) * scale, digits)


def cell(name: str, mode: str, file: str, column: str, digits: int = 2, scale: float = 1.0, **point) -> str:
    """One value of any committed CSV (e.g. a study's ``fig5.csv``), the row chosen by ``point``."""
    r = _select(_csv(name, mode, file), None, point).iloc[0]
    return fmt(float(r[column]) * scale, digits)


def text(name: str, mode: str, file: str, column: str, missing: str | None = None, **point) -> str:
    """One value of any committed CSV as written (a name, a partition), the row chosen by ``point``;
    ``missing`` where no row matches (a run not finished yet), if given."""
    try:
        return str(_select(_csv(name, mode, file), None, point).iloc[0][column])
    except (KeyError, FileNotFoundError):
        if missing is None:
            raise
        return missing


def sig(name: str, mode: str, file: str, column: str, digits: int = 2, **point) -> str:
    """As :func:`cell`, to ``digits`` significant digits (a value of any size: 8.6e-10, 1.4e+08)."""
    return f"{float(_select(_csv(name, mode, file), None, point).iloc[0][column]):.{digits}g}"


def summary_ci(name: str, mode: str, metric: str, arm: str | None = None, digits: int = 2, scale: float = 100.0,
               **point) -> str:
    """``metric``'s mean [CI] (``final_acc``, ``acc_at_common_cost``, their ``_diff`` against the
    first arm ...) from ``sweep-summary.csv``, times ``scale``."""
    r = _select(_csv(name, mode, "sweep-summary.csv"), arm, point).iloc[0]
    mean, low, high = (float(r[f"{metric}_{k}"]) * scale for k in ("mean", "ci95_low", "ci95_high"))
    if metric.startswith(("final_acc", "acc_at_common_cost")):   # proportions and their differences, × scale
        low, high, _ = clip(low, high, (-scale, scale) if metric.endswith("_diff") else (0.0, scale))
    return _ci(mean, low, high, digits)


# ----------------------------------------------------------------------------- runs.csv
def _at(name: str, mode: str, arm: str, x: str, at: float, point: dict) -> dict[int, float]:
    runs = _select(_csv(name, mode, "runs.csv"), arm, point)
    out = {}
    for seed, r in runs.groupby("seed"):
        r = r.sort_values(x)
        out[int(seed)] = float(np.interp(at, r[x].to_numpy(float), r["accuracy"].to_numpy(float))) * 100
    return out


def at_cost(name: str, mode: str, cost: float, arm: str, digits: int = 2, ci: bool = False, **point) -> str:
    """Mean accuracy (%) over seeds at Eq. 5 cost ``cost``, each run interpolated between evaluations."""
    mean, low, high = mean_ci(list(_at(name, mode, arm, "cost", cost, point).values()))
    return _ci(mean, *clip(low, high, (0.0, 100.0))[:2], digits) if ci else fmt(mean, digits)


def at_round(name: str, mode: str, round: int, arm: str, digits: int = 2, **point) -> str:
    """Mean accuracy (%) over seeds at round ``round``."""
    return fmt(float(np.mean(list(_at(name, mode, arm, "round", round, point).values()))), digits)


def at_cost_over(name: str, mode: str, cost: float, arm: str, over: dict[str, list], digits: int = 2,
                 **point) -> str:
    """Mean accuracy (%) at ``cost`` over seeds and every point of ``over`` (e.g. all MaxCoV)."""
    keys = list(over)
    values = []
    for combo in np.array(np.meshgrid(*[over[k] for k in keys])).T.reshape(-1, len(keys)):
        values += _at(name, mode, arm, "cost", cost, {**point, **dict(zip(keys, combo))}).values()
    return fmt(float(np.mean(values)), digits)


def paired_at_cost(name: str, mode: str, cost: float, arm: str, ref: str, digits: int = 2,
                   ref_at: dict | None = None, **point) -> str:
    """Paired difference arm − ref (accuracy points) at ``cost``: mean [95 % CI] over seeds.
    ``ref_at``: the reference's point when it runs at another one (e.g. another local algorithm;
    the same seed draws the same partition where the data settings are equal)."""
    a = _at(name, mode, arm, "cost", cost, point)
    b = _at(name, mode, ref, "cost", cost, point if ref_at is None else ref_at)
    return _paired([a[s] - b[s] for s in a if s in b], "accuracy", 100.0, digits)


def _final(name: str, mode: str, arm: str, point: dict) -> dict[int, float]:
    runs = _select(_csv(name, mode, "runs.csv"), arm, point)
    return {int(seed): float(r.sort_values("cost")["accuracy"].iloc[-1]) * 100 for seed, r in runs.groupby("seed")}


@cache
def _budget(name: str, mode: str) -> float:
    """The Eq. 5 budget of a reproduction's runs in folder ``mode`` (``quick…``: quick mode's)."""
    from .reproduce import load, resolve

    return float(resolve(load(name), mode.startswith("quick"))[1]["train"]["budget"])


def _best(name: str, mode: str, arm: str, point: dict, budget: float | None) -> dict[int, float]:
    """Each seed's best accuracy (%) over its evaluations at cost ≤ ``budget`` (default: the
    runs' own budget): the number the Group-FEL authors' plotting scripts report."""
    runs = _select(_csv(name, mode, "runs.csv"), arm, point)
    runs = runs[runs["cost"] <= (_budget(name, mode) if budget is None else budget) + 1e-9]
    return {int(s): float(r["accuracy"].max()) * 100 for s, r in runs.groupby("seed")}


def _best_diffs(name: str, mode: str, arm: str, ref: str, at: dict | None, ref_at: dict | None,
                budget: float | None, point: dict) -> list[float]:
    at = point if at is None else at
    x, y = _best(name, mode, arm, at, budget), _best(name, mode, ref, at if ref_at is None else ref_at, budget)
    return [x[s] - y[s] for s in x if s in y]


def paired_best(name: str, mode: str, arm: str, ref: str, digits: int = 2, at: dict | None = None,
                ref_at: dict | None = None, budget: float | None = None, **point) -> str:
    """Paired difference arm − ref of each seed's best accuracy at cost ≤ the budget (:func:`_best`),
    points: mean [95 % CI] over seeds. ``at`` / ``ref_at``: the two sides' points where they differ
    (default ``point``; ``ref_at`` defaults to ``at``)."""
    return _paired(_best_diffs(name, mode, arm, ref, at, ref_at, budget, point), "accuracy", 100.0, digits)


def verdict_best(name: str, mode: str, arm: str, ref: str, claim: str, at: dict | None = None,
                 ref_at: dict | None = None, budget: float | None = None, **point) -> str:
    """:func:`word` for the claim that :func:`paired_best` is ``claim`` zero."""
    _, low, high = _interval(_best_diffs(name, mode, arm, ref, at, ref_at, budget, point), "accuracy", 100.0)
    return word(low, high, claim)


def last(name: str, mode: str, column: str, arm: str, digits: int = 1, scale: float = 1.0, ci: bool = False,
         **point) -> str:
    """Mean over seeds of ``column`` at each run's last evaluation in ``runs.csv`` (e.g.
    ``groups_sampled``: the number of groups trained in the last round); with ``ci``, its 95 %
    interval beside it (none for one seed), a bounded column's clipped to its range."""
    if ci:
        mean, low, high = mean_ci(list(_last_per_seed(name, mode, column, arm, scale, point).values()))
        b = BOUNDS.get(column)
        if b is not None:
            low, high, _ = clip(low, high, (b[0] * scale, b[1] * scale))
        return _ci(mean, low, high, digits)
    runs = _select(_csv(name, mode, "runs.csv"), arm, point)
    return fmt(float(np.mean([r.sort_values("round")[column].iloc[-1] for _, r in runs.groupby("seed")])) * scale, digits)


def _last_per_seed(name: str, folder: str, column: str, arm: str, scale: float, point: dict) -> dict[int, float]:
    """``column`` at each run's last evaluation in ``folder/runs.csv``, times ``scale``, per seed."""
    runs = _select(_csv(name, folder, "runs.csv"), arm, point)
    return {int(s): float(r.sort_values("round")[column].iloc[-1]) * scale for s, r in runs.groupby("seed")}


def seed_last(name: str, mode: str, column: str, arm: str, seed: int, scale: float = 100.0, **point) -> float:
    """One seed's ``column`` at its run's last evaluation, times ``scale``: a number, for
    :func:`range_of` and arithmetic in the template."""
    return _last_per_seed(name, mode, column, arm, scale, point)[seed]


def paired_mean(name: str, mode: str, column: str, arm: str, ref: str, scale: float = 100.0, **point) -> float:
    """The mean over the seeds both ran of ``arm`` − ``ref`` at the last evaluation (the mean of
    :func:`paired_last`) as a number; ``ref`` may name another column instead of another arm
    (``ref="column:local_error_best_mean"``: the same arm's other column)."""
    x = _last_per_seed(name, mode, column, arm, scale, point)
    y = (_last_per_seed(name, mode, ref.removeprefix("column:"), arm, scale, point) if ref.startswith("column:")
         else _last_per_seed(name, mode, column, ref, scale, point))
    return float(np.mean([x[s] - y[s] for s in x if s in y]))


def range_of(values: list[float], digits: int = 0, sep: str = " to ") -> str:
    """The range of numbers given in the template (e.g. a :func:`paired_mean` per point): "24 to 29",
    or the one value where they agree at ``digits``."""
    low, high = fmt(min(values), digits), fmt(max(values), digits)
    return low if low == high else f"{low}{sep}{high}"


def _interval(diffs: list[float], column: str, scale: float) -> tuple[float, float, float]:
    """Mean and 95 % CI of paired differences; a bounded metric's difference interval is clipped to
    the widest difference it can take (accuracy in points: [-100, 100])."""
    mean, low, high = mean_ci(diffs)
    b = BOUNDS.get(column)
    if b is not None and np.isfinite(b[1] - b[0]):
        width = (b[1] - b[0]) * scale
        low, high, _ = clip(low, high, (-width, width))
    return mean, low, high


def _paired(diffs: list[float], column: str, scale: float, digits: int) -> str:
    return _ci(*_interval(diffs, column, scale), digits)


# The README's words for a paper's claim that a paired difference is below (or above) zero:
# "Holds" where the 95 % interval lies on the claim's side of zero; "Does not hold" only where it
# lies on the other side by more than MARGIN points (it excludes the claim by that margin);
# otherwise "Not reproduced" (the seeds neither confirm nor refute it), with the interval beside.
# For a claim that two arms are level: "Holds" where the interval lies within ±MARGIN, "Does not
# hold" where it lies wholly outside it (on one side), otherwise "Not reproduced".
MARGIN = 1.0
CLAIMS = ("below", "above", "level")


def word(low: float, high: float, claim: str, margin: float = MARGIN) -> str:
    """The rule above on an interval [low, high] for a claim that the difference is ``claim`` zero
    (``level``: within ±``margin``)."""
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {CLAIMS}, got {claim!r}")
    if claim == "level":
        if -margin <= low and high <= margin:
            return "Holds"
        return "Does not hold" if low > margin or high < -margin else "Not reproduced"
    sign = 1.0 if claim == "below" else -1.0
    low, high = sorted((sign * low, sign * high))
    if high < 0:
        return "Holds"
    return "Does not hold" if low > margin else "Not reproduced"


def either(words: list[str]) -> str:
    """One word for a claim made of several comparisons: it holds where every one holds and does
    not hold where any one excludes it by the margin; otherwise it is not reproduced."""
    if all(w == "Holds" for w in words):
        return "Holds"
    return "Does not hold" if "Does not hold" in words else "Not reproduced"


def verdict_summary(name: str, mode: str, metric: str, arms: list[str], claim: str, scale: float = 100.0,
                    **point) -> str:
    """:func:`word` for the paper's claim that each of ``arms``' paired difference from the first
    arm in ``sweep-summary.csv`` (``metric``: ``final_acc_diff``, ``acc_at_common_cost_diff``,
    times ``scale``: points) is ``claim`` zero, combined as :func:`either`."""
    rows = [_select(_csv(name, mode, "sweep-summary.csv"), a, point).iloc[0] for a in arms]
    return either([word(float(r[f"{metric}_ci95_low"]) * scale, float(r[f"{metric}_ci95_high"]) * scale, claim)
                    for r in rows])


def _ours_bounds(name: str, mode: str, metric: str, arm: str, ref: str, point: dict) -> tuple[float, float]:
    """[low(arm) − high(ref), high(arm) − low(ref)] of ``NAME.csv``'s ``metric``: it holds the
    paired difference's 95 % interval over the same seeds (whose half-width is at most the sum of
    the two arms'), for a table that holds each arm's interval but not their paired difference."""
    table = _csv(name, mode, f"{name}.csv")
    a, r = (_select(table[table["metric"] == metric], x, point).iloc[0] for x in (arm, ref))
    if bool(a["ci95_clipped"]) or bool(r["ci95_clipped"]):   # a clipped end is no bound of the difference
        raise ValueError(f"{arm}'s or {ref}'s {metric} interval is clipped to its range; pair them instead")
    if int(a["seeds"]) != int(r["seeds"]):
        raise ValueError(f"{arm} and {ref} ran {a['seeds']} and {r['seeds']} seeds; pair them instead")
    return float(a["ci95_low"]) - float(r["ci95_high"]), float(a["ci95_high"]) - float(r["ci95_low"])


def ours_bounds(name: str, mode: str, metric: str, arm: str, ref: str, digits: int = 2, **point) -> str:
    """:func:`_ours_bounds` as text: "[low, high]"."""
    low, high = _ours_bounds(name, mode, metric, arm, ref, point)
    return f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def verdict_ours(name: str, mode: str, metric: str, arm: str, ref: str, claim: str, **point) -> str:
    """:func:`word` for the paper's claim that ``arm`` − ``ref`` of ``NAME.csv``'s ``metric`` is
    ``claim`` zero, on :func:`_ours_bounds`: never stronger than the word on the paired interval."""
    return word(*_ours_bounds(name, mode, metric, arm, ref, point), claim)


def verdict_points(name: str, mode: str, arm: str, a: dict, b: dict, claim: str,
                   column: str = "local_error_mean", scale: float = 100.0) -> str:
    """:func:`word` for the paper's claim that point ``b`` minus point ``a`` (as
    :func:`paired_points`) is ``claim`` zero."""
    x, y = (_last_per_seed(name, mode, column, arm, scale, p) for p in (a, b))
    _, low, high = _interval([y[s] - x[s] for s in x if s in y], column, scale)
    return word(low, high, claim)


def verdict_last(name: str, mode: str, column: str, arm: str, ref: str, claim: str, scale: float = 100.0,
                 **point) -> str:
    """:func:`word` for the paper's claim that ``arm`` − ``ref`` (as :func:`paired_last`) is ``claim`` zero."""
    x, y = (_last_per_seed(name, mode, column, a, scale, point) for a in (arm, ref))
    _, low, high = _interval([x[s] - y[s] for s in x if s in y], column, scale)
    return word(low, high, claim)


def verdict_folders(name: str, mode: str, before: str, column: str, arm: str, claim: str,
                    before_arm: str | None = None, scale: float = 100.0, **point) -> str:
    """:func:`word` for the claim that ``arm`` in folder ``mode`` − ``before_arm`` in folder
    ``before`` (as :func:`paired_folders`) is ``claim`` zero."""
    x = _last_per_seed(name, mode, column, arm, scale, point)
    y = _last_per_seed(name, before, column, before_arm or arm, scale, point)
    _, low, high = _interval([x[s] - y[s] for s in x if s in y], column, scale)
    return word(low, high, claim)


def paired_last(name: str, mode: str, column: str, arm: str, ref: str, digits: int = 2, scale: float = 100.0,
                **point) -> str:
    """Paired difference arm − ref of ``column`` at each run's last evaluation (e.g.
    ``local_error_mean``, times 100: points), per seed: mean [95 % CI] over seeds."""
    x, y = (_last_per_seed(name, mode, column, a, scale, point) for a in (arm, ref))
    return _paired([x[s] - y[s] for s in x if s in y], column, scale, digits)


def paired_folders(name: str, mode: str, before: str, column: str, arm: str, digits: int = 2,
                   scale: float = 100.0, before_arm: str | None = None, **point) -> str:
    """Paired difference of ``column`` at each run's last evaluation between two committed runs of
    one reproduction, folder ``mode`` minus folder ``before`` (e.g. ``full`` − ``full-before``:
    what a change of setting did; ``before_arm`` in folder ``before``, default ``arm``: an arm
    rerun alone against another arm of the first run), per seed: mean [95 % CI] over seeds."""
    x = _last_per_seed(name, mode, column, arm, scale, point)
    y = _last_per_seed(name, before, column, before_arm or arm, scale, point)
    return _paired([x[s] - y[s] for s in x if s in y], column, scale, digits)


def paired_across(name: str, mode: str, arm: str, ref_mode: str, ref: str, at: dict | None = None,
                  ref_at: dict | None = None, digits: int = 2) -> str:
    """Paired difference of the final accuracy (points), ``arm`` in folder ``mode`` minus ``ref`` in
    folder ``ref_mode``, per seed: an arm rerun on another setting against an unchanged arm of the
    first run (same seeds, same worlds)."""
    x, y = _final(name, mode, arm, at or {}), _final(name, ref_mode, ref, ref_at or {})
    return _paired([x[s] - y[s] for s in x if s in y], "accuracy", 100.0, digits)


def before_after(name: str, mode: str, before: str, column: str, arm: str, digits: int = 2,
                 scale: float = 100.0, **point) -> str:
    """``column`` at each run's last evaluation, folder ``before`` → folder ``mode``, each the mean
    over the seeds both folders ran, then in brackets the paired difference after − before
    (mean [95 % CI] over those seeds)."""
    x, y = (_last_per_seed(name, f, column, arm, scale, point) for f in (mode, before))
    common = sorted(set(x) & set(y))
    diff = _paired([x[s] - y[s] for s in common], column, scale, digits)
    return f"{fmt(float(np.mean([y[s] for s in common])), digits)} → {fmt(float(np.mean([x[s] for s in common])), digits)} ({diff})"


def _round_per_seed(name: str, folder: str, column: str, arm: str, round: int, scale: float) -> dict[int, float]:
    """``column`` at evaluation ``round`` of each run in ``folder/runs.csv``, times ``scale``, per seed."""
    runs = _select(_csv(name, folder, "runs.csv"), arm, {})
    return {int(s): float(r[r["round"] == round][column].iloc[0]) * scale for s, r in runs.groupby("seed")
            if (r["round"] == round).any()}


def mean_at(name: str, mode: str, column: str, arm: str, round: int, digits: int = 1, scale: float = 1.0,
            among: tuple[str, str] | None = None) -> str:
    """Mean over seeds of ``column`` at evaluation ``round`` (e.g. ``maxfl_participants``); with
    ``among = (folder, arm)`` over the seeds that arm's runs in that folder hold only (a rerun
    with fewer seeds beside a longer one)."""
    values = _round_per_seed(name, mode, column, arm, round, scale)
    if among is not None:
        keep = set(_select(_csv(name, among[0], "runs.csv"), among[1], {})["seed"].astype(int))
        values = {s: v for s, v in values.items() if s in keep}
    return fmt(float(np.mean(list(values.values()))), digits)


def before_after_at(name: str, mode: str, before: str, column: str, arm: str, round: int,
                    before_arm: str | None = None, digits: int = 2, scale: float = 100.0) -> str:
    """As :func:`before_after`, at evaluation ``round`` of both folders (a shorter rerun beside a
    longer one), ``before_arm`` in folder ``before`` (default: ``arm``)."""
    x = _round_per_seed(name, mode, column, arm, round, scale)
    y = _round_per_seed(name, before, column, before_arm or arm, round, scale)
    common = sorted(set(x) & set(y))
    diff = _paired([x[s] - y[s] for s in common], column, scale, digits)
    return f"{fmt(float(np.mean([y[s] for s in common])), digits)} → {fmt(float(np.mean([x[s] for s in common])), digits)} ({diff})"


def csv_before_after(name: str, mode: str, before: str, file: str, column: str, at: int, before_at: int,
                     x: str = "epoch", digits: int = 2, scale: float = 100.0) -> str:
    """As :func:`before_after_at` on any committed CSV with a ``seed`` column (e.g. a study's own
    table): ``column`` where ``x`` = ``before_at`` in folder ``before`` → where ``x`` = ``at`` in
    folder ``mode``, means over the seeds both hold, then the paired difference after − before."""
    def per_seed(folder: str, where: int) -> dict[int, float]:
        df = _csv(name, folder, file)
        df = df[df[x] == where]
        return {int(r["seed"]): float(r[column]) * scale for _, r in df.iterrows()}

    after, prior = per_seed(mode, at), per_seed(before, before_at)
    common = sorted(set(after) & set(prior))
    diff = _paired([after[s] - prior[s] for s in common], column, scale, digits)
    return (f"{fmt(float(np.mean([prior[s] for s in common])), digits)} → "
            f"{fmt(float(np.mean([after[s] for s in common])), digits)} ({diff})")


def paired_at(name: str, mode: str, column: str, arm: str, ref: str, round: int, digits: int = 2,
              scale: float = 100.0) -> str:
    """As :func:`paired_last`, at evaluation ``round``: arm − ref per seed, mean [95 % CI]."""
    x, y = (_round_per_seed(name, mode, column, a, round, scale) for a in (arm, ref))
    return _paired([x[s] - y[s] for s in x if s in y], column, scale, digits)


def paired_folders_at(name: str, mode: str, before: str, column: str, arm: str, round: int, digits: int = 2,
                      scale: float = 100.0) -> str:
    """As :func:`paired_folders`, at evaluation ``round`` of both folders."""
    x, y = (_round_per_seed(name, f, column, arm, round, scale) for f in (mode, before))
    return _paired([x[s] - y[s] for s in x if s in y], column, scale, digits)


def paired_points(name: str, mode: str, arm: str, a: dict, b: dict, digits: int = 2,
                  column: str = "accuracy", scale: float = 100.0) -> str:
    """Paired difference, point ``b`` minus point ``a``, per seed (the same seed draws the same
    partition at both points where the data settings are equal): of the final accuracy (points),
    or of another ``column`` at each run's last evaluation, times ``scale``."""
    if column == "accuracy":
        x, y = _final(name, mode, arm, a), _final(name, mode, arm, b)
    else:
        x, y = (_last_per_seed(name, mode, column, arm, scale, p) for p in (a, b))
    return _paired([y[s] - x[s] for s in x if s in y], column, scale, digits)


def paired_final(name: str, mode: str, arm: str, ref: str, at: dict, ref_at: dict, digits: int = 2) -> str:
    """Paired difference of the final accuracy (points), ``arm`` at point ``at`` minus ``ref`` at
    point ``ref_at``, per seed."""
    return paired_across(name, mode, arm, mode, ref, at, ref_at, digits)


def cost_to(name: str, mode: str, accuracy: float, arm: str, digits: int = 0, **point) -> str:
    """Eq. 5 cost of the first evaluation at or above ``accuracy`` (%): mean [95 % CI] over the
    seeds that reach it, and how many do when not all."""
    runs = _select(_csv(name, mode, "runs.csv"), arm, point)
    costs, n = [], runs["seed"].nunique()
    for _, r in runs.groupby("seed"):
        hit = r[r["accuracy"] * 100 >= accuracy]
        if len(hit):
            costs.append(float(hit["cost"].iloc[0]))
    if not costs:
        return "never"
    text = _ci(*mean_ci(costs), digits)
    return text if len(costs) == n else f"{text} ({len(costs)} of {n} seeds)"


def diverged(name: str, mode: str, match: str = "") -> str:
    """How many (seed, arm) runs diverged, from ``diverged.txt`` (one line per run, as the run
    printed it; absent: none), counting the lines that contain ``match``."""
    path = ROOT / name / mode / "diverged.txt"
    lines = [line for line in path.read_text().splitlines() if match in line] if path.is_file() else []
    return str(len(lines))


def span(name: str, mode: str, metric: str, digits: int = 0, width: bool = True) -> str:
    """The range over ``NAME.csv``'s rows of ``metric``: of its CI widths (``width``) or its CI ends."""
    t = _csv(name, mode, f"{name}.csv")
    t = t[t["metric"] == metric]
    if width:
        w = t["ci95_high"] - t["ci95_low"]
        return f"{fmt(w.min(), digits)}-{fmt(w.max(), digits)}"
    return f"[{fmt(t['ci95_low'].min(), digits)}, {fmt(t['ci95_high'].max(), digits)}]"


def seeds(name: str, mode: str, arm: str | None = None) -> str:
    """How many seeds the folder's runs hold (of ``arm``'s, where given)."""
    runs = _csv(name, mode, "runs.csv")
    return str((runs if arm is None else _select(runs, arm, {}))["seed"].nunique())


def _and(items: list[str]) -> str:
    """Items as one phrase: "a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(items[:-1]), items[-1]]))


def seed_list(seeds) -> str:
    """Seeds as text: a run of consecutive ones "0-4", else "0, 2 and 3"."""
    seeds = sorted({int(s) for s in seeds})
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return _and([str(s) for s in seeds])


def csv_seeds(name: str, mode: str, file: str, count: bool = False, **point) -> str:
    """The seeds a committed CSV's ``seed`` column holds in the rows matching ``point``
    (:func:`seed_list`), or with ``count`` how many."""
    seeds = _select(_csv(name, mode, file), None, point)["seed"].unique()
    return str(len(seeds)) if count else seed_list(seeds)


def arm_seeds(name: str, mode: str, arm: str, **point) -> str:
    """The seeds ``arm`` ran in the folder's ``runs.csv`` (:func:`seed_list`), at ``point`` if given."""
    return seed_list(_select(_csv(name, mode, "runs.csv"), arm, point)["seed"].unique())


def per_seed(name: str, mode: str, column: str, arm: str, digits: int = 1, scale: float = 1.0, unit: str = "",
             named: bool = True, **point) -> str:
    """``column`` at each run's last evaluation, seed by seed, then ``unit``: "90.2 and 89.6 % (seeds 1
    and 2)"; without the seeds unless ``named`` (where the sentence names them once)."""
    values = _last_per_seed(name, mode, column, arm, scale, point)
    order = sorted(values)
    text = _and([fmt(values[s], digits) for s in order]) + unit
    return f"{text} (seed{'s' if len(order) > 1 else ''} {seed_list(order)})" if named else text


def csv_span(name: str, mode: str, file: str, column: str, digits: int = 2, scale: float = 1.0, **point) -> str:
    """The range of ``column`` over a committed CSV's rows (those matching ``point``): "low to
    high", or the one value where they agree."""
    values = _select(_csv(name, mode, file), None, point)[column].astype(float) * scale
    low, high = fmt(float(values.min()), digits), fmt(float(values.max()), digits)
    return low if low == high else f"{low} to {high}"


def csv_sum(name: str, mode: str, file: str, column: str, **point) -> str:
    """The sum of an integer ``column`` over a committed CSV's rows matching ``point`` (a count
    of the rows where a 0/1 column holds), with the number of those rows: "5 of 5"."""
    rows = _select(_csv(name, mode, file), None, point)
    return f"{int(rows[column].sum())} of {len(rows)}"


def _clients(members: list[int]) -> str:
    """A group's client indices as a set with runs collapsed: {0-5, 7-9}."""
    runs: list[list[int]] = []
    for m in sorted(members):
        if runs and m == runs[-1][-1] + 1:
            runs[-1].append(m)
        else:
            runs.append([m])
    return "{" + ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs) + "}"


def partitions(name: str, mode: str, file: str, column: str, **point) -> str:
    """Each seed's partition (``column``: a list of client-index lists) in a committed CSV's row
    matching ``point``: "seed 0: {0-5, 7-9}, {6}; seed 1: {0-9}"."""
    import ast

    rows = _select(_csv(name, mode, file), None, point).sort_values("seed")
    return "; ".join(f"seed {int(r['seed'])}: " + ", ".join(_clients(g) for g in ast.literal_eval(r[column]))
                     for _, r in rows.iterrows())


def _hits(name: str, mode: str, file: str, column: str, target: list[list[int]], point: dict) -> tuple[pd.DataFrame, np.ndarray]:
    """A committed CSV's rows matching ``point`` and, per row, whether ``column`` holds the
    partition ``target`` (a list of client-index lists, in any order)."""
    import ast

    want = {frozenset(g) for g in target}
    rows = _select(_csv(name, mode, file), None, point)
    return rows, np.array([{frozenset(g) for g in ast.literal_eval(v)} == want for v in rows[column]], dtype=bool)


def partition_count(name: str, mode: str, file: str, column: str, target: list[list[int]], **point) -> str:
    """How many of a committed CSV's rows matching ``point`` hold the partition ``target`` in
    ``column``, with the number of those rows: "14 of 16"."""
    rows, hit = _hits(name, mode, file, column, target, point)
    return f"{int(hit.sum())} of {len(rows)}"


def partition_misses(name: str, mode: str, file: str, column: str, target: list[list[int]], **point) -> str:
    """The seeds whose partition is not ``target`` (:func:`partition_count`'s other rows): "4, 11 and 12"."""
    rows, hit = _hits(name, mode, file, column, target, point)
    return seed_list(rows["seed"][~hit])


def miss_rate(name: str, mode: str, file: str, column: str, target: list[list[int]], **point) -> str:
    """The share of rows that miss ``target``, with its Wilson 95 % interval:
    "15 % (Wilson 95 % interval 5 to 36 %)"."""
    from scipy.stats import binomtest

    _, hit = _hits(name, mode, file, column, target, point)
    missed, n = int((~hit).sum()), len(hit)
    ci = binomtest(missed, n).proportion_ci(0.95, method="wilson")
    return f"{100 * missed / n:.0f} % (Wilson 95 % interval {100 * ci.low:.0f} to {100 * ci.high:.0f} %)"


def none_missed(runs: int, name: str, mode: str, file: str, column: str, target: list[list[int]], **point) -> str:
    """The chance that ``runs`` independent seeds all hit ``target`` at the rows' hit rate h:
    "0.85⁵ = 44 %" (h to the power ``runs``)."""
    hit = float(_hits(name, mode, file, column, target, point)[1].mean())
    power = str(runs).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    return f"{hit:.2f}{power} = {100 * hit ** runs:.0f} %"


def groups_at(name: str, mode: str, arm: str, round: int) -> str:
    """Each seed's groups of ``arm`` in round ``round`` of a committed ``groups.csv`` (a run's groups
    per round, collected): "seed 0: {0-4}, {5-8}, {9}; seed 1: {0-9}"."""
    rows = _select(_csv(name, mode, "groups.csv"), arm, {"round": round})
    def members(g):
        return sorted((sorted(int(c) for c in str(cs).split()) for cs in g["clients"]), key=min)

    return "; ".join(f"seed {int(seed)}: " + ", ".join(_clients(m) for m in members(g)) for seed, g in rows.groupby("seed"))


def seed_table(name: str, mode: str, file: str, at: list, cell, x: str = "epoch", indent: str = "") -> str:
    """A table of a committed CSV with a ``seed`` column: one row per value of ``x`` in ``at``, one
    column per seed the CSV holds, each cell ``cell(seed, x_value)``; lines after the first start
    with ``indent`` (a table inside a list item)."""
    seeds = sorted(int(s) for s in _csv(name, mode, file)["seed"].unique())
    lines = [f"| {x} |" + "".join(f" seed {s} |" for s in seeds), "|---" * (1 + len(seeds)) + "|"]
    lines += [f"| {v} |" + "".join(f" {cell(s, v)} |" for s in seeds) for v in at]
    return ("\n" + indent).join(lines)


def _g(value: float) -> str:
    return f"{value:.3g}"


# ----------------------------------------------------------------------------- tables
def table1(mode: str) -> str:
    """Group-FEL Table 1: per α × MaxCoV, group sizes [min, max] (mean), mean CoV and accuracy,
    ours (means over seeds of each seed's initial grouping) beside the paper's."""
    t = _csv("table1", mode, "table1.csv")
    lines = ["| α, MaxCoV | ours: sizes | paper: sizes | ours: CoV | paper: CoV | ours: acc % | paper: acc % |",
             "|---|---|---|---|---|---|---|"]
    for (a, c), g in t.groupby(["alpha", "max_cov"], sort=True):
        m = {r["metric"]: r for _, r in g.iterrows()}
        # each interval stays in its metric's range: a group has at least one client, a CoV is never negative
        ci = {k: _ci(m[k]["ours"], *clip(m[k]["ci95_low"], m[k]["ci95_high"], b)[:2], 2) for k, b in
              (("size_mean", (1.0, np.inf)), ("cov", (0.0, np.inf)), ("accuracy", (0.0, 100.0)))}
        pm = {k: m[k]["paper"] for k in m}
        lines.append(f"| {a}, {c} | [{_g(m['size_min']['ours'])}, {_g(m['size_max']['ours'])}] ({ci['size_mean']}) "
                     f"| [{_g(pm['size_min'])}, {_g(pm['size_max'])}] ({fmt(pm['size_mean'])}) | {ci['cov']} "
                     f"| {fmt(pm['cov'])} | {ci['accuracy']} | {fmt(pm['accuracy'])} |")
    return "\n".join(lines)


def _grouping_rules(data: str) -> pd.DataFrame:
    """``table1/grouping-rules/groups.csv`` on one data setting: means over seeds per (α, MaxCoV, rule)."""
    t = _csv("table1", "grouping-rules", "groups.csv")
    t = t[t["data"] == data]
    return t.groupby(["alpha", "max_cov", "rule"]).mean(numeric_only=True)


def grouping_rules(data: str = "authors") -> str:
    """Group-FEL Table 1's grouping columns under CoVG as Alg. 2 reads (ours) and as the authors'
    code runs it, beside the paper's (means over seeds; no training)."""
    t, paper_t = _grouping_rules(data), pd.read_csv(ROOT / "table1" / "paper.csv")
    lines = ["| α, MaxCoV | paper: size, CoV | Alg. 2, merge: groups, size, CoV | authors' rule: groups, size, CoV "
             "| authors' rule: clients left out of 300 (samples %) |", "|---|---|---|---|---|"]
    for (a, c), g in t.groupby(level=["alpha", "max_cov"], sort=True):
        o, w = g.xs("ours", level="rule").iloc[0], g.xs("authors", level="rule").iloc[0]
        pr = _select(paper_t, None, {"alpha": a, "max_cov": c}).iloc[0]
        lines.append(f"| {a}, {c} | {fmt(pr['size_mean'])}, {fmt(pr['cov'])} "
                     f"| {fmt(o['groups'], 1)}, {fmt(o['size_mean'])}, {fmt(o['cov_mean'])} "
                     f"| {fmt(w['groups'], 1)}, {fmt(w['size_mean'])}, {fmt(w['cov_mean'])} "
                     f"| {fmt(w['clients_left_out'], 1)} ({fmt(100 * w['samples_left_out'] / w['samples'], 1)}) |")
    return "\n".join(lines)


def grouping_rules_gap(rule: str, column: str = "cov", data: str = "authors", digits: int = 3) -> str:
    """The mean absolute difference from the paper's Table 1 column over its 9 cells, of the
    grouping ``rule`` (``ours`` or ``authors``) on ``data`` (``authors`` or ``paper`` sizes)."""
    t = _grouping_rules(data).xs(rule, level="rule")
    paper_t = pd.read_csv(ROOT / "table1" / "paper.csv").set_index(["alpha", "max_cov"])
    ours_col = {"cov": "cov_mean", "size_mean": "size_mean"}[column]
    return fmt(float((t[ours_col] - paper_t.loc[t.index, column]).abs().mean()), digits)


def grouping_rules_mean(rule: str, column: str, data: str = "authors", digits: int = 1, **point) -> str:
    """A grouping-rules column (e.g. ``clients_left_out``, ``cov_mean``): its mean over seeds at
    ``point`` (``alpha``, ``max_cov``), else over the 9 cells too."""
    t = _grouping_rules(data).xs(rule, level="rule")
    if point:
        t = t.xs((point["alpha"], point["max_cov"]))
    return fmt(float(t[column].mean()), digits)


def grouping_rules_range(rule: str, column: str, data: str = "authors", digits: int = 0) -> str:
    """The smallest and largest cell of a grouping-rules column (means over seeds), as "a-b";
    ``samples_left_out`` as % of the samples."""
    t = _grouping_rules(data).xs(rule, level="rule")
    col = t[column] if column != "samples_left_out" else 100 * t[column] / t["samples"]
    return f"{fmt(float(col.min()), digits)}-{fmt(float(col.max()), digits)}"


def arms_table(name: str, mode: str, costs: tuple[float, ...] = (), first: str = "arm", **point) -> str:
    """One row per arm: groups (mean size), mean CoV, rounds, accuracy % at the budget and at the
    common cost (mean [95 % CI]), then the mean accuracy at each of ``costs`` (the best in bold)."""
    summ = _select(_csv(name, mode, "sweep-summary.csv"), None, point)
    arms = list(dict.fromkeys(summ["arm"]))
    early = {c: {a: float(at_cost(name, mode, c, a, **point).replace(",", "")) for a in arms} for c in costs}
    head = f"| {first} | groups (size) | mean CoV | rounds | at the budget | at the common cost |" + \
        "".join(f" at cost {c:,.0f} |" for c in costs)
    lines = [head, "|---" * (6 + len(costs)) + "|"]
    for a in arms:
        r = summ[summ["arm"] == a].iloc[0]
        cells = []
        for c in costs:
            v = early[c][a]
            cells.append(f"**{fmt(v)}**" if v == max(early[c].values()) else fmt(v))
        lines.append(f"| {a} | {fmt(r['groups'], 1)} ({fmt(r['group_size'])}) | {fmt(r['avg_cov'])} | {fmt(r['rounds'], 1)} "
                     f"| {summary_ci(name, mode, 'final_acc', a, **point)} "
                     f"| {summary_ci(name, mode, 'acc_at_common_cost', a, **point)} |" + "".join(f" {x} |" for x in cells))
    return "\n".join(lines)


def methods_table(name: str, mode: str, rows: list, ref: tuple, costs: tuple[float, ...] = ()) -> str:
    """One row per (label, arm, point) of ``rows``, arms that may run at different points (e.g. a
    local algorithm per point): groups (mean size), rounds, accuracy % at the budget (mean [95 %
    CI]), the mean accuracy at each of ``costs`` (the best in bold), and the paired difference
    from ``ref`` = (arm, point) at the largest of ``costs`` and at the budget."""
    early = {c: {label: float(at_cost(name, mode, c, arm, **point).replace(",", "")) for label, arm, point in rows}
             for c in costs}
    ref_arm, ref_point = ref
    last_cost = max(costs) if costs else None
    head = "| method | groups (size) | rounds | at the budget |" + "".join(f" at cost {c:,.0f} |" for c in costs)
    head += (f" minus {ref_arm} at cost {last_cost:,.0f} |" if costs else "") + f" minus {ref_arm} at the budget |"
    lines = [head, "|---" * (4 + len(costs) + bool(costs) + 1) + "|"]
    for label, arm, point in rows:
        r = _select(_csv(name, mode, "sweep-summary.csv"), arm, point).iloc[0]
        cells = [f"**{fmt(early[c][label])}**" if early[c][label] == max(early[c].values()) else fmt(early[c][label])
                 for c in costs]
        is_ref = (arm, point) == (ref_arm, ref_point)
        if costs:
            cells.append("—" if is_ref else paired_at_cost(name, mode, last_cost, arm, ref_arm, ref_at=ref_point, **point))
        cells.append("—" if is_ref else paired_final(name, mode, arm, ref_arm, point, ref_point))
        lines.append(f"| {label} | {fmt(r['groups'], 1)} ({fmt(r['group_size'])}) | {fmt(r['rounds'], 1)} "
                     f"| {summary_ci(name, mode, 'final_acc', arm, **point)} |" + "".join(f" {x} |" for x in cells))
    return "\n".join(lines)


def with_arm_table(rows: list, arm: str = "fedcollab", claim: str = "above", label: str = "FedCollab") -> str:
    """One row per base algorithm run alone and with ``arm`` (FedCollab Table 1):
    ``rows`` = [(label, name, folder, alone_arm, point, paper_point)], each run's last round
    from ``name/folder/runs.csv``. Cells: seeds, accuracy % alone and with the arm (mean [95 %
    CI], the paper's in brackets where it has one), the paired difference, :func:`word` for the
    claim that it is ``claim`` zero, and the groups trained in the last round per seed. A row
    whose runs are not committed reads "—" in every cell."""
    lines = [f"| base algorithm | seeds | alone % (paper) | +{label} % (paper) | +{label} − alone (points) "
             "| verdict | groups per seed |", "|---" * 7 + "|"]
    for algorithm, name, folder, alone, point, paper_point in rows:
        try:
            seeds = arm_seeds(name, folder, arm, **point)
        except (KeyError, FileNotFoundError):   # not run yet
            lines.append(f"| {algorithm} |" + " — |" * 6)
            continue

        def with_paper(a: str, col: str) -> str:
            ours = last(name, folder, "accuracy", a, 2, 100, True, **point)
            try:
                theirs = paper("fedcollab-table1", "accuracy", col, **paper_point)
            except KeyError:
                theirs = "—"
            return f"{ours} ({theirs})"

        lines.append(f"| {algorithm} | {seeds} | {with_paper(alone, 'alone')} | {with_paper(arm, arm)} "
                     f"| {paired_last(name, folder, 'accuracy', arm, alone, **point)} "
                     f"| {verdict_last(name, folder, 'accuracy', arm, alone, claim, **point)} "
                     f"| {per_seed(name, folder, 'groups_sampled', arm, 0, 1, named=False, **point)} |")
    return "\n".join(lines)


def grid(name: str, mode: str, rows: str, cols: str, cell, order: list | None = None) -> str:
    """A rows × cols table of ``cell(row_value, col_value)`` over the sweep's points (the columns
    in ``order`` where given, else as they first appear)."""
    summ = _csv(name, mode, "sweep-summary.csv")
    rv, cv = list(dict.fromkeys(summ[rows])), order or list(dict.fromkeys(summ[cols]))
    lines = [f"| {rows.rsplit('.', 1)[-1]} \\ {cols.rsplit('.', 1)[-1]} |" + "".join(f" {c} |" for c in cv),
             "|---" * (1 + len(cv)) + "|"]
    for r in rv:
        lines.append(f"| {r} |" + "".join(f" {_or_dash(cell, r, c)} |" for c in cv))
    return "\n".join(lines)


def _or_dash(cell, r, c) -> str:
    """A grid cell, or "—" where that point did not run that arm (HCCT Fig. 6: no K = 10 at N = 10)."""
    try:
        return cell(r, c)
    except KeyError:   # _select: no rows for that arm at that point
        return "—"


def table2(mode: str) -> str:
    """Group-FEL Table 2: K × E, Group-FEL / FedAvg accuracy %, ours (means) then the paper's."""
    def cell(k, e):
        o = " / ".join(summary("table2", mode, "final_acc_mean", a, 1, 100, K=k, E=e) for a in ("group-fel", "fedavg"))
        p = " / ".join(paper("table2", "accuracy", a, 1, K=k, E=e) for a in ("group-fel", "fedavg"))
        return f"{o} ({p})"
    return grid("table2", mode, "train.group_rounds", "train.local_epochs", cell)


def table2_diff(mode: str) -> str:
    """Group-FEL Table 2: K × E, Group-FEL minus FedAvg at the budget, paired per seed (accuracy
    points, mean [95 % CI]), then the paper's difference."""
    def cell(k, e):
        r = _select(_csv("table2", mode, "sweep-summary.csv"), "fedavg", {"K": k, "E": e}).iloc[0]
        mean, low, high = (-100 * float(r[f"final_acc_diff_{c}"]) for c in ("mean", "ci95_high", "ci95_low"))
        ours = _ci(mean, *clip(low, high, (-100.0, 100.0))[:2], 1)
        gap = float(paper("table2", "accuracy", "group-fel", 1, K=k, E=e)) - float(paper("table2", "accuracy", "fedavg", 1, K=k, E=e))
        return f"{ours} ({gap:+.1f})"
    return grid("table2", mode, "train.group_rounds", "train.local_epochs", cell)


def table2_span(mode: str) -> str:
    """The range over Table 2's cells of the mean Group-FEL minus FedAvg difference (points)."""
    summ = _csv("table2", mode, "sweep-summary.csv")
    d = -100 * summ[summ["arm"] == "fedavg"]["final_acc_diff_mean"]
    return f"{fmt(d.min(), 1)}-{fmt(d.max(), 1)}"


def sources(name: str, quick: bool = True) -> str:
    """The reproduction's settings and their sources, one bullet per sources key (the shared
    base's and quick mode's are listed once, in :func:`base_sources`)."""
    from . import reproduce

    rep = reproduce.load(name)
    shared = {**reproduce._source_tables(rep)[0], **reproduce._source_tables(rep)[1]}
    seen: dict[str, str] = {}
    for leaf, (key, text) in reproduce.setting_sources(rep).items():
        if (quick or not leaf.startswith("quick.")) and shared.get(key) != text:
            seen.setdefault(key, text)
    return "\n".join(f"- `{k}`: {v}" for k, v in seen.items())


def base_sources(quick: bool = False) -> str:
    """The shared Group-FEL base's settings and their sources (``quick``: quick.toml's)."""
    import tomllib

    table = (tomllib.loads((ROOT / "quick.toml").read_text())["sources"] if quick
             else tomllib.loads((ROOT / "groupfel-base.sources.toml").read_text()))
    return "\n".join(f"- `{k}`: {v}" for k, v in table.items())


FUNCTIONS = {f.__name__: f for f in (ours, paper, summary, cell, summary_ci, at_cost, at_round, at_cost_over,
                                     paired_at_cost, last, paired_last, paired_folders, before_after, paired_points, paired_final,
                                     cost_to, diverged, span, seeds, fmt, table1, arms_table, methods_table, grid, verdict_points, verdict_last, verdict_summary, verdict_ours, ours_bounds, either, before_after_at, mean_at, paired_at, paired_folders_at, csv_before_after,
                                     table2, table2_diff, table2_span, sources, base_sources, csv_seeds, arm_seeds, per_seed, csv_span, csv_sum, partitions, partition_count, partition_misses, miss_rate, none_missed, seed_last, paired_mean, range_of,
                                     seed_table, text, sig, verdict_folders, groups_at, with_arm_table, paired_best, verdict_best,
                                     grouping_rules, grouping_rules_gap, grouping_rules_mean, grouping_rules_range,
                                     paired_across)}


def render(template: Path = TEMPLATE) -> str:
    """The README: the template with every ``{{ expression }}`` evaluated."""
    _csv.cache_clear()

    def value(m: re.Match) -> str:
        expr = m.group(1).strip()
        try:
            # the functions as globals, so that a lambda in the template (a grid's cell) sees them
            return str(eval(expr, {"__builtins__": {"dict": dict}, **FUNCTIONS}))  # noqa: S307 (our own template)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{template.name}: {{{{ {expr} }}}}: {type(e).__name__}: {e}") from e

    return EXPR.sub(value, template.read_text())


def write(path: Path = README) -> Path:
    from groupfel.emulator.io import atomic_write

    text = render()
    atomic_write(path, lambda p: p.write_text(text))
    return path
