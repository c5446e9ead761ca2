"""FedCollab (paper ``003``): coalitions minimising the FedCollab objective (FedCollab Eq. 10).

With α_ij = β_j / Σ_{l∈C} β_l inside a coalition C (FedCollab Eq. 9) and β_j = n_j / m, both
terms of Eq. 10 depend on a coalition only through its members:

    Σ_{i∈C} C/√m · sqrt(Σ_j α_ij²/β_j) = |C| · C_cap / √n_C                  (Eq. 7 summed)
    Σ_{i∈C} Σ_j α_ij D_ij            = (1/n_C) Σ_{i,j∈C} n_j D_ij

so L = Σ_C f(C) with f(C) = |C|·C_cap/√n_C + (1/n_C) Σ_{i,j∈C} n_j D_ij. Moving one client then
changes two coalitions only, and its gain over every target coalition is computed at once from
per-coalition sums (``np.bincount``), O(N) per client instead of re-evaluating Eq. 10.

The distance D is the total-variation distance between label distributions (labels are known
at the edge) by default, or, with ``distance = "discriminator"``, the estimates of FedCollab's
client discriminators (Alg. 1), which the clients train on their raw samples
(:mod:`groupfel.emulator.discriminator`) and the edge receives in ``EdgeView.distances``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .grouping import EdgeGrouping, EdgeView, GroupingPolicy, enforce_min_size, groupings


def tv_distance(label_counts: np.ndarray) -> np.ndarray:
    """Pairwise total-variation distance ½‖p_i − p_j‖₁ between the rows' label distributions."""
    L = np.asarray(label_counts, dtype=float)
    P = L / np.maximum(L.sum(axis=1, keepdims=True), 1.0)
    from scipy.spatial.distance import cdist   # slow to import; keeps `groupfel group` fast

    return 0.5 * cdist(P, P, "cityblock")


def coalition_cost(members, sizes: np.ndarray, D: np.ndarray, capacity: float) -> float:
    """f(C): one coalition's share of FedCollab Eq. 10 (see the module docstring)."""
    m = np.asarray(members, dtype=int)
    n_c = float(sizes[m].sum())
    return float(len(m) * capacity / np.sqrt(n_c) + (D[np.ix_(m, m)] @ sizes[m]).sum() / n_c)


def objective(assign: np.ndarray, sizes: np.ndarray, D: np.ndarray, capacity: float) -> float:
    """FedCollab Eq. 10 of the coalition assignment ``assign`` (client -> coalition label)."""
    return sum(coalition_cost(np.flatnonzero(assign == c), sizes, D, capacity) for c in np.unique(assign))


RESTART_INITS = ("local", "random")


def fedcollab_optimize(sizes: np.ndarray, D: np.ndarray, capacity: float, rng: np.random.Generator,
                       restarts: int = 100, max_sweeps: int = 100, init: str = "local") -> np.ndarray:
    """FedCollab Alg. 2, re-run ``restarts`` times with random client orders; the assignment of
    lowest Eq. 10 wins. With ``init = "local"`` every run starts from local training (p(i) = i,
    Line 1), as App. B.3 re-runs the solver 100 times and the authors' collab_opt.py keeps the
    best of 100 runs of solver.py's discrete_solver(init='local'); ``"random"`` (the earlier
    choice) starts runs after the first from random coalitions. A client moves (Lines 4-5) only
    when that strictly lowers Eq. 10, so each run converges within ``max_sweeps`` (solver.py's
    max_iter = 100)."""
    if init not in RESTART_INITS:
        raise ValueError(f"init must be one of {RESTART_INITS}, got {init!r}")
    n = len(sizes)
    sizes = sizes.astype(float)
    best, best_obj = np.arange(n), np.inf
    Dn = D * sizes[None, :]
    for run in range(restarts):
        # Line 1: local training; the runs differ only in their client orders (Line 3).
        p = np.arange(n) if run == 0 or init == "local" else rng.integers(int(np.sqrt(n)) + 1, size=n)
        cnt = np.bincount(p, minlength=n).astype(float)
        ntot = np.bincount(p, weights=sizes, minlength=n)
        same = p[:, None] == p[None, :]
        W = np.bincount(p, weights=(Dn * same).sum(axis=1), minlength=n)  # Σ_{i,j∈C} n_j D_ij per label
        with np.errstate(divide="ignore", invalid="ignore"):     # an empty label costs 0
            f = np.where(cnt > 0, cnt * capacity / np.sqrt(ntot) + W / ntot, 0.0)
        for _ in range(max_sweeps):
            moved = False
            for k in rng.permutation(n):                                          # Line 3
                own, nk = p[k], sizes[k]
                # What k adds to W when joining each coalition (D symmetric, D_kk = 0).
                link = nk * np.bincount(p, weights=D[k], minlength=n) + np.bincount(p, weights=Dn[k], minlength=n)
                cnt_o, n_o, W_o = cnt[own] - 1, ntot[own] - nk, W[own] - link[own]
                f_own = cnt_o * capacity / np.sqrt(n_o) + W_o / n_o if cnt_o > 0 else 0.0
                join = (cnt + 1) * capacity / np.sqrt(ntot + nk) + (W + link) / (ntot + nk)
                delta = join - f + (f_own - f[own])                               # Line 4: change of Eq. 10
                delta[own] = 0.0
                target = int(np.argmin(delta))                                    # Line 5
                if delta[target] < -1e-12 * (1.0 + abs(f[own])):
                    p[k] = target
                    cnt[own], ntot[own], W[own], f[own] = cnt_o, n_o, W_o, f_own
                    cnt[target] += 1
                    ntot[target] += nk
                    W[target] += link[target]
                    f[target] = join[target]
                    moved = True
            if not moved:                                                          # Line 2
                break
        obj = objective(p, sizes, D, capacity)
        if obj < best_obj - 1e-12:
            best, best_obj = p.copy(), obj
    return best


