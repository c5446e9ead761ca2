"""Plots of result tables (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from emulator.io import atomic_write  # noqa: E402

AXES = {"cost": "cumulative cost, Eq. 5 (device seconds)", "sim_time_s": "simulated wall-clock time (s)",
        "round": "global round", "accuracy": "test accuracy", "loss": "test loss"}


def plot_curves(results: pd.DataFrame, path: Path, x: str = "cost", y: str = "accuracy", title: str = "") -> Path:
    """One line per arm of ``y`` against ``x`` (the paper's accuracy-versus-cost figures)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for arm, df in results.groupby("arm", sort=False):
        ax.plot(df[x], df[y], marker="o", markersize=2.5, linewidth=1.4, label=str(arm))
    ax.set_xlabel(AXES.get(x, x))
    ax.set_ylabel(AXES.get(y, y))
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    atomic_write(Path(path), lambda p: fig.savefig(p, format="png"))
    plt.close(fig)
    return Path(path)
