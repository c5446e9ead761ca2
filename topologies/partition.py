"""Data placement: which training samples each client holds.

Scenarios (``[data] partition``), each deterministic from the generator it is given:

==================  ===========================================================  ======================
partition           what differs between clients                                  from
==================  ===========================================================  ======================
``dirichlet``       label shares q_i ~ Dir(α·1)                                   Group-FEL Sec. 7.1
``shards``          a few single-label shards each (100 shards over all clients)  HCCT Sec. 7.1 (CIFAR-10);
                    (``shards_deal = "authors"``: every sample, as their code)    HCCT authors' code
``label-shift``     label shares set per client type                              FedCollab Sec. 5.1
                    (``label_shift_deal = "authors"``: cluster4_k with a          FedCollab authors' code
                    stratified subsample and holdout, as their code)
``feature-shift``   images rotated by a per-type angle (±25°, ±155°)              FedCollab Sec. 5.1
``concept-shift``   labels permuted per client type                               FedCollab Sec. 5.1
==================  ===========================================================  ======================

Sample counts (``sizes``): ``normal`` clipped to [min, max] (Group-FEL paper: 20..200),
``uniform`` integers in [min, max] (the Group-FEL authors' code: randint(20, 201)), ``half-normal``
(HCCT's H(1), scaled to the mean); client types may fix their own count (FedCollab's large and
small clients).
"""
from __future__ import annotations

import numpy as np
from scipy import ndimage

from groupfel.errors import InputError

SIZE_KINDS = ("normal", "uniform", "half-normal")


def client_sizes(n_clients: int, min_size: int, max_size: int, mean: float, std: float,
                 rng: np.random.Generator, kind: str = "normal") -> np.ndarray:
    """Sample counts in [min_size, max_size]: ``normal`` N(mean, std²) rounded and clipped (the
    paper: 20..200); ``uniform`` integers drawn uniformly (the authors' randint(min, max + 1));
    ``half-normal`` mean·|z|/E|z| with z ~ N(0, 1) (HCCT's H(1), whose mean is then ``mean``),
    rounded and clipped."""
    if kind == "normal":
        raw = rng.normal(mean, std, n_clients)
    elif kind == "uniform":
        return rng.integers(min_size, max_size + 1, n_clients).astype(int)
    elif kind == "half-normal":
        raw = mean * np.abs(rng.standard_normal(n_clients)) / np.sqrt(2.0 / np.pi)
    else:
        raise ValueError(f"unknown size distribution {kind!r}; choose one of {SIZE_KINDS}")
    return np.clip(np.rint(raw), min_size, max_size).astype(int)


def _check_total(sizes: np.ndarray, n_available: int) -> None:
    if sizes.sum() > n_available:
        raise InputError(f"data: the clients need {int(sizes.sum())} samples but the training set has "
                         f"{n_available}; lower data.max_samples/mean_samples or the number of clients")


def dirichlet_partition(labels: np.ndarray, sizes: np.ndarray, alpha: float, num_classes: int,
                        rng: np.random.Generator, floor: bool = False) -> list[np.ndarray]:
    """Label skew: client i draws class proportions q_i ~ Dir(α·1) and n_i samples by q_i.

    Samples are drawn without replacement; when a class runs out, the client's remaining draws
    go to its other classes in proportion to q_i (then to any class left), so every client gets
    exactly n_i samples and no sample is given twice.

    ``floor`` follows the Group-FEL authors' code instead: client i gets floor(q_ic·n_i) samples
    of class c (fewer than n_i in all; at most what is left of the class, and at least one sample
    of its largest class so that no client is empty).
    """
    sizes = np.asarray(sizes, dtype=int)
    _check_total(sizes, len(labels))
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
        if floor:
            counts = np.minimum(np.floor(q * n).astype(int), avail)
            if counts.sum() == 0:
                counts[np.argmax(q * (avail > 0))] = 1
            need = 0
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


