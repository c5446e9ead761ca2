"""Gantt-like timeline of one global round from an arm's ledger (start/end of every charge), and,
for a run on shared edges, its ``network.parquet``: every download, upload and edge-core hold,
with the time each group waited for a core."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from groupfel.errors import InputError


def load_round(arm_dir: Path, round_: int) -> pd.DataFrame:
    path = Path(arm_dir) / "ledger.parquet"
    if not path.exists():
        raise InputError(f"timeline: no ledger.parquet in {arm_dir}; give RUN_DIR/ARM of a finished run")
    led = pd.read_parquet(path)
    rows = led[led["round"] == round_]
    if rows.empty:
        have = sorted(led["round"].unique().tolist())
        raise InputError(f"--round {round_}: not in the ledger; rounds run: {have[0]}..{have[-1]} (numbered from 1)"
                         if have else
                         "timeline: the ledger is empty (no rounds were run)")
    return rows.astype({"component": str, "device": str})


def load_network(arm_dir: Path, round_: int) -> pd.DataFrame | None:
    """The round's transfers and core holds (a run with the shared-edge keys), else None."""
    path = Path(arm_dir) / "network.parquet"
    if not path.exists():
        return None
    net = pd.read_parquet(path)
    return net[net["round"] == round_]


def plot_timeline(rows: pd.DataFrame, path: Path, title: str, network: pd.DataFrame | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = rows[["edge", "group", "client"]].drop_duplicates().sort_values(["edge", "group", "client"])
    ypos = {c: i for i, c in enumerate(order["client"])}
    labels = [f"e{e} g{g} c{c}" for e, g, c in order.itertuples(index=False)]
    comps = sorted(rows["component"].unique(), key=lambda c: (c != "training", c))
    colors = dict(zip(comps, plt.get_cmap("tab10").colors))
    cores = network[network["kind"] == "core"] if network is not None else None
    edges = sorted(cores["edge"].unique()) if cores is not None else []
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.22 * (len(ypos) + len(edges)) + 1.2)), dpi=110)
    live = rows[rows["end"] > rows["start"]]
    for comp, part in live.groupby("component"):
        ax.barh([ypos[c] for c in part["client"]], part["end"] - part["start"], left=part["start"], height=0.7,
                color=colors[comp], label=comp)
    if network is not None:
        moves = network[network["kind"] != "core"]
        for kind, color in (("download", "0.55"), ("upload", "0.3")):
            part = moves[(moves["kind"] == kind) & moves["client"].isin(ypos)]
            if len(part):
                ax.barh([ypos[c] for c in part["client"]], part["end"] - part["start"], left=part["start"],
                        height=0.35, color=color, label=kind)
        for i, j in enumerate(edges):   # one row per edge: the groups' waits for a core, then their holds
            y = len(ypos) + i
            part = cores[cores["edge"] == j]
            ax.barh([y] * len(part), part["start"] - part["queued"], left=part["queued"], height=0.7,
                    color="tab:purple", alpha=0.3, label="waiting for a core" if i == 0 else None)
            ax.barh([y] * len(part), part["end"] - part["start"], left=part["start"], height=0.7, color="tab:purple",
                    edgecolor="white", label="edge aggregation" if i == 0 else None)
            labels.append(f"e{j} cores")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group round of each group: members, busy span, and the Eq. 5 charge."""
    g = rows.groupby(["edge", "group", "group_round"])
    return pd.DataFrame({"members": g["client"].nunique(), "start": g["start"].min(), "end": g["end"].max(),
                         "cost": g["amount"].sum()}).reset_index()
