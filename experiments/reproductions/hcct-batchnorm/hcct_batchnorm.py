"""Does HCCT merge on the digit stand-in when the model has BatchNorm and the gradient vector is
the authors' (HCCT Table 4, Digit; finding 6 of the reproductions README)?

HCCT's authors train FedBN's Digit CNN (3 conv + 2 linear layers, each followed by BatchNorm) and
form each client's "gradient" from its whole state dict, so it holds the BatchNorm running means,
variances and batch counters beside the parameters. This script runs HCCT Alg. 1 on the
``hcct-table4-digit`` data (experiments/configs/hcct-digits.toml: 10 clients on two real digit
domains, α = 1, lr 0.1 × 0.995^t, batch 64, 5 local epochs) with that model, and at every epoch
partitions the clients (Alg. 2, from singletons) on two vectors of the same updates:

* ``params``: the trainable parameters only (what groupfel's emulator sends);
* ``state``: every state-dict entry, running statistics and ``num_batches_tracked`` included
  (the authors' vector).

Training follows the ``state`` partition (the authors' run). It prints, per epoch, the number of
groups each vector gives and the mean pairwise cosine similarity of the clients' vectors, and
writes them to a CSV. Plain torch, one thread, deterministic for a seed.

    python experiments/reproductions/hcct-batchnorm/hcct_batchnorm.py --seeds 0 1 2 --epochs 10 \
        --out experiments/reproductions/hcct-batchnorm/full

``client0/`` adds ``--bn-stats client0`` (a group's model takes client 0's BatchNorm statistics);
``authors/`` adds ``--bn-stats client0 --partition authors`` (Alg. 2 as the authors' code runs it,
its ĝ holding client 0's statistics too; one seed a run, the CSVs concatenated in seed order).
``full-20/`` is the same at Table 3's 20 epochs (``--seeds N --epochs 20``, one seed a run, the
CSVs concatenated in seed order).
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import torch
from torch import nn

from groupfel import experiments
from groupfel.emulator.config import load_config
from groupfel.emulator.models import build_model
from groupfel.emulator.world import build_world
from groupfel.policies.hcct import hcct_partition

CONFIG = Path(experiments.__file__).parent / "configs" / "hcct-digits.toml"


def digit_bn_cnn(channels: int, classes: int, side: int) -> nn.Module:
    """FedBN's Digit model (conv 64-64-128, 5×5, each + BatchNorm; linear 2048-512, each +
    BatchNorm) on groupfel's 16×16 images: the shipped ``digit-bn-cnn``, whose BatchNorm statistics
    are parameters without a gradient (they take no SGD step)."""
    return build_model("digit-bn-cnn", (channels, side, side), classes)


def flat_state(model: nn.Module, params_only: bool) -> torch.Tensor:
    if params_only:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad]).double()
    return torch.cat([v.detach().reshape(-1).double() for v in model.state_dict().values()])


def load_state(model: nn.Module, state: dict) -> None:
    model.load_state_dict({k: v.clone() for k, v in state.items()})


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, batch: int, lr: float,
          gen: torch.Generator) -> None:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for s in range(0, len(x), batch):
            idx = order[s:s + batch]
            if len(idx) < 2:          # BatchNorm needs two samples in training mode
                continue
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def mean_cosine(v: np.ndarray) -> float:
    u = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    c = u @ u.T
    return float(c[~np.eye(len(v), dtype=bool)].mean())


BN_STATS = ("mean", "client0")
PARTITIONS = ("ours", "authors")


def stat_mask(model: nn.Module) -> np.ndarray:
    """Which entries of the state-dict vector (:func:`flat_state`) are BatchNorm running statistics
    or batch counters: the keys the authors' ``FedWeightAvg`` does not average."""
    return np.concatenate([np.full(v.numel(), "running" in k or "num_batches_tracked" in k)
                           for k, v in model.state_dict().items()])


def authors_partition(g: np.ndarray, sizes: np.ndarray, alpha: float, stats: np.ndarray) -> list[list[int]]:
    """HCCT Alg. 2 from singletons as the authors' code runs it (utils/keyfunc.py ``user_cluster``,
    strategy hcct, cosine): every pass merges the pair of groups whose merged utility gains most over
    its members' recorded utilities, while that gain is above 0. A merged group's ĝ is
    ``FedWeightAvg`` of its members' vectors: the D_i-weighted mean of every entry but the BatchNorm
    statistics (``stats``), which are client 0's, member or not. A member's utility in it is
    −α/D_G + cos(g_j, ĝ); a client alone has −α/D_j + 1."""
    n = len(g)
    norms = np.maximum(np.linalg.norm(g, axis=1), 1e-8)
    u = {i: -alpha / sizes[i] + 1.0 for i in range(n)}
    groups = {i: [i] for i in range(n)}
    while True:
        best, gap, best_u = None, 0.0, None
        for ci, mi in groups.items():
            for cj, mj in groups.items():
                if cj >= ci:
                    continue
                members = mi + mj
                d = float(sizes[members].sum())
                gc = (sizes[members, None] * g[members]).sum(axis=0) / d
                gc[stats] = g[0][stats]
                cos = g[members] @ gc / np.maximum(norms[members] * np.linalg.norm(gc), 1e-8)
                new = {j: -alpha / d + float(c) for j, c in zip(members, cos)}
                gain = sum(new.values()) - sum(u[x] for x in mi) - sum(u[x] for x in mj)
                if gain > gap:
                    best, gap, best_u = (ci, cj), gain, new
        if best is None:
            return sorted(sorted(m) for m in groups.values())
        ci, cj = best
        groups[cj].extend(groups.pop(ci))
        u.update(best_u)


