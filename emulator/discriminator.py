"""FedCollab's client discriminators (FedCollab Alg. 1): pairwise distribution distances.

For every pair of clients (i, j) on an edge, a two-layer MLP on feature-label pairs (x, one-hot y)
learns to tell client i's samples (label 1) from client j's (label 0), trained federatedly: each
round both clients take ``local_steps`` full-batch steps from the shared weights on their own
``m_train`` samples, and the server averages the two. The distance is |2·BalAcc − 1| on the
clients' held-out samples (Alg. 1 Line 11; the absolute value because the C-divergence of Eq. 8
maximises over a discriminator and its complement). Only the distances reach the edge server.

All pairs of a chunk train at once as one batched network (``torch.bmm``), so the O(N²)
discriminators cost O(N²) arithmetic but few Python steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DiscriminatorSpec:
    rounds: int = 20          # T communication rounds of Alg. 1
    local_steps: int = 2      # full-batch steps per LocalUpdate
    lr: float = 0.5
    m_train: int = 16         # training samples per client (the rest validate, up to max_valid)
    hidden: int = 32
    max_valid: int = 100
    chunk: int = 256          # pairs trained together

    def n_params(self, n_features: int) -> int:
        return n_features * self.hidden + self.hidden + self.hidden + 1


def _mlp(params, x):
    w1, b1, w2, b2 = params
    h = torch.relu(torch.baddbmm(b1.unsqueeze(1), x, w1))
    return torch.baddbmm(b2.unsqueeze(1), h, w2).squeeze(-1)


def discriminator_distances(features: torch.Tensor, client_samples: list[np.ndarray], seed: tuple[int, ...],
                            spec: DiscriminatorSpec = DiscriminatorSpec()) -> tuple[np.ndarray, int]:
    """(clients × clients distance matrix, training samples m used per client per step)."""
    n = len(client_samples)
    sizes = np.array([len(s) for s in client_samples])
    if n < 2:
        return np.zeros((n, n)), 0
    if sizes.min() < 2:
        raise ValueError("fedcollab discriminator: every client needs >= 2 samples (train and validate)")
    m = int(min(spec.m_train, sizes.min() // 2))
    rng = np.random.default_rng((*seed, 7))
    order = [rng.permutation(s) for s in client_samples]
    train = torch.as_tensor(np.stack([o[:m] for o in order]), dtype=torch.long)
    v = min(spec.max_valid, int(sizes.max()) - m)
    valid = torch.zeros(n, v, dtype=torch.long)
    vmask = torch.zeros(n, v)
    for k, o in enumerate(order):
        rest = o[m:m + v]
        valid[k, :len(rest)] = torch.as_tensor(rest)
        vmask[k, :len(rest)] = 1.0
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence((*seed, 8)).generate_state(1)[0]))
    nf, h = features.shape[1], spec.hidden
    D = np.zeros((n, n))
    pairs = np.array(list(combinations(range(n), 2)))
    for c in range(0, len(pairs), spec.chunk):
        pi, pj = (torch.as_tensor(a) for a in pairs[c:c + spec.chunk].T)
        P = len(pi)
        shared = [torch.randn(P, nf, h, generator=gen) / nf ** 0.5, torch.zeros(P, h),
                  torch.randn(P, h, 1, generator=gen) / h ** 0.5, torch.zeros(P, 1)]
        x = torch.cat([features[train[pi]], features[train[pj]]])                  # (2P, m, F)
        y = torch.cat([torch.ones(P, m), torch.zeros(P, m)])                        # client i -> 1
        for _ in range(spec.rounds):
            local = [p.repeat(2, *[1] * (p.dim() - 1)).requires_grad_() for p in shared]
            for _ in range(spec.local_steps):                                       # LocalUpdate
                loss = F.binary_cross_entropy_with_logits(_mlp(local, x), y, reduction="sum") / m
                grads = torch.autograd.grad(loss, local)
                with torch.no_grad():
                    local = [(p - spec.lr * g).requires_grad_() for p, g in zip(local, grads)]
            shared = [(p[:P] + p[P:]).detach() / 2 for p in local]                  # server average
        with torch.no_grad():
            hit_i = (_mlp(shared, features[valid[pi]]) > 0).float()
            hit_j = (_mlp(shared, features[valid[pj]]) <= 0).float()
            acc_i = (hit_i * vmask[pi]).sum(1) / vmask[pi].sum(1)
            acc_j = (hit_j * vmask[pj]).sum(1) / vmask[pj].sum(1)
        d = (acc_i + acc_j - 1.0).abs().numpy()                                     # |2·BalAcc − 1|
        D[pi.numpy(), pj.numpy()] = D[pj.numpy(), pi.numpy()] = d
    return D, m


def discriminator_features(x: np.ndarray, y: np.ndarray, num_classes: int) -> torch.Tensor:
    """Feature-label pairs (flattened x, one-hot y): the discriminator sees both, so it catches
    feature, label and concept shift."""
    flat = torch.as_tensor(x.reshape(len(x), -1), dtype=torch.float32)
    return torch.cat([flat, F.one_hot(torch.as_tensor(y), num_classes).float()], dim=1)
