"""Calibration: fit cost curves to measured timings and write a profile ready to plug in.

Group operations get O_g(s) = a·s² + b·s + c, training H(n) = a·n + b (Sec. 2.3, Eq. 5), by
ordinary least squares with 95 % confidence intervals, R² and RMSE. A robust fit (soft-L1 loss,
scale from the median absolute deviation) is also made; when points lie far from the OLS fit it
is reported and written to the profile instead, because one preempted run should not bend a
cost curve used for thousands of simulated rounds.

This module computes: the profile comes back as text and the plots as figures, which the command
layer writes (atomically).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from groupfel.errors import InputError
from groupfel.userfile import short


X_COLUMNS = {"group_size": ("group_overhead", 2), "n_samples": ("training", 1)}
ENERGY_COLUMNS = ("joules", "energy_span_s")   # written by measure where an energy meter was readable
OUTLIER_Z = 3.5   # robust z-score (residual / (1.4826·MAD)) beyond which a point is an outlier


@dataclass(frozen=True)
class Fit:
    """One fitted curve; coefficients highest power first (numpy.polyval order)."""

    device: str
    operation: str          # profile operation: "group_overhead" or "training"
    method: str
    x_name: str
    x: np.ndarray
    y: np.ndarray
    coef: np.ndarray
    ci: np.ndarray          # half-width of the 95 % confidence interval per coefficient (nan: no dof)
    r2: float
    rmse: float
    robust: np.ndarray
    outliers: np.ndarray    # boolean mask over the points
    weighting: str = "none"     # "none" (ordinary least squares) or "relative" (weights 1/fitted²)
    why: str = ""               # why that weighting (auto's test, or "asked for")
    # the fit with every coefficient >= 0, where the unconstrained one is not a cost at some size
    # from 1 up (:func:`first_nonpositive`); None where it is
    bounded: np.ndarray | None = None

    @property
    def has_outliers(self) -> bool:
        return bool(self.outliers.any())

    @property
    def unbounded(self) -> np.ndarray:
        return self.robust if self.has_outliers else self.coef

    @property
    def chosen(self) -> np.ndarray:
        return self.unbounded if self.bounded is None else self.bounded


def read_measurements(paths: list[str | Path]) -> pd.DataFrame:
    """Measurement CSVs (``#`` comment lines skipped) → one validated frame."""
    from groupfel.usercsv import read_user_csv

    frames = []
    for path in map(Path, paths):
        table = read_user_csv(path, f"measurements {path}" if not path.is_file() else str(path))
        table.require(("operation", "seconds"), "operation, group_size or n_samples, seconds")
        if not set(table.header) & set(X_COLUMNS):
            raise InputError(f"{path}: missing column 'group_size' or 'n_samples' (the x of the fit)")
        if not table.rows:
            raise InputError(f"{path}: no measurements below the header")
        df = pd.DataFrame([r.cells for r in table.rows]).reindex(
            columns=["operation", "method", "device", *X_COLUMNS, "seconds", *ENERGY_COLUMNS])
        df["row"] = [table.where(r) for r in table.rows]
        frames.append(df)
    df = pd.concat(frames, ignore_index=True).replace("", np.nan)
    for col in ("seconds", *X_COLUMNS, *ENERGY_COLUMNS):
        num = pd.to_numeric(df[col], errors="coerce")
        bad = df[col].notna() & num.isna() | (col == "seconds") & num.isna()
        if bad.any():
            i = bad.idxmax()
            raise InputError(f"{df.at[i, 'row']}: column '{col}' must be a number, got {short(df.at[i, col])}")
        df[col] = num
    rules = (("seconds", lambda v: v >= 0, ">= 0 and finite"),
             ("group_size", lambda v: (v >= 1) & (v == np.round(v)), "a whole number >= 1 (clients in the group)"),
             ("n_samples", lambda v: (v >= 1) & (v == np.round(v)), "a whole number >= 1 (samples)"),
             ("joules", lambda v: v >= 0, ">= 0 and finite (the energy meter's reading)"),
             ("energy_span_s", lambda v: v > 0, "> 0 and finite (the seconds the energy reading covers)"))
    for col, ok, what in rules:
        bad = df[col].notna() & ~(np.isfinite(df[col]) & ok(df[col]))
        if bad.any():
            i = bad.idxmax()
            raise InputError(f"{df.at[i, 'row']}: {col} must be {what}, got {df.at[i, col]:g}; fix or delete the row")
    half = df["joules"].notna() != df["energy_span_s"].notna()
    if half.any():
        raise InputError(f"{df.at[half.idxmax(), 'row']}: fill both joules and energy_span_s, or neither")
    both = df["group_size"].notna() == df["n_samples"].notna()
    if both.any():
        raise InputError(f"{df.at[both.idxmax(), 'row']}: fill exactly one of group_size (group operations) "
                         f"or n_samples (training)")
    if df["operation"].isna().any():
        raise InputError(f"{df.at[df['operation'].isna().idxmax(), 'row']}: column 'operation' is empty")
    df["device"] = df["device"].astype(object).fillna("local")
    df["method"] = df["method"].astype(object).fillna(df["operation"].where(df["operation"] != "training", "sgd"))
    return df


WEIGHTS = ("auto", "none", "relative")


def fit_curve(x: np.ndarray, y: np.ndarray, degree: int, where: str) -> tuple[np.ndarray, np.ndarray, float,
                                                                                float, np.ndarray, np.ndarray]:
    """OLS polynomial fit with 95 % CIs, R², RMSE, plus a soft-L1 robust fit and outlier mask."""
    return fit_weighted(x, y, degree, where, "none")[:6]


def noise_grows(x: np.ndarray, y: np.ndarray, degree: int) -> tuple[bool, str]:
    """Whether timing noise grows with the time: the Spearman rank correlation between the
    ordinary least-squares fit's |residuals| and its fitted values, positive at p < 0.05
    (one-sided). Returns the decision and the sentence that says why."""
    from scipy import stats as st

    if len(x) < 6:
        return False, f"auto: {len(x)} points are too few to tell whether the noise grows with the time"
    X = np.vander(x, degree + 1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    fitted = X @ coef
    rho, p = st.spearmanr(np.abs(y - fitted), fitted)
    p_one = p / 2 if rho > 0 else 1 - p / 2
    grows = bool(np.isfinite(rho) and p_one < 0.05)
    return grows, (f"auto: |residuals| {'grow' if grows else 'do not grow'} with the fitted time (Spearman "
                   f"rho = {rho:.2f}, one-sided p = {p_one:.2g} {'<' if grows else '>='} 0.05)")


def fit_weighted(x: np.ndarray, y: np.ndarray, degree: int, where: str, weights: str = "none"):
    """A polynomial fit with 95 % t intervals, R², RMSE, a soft-L1 robust fit, the outlier mask,
    the weighting used and why. ``weights``: "none" (ordinary least squares: constant noise),
    "relative" (iteratively reweighted by 1/fitted²: noise proportional to the time, as on-device
    timings have) or "auto" (:func:`noise_grows` decides)."""
    p = degree + 1
    sizes = np.unique(x)
    if len(x) < p or len(sizes) < p:
        # the sizes it has: an operation measured at fewer sizes than asked for (secagg-recovery
        # needs a group of 3) is told apart from one measured too little
        at = ", ".join(f"{v:g}" for v in sizes[:10]) + (", ..." if len(sizes) > 10 else "")
        raise InputError(f"{where}: measured at {len(sizes)} size(s) ({at}) in {len(x)} row(s), which cannot fit "
                         f"{p} parameters; measure it at {p} or more different sizes"
                         f"{' (recovery is timed from group size 3: a member drops, two remain)' if 'recovery' in where else ''}")
    if weights not in WEIGHTS:
        raise InputError(f"--weights: {weights!r} is not one of {', '.join(WEIGHTS)}")
    why = "asked for (--weights)"
    if weights == "auto":
        grows, why = noise_grows(x, y, degree)
        weights = "relative" if grows else "none"
    X = np.vander(x, p)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    w = np.ones(len(x))
    if weights == "relative":
        floor = 1e-3 * max(float(np.abs(y).max()), 1e-12)   # a fitted value near 0 must not take all weight
        for _ in range(5):   # feasible GLS: the weights from the fitted times, refit
            w = 1.0 / np.maximum(np.abs(X @ coef), floor) ** 2
            sw = np.sqrt(w)
            coef, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    sw = np.sqrt(w)
    resid = y - X @ coef
    dof = len(x) - p
    sse = float(resid @ resid)
    rmse = float(np.sqrt(sse / len(x)))
    sst = float(((y - y.mean()) ** 2).sum())
    # R² is undefined where y does not vary: rounding leaves sst ~1e-30 there, and 1 − sse/sst
    # would print any number (−14.7 for a perfect constant fit)
    r2 = 1.0 - sse / sst if sst > 1e-12 * float(y @ y) else float("nan")
    if dof > 0:
        wr = sw * resid
        cov = float(wr @ wr) / dof * np.linalg.inv((X * w[:, None]).T @ X)
        ci = stats.t.ppf(0.975, dof) * np.sqrt(np.diag(cov))
    else:
        ci = np.full(p, np.nan)
    scale = _mad(sw * resid) or max(float(np.sqrt(np.mean((sw * resid) ** 2))), 1e-12)
    robust = optimize.least_squares(lambda c: sw * (X @ c - y), coef, loss="soft_l1", f_scale=scale).x
    outliers = _outliers(y, X @ robust)
    return coef, ci, r2, rmse, robust, outliers, weights, why


def _mad(r: np.ndarray) -> float:
    """1.4826 × the median absolute deviation: σ of normal residuals, robust to a few wild ones."""
    return 1.4826 * float(np.median(np.abs(r - np.median(r))))


def _outliers(y: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """Points far (robust z > OUTLIER_Z) from the robust fit both in seconds and relative to the
    fitted time. Timing noise is often proportional to the time (3 % of 10 s is 30 times 3 % of
    0.3 s), which the absolute z alone reads as outliers at the large sizes, and additive noise
    the relative z alone reads as outliers at the small ones; a preempted run is far on both."""
    resid = y - fitted
    z_abs = np.abs(resid - np.median(resid)) / (_mad(resid) or max(float(np.sqrt(np.mean(resid**2))), 1e-12))
    rel = resid / np.maximum(np.abs(fitted), 1e-12)
    z_rel = np.abs(rel - np.median(rel)) / (_mad(rel) or max(float(np.sqrt(np.mean(rel**2))), 1e-12))
    return (z_abs > OUTLIER_Z) & (z_rel > OUTLIER_Z)


def first_nonpositive(coef: np.ndarray) -> float | None:
    """The smallest x >= 1 where the polynomial ``coef`` (highest power first) is <= 0, or None
    where it is a cost (positive) at every size a run can use: a group of 1 client up, a client
    of 1 sample up. A curve fitted to sizes 3-6 can dip below 0 at 1 or 2 (timing noise on
    microsecond operations), and a concave one falls below 0 beyond the sizes measured."""
    coef = np.trim_zeros(np.asarray(coef, dtype=float), "f")
    if len(coef) == 0 or np.polyval(coef, 1.0) <= 0:
        return 1.0
    roots = [r.real for r in np.roots(coef) if abs(r.imag) < 1e-9 * max(1.0, abs(r)) and r.real >= 1]
    if roots:
        return float(min(roots))
    if len(coef) > 1 and coef[0] < 0:   # falls without bound: past its largest root
        return float(max(1.0, *np.roots(coef).real))
    return None


def _bounded(x: np.ndarray, y: np.ndarray, degree: int, weighting: str, unbounded: np.ndarray,
             robust: bool) -> np.ndarray:
    """The fit with every coefficient >= 0 (then positive at every size from 1 up), weighted as the
    unconstrained fit was, with its soft-L1 loss where that fit had outliers."""
    X = np.vander(x, degree + 1)
    w = 1.0 / np.maximum(np.abs(X @ unbounded), 1e-3 * max(float(np.abs(y).max()), 1e-12)) ** 2 \
        if weighting == "relative" else np.ones(len(x))
    sw = np.sqrt(w)
    linear = optimize.lsq_linear(X * sw[:, None], y * sw, bounds=(0.0, np.inf)).x
    if not robust:
        return linear
    scale = _mad(sw * (y - X @ linear)) or max(float(np.sqrt(np.mean((sw * (y - X @ linear)) ** 2))), 1e-12)
    return optimize.least_squares(lambda c: sw * (X @ c - y), linear, bounds=(0.0, np.inf), loss="soft_l1",
                                  f_scale=scale).x


def calibrate(df: pd.DataFrame, weights: str = "auto") -> list[Fit]:
    """One fit per (device, operation, method) in the measurements (``weights``: see
    :func:`fit_weighted`). Where that fit is not a cost at some size from 1 up
    (:func:`first_nonpositive`), the profile gets the fit with non-negative coefficients instead,
    and the report says why: a run refuses a curve that is not positive over its sizes."""
    fits = []
    for x_name, (operation, degree) in X_COLUMNS.items():
        part = df[df[x_name].notna()]
        for (device, method), g in part.groupby(["device", "method"], sort=True):
            x, y = g[x_name].to_numpy(float), g["seconds"].to_numpy(float)
            where = f"{device}/{method} ({x_name})"
            coef, ci, r2, rmse, robust, outliers, used, why = fit_weighted(x, y, degree, where, weights)
            fit = Fit(device, operation, method, x_name, x, y, coef, ci, r2, rmse, robust, outliers, used, why)
            if first_nonpositive(fit.unbounded) is not None:
                fit = replace(fit, bounded=_bounded(x, y, degree, used, fit.unbounded, fit.has_outliers))
            fits.append(fit)
    return fits + power_fits(df)


def power_fits(df: pd.DataFrame) -> list[Fit]:
    """Power per state where the measurements carry energy: mean watts of each call (joules /
    energy_span_s) against its x, a straight line with 95 % intervals, one per (device, state):
    training rows give ``training`` power, every group operation's rows ``group_operation``."""
    part = df[df["joules"].notna()]
    if part.empty:
        return []
    part = part.assign(state=np.where(part["n_samples"].notna(), "training", "group_operation"),
                       x=part["n_samples"].fillna(part["group_size"]), watts=part["joules"] / part["energy_span_s"])
    fits = []
    for (device, state), g in part.groupby(["device", "state"], sort=True):
        x, y = g["x"].to_numpy(float), g["watts"].to_numpy(float)
        x_name = "n_samples" if state == "training" else "group_size"
        coef, ci, r2, rmse, robust, outliers, used, why = fit_weighted(x, y, 1, f"{device}/{state} power ({x_name})",
                                                                        "none")
        fits.append(Fit(device, "power", state, x_name, x, y, coef, ci, r2, rmse, robust, outliers, used,
                        "mean watts of each measured call (joules / energy_span_s)"))
    return fits


def r2_text(r2: float) -> str:
    return "n/a (every y equal)" if r2 != r2 else f"{r2:.4f}"


def report(fits: list[Fit]) -> str:
    lines = []
    for f in fits:
        names = "abc"[: len(f.coef)]
        form = {"group_overhead": "a·s² + b·s + c", "training": "a·n + b"}.get(f.operation, "b·x + c (W)")
        if f.operation == "power":
            names = "bc"
        unit = "W" if f.operation == "power" else "s"
        lines.append(f"{f.device}/{f.method}: {f.operation} = {form}  ({len(f.x)} points, "
                     f"R² = {r2_text(f.r2)}, RMSE = {f.rmse:.4g} {unit})")
        how = "relative (weights 1/fitted², noise proportional to the time)" if f.weighting == "relative" else \
            "none (ordinary least squares, constant noise)"
        lines.append(f"  weights: {how}; {f.why}")
        for name, c, h in zip(names, f.coef, f.ci):
            lines.append(f"  {name} = {c: .6g}  ± {h:.3g} (95% CI)" if np.isfinite(h) else
                         f"  {name} = {c: .6g}  (no CI: as many points as parameters)")
        if f.has_outliers:
            rob = ", ".join(f"{n} = {c:.6g}" for n, c in zip(names, f.robust))
            lines.append(f"  {int(f.outliers.sum())} outlier(s) at {f.x_name} = "
                         f"{sorted(set(f.x[f.outliers].astype(int).tolist()))}; robust (soft-L1) fit: {rob}"
                         f"{'  <- written to the profile' if f.bounded is None else ''}")
        if f.bounded is not None:
            at = first_nonpositive(f.unbounded)
            fit = ", ".join(f"{n} = {c:.6g}" for n, c in zip(names, f.bounded))
            lines.append(f"  that fit is {np.polyval(f.unbounded, at):.3g} {unit} at {f.x_name} = {at:.3g}, not a cost "
                         f"(a run refuses it there); fit with every coefficient >= 0: {fit}  <- written to the profile")
    return "\n".join(lines)


def profile_csv(fits: list[Fit], task: str) -> str:
    """The text of the CSV ``read_profiles`` reads (usable as ``cost.profiles_file`` in a run config)."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["device", "task", "operation", "method", "a", "b", "c", "note"])
    for f in fits:
        c = [f"{v:.9g}" for v in f.chosen] + ([""] if f.operation == "training" else [])
        if f.operation == "power":   # a·x² + b·x + c watts with a = 0
            c = ["0", *c]
        note = (f"{'robust soft-L1' if f.has_outliers else 'least-squares'}"
                f"{' non-negative' if f.bounded is not None else ''} fit of {len(f.x)} points, "
                f"{f.x_name} {f.x.min():g}..{f.x.max():g}, R2 {r2_text(f.r2)}, weights {f.weighting}")
        w.writerow([f.device, task, f.operation, f.method, *c, note])
    return buf.getvalue()


def plot_fit(f: Fit):
    """A figure of the points, fitted curve (and robust fit when it differs) and residuals; the
    caller saves and closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, res) = plt.subplots(2, 1, figsize=(6.4, 5.6), dpi=110, sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    grid = np.linspace(f.x.min(), f.x.max(), 200)
    ax.scatter(f.x[~f.outliers], f.y[~f.outliers], s=12, label="measured")
    if f.has_outliers:
        ax.scatter(f.x[f.outliers], f.y[f.outliers], s=24, marker="x", color="tab:red", label="outlier")
        ax.plot(grid, np.polyval(f.robust, grid), "--", color="tab:green", label="robust fit")
    ax.plot(grid, np.polyval(f.coef, grid), color="tab:orange", label=f"least squares (R² {r2_text(f.r2)})")
    if f.bounded is not None:
        ax.plot(grid, np.polyval(f.bounded, grid), ":", color="tab:purple", label="coefficients >= 0 (the profile's)")
    ax.set_ylabel("watts" if f.operation == "power" else "seconds")
    ax.set_title(f"{f.device} / {f.method}")
    ax.legend()
    ax.grid(alpha=0.3)
    res.axhline(0, color="grey", linewidth=0.8)
    res.scatter(f.x, f.y - np.polyval(f.coef, f.x), s=10)
    res.set_xlabel(f"{f.x_name.replace('_', ' ')} ({'clients' if f.x_name == 'group_size' else 'samples'})")
    res.set_ylabel("residual (W)" if f.operation == "power" else "residual (s)")
    res.grid(alpha=0.3)
    fig.tight_layout()
    return fig
