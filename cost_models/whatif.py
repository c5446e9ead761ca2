"""What-if: Eq. 5's cost per global round across group sizes, without training or SimPy.

For each group size s, N clients (sample counts n_i drawn once) are split at random into groups
of s (the N mod s left over join groups, making some of size s + 1); each global round samples S
groups uniformly without replacement, and a sampled group g costs K Σ_{i∈g} (O_g(|g|) + E·H(n_i))
(Eq. 5), split into training and group operations — the table behind the paper's Fig. 2(a).
All per-group sums are vectorised; only the T per-round draws loop (numpy's Floyd sampling).

With a grouping policy (:func:`form_groups`, :func:`grouped_costs`) the groups are the ones the
policy builds on each edge's label counts (a user's label matrix or Dirichlet(α) edges), and a
sampling policy may draw them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from groupfel.errors import InputError

from .curves import Curve


@dataclass(frozen=True)
class Scenario:
    clients: int = 100_000
    samples_mean: float = 50.0
    samples_std: float | None = None      # default: Poisson spread around the mean
    rounds: int = 1000                    # T
    group_rounds: int = 5                 # K
    local_epochs: int = 2                 # E
    groups_per_round: int | None = None   # S; default: enough groups for `participation` of clients
    participation: float = 0.1
    seed: int = 0

    def __post_init__(self):
        for name in ("clients", "rounds", "group_rounds", "local_epochs"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.samples_mean <= 0 or not 0 < self.participation <= 1:
            raise InputError("--samples-mean must be > 0 and participation in (0, 1]")
        if self.groups_per_round is not None and self.groups_per_round < 1:
            raise InputError(f"--groups-per-round must be >= 1, got {self.groups_per_round}")

    def sample_counts(self) -> np.ndarray:
        rng = np.random.default_rng((self.seed, 0))
        n = (rng.poisson(self.samples_mean, self.clients) if self.samples_std is None
             else np.round(rng.normal(self.samples_mean, self.samples_std, self.clients)))
        return np.maximum(n, 1).astype(float)


def group_costs(s: int, n: np.ndarray, overhead: Curve, training: Curve, sc: Scenario,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, training cost, operation cost) of each group for one round of the Eq. 5 sum."""
    n_groups = len(n) // s
    sizes = np.full(n_groups, s) + (np.arange(n_groups) < len(n) - n_groups * s)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    h = training(rng.permutation(n))
    train = sc.group_rounds * sc.local_epochs * np.add.reduceat(h, starts)
    ops = sc.group_rounds * sizes * overhead(sizes)
    return sizes, train, ops


def sweep(group_sizes: list[int], overhead: Curve, training: Curve, sc: Scenario) -> pd.DataFrame:
    """One row per group size: mean (and std over rounds) cost per global round, and its split."""
    n = sc.sample_counts()
    rows = []
    for s in group_sizes:
        if not 1 <= s <= sc.clients:
            raise InputError(f"--group-sizes: {s} must be in 1..{sc.clients} (the number of clients)")
        rng = np.random.default_rng((sc.seed, 1, s))
        sizes, train, ops = group_costs(s, n, overhead, training, sc, rng)
        n_groups = len(sizes)
        S = sc.groups_per_round or max(1, round(sc.participation * sc.clients / s))
        S = min(S, n_groups)
        picks = np.stack([rng.choice(n_groups, S, replace=False) for _ in range(sc.rounds)])
        t_round, o_round = train[picks].sum(axis=1), ops[picks].sum(axis=1)
        total = t_round + o_round
        rows.append({"group_size": s, "groups": n_groups, "groups_per_round": S,
                     "clients_per_round": float(sizes[picks].sum(axis=1).mean()),
                     "per_client_overhead": float(overhead(s)),
                     "training_per_round": float(t_round.mean()), "operations_per_round": float(o_round.mean()),
                     "total_per_round": float(total.mean()), "total_per_round_std": float(total.std()),
                     "operations_share": float(o_round.sum() / total.sum()),
                     "total_all_rounds": float(total.sum())})
    return pd.DataFrame(rows)


