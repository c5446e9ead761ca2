"""Data placement: which training samples each client holds."""
from __future__ import annotations

import numpy as np

from emulator.errors import InputError


def client_sizes(n_clients: int, min_size: int, max_size: int, mean: float, std: float,
                 rng: np.random.Generator) -> np.ndarray:
    """Normally distributed sample counts clipped to [min_size, max_size] (the paper: 20..200)."""
    return np.clip(np.rint(rng.normal(mean, std, n_clients)), min_size, max_size).astype(int)


def dirichlet_partition(labels: np.ndarray, sizes: np.ndarray, alpha: float, num_classes: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew: client i draws class proportions q_i ~ Dir(α·1) and n_i samples by q_i.

    Samples are drawn without replacement; when a class runs out, the client's remaining draws
    go to its other classes in proportion to q_i (then to any class left), so every client gets
    exactly n_i samples and no sample is given twice.
    """
    sizes = np.asarray(sizes, dtype=int)
    if sizes.sum() > len(labels):
        raise InputError(f"data: the clients need {int(sizes.sum())} samples but the training set has "
                         f"{len(labels)}; lower data.max_samples/mean_samples or the number of clients")
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    avail = np.array([len(p) for p in pools])
    taken = np.zeros(num_classes, dtype=int)
    out = []
    for n in sizes:
        q = rng.dirichlet(np.full(num_classes, alpha))
        if not np.all(np.isfinite(q)) or q.sum() <= 0:  # tiny α can underflow every component
            q = np.eye(num_classes)[rng.integers(num_classes)]
        counts = np.zeros(num_classes, dtype=int)
        need = int(n)
        while need > 0:
            left = avail - counts
            w = q * (left > 0)
            if w.sum() <= 0:
                w = (left > 0).astype(float)
            draw = np.minimum(rng.multinomial(need, w / w.sum()), left)
            counts += draw
            need -= int(draw.sum())
        idx = [pools[c][taken[c]:taken[c] + counts[c]] for c in range(num_classes)]
        taken += counts
        avail -= counts
        out.append(np.sort(np.concatenate(idx)))
    return out


def label_matrix(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """The clients × labels count matrix L of Sec. 4.2."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]).astype(np.int64)
