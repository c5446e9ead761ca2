"""FedCollab's client discriminators (FedCollab Alg. 1): pairwise distribution distances.

For every pair of clients (i, j) on an edge, a two-layer MLP on feature-label pairs (x, one-hot y)
learns to tell client i's samples (label 1) from client j's (label 0), trained federatedly: each
round both clients take ``local_steps`` full-batch steps from the shared weights on their own
training split, and the server averages the two. The distance is max(0, 2·BalAcc − 1) on the
clients' held-out samples (Alg. 1 Line 11, floored at 0 since a distance is not negative). Not
|2·BalAcc − 1|: taking the complement of a discriminator because it did worse than chance on the
held-out samples would select on them, and it doubled the bias of same-distribution pairs. Only
the distances reach the edge server.

Calibration. For clients that differ only in their label distributions (label shift), the
discriminator sees y, so the best one predicts "i" where p_i(y) > p_j(y) and the C-divergence is
the total variation ½Σ_y |p_i(y) − p_j(y)|. Each client splits its own samples (Alg. 1 Line 1).
``split = "stratified"`` (default) splits as the authors' DiscEstimateClient (code:
baowenxuan/FedCollab src/collab/disc_estimate.py): every client of the edge trains on half as many
samples as the edge's smallest client holds and validates on all the rest, both parts cut by label
(:func:`groupfel.topologies.partition.stratified_split`), so a client's held-out labels are the
labels it trained on. ``split = "random"`` draws ``train_fraction`` of a client's samples (at most
``m_train``) at random to train and validates on the rest (at most ``max_valid``): a client of 14
samples then holds out labels its 7 training samples lack, and the discriminator of a large and a
disjoint small client read 0.86 on average (minimum 0.29) on FedCollab's Table 2 where the
stratified split reads 1.00. The earlier defaults (every pair of an edge trained on the m of its smallest client,
m = 4 next to an 8-sample client; |2·BalAcc − 1|; the label block unscaled) read digits pairs of
100 samples per client with TV 0 / 0.5 / 1 as 0.01 / 0.28 / 0.64 on average over 3 seeds; these
defaults read them as 0.00 / 0.49 / 1.00 (tests/test_discriminator.py). The estimate cannot be
better than the held-out samples allow: with v per client, 2·BalAcc − 1 has a standard error of
about √(2/v)/2 (0.1 for v = 50).

Selection. ``selection = "final"`` (default) reads the distance once, from the model after the
last round. ``selection = "best"`` is the authors' disc_estimate.py (code: baowenxuan/FedCollab
src/collab/disc_estimate.py; example/label_shift/distance_estimate.sh runs it with
--eval_rounds 10 --early_stop 10): after every ``eval_every``-th round (from round 0) the pair's
2·BalAcc − 1 on the held-out samples is evaluated, the best over evaluations is kept, and a pair
stops after ``early_stop`` evaluations without improvement. The maximum of noisy evaluations is
biased upwards, so "best" reads same-distribution pairs higher than "final" does.

Budget. The defaults train ``rounds`` rounds of ``local_steps`` full-batch steps at ``lr``. The
authors' disc.py (code: example/label_shift/distance_estimate.sh: --lr 0.01 --rounds 2000
--eval_rounds 10 --early_stop 10, --iters 1 and --batch_size 32 by default) takes one SGD step on
one minibatch of 32 a round: ``batch_size`` > 0 draws each round's minibatch of each client
uniformly without replacement from its training samples (the authors' DataLoader deals shuffled
passes; the draws here are independent between rounds). A pair that stops early stops training:
each client is charged the rounds its pairs ran (the third value returned).

All pairs of a chunk train at once as one batched network (``torch.bmm``), so the O(N²)
discriminators cost O(N²) arithmetic but few Python steps.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from groupfel.topologies.partition import stratified_split

from .io import atomic_write
from .rng import seed_of, sub_key


SELECTIONS = ("final", "best")
SPLITS = ("stratified", "random")
CACHE_ENV = "GROUPFEL_CACHE"   # a folder for computed distances, or "off"


@dataclass(frozen=True)
class DiscriminatorSpec:
    rounds: int = 20          # T communication rounds of Alg. 1
    local_steps: int = 2      # full-batch steps per LocalUpdate
    lr: float = 0.5
    train_fraction: float = 0.5   # of each client's samples that train (Alg. 1 Line 1); the rest validate
    m_train: int = 64         # at most this many training samples per client
    hidden: int = 32
    max_valid: int = 100
    chunk: int = 256          # pairs trained together
    selection: str = "final"  # or "best": best held-out score over evaluations (the authors' code)
    eval_every: int = 10      # rounds between evaluations (selection = "best")
    early_stop: int = 10      # evaluations without improvement before a pair stops; 0: never
    batch_size: int = 0       # samples a step takes from each client; 0: all its training samples
    split: str = "stratified"  # or "random": train_fraction (≤ m_train) at random, ≤ max_valid held out

    def __post_init__(self):
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be >= 0 (0: full batch), got {self.batch_size!r}")

    def n_params(self, n_features: int) -> int:
        return n_features * self.hidden + self.hidden + self.hidden + 1


def _mlp(params, x):
    w1, b1, w2, b2 = params
    h = torch.relu(torch.baddbmm(b1.unsqueeze(1), x, w1))
    return torch.baddbmm(b2.unsqueeze(1), h, w2).squeeze(-1)


def _padded(parts: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, mask): ragged per-client index lists as one zero-padded tensor and its 0/1 mask."""
    width = max(len(p) for p in parts)
    idx, mask = torch.zeros(len(parts), width, dtype=torch.long), torch.zeros(len(parts), width)
    for k, p in enumerate(parts):
        idx[k, :len(p)] = torch.as_tensor(p, dtype=torch.long)
        mask[k, :len(p)] = 1.0
    return idx, mask