def shards_partition(labels: np.ndarray, sizes: np.ndarray, n_shards: int, num_classes: int,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Label shards (HCCT Sec. 7.1, CIFAR-10): ``n_shards`` shards of one class each, the classes
    dealt evenly (shard s has class s mod m, in random order); client i gets a number of shards
    proportional to ``sizes[i]`` (largest remainder, at least one), every shard holding
    round(Σ sizes / n_shards) samples drawn without replacement from its class."""
    sizes = np.asarray(sizes, dtype=float)
    n = len(sizes)
    if n_shards < n:
        raise InputError(f"data.n_shards: {n_shards} shards cannot give each of the {n} clients one; "
                         f"raise data.n_shards")
    shard_size = max(1, int(round(sizes.sum() / n_shards)))
    exact = 1 + sizes / sizes.sum() * (n_shards - n)
    counts = np.floor(exact).astype(int)
    counts[np.argsort(-(exact - counts), kind="stable")[: n_shards - counts.sum()]] += 1
    shard_class = rng.permutation(np.arange(n_shards) % num_classes)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    need = np.bincount(shard_class, minlength=num_classes) * shard_size
    short = np.flatnonzero(need > np.array([len(p) for p in pools]))
    if len(short):
        raise InputError(f"data: {n_shards} shards of {shard_size} samples need {int(need[short[0]])} samples "
                         f"of class {int(short[0])} but the training set has {len(pools[short[0]])}; "
                         f"lower data.mean_samples or raise data.n_shards")
    taken = np.zeros(num_classes, dtype=int)
    out, s = [], 0
    for k in counts:
        idx = []
        for c in shard_class[s:s + k]:
            idx.append(pools[c][taken[c]:taken[c] + shard_size])
            taken[c] += shard_size
        s += k
        out.append(np.sort(np.concatenate(idx)))
    return out


def authors_shards_partition(labels: np.ndarray, n_clients: int, n_shards: int, shard_samples: int | None,
                             rng: np.random.Generator) -> list[np.ndarray]:
    """Label shards as the HCCT authors' code deals them (``imbalanced`` in their utils/sampling.py,
    used for CIFAR-10): the first ``n_shards · shard_samples`` training samples (``shard_samples``
    unset: len(labels) // n_shards, their ``len(dataset) / 100``: 500 on CIFAR-10) sorted by label
    and cut into ``n_shards`` consecutive shards; client i gets floor(h_i / Σh · n_shards) shards
    (at least one), h_i half-normal, the shards drawn without replacement. Every sample of the
    training set is thus dealt at once (about 4,750 a client on CIFAR-10), and the train ratio is
    then taken over each client's whole share."""
    per = shard_samples if shard_samples is not None else len(labels) // n_shards
    if per < 1 or n_shards * per > len(labels):
        raise InputError(f"data.shard_samples: {n_shards} shards of {per} samples need {n_shards * per} samples "
                         f"but the training set has {len(labels)}; lower data.shard_samples or data.n_shards")
    h = np.abs(rng.standard_normal(n_clients))
    counts = np.maximum(np.floor(h / h.sum() * n_shards).astype(int), 1)
    if counts.sum() > n_shards:   # the authors' code fails here (np.random.choice of too few shards)
        raise InputError(f"data.n_shards: {n_shards} shards cannot give each of the {n_clients} clients at least "
                         f"one after the half-normal deal (it needs {int(counts.sum())}); raise data.n_shards")
    order = np.argsort(labels[: n_shards * per], kind="stable")
    shards = order.reshape(n_shards, per)
    drawn = rng.permutation(n_shards)
    out, s = [], 0
    for k in counts:
        out.append(np.sort(shards[drawn[s:s + k]].ravel()))
        s += k
    return out


def weighted_partition(labels: np.ndarray, sizes: np.ndarray, weights: np.ndarray, num_classes: int,
                       rng: np.random.Generator) -> list[np.ndarray]:
    """Client i gets exactly round(sizes[i]·w_i) samples of each label (largest remainder), with
    w_i the row ``weights[i]`` normalised: FedCollab's label shift (a per-type w) and the IID draw
    of its feature and concept shifts (uniform w). Drawn without replacement."""
    sizes = np.asarray(sizes, dtype=int)
    _check_total(sizes, len(labels))
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    taken = np.zeros(num_classes, dtype=int)
    out = []
    for n, w in zip(sizes, np.asarray(weights, dtype=float)):
        exact = n * w / w.sum()
        counts = np.floor(exact).astype(int)
        counts[np.argsort(-(exact - counts), kind="stable")[: n - counts.sum()]] += 1
        over = np.flatnonzero(taken + counts > np.array([len(p) for p in pools]))
        if len(over):
            raise InputError(f"data: the clients need more samples of class {int(over[0])} than the training set "
                             f"has ({len(pools[over[0]])}); lower the sample counts or the number of clients")
        out.append(np.sort(np.concatenate([pools[c][taken[c]:taken[c] + counts[c]] for c in range(num_classes)])))
        taken += counts
    return out


def fedcollab_types(partition: str, n_clients: int, num_classes: int, large: int, small: int) -> list[dict]:
    """FedCollab's four client types (Sec. 5.1) for ``n_clients`` (a quarter each; clients 0-9 of 20
    are "large" with ``large`` samples, 10-19 "small" with ``small``):

    * label-shift: types 0, 1 hold the first half of the labels, 2, 3 the second half; inside a
      half, type 0 (2) leans to its first labels (weights 3 → 1) and type 1 (3) to its last
      (1 → 3). So client 0 is closest to its own type, less close to type 1, disjoint from 2, 3.
    * feature-shift: rotations +25°, −25°, +155°, −155°.
    * concept-shift: type 0 keeps the labels; type 1 cycles the last 30 % of them (FedCollab: 14
      of 20 aligned); type 2 shifts every label by m/2 (none aligned with 0, 1); type 3 is type 2
      with its last 30 % cycled.
    """
    q, r = divmod(n_clients, 4)
    counts = [q + (i < r) for i in range(4)]
    sizes = [large, large, small, small]
    m, half = num_classes, num_classes // 2
    types = [{"clients": c, "samples": s} for c, s in zip(counts, sizes)]
    if partition == "label-shift":
        ramp = np.linspace(3.0, 1.0, half)
        for i, t in enumerate(types):
            w = np.zeros(m)
            lo = 0 if i < 2 else half
            w[lo:lo + half] = ramp if i % 2 == 0 else ramp[::-1]
            t["label_weights"] = w.tolist()
    elif partition == "feature-shift":
        for t, angle in zip(types, (25.0, -25.0, 155.0, -155.0)):
            t["rotation"] = angle
    elif partition == "concept-shift":
        tail = max(2, int(round(0.3 * m)))

        def cycle_tail(p):
            p = list(p)
            return p[:m - tail] + p[m - tail + 1:] + [p[m - tail]]

        shifted = [(c + half) % m for c in range(m)]
        for t, perm in zip(types, (list(range(m)), cycle_tail(range(m)), shifted, cycle_tail(shifted))):
            t["permutation"] = perm
    else:
        raise ValueError(f"no client types for partition {partition!r}")
    return types


def stratified_split(labels: np.ndarray, idx: np.ndarray, rates: list[float],
                     rng: np.random.Generator) -> list[np.ndarray]:
    """``idx`` cut into len(rates) parts that each keep its label distribution: label c's samples
    (shuffled) go to part k from int(n_c·Σ_{l<k} r_l + 0.49) to int(n_c·Σ_{l≤k} r_l + 0.49), the
    cumulative rounding of the FedCollab authors' ``stratified_split`` (code: baowenxuan/FedCollab
    src/partition/utils.py). With rates summing to 1 every sample lands in exactly one part."""
    idx = np.asarray(idx)
    y = labels[idx]
    classes = np.unique(y)
    cum = np.concatenate([[0.0], np.cumsum(rates)])
    out: list[list[np.ndarray]] = [[] for _ in rates]
    for c in classes:
        mine = rng.permutation(idx[y == c])
        cut = (cum * len(mine) + 0.49).astype(int)
        for k in range(len(rates)):
            out[k].append(mine[cut[k]:cut[k + 1]])
    return [np.sort(np.concatenate(p)) if p else np.empty(0, dtype=idx.dtype) for p in out]


def authors_label_shift(labels: np.ndarray, n_clients: int, num_classes: int, k: float, decay: float,
                        holdout: float, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """FedCollab's label shift as the authors' code deals it (code: baowenxuan/FedCollab
    example/label_shift/data_prepare.sh: ``--partition cluster4_0.25 --subsample clusterexp_2_5.0``;
    src/partition/cluster_partition.py, subsample.py, create_partition.py). Returns (train, test).

    * cluster4_k: four types of n/4 clients; type 0 holds labels {0: k, 1-3: 0.5}, type 1
      {1-3: 0.5, 4: k}, type 2 {5: k, 6-8: 0.5}, type 3 {6-8: 0.5, 9: k}, the share of all of a
      label's samples that the type's clients split evenly (cumulative rounding, + 0.49). Types
      0 and 1 share labels 1-3, types 2 and 3 share 6-8; the halves share none.
    * clusterexp_2_decay: the first half of the clients (types 0, 1) keep all their training
      share, the second half (types 2, 3) e^-decay of it.
    * Each client's samples are cut by label (:func:`stratified_split`) into training
      (1 − holdout)·q, unused (1 − holdout)·(1 − q) and local test ``holdout``.

    On Fashion-MNIST's 70,000 images (7,000 a label; the authors deal the training and test sets
    together) with k = 0.25, decay 5 and holdout 1/7, a large client trains on 2,100 samples
    (300 of its edge label, 600 of each shared one), a small client on 14 (2 + 3 × 4), and every
    client tests on 350: FedCollab Table 4's counts."""
    if n_clients % 4 or num_classes != 10:
        raise InputError(f"data.label_shift_deal = \"authors\": the authors' cluster4 deal needs 10 labels and a "
                         f"multiple of 4 clients (got {num_classes} labels, {n_clients} clients); use "
                         f"label_shift_deal = \"types\" or change the dataset or topology")
    h = 0.5
    cluster = np.array([[k, h, h, h, 0, 0, 0, 0, 0, 0],
                        [0, h, h, h, k, 0, 0, 0, 0, 0],
                        [0, 0, 0, 0, 0, k, h, h, h, 0],
                        [0, 0, 0, 0, 0, 0, h, h, h, k]])
    per = n_clients // 4
    share = np.repeat(cluster, per, axis=0) / per
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    counts = np.array([len(p) for p in pools])
    cum = np.vstack([np.zeros((1, num_classes), dtype=int),
                     (share.cumsum(axis=0) * counts + 0.49).astype(int)])
    keep = np.repeat(np.exp(-np.arange(2) * decay), n_clients // 2)
    train, test = [], []
    for i in range(n_clients):
        mine = np.concatenate([pools[c][cum[i, c]:cum[i + 1, c]] for c in range(num_classes)])
        part, _, held = stratified_split(labels, mine, [(1 - holdout) * keep[i], (1 - holdout) * (1 - keep[i]),
                                                        holdout], rng)
        if not len(part) or not len(held):
            raise InputError(f"data: the authors' label-shift deal leaves client {i} with {len(part)} training and "
                             f"{len(held)} test samples; lower data.subsample_decay or use a larger dataset")
        train.append(part)
        test.append(held)
    return train, test


def split_local(parts: list[np.ndarray], fraction: float, rng: np.random.Generator,
                count: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's samples split at random into (train, local test): the test split holds
    round(fraction·n_i) samples (at least one when ``fraction`` > 0, never all), or exactly
    ``count`` when given, so it follows the client's own distribution and is disjoint from its
    training samples."""
    train, test = [], []
    if count is not None and parts and min(len(p) for p in parts) <= count:
        raise InputError(f"data.test_samples = {count}: a client holds only {min(len(p) for p in parts)} "
                         "samples, which leaves none to train on; give every client more samples or lower it")
    for p in parts:
        k = count if count is not None else (
            0 if fraction <= 0 else min(len(p) - 1, max(1, int(round(fraction * len(p))))))
        order = rng.permutation(p)
        test.append(np.sort(order[:k]))
        train.append(np.sort(order[k:]))
    return train, test


def rotate_images(x: np.ndarray, degrees: float) -> np.ndarray:
    """Images (N, C, H, W) rotated counter-clockwise by ``degrees`` about their centre (bilinear,
    zero fill, same size): FedCollab's feature shift."""
    return ndimage.rotate(x, degrees, axes=(-1, -2), reshape=False, order=1, mode="constant",
                          cval=0.0).astype(x.dtype)


def apply_client_types(x: np.ndarray, y: np.ndarray, parts: list[list[np.ndarray]], client_type: np.ndarray,
                       types: list[dict]) -> tuple[np.ndarray, np.ndarray, list[list[np.ndarray]]]:
    """Give each client of a rotating or permuting type its own transformed copies of its samples.

    ``parts`` holds index lists into (x, y) (e.g. [train, test]), one entry per client each. The
    copies are appended to (x, y) and the client's indices point at them; clients whose type has
    no transform (or the identity) keep the original samples. Returns (x, y, parts)."""
    xs, ys = [x], [y]
    n = len(y)
    parts = [list(p) for p in parts]
    for k, t in enumerate(types):
        rot, perm = t.get("rotation"), t.get("permutation")
        if not rot and (perm is None or list(perm) == list(range(len(perm)))):
            continue
        for i in np.flatnonzero(client_type == k):
            for p in parts:
                idx = p[i]
                xi, yi = x[idx], y[idx]
                if rot:
                    xi = rotate_images(xi, rot)
                if perm is not None:
                    yi = np.asarray(perm, dtype=y.dtype)[yi]
                xs.append(xi)
                ys.append(yi)
                p[i] = np.arange(n, n + len(idx))
                n += len(idx)
    return np.concatenate(xs), np.concatenate(ys), parts
