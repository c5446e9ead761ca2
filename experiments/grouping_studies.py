"""The Group-FEL paper's grouping studies (Sec. 6.4) on synthetic Dirichlet label matrices.

* ``fig5``: grouping runtime against the number of clients on one edge, every policy.
* ``fig6``: average group CoV against average group overhead O_g over a MinGS sweep.
* ``fig7``: the label make-up of the groups each policy forms on one edge (stacked bars).

Each writes ``figN.csv`` and ``figN.png`` to the output directory. Label matrices come from
:func:`groupfel.topologies.dirichlet_partition` (Dir(α) label skew, 20..200 samples per client as in the
paper) over a synthetic label pool. HCCT has no gradients here, so Fig. 5 times it on surrogate
gradients (label distributions through a fixed random projection); the table says so.
"""
from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from tqdm import tqdm  # noqa: E402

from groupfel.cost_models import get_profile  # noqa: E402
from groupfel.errors import InputError  # noqa: E402
from groupfel.emulator.io import atomic_write  # noqa: E402
from groupfel.policies import EdgeView, groupings  # noqa: E402
from groupfel.policies.cov import cov_of_counts  # noqa: E402
from groupfel.policies.reference import covg_reference  # noqa: E402
from groupfel.topologies import client_sizes, dirichlet_partition, label_matrix  # noqa: E402

FIG5_SIZES = (100, 300, 1000, 3000, 10000)
# Largest edge each policy is timed on: beyond it a run takes minutes (or, for HCCT's N×N
# benefit matrix, gigabytes), so the table marks those sizes as skipped.
FIG5_LIMITS = {"covg-reference": 1000, "hcct": 1000, "hcct-e": 1000, "fedcollab": 3000}
STUDY_POLICIES = ("rg", "cdg", "kldg", "qcid", "covg", "fedcollab")
PROFILE = "raspberry-pi-4/cifar10-resnet"


def synthetic_label_matrix(n_clients: int, rng: np.random.Generator, n_labels: int = 10,
                           alpha: float = 0.1) -> np.ndarray:
    """Clients × labels counts: Dir(α) label skew, sample counts ~ N(110, 45) clipped to 20..200."""
    sizes = client_sizes(n_clients, 20, 200, 110, 45, rng)
    pool = np.repeat(np.arange(n_labels), int(np.ceil(sizes.sum() / n_labels * 1.5)) + 200)
    return label_matrix(pool, dirichlet_partition(pool, sizes, alpha, n_labels, rng), n_labels)


def surrogate_gradients(L: np.ndarray, dim: int = 256, seed: int = 0) -> np.ndarray:
    """Stand-in client gradients for timing HCCT: label distributions through a random projection."""
    P = L / L.sum(axis=1, keepdims=True)
    return P @ np.random.default_rng(seed).normal(size=(L.shape[1], dim))


def _save(fig, path: Path, rect=(0, 0, 1, 1)) -> None:
    fig.tight_layout(rect=rect)
    atomic_write(path, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda p: df.to_csv(p, index=False))


def fig5(out: Path, max_clients: int = 10000, seed: int = 0, min_group_size: int = 5,
         progress: bool = True) -> pd.DataFrame:
    """Runtime of every grouping policy (and the straightforward CoVG) vs clients per edge."""
    sizes = [s for s in FIG5_SIZES if s <= max_clients]
    if not sizes:
        raise InputError(f"--max-clients {max_clients}: fig5 times edges of {', '.join(map(str, FIG5_SIZES))} "
                         f"clients; give at least {FIG5_SIZES[0]}")
    rows = []
    names = [*sorted(groupings), "covg-reference"]
    bar = tqdm(total=len(sizes) * len(names), desc="fig5: timing groupings", unit="run", disable=not progress,
               dynamic_ncols=True)
    for n in sizes:
        L = synthetic_label_matrix(n, np.random.default_rng((seed, n)))
        grads = surrogate_gradients(L, seed=seed)
        for name in names:
            bar.set_postfix_str(f"{name} on {n} clients")
            bar.update()
            limit = FIG5_LIMITS.get(name)
            row = {"policy": name, "clients": n, "seconds": np.nan, "groups": np.nan, "note": ""}
            if limit is not None and n > limit:
                row["note"] = f"skipped: > {limit} clients takes too long"
                rows.append(row)
                continue
            pol = groupings.make("covg" if name == "covg-reference" else name, {"min_group_size": min_group_size})
            view = EdgeView(L, grads if pol.needs_gradients else None)
            rng = np.random.default_rng(seed)
            t0 = time.perf_counter()
            res = covg_reference(pol, view, rng) if name == "covg-reference" else pol.group(view, rng)
            row.update(seconds=time.perf_counter() - t0, groups=len(res.groups),
                       note="surrogate gradients (256-d projection of label distributions)" if pol.needs_gradients else "")
            rows.append(row)
    bar.close()
    df = pd.DataFrame(rows)
    _write_csv(df, out / "fig5.csv")
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for name, d in df.dropna(subset=["seconds"]).groupby("policy"):
        ax.plot(d["clients"], d["seconds"], marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="clients per edge (clients)", ylabel="grouping time (s)",
           title="Fig. 5: grouping runtime")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _save(fig, out / "fig5.png")
    return df