def average_states(trained: list[dict], members: list[int], sizes: np.ndarray, bn_stats: str = "mean") -> dict:
    """A group's state: the D_i-weighted mean of its members' trained states. BatchNorm's running
    statistics and batch counters are averaged too (``"mean"``, FedAvg of a state dict) or copied
    from client 0's state (``"client0"``, code: the HCCT authors' ``FedWeightAvg`` in models/Fed.py
    starts from a copy of the first trained client's state, client 0's after epoch 0, and averages
    only the entries without ``running`` or ``num_batches_tracked`` in their names). A group of one
    keeps its member's whole state (main_cluster.py copies ``w_locals[idxs_users[0]]``)."""
    if len(members) == 1:
        return {k: v.clone() for k, v in trained[members[0]].items()}
    w = torch.as_tensor(sizes[members] / sizes[members].sum(), dtype=torch.float64)
    avg = {}
    for k in trained[0]:
        if bn_stats == "client0" and ("running" in k or "num_batches_tracked" in k):
            avg[k] = trained[0][k].clone()
            continue
        stack = torch.stack([trained[i][k].double() for i in members])
        avg[k] = torch.tensordot(w, stack, dims=1).to(trained[0][k].dtype)
    return avg


def run(seed: int, epochs: int, alpha: float, bn_stats: str = "mean", partition: str = "ours") -> list[dict]:
    cfg = load_config(CONFIG).model_copy(update={"seed": seed})
    world = build_world(cfg)
    ds, topo, tc = world.dataset, world.topology, cfg.train
    x_all, y_all = torch.as_tensor(ds.x_train), torch.as_tensor(ds.y_train).long()
    data = [(x_all[idx], y_all[idx]) for idx in topo.client_samples]
    sizes = np.array([len(idx) for idx in topo.client_samples])
    n = len(data)
    torch.manual_seed(seed)
    model = digit_bn_cnn(x_all.shape[1], int(y_all.max()) + 1, x_all.shape[-1])
    states = [{k: v.clone() for k, v in model.state_dict().items()} for _ in range(n)]   # w_i^0
    groups = [[i] for i in range(n)]                                                      # Alg. 1: t = 0
    stats = stat_mask(model)
    rows = []
    for t in range(epochs):
        lr = tc.lr * tc.lr_decay ** t
        vec = {"params": [], "state": []}
        trained = []
        for i in range(n):
            load_state(model, states[i])
            before = {k: flat_state(model, k == "params") for k in vec}
            gen = torch.Generator().manual_seed(seed * 100_003 + t * 1_009 + i)
            train(model, *data[i], tc.local_epochs, tc.batch_size, lr, gen)
            for k in vec:
                vec[k].append(((before[k] - flat_state(model, k == "params")) / lr).numpy())
            trained.append({k: v.clone() for k, v in model.state_dict().items()})
        row = {"seed": seed, "epoch": t + 1}
        for k, v in vec.items():
            g = np.stack(v)
            if k == "state" and partition == "authors":
                part = authors_partition(g, sizes, alpha, stats)
            else:
                part = hcct_partition(g, sizes, alpha)                  # Alg. 2 from singletons
            row[f"groups_{k}"] = len(part)
            row[f"partition_{k}"] = sorted(sorted(p) for p in part)
            row[f"mean_cos_{k}"] = round(mean_cosine(g), 4)
        # Alg. 1 lines 14-19 on the authors' partition: a group's model is the D_i-weighted mean
        # of its members' trained state (BatchNorm statistics by ``bn_stats``)
        groups = row["partition_state"]
        for members in groups:
            avg = average_states(trained, members, sizes, bn_stats)
            for i in members:
                states[i] = avg
        # test error of each client's model on its local split
        errs = []
        for i in range(n):
            load_state(model, states[i])
            model.eval()
            idx = world.local_test[i]
            with torch.no_grad():
                pred = model(x_all[idx]).argmax(1)
            errs.append(float((pred != y_all[idx]).float().mean()))
        row["local_error_mean"] = round(float(np.mean(errs)), 4)
        rows.append(row)
        print(f"seed {seed} epoch {t + 1}: groups params {row['groups_params']} (cos {row['mean_cos_params']}), "
              f"state {row['groups_state']} (cos {row['mean_cos_state']}) {row['partition_state']}, "
              f"error {row['local_error_mean']}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--bn-stats", choices=BN_STATS, default="mean",
                    help="a group's BatchNorm running statistics: their mean (FedAvg of the state dict) or client "
                         "0's (client0: the HCCT authors' FedWeightAvg)")
    ap.add_argument("--partition", choices=PARTITIONS, default="ours",
                    help="Alg. 2 on the state-dict vector: ours (a group's ĝ the weighted mean of every entry) or "
                         "the authors' user_cluster (ĝ's BatchNorm statistics client 0's)")
    ap.add_argument("--out", type=Path, default=Path("results/hcct-batchnorm"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rows = [r for s in a.seeds for r in run(s, a.epochs, a.alpha, a.bn_stats, a.partition)]
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "hcct-batchnorm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