def _held_out_score(shared, features, valid, vmask, pi, pj) -> torch.Tensor:
    """2·BalAcc − 1 of each pair's discriminator on the two clients' held-out samples."""
    with torch.no_grad():
        hit_i = (_mlp(shared, features[valid[pi]]) > 0).float()
        hit_j = (_mlp(shared, features[valid[pj]]) <= 0).float()
        acc_i = (hit_i * vmask[pi]).sum(1) / vmask[pi].sum(1)
        acc_j = (hit_j * vmask[pj]).sum(1) / vmask[pj].sum(1)
    return acc_i + acc_j - 1.0


def split_samples(client_samples: list[np.ndarray], labels: np.ndarray | None, spec: DiscriminatorSpec,
                  rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's (training, held-out) samples for its discriminators, as ``spec.split`` says
    (module docstring)."""
    sizes = np.array([len(s) for s in client_samples])
    if spec.split == "random":
        m = np.clip((sizes * spec.train_fraction).astype(int), 1, np.minimum(spec.m_train, sizes - 1))
        order = [rng.permutation(s) for s in client_samples]
        return [o[:k] for o, k in zip(order, m)], [o[k:k + spec.max_valid] for o, k in zip(order, m)]
    if labels is None:
        raise ValueError("fedcollab discriminator: split = 'stratified' needs the samples' labels")
    half = sizes.min() / 2   # the authors' min_num_train / 2, the same for every client
    cuts = [split for s in client_samples
            for split in [stratified_split(labels, s, [half / len(s), 1 - half / len(s)], rng)]]
    short = [i for i, (t, v) in enumerate(cuts) if not len(t) or not len(v)]
    if short:
        raise ValueError(f"fedcollab discriminator: the stratified split leaves client {short[0]} of the edge without "
                         f"training or held-out samples (its smallest client holds {int(sizes.min())}); give every "
                         f"client more samples or use discriminator_split = 'random'")
    return [t for t, _ in cuts], [v for _, v in cuts]


def cache_dir() -> Path | None:
    """Where computed distances are kept: ``$GROUPFEL_CACHE/discriminators`` (``off``: nowhere),
    else ``$XDG_CACHE_HOME/groupfel/discriminators`` (default ``~/.cache``)."""
    where = os.environ.get(CACHE_ENV, "")
    if where.lower() == "off":
        return None
    root = Path(where) if where else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "groupfel"
    return root / "discriminators"


def _cache_key(features: torch.Tensor, client_samples: list[np.ndarray], seed: tuple[int, ...],
               spec: DiscriminatorSpec, labels: np.ndarray | None) -> str:
    """A digest of everything the distances depend on: the rows and labels of the clients' samples
    (nothing else of the dataset is read), each client's sample list, the seed, the settings, this
    module's code, torch's version and its thread count (a matrix product's last bits follow it)."""
    h = hashlib.sha256()
    every = np.concatenate([np.asarray(s, dtype=np.int64) for s in client_samples])
    for part in (Path(__file__).read_bytes(), torch.__version__, torch.get_num_threads(), repr(seed),
                 repr(asdict(spec)), [len(s) for s in client_samples], every,
                 features[torch.as_tensor(every)].contiguous().numpy(),
                 None if labels is None else np.asarray(labels)[every]):
        h.update(part if isinstance(part, bytes) else
                 np.ascontiguousarray(part).tobytes() if isinstance(part, np.ndarray) else repr(part).encode())
        h.update(b"|")
    return h.hexdigest()


def discriminator_distances(features: torch.Tensor, client_samples: list[np.ndarray], seed: tuple[int, ...],
                            spec: DiscriminatorSpec = DiscriminatorSpec(),
                            labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(clients × clients distance matrix, samples of each client a step passes over, rounds each
    client trained, summed over its pairs). ``labels`` (of the samples ``client_samples`` index)
    is needed by the stratified split.

    The result is kept in :func:`cache_dir` under a digest of all it depends on, so runs of one
    world, seed and discriminator settings (FedCollab Table 1's seven algorithms) train the
    discriminators once; a kept result is the computed one, byte for byte. An unreadable or
    unwritable cache only costs the training."""
    n = len(client_samples)
    sizes = np.array([len(s) for s in client_samples])
    if n < 2:
        return np.zeros((n, n)), np.zeros(n, dtype=int), np.zeros(n)
    if sizes.min() < 2:
        raise ValueError("fedcollab discriminator: every client needs >= 2 samples (train and validate)")
    where = cache_dir()
    path = where / f"{_cache_key(features, client_samples, seed, spec, labels)}.npz" if where else None
    if path is not None and path.exists():
        try:
            with np.load(path) as kept:
                return kept["D"], kept["m"], kept["ran"]
        except (OSError, ValueError, KeyError, EOFError):   # a damaged entry: train again and replace it
            pass
    D, m, ran = _train_distances(features, client_samples, seed, spec, labels)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda tmp: _save(tmp, D=D, m=m, ran=ran))
        except OSError:
            pass
    return D, m, ran


def _save(path: Path, **arrays: np.ndarray) -> None:
    with open(path, "wb") as f:   # a file object: np.savez would add ".npz" to a path's name
        np.savez(f, **arrays)


def _train_distances(features: torch.Tensor, client_samples: list[np.ndarray], seed: tuple[int, ...],
                     spec: DiscriminatorSpec, labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`discriminator_distances` computed: every pair's discriminator trained (Alg. 1)."""
    n = len(client_samples)
    trains, valids = split_samples(client_samples, labels, spec, np.random.default_rng(sub_key(seed, "discriminator-split")))
    m = np.array([len(t) for t in trains])
    train, tmask = _padded(trains)
    valid, vmask = _padded(valids)
    gen = torch.Generator().manual_seed(seed_of(sub_key(seed, "discriminator-init")))
    batches = torch.Generator().manual_seed(seed_of(sub_key(seed, "discriminator-batches")))
    nf, h = features.shape[1], spec.hidden
    D, ran = np.zeros((n, n)), np.zeros(n)
    pairs = np.array(list(combinations(range(n), 2)))
    for c in range(0, len(pairs), spec.chunk):
        pi, pj = (torch.as_tensor(a) for a in pairs[c:c + spec.chunk].T)
        P = len(pi)
        shared = [torch.randn(P, nf, h, generator=gen) / nf ** 0.5, torch.zeros(P, h),
                  torch.randn(P, h, 1, generator=gen) / h ** 0.5, torch.zeros(P, 1)]
        x = torch.cat([features[train[pi]], features[train[pj]]])                  # (2P, max m, F)
        real = torch.cat([tmask[pi], tmask[pj]])
        w = real / real.sum(1, keepdim=True)                                        # each client's mean loss
        y = torch.cat([torch.ones(P, w.shape[1]), torch.zeros(P, w.shape[1])])      # client i -> 1
        best = torch.full((P,), -torch.inf)
        stale, active = torch.zeros(P, dtype=torch.long), torch.ones(P, dtype=torch.bool)
        rounds = torch.zeros(P)
        for r in range(spec.rounds):
            rounds += active.float()
            if spec.batch_size:   # this round's minibatch: the batch_size real samples of lowest random key
                keys = torch.rand(real.shape, generator=batches).masked_fill(real == 0, 2.0)
                pick = (keys.argsort(1).argsort(1) < spec.batch_size) & (real > 0)
                w = pick / pick.sum(1, keepdim=True)
            local = [p.repeat(2, *[1] * (p.dim() - 1)).requires_grad_() for p in shared]
            for _ in range(spec.local_steps):                                       # LocalUpdate
                loss = (F.binary_cross_entropy_with_logits(_mlp(local, x), y, reduction="none") * w).sum()
                grads = torch.autograd.grad(loss, local)
                with torch.no_grad():
                    local = [(p - spec.lr * g).requires_grad_() for p, g in zip(local, grads)]
            shared = [(p[:P] + p[P:]).detach() / 2 for p in local]                  # server average
            if spec.selection == "best" and r % spec.eval_every == 0:
                score = _held_out_score(shared, features, valid, vmask, pi, pj)
                better = score > best
                best = torch.where(active & better, score, best)
                stale = torch.where(active, torch.where(better, 0, stale + 1), stale)
                if spec.early_stop > 0:
                    active &= stale < spec.early_stop
                    if not active.any():
                        break
        score = best if spec.selection == "best" else _held_out_score(shared, features, valid, vmask, pi, pj)
        d = score.clamp(min=0.0).numpy()                                            # 2·BalAcc − 1, ≥ 0
        D[pi.numpy(), pj.numpy()] = D[pj.numpy(), pi.numpy()] = d
        np.add.at(ran, pi.numpy(), rounds.numpy())
        np.add.at(ran, pj.numpy(), rounds.numpy())
    return D, (np.minimum(m, spec.batch_size) if spec.batch_size else m), ran


def discriminator_features(x: np.ndarray, y: np.ndarray, num_classes: int) -> torch.Tensor:
    """Feature-label pairs (flattened x, one-hot y): the discriminator sees both, so it catches
    feature, label and concept shift. The one-hot block is scaled to the root-mean-square norm of
    the x block, so both carry the same weight: at scale 1 the label (10 of 74 inputs on digits)
    was drowned by the pixels and a TV-0.5 label shift read 0.42 on average, at equal norm 0.48."""
    flat = torch.as_tensor(x.reshape(len(x), -1), dtype=torch.float32)
    scale = float(torch.sqrt(torch.mean(torch.sum(flat ** 2, dim=1))))
    return torch.cat([flat, scale * F.one_hot(torch.as_tensor(y), num_classes).float()], dim=1)