def plot_sweep(df: pd.DataFrame, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    s = df["group_size"]
    ax.plot(s, df["total_per_round"], marker="o", ms=3, label="total")
    ax.plot(s, df["training_per_round"], marker="o", ms=3, label="training (E·H)")
    ax.plot(s, df["operations_per_round"], marker="o", ms=3, label="group operations (O_g)")
    ax.set_xlabel("group size |g| (clients)")
    ax.set_ylabel("cost per global round, Eq. 5 (device s)")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax2.plot(s, df["per_client_overhead"], marker="o", ms=3, color="tab:green")
    ax2.set_xlabel("group size |g| (clients)")
    ax2.set_ylabel("per-client overhead O_g(|g|) (s)")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_makespan(df: pd.DataFrame, path, title: str) -> None:
    """The shared edge's round: its makespan, one line per access capacity, and its Eq. 5 cost,
    against the size of the groups it actually forms (each point labelled groups × size); with
    ``edge_energy_j`` (``whatif --energy``) a third panel: its joules, one line per capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    energy = "edge_energy_j" in df
    fig, axes = plt.subplots(1, 3 if energy else 2, figsize=(17 if energy else 12, 4.6), dpi=110,
                             layout="constrained")
    ax, ax2 = axes[0], axes[1]
    mean_size = df["edge_group_sizes"].map(lambda t: np.mean([float(v) for v in str(t).split("-")]))
    for cap, part in df.assign(x=mean_size).groupby("access_mbps", dropna=False, sort=False):
        label = "dedicated links" if cap != cap else f"access {cap:g} Mbit/s"
        ax.plot(part["x"], part["makespan_s"], marker="o", ms=3.5, label=label)
        if energy:
            line = axes[2].plot(part["x"], part["edge_energy_j"], marker="o", ms=3.5, label=f"{label}: clients")
            if "edge_total_energy_j" in part:     # the edge server's joules on top of its clients'
                axes[2].plot(part["x"], part["edge_total_energy_j"], marker="s", ms=3.5, ls="--",
                             color=line[0].get_color(), label=f"{label}: clients + edge server")
    if energy:
        axes[2].set_xlabel("size of the groups the edge forms (clients)")
        who = "clients' (dashed: + its server's)" if "edge_total_energy_j" in df else "clients'"
        axes[2].set_ylabel(f"the edge's {who} energy per round (J),\ngroup-rounds: sampled clients in their group rounds")
        axes[2].set_title("energy: one line per access capacity", fontsize=9)
        axes[2].legend(fontsize=8)
        axes[2].grid(alpha=0.3)
    one = df.assign(x=mean_size).drop_duplicates("edge_group_sizes")
    last, gap = -np.inf, 0.05 * (one["x"].max() - one["x"].min())
    for x, y, g, s in zip(one["x"], df.loc[one.index, "makespan_s"], one["edge_groups"], one["edge_group_sizes"]):
        if x - last < gap:    # labels that would overlap: every point keeps its marker
            continue
        last = x
        ax.annotate(f"{g}×{s}", (x, y), textcoords="offset points", xytext=(0, 6), fontsize=6.5, ha="center",
                    color="0.35")
    ax.set_xlabel("size of the groups the edge forms (clients; labels: groups × size)")
    ax.set_ylabel("round makespan on the edge (simulated s)")
    ax.set_title("makespan: one line per access capacity", fontsize=9)
    ax.margins(x=0.06)    # room for the end points' labels
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax2.plot(one["x"], one["edge_cost"], marker="o", ms=3.5, color="tab:gray")
    ax2.set_xlabel("size of the groups the edge forms (clients)")
    ax2.set_ylabel("the edge's Eq. 5 cost per round (device s)")
    ax2.set_title("Eq. 5 cost (the same at every capacity)", fontsize=9)
    ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path)
    plt.close(fig)


# --- What-if with a real grouping policy ------------------------------------------------------------
# The random-group sweep above spreads clients evenly; a policy such as CoVG builds groups whose
# sizes depend on the data (MinGS 5, MaxCoV 0.5: sizes 5..13). Here every edge's clients are
# grouped by the policy itself and Eq. 5 is summed over the groups it actually built.

GroupEdge = Callable[[np.ndarray, np.random.Generator], list[np.ndarray]]


def dirichlet_label_counts(clients: int, labels: int, alpha: float, n: np.ndarray, seed: int) -> np.ndarray:
    """Clients × labels counts: each client's label mix ~ Dirichlet(α), its n_i samples drawn from it."""
    if not alpha > 0:
        raise InputError(f"--alpha must be > 0, got {alpha}")
    rng = np.random.default_rng((seed, 2))
    return rng.multinomial(n.astype(np.int64), rng.dirichlet(np.full(labels, alpha), size=clients))


def _group_one_edge(args) -> list[np.ndarray]:
    group_edge, counts, seed = args
    return group_edge(counts, np.random.default_rng(seed))


def form_groups(counts: np.ndarray, edges: np.ndarray, group_edge: GroupEdge, seed: int,
                jobs: int = 1) -> list[np.ndarray]:
    """Every edge's groups (global client ids); groups never cross edges. ``jobs`` > 1 groups the
    edges on a pool of forked processes (each edge is independent)."""
    ids = [np.flatnonzero(edges == e) for e in np.unique(edges)]
    work = [(group_edge, counts[m], (seed, int(e))) for e, m in zip(np.unique(edges), ids)]
    if jobs > 1 and len(work) > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(jobs, mp_context=get_context("fork")) as pool:   # numpy only: fork is safe
            local = list(pool.map(_group_one_edge, work, chunksize=max(1, len(work) // (4 * jobs))))
    else:
        local = [_group_one_edge(w) for w in work]
    return [m[np.sort(g)] for m, gs in zip(ids, local) for g in gs]


def grouped_costs(groups: list[np.ndarray], counts: np.ndarray, overhead: Curve, training: Curve, sc: Scenario,
                  log_p: Callable[[np.ndarray], np.ndarray] | None = None, cov=None) -> dict:
    """Eq. 5 per global round over the policy's groups: S groups drawn per round (uniformly, or by
    ``log_p(covs)`` — a sampling policy — without replacement, Gumbel-top-k), a sampled group
    costing K Σ_{i∈g} (O_g(|g|) + E·H(n_i)). One row of the what-if table."""
    n = counts.sum(axis=1).astype(float)
    order = np.concatenate(groups)
    sizes = np.array([len(g) for g in groups])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    train = sc.group_rounds * sc.local_epochs * np.add.reduceat(training(n[order]), starts)
    ops = sc.group_rounds * sizes * overhead(sizes)
    label_sums = np.add.reduceat(counts[order], starts, axis=0)
    covs = cov(label_sums) if cov is not None else np.full(len(groups), np.nan)
    G = len(groups)
    S = sc.groups_per_round or max(1, round(sc.participation * sizes.sum() / sizes.mean()))
    S = min(S, G)
    rng = np.random.default_rng((sc.seed, 1))
    if log_p is None:
        picks = np.stack([rng.choice(G, S, replace=False) for _ in range(sc.rounds)])
    else:
        lp = log_p(covs)
        picks = np.stack([np.argpartition(-(lp + rng.gumbel(size=G)), S - 1)[:S] for _ in range(sc.rounds)])
    t_round, o_round = train[picks].sum(axis=1), ops[picks].sum(axis=1)
    total = t_round + o_round
    return {"groups": G, "size_min": int(sizes.min()), "size_mean": float(sizes.mean()),
            "size_max": int(sizes.max()), "cov_mean": float(np.mean(covs)),
            "clients_grouped": int(sizes.sum()), "groups_per_round": S,
            "clients_per_round": float(sizes[picks].sum(axis=1).mean()),
            "training_per_round": float(t_round.mean()), "operations_per_round": float(o_round.mean()),
            "total_per_round": float(total.mean()), "total_per_round_std": float(total.std()),
            "operations_share": float(o_round.sum() / total.sum()), "total_all_rounds": float(total.sum())}


def plot_grouped(df: pd.DataFrame, axis: str, path, title: str) -> None:
    """Cost per round and its split against the varied axis (MinGS, MaxCoV or α), with the sizes
    the policy built."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    x = df[axis]
    ax.plot(x, df["total_per_round"], marker="o", ms=3, label="total")
    ax.plot(x, df["training_per_round"], marker="o", ms=3, label="training (E·H)")
    ax.plot(x, df["operations_per_round"], marker="o", ms=3, label="group operations (O_g)")
    unit = {"min_group_size": "MinGS (clients)", "max_cov": "max CoV (σ/μ of label counts)",
            "alpha": "Dirichlet α (no unit)"}.get(axis, axis)
    ax.set(xlabel=unit, ylabel="cost per global round, Eq. 5 (device s)")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax2.plot(x, df["size_mean"], marker="o", ms=3, label="mean")
    ax2.fill_between(x, df["size_min"], df["size_max"], alpha=0.2, label="min..max")
    ax2.set(xlabel=unit, ylabel="group size the policy built (clients)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
