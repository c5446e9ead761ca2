"""Plots of result tables (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from groupfel.emulator.io import atomic_write  # noqa: E402

AXES = {"cost": "cumulative cost, Eq. 5 (device seconds)", "sim_time_s": "simulated wall-clock time (s)",
        "round": "global round (rounds)", "accuracy": "test accuracy", "loss": "test loss",
        "local_error_mean": "mean local test error", "energy_j": "cumulative energy (J)"}
# what each cost.energy_accounting counts (every energy label names it)
ACCOUNTING = {"group-rounds": "sampled clients in their group rounds",
              "full-fleet": "every online client, idle between its work",
              "marginal": "above idle power"}


def energy_label(accounting: str) -> str:
    return f"cumulative energy (J), {accounting}: {ACCOUNTING.get(accounting, accounting)}"


def save_png(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG atomically (no half-written image), then close it."""
    atomic_write(Path(path), lambda p: fig.savefig(p, format="png"))
    plt.close(fig)
    return Path(path)


def plot_curves(results: pd.DataFrame, path: Path, x: str = "cost", y: str = "accuracy", title: str = "",
                xlabel: str | None = None) -> Path:
    """One line per arm of ``y`` against ``x`` (the paper's accuracy-versus-cost figures)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for arm, df in results.groupby("arm", sort=False):
        ax.plot(df[x], df[y], marker="o", markersize=2.5, linewidth=1.4, label=str(arm))
    ax.set_xlabel(xlabel or AXES.get(x, x))
    ax.set_ylabel(AXES.get(y, y))
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_png(fig, path)


def plot_bands(runs: dict[str, pd.DataFrame], path: Path, x: str = "cost", y: str = "accuracy",
               title: str = "", xlabel: str | None = None) -> Path:
    """Mean curve with its 95 % band per arm of each run (label -> rows with a ``seed`` column),
    on a common ``x`` grid (:func:`groupfel.experiments.stats.curves_on_grid`); one seed gives a bare line."""
    return save_png(band_figure(runs, x, y, title, xlabel), path)


SMALL_MULTIPLES = 4   # more series than this: one panel each, not one crowded plot


def band_figure(runs: dict[str, pd.DataFrame], x: str = "cost", y: str = "accuracy", title: str = "",
                xlabel: str | None = None):
    from .stats import curves_on_grid

    series = []
    for label, results in runs.items():
        if "seed" not in results:
            results = results.assign(seed=0)
        for arm, c in curves_on_grid(results, x, y).groupby("arm", sort=False):
            series.append((f"{label}: {arm}" if len(runs) > 1 else str(arm), c))
    many = len(series) > SMALL_MULTIPLES   # one panel per series, the others faint behind it
    cols = min(len(series), 3) if many else 1
    rows = -(-len(series) // cols) if many else 1
    fig, grid = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows) if many else (6.8, 4.4), dpi=120,
                             sharex=True, sharey=True, squeeze=False)
    panels = list(grid.flat)
    clipped = any(bool(c["clipped"].any()) for _, c in series if "clipped" in c)
    for i, (name, c) in enumerate(series):
        ax = panels[i] if many else panels[0]
        if many:
            for _, other in series:
                ax.plot(other[x], other[f"{y}_mean"], color="0.85", linewidth=0.8)
            ax.set_title(name, fontsize=8)
        n = int(c["seeds"].iloc[0])
        line, = ax.plot(c[x], c[f"{y}_mean"], linewidth=1.5, color=f"C{i % 10}",
                        label=f"{name} (mean of {n} seeds)" if n > 1 else name)
        if n > 1:
            ax.fill_between(c[x], c[f"{y}_ci95_low"], c[f"{y}_ci95_high"], color=line.get_color(), alpha=0.2,
                            linewidth=0)
    band = " (band: 95 % CI over seeds" + (", clipped to the range)" if clipped else ")")
    for j, ax in enumerate(panels):
        if j >= len(series):
            ax.set_visible(False)
            continue
        ax.grid(alpha=0.3)
        if j >= (len(series) if many else 1) - cols:   # the bottom row of panels names the x-axis
            ax.set_xlabel(xlabel or AXES.get(x, x))
        if j % cols == 0:
            ax.set_ylabel(AXES.get(y, y) + ("" if many else band), fontsize=8)   # the band note fits the height
    if many:
        fig.suptitle((title + ": " if title else "") + f"one panel per arm, grey: the others{band}", fontsize=9)
    else:
        panels[0].legend(fontsize=7)
        if title:
            panels[0].set_title(title)
    fig.tight_layout()
    return fig


def load_results(path: Path) -> pd.DataFrame:
    """Every evaluation row under a directory: a sweep or multi-seed run (runs.csv), a single-seed
    run (<arm>/results.csv) or one arm (results.csv). A sweep's arms are named ``<point>/<arm>``."""
    from groupfel.emulator.runfiles import load_csv
    from groupfel.errors import InputError

    path = Path(path)
    if (path / "runs.csv").exists():
        df = load_csv(path / "runs.csv")
        if "point" in df:
            df = df.assign(arm=df["point"].astype(str) + "/" + df["arm"].astype(str))
    else:
        files = sorted(path.glob("*/results.csv")) or sorted(path.glob("results.csv"))
        if not files:
            raise InputError(f"plot: no results.csv or runs.csv under {path}; give a run, sweep or arm directory")
        df = pd.concat([load_csv(f) for f in files], ignore_index=True)
    return df if "seed" in df else df.assign(seed=0)
