"""Gantt-like timeline of one global round from an arm's ledger (start/end of every charge), and,
for a run on shared edges, its ``network.parquet``: every download, upload and edge-core hold,
with the time each group waited for a core."""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from groupfel.emulator.runfiles import damaged, load_parquet
from groupfel.errors import InputError

LEDGER_COLUMNS = ("round", "edge", "group", "group_round", "client", "component", "amount", "start", "end")
NETWORK_COLUMNS = ("kind", "round", "edge", "group", "group_round", "client", "queued", "start", "end")
OFFLINE = "offline"     # the ledger's zero charge of a client found offline (groupfel.emulator.network)

# one colour per component in every chart: the shipped components by name, any other by a hash of it
COLORS = {"training": "tab:blue", "secagg": "tab:orange", "scaffold-secagg": "tab:orange", "backdoor": "tab:green",
          "secagg-recovery": "tab:brown", "scaffold-secagg-recovery": "tab:brown", "aggregation": "tab:cyan"}
SPARE = ("tab:pink", "tab:olive", "tab:red", "gold", "tab:cyan", "darkseagreen")
CORE, WAIT, DOWN, UP = "tab:purple", "thistle", "0.7", "0.35"
MIN_WIDTH = 0.004       # a core hold is drawn at least this share of the round wide, so it shows at any scale


def color(component: str) -> str:
    return COLORS.get(component) or SPARE[zlib.crc32(component.encode()) % len(SPARE)]


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    df = load_parquet(path, "rerun the run to write it again")
    missing = [c for c in columns if c not in df]
    if missing:
        raise damaged(path, f"no column {missing[0]!r}", "rerun the run to write it again")
    return df


def load_round(arm_dir: Path, round_: int) -> pd.DataFrame:
    path = Path(arm_dir) / "ledger.parquet"
    if not path.exists():
        raise InputError(f"timeline: no ledger.parquet in {arm_dir}; give RUN_DIR/ARM of a finished run")
    led = _read(path, LEDGER_COLUMNS)
    rows = led[led["round"] == round_]
    if rows.empty:
        have = sorted(led["round"].unique().tolist())
        raise InputError(f"--round {round_}: not in the ledger; rounds run: {have[0]}..{have[-1]} (numbered from 1)"
                         if have else
                         "timeline: the ledger is empty (no rounds were run)")
    return rows.astype({"component": str})


def load_network(arm_dir: Path, round_: int) -> pd.DataFrame | None:
    """The round's transfers and core holds (a run with the shared-edge keys), else None."""
    path = Path(arm_dir) / "network.parquet"
    if not path.exists():
        return None
    net = _read(path, NETWORK_COLUMNS)
    return net[net["round"] == round_]


ENERGY_COLUMNS = ("round", "group", "client", "state", "seconds", "joules")


def load_energy(arm_dir: Path, round_: int) -> pd.DataFrame | None:
    """The round's joules per client and state (a run with cost.energy), else None."""
    path = Path(arm_dir) / "energy.parquet"
    if not path.exists():
        return None
    e = _read(path, ENERGY_COLUMNS)
    return e[e["round"] == round_]


def energy_accounting(arm_dir: Path) -> str:
    """The arm's ``cost.energy_accounting`` (its manifest's config)."""
    from groupfel.emulator.runfiles import load_json

    try:
        return load_json(Path(arm_dir) / "manifest.json")["config"]["cost"]["energy_accounting"]
    except (OSError, KeyError, TypeError, ValueError):
        return "group-rounds"


def battery_events(arm_dir: Path, round_: int) -> list[dict]:
    """Batteries that emptied or came back charged during the round (train.client_charge_w): the
    manifest's events from the round's start to its end."""
    from groupfel.emulator.runfiles import load_json

    try:
        net = load_json(Path(arm_dir) / "manifest.json")["network"]
        r = next(x for x in net["rounds"] if x["round"] == round_)
    except (OSError, KeyError, TypeError, ValueError, StopIteration):
        return []
    end = r["start_s"] + r["makespan_s"]
    return [e for e in net.get("battery_events", []) if r["start_s"] <= e["time_s"] <= end]


def site_energy(arm_dir: Path, round_: int) -> pd.DataFrame | None:
    """The round's joules (and grams) per edge server and the cloud, by state (cost.edge_power,
    cost.cloud_power), else None."""
    path = Path(arm_dir) / "server_energy.parquet"
    if not path.exists():
        return None
    e = _read(path, ("round", "site", "edge", "state", "joules"))
    e = e[e["round"] == round_]
    values = ["joules", *(["grams"] if "grams" in e else [])]
    table = e.pivot_table(index=["site", "edge"], columns="state", values="joules", aggfunc="sum", fill_value=0.0)
    table.columns = [f"{c}_j" for c in table.columns]
    table["total_j"] = table.sum(axis=1)
    if "grams" in values:
        table["grams"] = e.groupby(["site", "edge"])["grams"].sum()
    return table.reset_index()