ABLATIONS = ("none", "ignore-quantities", "ignore-distances")


def set_partitions(n: int):
    """Every partition of range(n) as a label vector (restricted growth strings): Eq. 10's brute-force
    optimum for small N (21,147 partitions at N = 9)."""
    def rec(i, labels, k):
        if i == n:
            yield np.array(labels)
            return
        for c in range(k + 1):
            yield from rec(i + 1, labels + [c], max(k, c + 1))
    yield from rec(1, [0], 1)


@groupings.register("fedcollab")
@dataclass(frozen=True)
class FedCollabGrouping(GroupingPolicy):
    """FedCollab (FedCollab Eq. 10 minimised by FedCollab Alg. 2, run ``restarts`` times with
    random client orders, the best kept) on the total-variation distance of the clients' label
    distributions.

    ``restarts`` = 100 runs from local training (``restart_init = "local"``) as FedCollab App. B.3
    and the authors' collab_opt.py; ``restart_init = "random"`` with ``restarts = 3`` is the
    earlier choice (later runs from random coalitions).

    ``capacity`` is the model-capacity constant C of FedCollab Eq. 7 (the paper uses 8-10).
    The number of groups is FedCollab's own choice. With ``min_group_size`` > 1, coalitions
    smaller than MinGS are then merged, smallest first, into the coalition whose merge raises
    Eq. 10 least (:func:`groupfel.policies.grouping.enforce_min_size`); 1 (default) keeps the optimum.

    ``discriminator_selection = "best"`` reads each pair's distance as the best held-out score over
    evaluations every ``discriminator_eval_every`` rounds, stopping a pair after
    ``discriminator_early_stop`` evaluations without improvement, as the authors' disc_estimate.py
    (:mod:`groupfel.emulator.discriminator`); ``"final"`` (default) reads it after the last round.
    Each round a client takes ``discriminator_local_steps`` SGD steps of size ``discriminator_lr``
    on ``discriminator_batch_size`` of its training samples (0: all); the authors' disc.py takes
    one step on a minibatch of 32 at lr 0.01, for up to 2,000 rounds. ``discriminator_split =
    "stratified"`` (default) splits each client's samples by label as the authors' code: every
    client trains on half the edge's smallest client and holds out the rest; ``"random"`` draws
    the split at random (at most 64 training and 100 held-out samples a client). Each discriminator
    has ``discriminator_hidden`` hidden units (the authors' MLPDivergenceEstimator in
    src/collab/model.py: 200; 32 by default here).

    ``ablation`` runs FedCollab Sec. 5.5's variants (Table 3): ``"ignore-quantities"`` replaces
    the quantity distribution β by the uniform 1/N (every client weighs the mean sample count),
    ``"ignore-distances"`` replaces the off-diagonal distances by their average.
    """

    min_group_size: int = 1
    capacity: float = 10.0
    restarts: int = 100
    restart_init: str = "local"      # or "random" (runs after the first from random coalitions)
    distance: str = "label-tv"       # or "discriminator" (FedCollab Alg. 1)
    discriminator_rounds: int = 20   # T of Alg. 1
    discriminator_selection: str = "final"   # or "best": the authors' best evaluation, early stopping
    discriminator_eval_every: int = 10       # rounds between evaluations (disc.py --eval_rounds)
    discriminator_early_stop: int = 10       # evaluations without improvement (--early_stop); 0: never
    discriminator_lr: float = 0.5            # the discriminators' SGD step (disc.py --lr: 0.01)
    discriminator_local_steps: int = 2       # steps a client takes a round (disc.py --iters: 1)
    discriminator_batch_size: int = 0        # samples a step takes; 0: all of the client's (disc.py: 32)
    discriminator_split: str = "stratified"  # or "random" (module groupfel.emulator.discriminator)
    discriminator_hidden: int = 32           # hidden units (the authors' MLPDivergenceEstimator: 200)
    ablation: str = "none"           # FedCollab Sec. 5.5: "ignore-quantities" or "ignore-distances"

    @property
    def needs_distances(self) -> bool:
        return self.distance == "discriminator"

    def __post_init__(self):
        if not isinstance(self.min_group_size, int) or self.min_group_size < 1:
            raise ValueError(f"min_group_size must be an integer >= 1, got {self.min_group_size!r}")
        if not self.capacity >= 0:
            raise ValueError(f"capacity must be >= 0 (FedCollab Eq. 7's C), got {self.capacity!r}")
        if not isinstance(self.restarts, int) or self.restarts < 1:
            raise ValueError(f"restarts must be an integer >= 1, got {self.restarts!r}")
        if self.restart_init not in RESTART_INITS:
            raise ValueError(f"restart_init must be one of {RESTART_INITS}, got {self.restart_init!r}")
        if self.distance not in ("label-tv", "discriminator"):
            raise ValueError(f"distance must be 'label-tv' or 'discriminator', got {self.distance!r}")
        if not isinstance(self.discriminator_rounds, int) or self.discriminator_rounds < 1:
            raise ValueError(f"discriminator_rounds must be an integer >= 1, got {self.discriminator_rounds!r}")
        if self.discriminator_selection not in ("final", "best"):
            raise ValueError(f"discriminator_selection must be 'final' or 'best', got {self.discriminator_selection!r}")
        if not isinstance(self.discriminator_eval_every, int) or self.discriminator_eval_every < 1:
            raise ValueError(f"discriminator_eval_every must be an integer >= 1, got {self.discriminator_eval_every!r}")
        if not isinstance(self.discriminator_early_stop, int) or self.discriminator_early_stop < 0:
            raise ValueError(f"discriminator_early_stop must be an integer >= 0, got {self.discriminator_early_stop!r}")
        if not self.discriminator_lr > 0:
            raise ValueError(f"discriminator_lr must be > 0, got {self.discriminator_lr!r}")
        for name in ("discriminator_local_steps", "discriminator_batch_size", "discriminator_hidden"):
            value, least = getattr(self, name), 0 if name.endswith("batch_size") else 1
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if self.discriminator_split not in ("stratified", "random"):
            raise ValueError(f"discriminator_split must be 'stratified' or 'random', got {self.discriminator_split!r}")
        if self.ablation not in ABLATIONS:
            raise ValueError(f"ablation must be one of {ABLATIONS}, got {self.ablation!r}")

    def group(self, view: EdgeView, rng: np.random.Generator) -> EdgeGrouping:
        sizes = view.n_samples.astype(float)
        if np.any(sizes <= 0):
            raise ValueError("fedcollab: every client needs at least one sample (Eq. 7 divides by n)")
        if self.needs_distances:
            if view.distances is None:
                raise ValueError("fedcollab: distance = 'discriminator' needs the clients' discriminator "
                                 "estimates (EdgeView.distances); the emulator computes them, the group CLI cannot")
            D = view.distances
        else:
            D = tv_distance(view.label_counts)
        return self.group_with_distance(sizes, D, rng)

    def group_with_distance(self, sizes: np.ndarray, D: np.ndarray, rng: np.random.Generator) -> EdgeGrouping:
        """Group from an explicit distance matrix D (e.g. discriminator estimates of Alg. 1)."""
        if self.ablation == "ignore-quantities":      # β = 1/N: Eq. 10 sees equal sample counts
            sizes = np.full(len(sizes), sizes.mean())
        elif self.ablation == "ignore-distances" and len(sizes) > 1:   # off-diagonal D -> its average
            off = ~np.eye(len(sizes), dtype=bool)
            D = np.where(off, D[off].mean(), 0.0)
        p = fedcollab_optimize(sizes, D, self.capacity, rng, self.restarts, init=self.restart_init)
        groups = [list(map(int, np.flatnonzero(p == c))) for c in np.unique(p)]
        touched = 0
        if self.min_group_size > 1:
            groups, touched = enforce_min_size(
                groups, self.min_group_size, lambda m: coalition_cost(m, sizes, D, self.capacity))
        return EdgeGrouping([np.array(g, dtype=int) for g in groups], leftover_clients=touched)