def fig6(out: Path, n_clients: int = 300, sizes=range(2, 21, 2), seed: int = 0) -> pd.DataFrame:
    """Average group CoV vs average group overhead O_g (secure aggregation, Raspberry Pi 4 curve)
    over a MinGS sweep. Per group: O_g(|g|) is what each member pays per group operation;
    the group pays |g|·O_g(|g|)."""
    og = get_profile(PROFILE).group_overhead["secagg"]
    L = synthetic_label_matrix(n_clients, np.random.default_rng((seed, 6)))
    rows = []
    for s in sizes:
        for name in STUDY_POLICIES:
            res = groupings.make(name, {"min_group_size": int(s)}).group(EdgeView(L), np.random.default_rng(seed))
            sz = np.array([len(g) for g in res.groups], dtype=float)
            covs = cov_of_counts(np.stack([L[g].sum(axis=0) for g in res.groups]))
            per_client = np.array([float(og(v)) for v in sz])
            rows.append({"policy": name, "min_group_size": int(s), "groups": len(sz), "size_mean": sz.mean(),
                         "avg_cov": covs.mean(), "avg_overhead_per_client": per_client.mean(),
                         "avg_overhead_per_group": (per_client * sz).mean()})
    df = pd.DataFrame(rows)
    _write_csv(df, out / "fig6.csv")
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for name, d in df.groupby("policy", sort=False):
        ax.plot(d["avg_overhead_per_client"], d["avg_cov"], marker="o", label=name)
    ax.set(xlabel="average group overhead O_g(|g|) per client (s)", ylabel="average group CoV (σ/μ)",
           title=f"Fig. 6: CoV vs overhead, MinGS {min(sizes)}..{max(sizes)}\n(secagg, {PROFILE})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, out / "fig6.png")
    return df


def fig7(out: Path, n_clients: int = 50, min_group_size: int = 5, seed: int = 0) -> pd.DataFrame:
    """The label make-up of every group each policy forms on one edge (MaxCoV 1.0 for CoVG)."""
    L = synthetic_label_matrix(n_clients, np.random.default_rng((seed, 7)))
    rows = []
    params = {"covg": {"max_cov": 1.0}}
    for name in STUDY_POLICIES:
        pol = groupings.make(name, {"min_group_size": min_group_size, **params.get(name, {})})
        res = pol.group(EdgeView(L), np.random.default_rng(seed))
        for gi, g in enumerate(res.groups):
            counts = L[g].sum(axis=0)
            cov = float(cov_of_counts(counts))
            rows += [{"policy": name, "group": gi, "size": len(g), "cov": cov, "label": lab, "count": int(c)}
                     for lab, c in enumerate(counts)]
    df = pd.DataFrame(rows)
    _write_csv(df, out / "fig7.csv")
    fig, axes = plt.subplots(1, len(STUDY_POLICIES), figsize=(3.2 * len(STUDY_POLICIES), 3.6), dpi=110)
    colors = plt.get_cmap("tab10").colors
    for ax, name in zip(axes, STUDY_POLICIES):
        d = df[df.policy == name].pivot(index="group", columns="label", values="count")
        bottom = np.zeros(len(d))
        for lab in d.columns:
            ax.bar(d.index, d[lab], bottom=bottom, color=colors[lab % 10], width=0.85)
            bottom += d[lab].to_numpy()
        avg = df[df.policy == name].groupby("group")["cov"].first().mean()
        ax.set(title=f"{name}: avgCoV {avg:.2f}", xlabel="group (index)", ylabel="samples" if ax is axes[0] else "")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    labels = sorted(df["label"].unique())
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=colors[lab % 10]) for lab in labels],
               [str(lab) for lab in labels], title="label", loc="center right", fontsize=8)
    _save(fig, out / "fig7.png", rect=(0, 0, 0.96, 1))
    return df