def energy_per_client(energy: pd.DataFrame) -> pd.DataFrame:
    """One row per client of the round: joules in each state and in all. Idle outside the
    group rounds (``full-fleet``: charged with group -1) is its own column, ``idle_between_j``."""
    from groupfel.cost_models.power import STATES

    energy = energy.assign(state=energy["state"].astype(str))
    if "group" in energy:
        energy.loc[(energy["group"] < 0) & (energy["state"] == "idle"), "state"] = "idle_between"
    table = energy.pivot_table(index="client", columns="state", values="joules", aggfunc="sum", observed=True)
    table = table.reindex(columns=[s for s in (*STATES, "idle_between") if s in table.columns]).fillna(0.0)
    table.columns = [f"{c}_j" for c in table.columns]
    table["total_j"] = table.sum(axis=1)
    return table.reset_index()


def member_states(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (edge, group, group round, client): trained (it paid training), offline (it had left
    the group: no charge at all) or dropped (it trained, then left: no group operation charge
    while a member that stayed paid one), with the time each state is marked at."""
    key = ["edge", "group", "group_round", "client"]
    per = rows.groupby(key).agg(start=("start", "min"), end=("end", "max"))
    training = rows[rows["component"] == "training"].groupby(key)["amount"].sum()
    ops = rows[~rows["component"].isin(["training", OFFLINE])].groupby(key)["amount"].sum()
    per["trained"] = training.reindex(per.index).fillna(0) > 0
    per["offline"] = ~per["trained"]
    op = ops.reindex(per.index).fillna(0)
    someone_paid = op.groupby(level=[0, 1, 2]).transform("max") > 0
    per["dropped"] = per["trained"] & (op == 0) & someone_paid
    return per.reset_index()


def plot_timeline(rows: pd.DataFrame, path: Path, title: str, network: pd.DataFrame | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import save_png

    order = rows[["edge", "group", "client"]].drop_duplicates().sort_values(["edge", "group", "client"])
    ypos = {c: i for i, c in enumerate(order["client"])}
    labels = [f"e{e} g{g} c{c}" for e, g, c in order.itertuples(index=False)]
    cores = network[network["kind"] == "core"] if network is not None else None
    edges = sorted(cores["edge"].unique()) if cores is not None else []
    fig, ax = plt.subplots(figsize=(11, max(2.8, 0.22 * (len(ypos) + len(edges)) + 1.4)), dpi=110,
                           layout="constrained")
    live = rows[(rows["end"] > rows["start"]) & (rows["component"] != OFFLINE)]
    comps = sorted(live["component"].unique(), key=lambda c: (c != "training", c))
    for comp in comps:
        part = live[live["component"] == comp]
        ax.barh([ypos[c] for c in part["client"]], part["end"] - part["start"], left=part["start"], height=0.7,
                color=color(comp), label=comp)
    if network is not None:
        moves = network[network["kind"] != "core"]
        for kind, shade in (("download", DOWN), ("upload", UP)):
            part = moves[(moves["kind"] == kind) & moves["client"].isin(ypos)]
            if len(part):
                ax.barh([ypos[c] for c in part["client"]], part["end"] - part["start"], left=part["start"],
                        height=0.35, color=shade, label=kind)
    span = max(float(rows["end"].max()), float(network["end"].max()) if network is not None and len(network) else 0.0)
    for i, j in enumerate(edges):   # one row per edge: the groups' waits for a core, then their holds
        y = len(ypos) + i
        part = cores[cores["edge"] == j]
        waits = (cores["start"] > cores["queued"]).any()
        ax.barh([y] * len(part), part["start"] - part["queued"], left=part["queued"], height=0.7,
                color=WAIT, label="waiting for a core" if i == 0 and waits else None)
        ax.barh([y] * len(part), np.maximum(part["end"] - part["start"], MIN_WIDTH * span), left=part["start"],
                height=0.7, color=CORE, edgecolor="white", linewidth=0.5,
                label="edge aggregation (at least 0.4 % of the round wide)" if i == 0 else None)
        labels.append(f"e{j} cores")
    states = member_states(rows)
    for flag, at, marker, shade, text in (("offline", "start", "x", "tab:red", "offline: left the group"),
                                          ("dropped", "end", "v", "black", "dropped: update left out")):
        part = states[states[flag]]
        if len(part):
            ax.scatter(part[at], [ypos[c] for c in part["client"]], marker=marker, color=shade, s=28, zorder=3,
                       label=text)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)   # beside the bars
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.015)    # a mark at time 0 stays inside the axes
    return save_png(fig, path)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per group round of each group: the members who trained, those offline and dropped, busy
    span, and the Eq. 5 charge."""
    states = member_states(rows).groupby(["edge", "group", "group_round"])
    g = rows.groupby(["edge", "group", "group_round"])
    return pd.DataFrame({"members": states["trained"].sum(), "offline": states["offline"].sum(),
                         "dropped": states["dropped"].sum(), "start": g["start"].min(), "end": g["end"].max(),
                         "cost": g["amount"].sum()}).reset_index()
