"""The discriminator distances FedCollab's Table 2 world gives, and the coalitions they form, on
each setup: ``authors`` (base.toml: the authors' partition and their split of each client's samples
by label) and ``our-partition`` (our-partition.base.toml: our four types, random small clients, a
random split). The distances are those a run of the ``fedcollab`` arm computes (same world, same
seed stream, the authors' budget), so a run's distances.csv equals them. Appends one row per
(setup, seed) to discriminator-check.csv beside this file:

    python experiments/reproductions/fedcollab-table2/discriminator_check.py authors 0
    python experiments/reproductions/fedcollab-table2/discriminator_check.py our-partition 0
    python experiments/reproductions/fedcollab-table2/discriminator_check.py authors 0 200   # 200 hidden units

The third argument is the discriminators' hidden units (default: the setup's
``discriminator_hidden``, 32; the authors' MLPDivergenceEstimator has 200). Columns: the hidden
units, the large-small pairs whose label sets are disjoint (all 100 on both setups), their mean,
minimum and how many read at least 0.99; the mean over large pairs of one type and over small
pairs; the coalitions FedCollab's solver forms (C = 10, 100 runs from local training) and their
Eq. 10, beside Eq. 10 of the paper's coalitions {0-4}, {5-9}, {10-19}.
"""
from __future__ import annotations

import csv
import sys
import tomllib
from pathlib import Path

import numpy as np

from groupfel.emulator.config import parse_config
from groupfel.emulator.config.parse import check_modes
from groupfel.emulator.discriminator import DiscriminatorSpec, discriminator_distances, discriminator_features
from groupfel.emulator.rng import key
from groupfel.emulator.world import place_data
from groupfel.policies.fedcollab import fedcollab_optimize, objective
from groupfel.topologies import load_dataset

HERE = Path(__file__).parent
BASES = {"authors": "base.toml", "our-partition": "our-partition.base.toml"}


def check(setup: str, seed: int, hidden: int | None = None) -> dict:
    data = tomllib.loads((HERE / BASES[setup]).read_text()) | {"seed": seed}
    config = check_modes(data, parse_config(data))
    arm = next(a for a in data["arms"] if a["name"] == "fedcollab")
    g = arm["grouping"]
    hidden = hidden or g.get("discriminator_hidden", 32)
    spec = DiscriminatorSpec(rounds=g["discriminator_rounds"], selection=g["discriminator_selection"],
                             eval_every=g["discriminator_eval_every"], early_stop=g["discriminator_early_stop"],
                             lr=g["discriminator_lr"], local_steps=g["discriminator_local_steps"],
                             batch_size=g["discriminator_batch_size"], split=g.get("discriminator_split", "stratified"),
                             hidden=hidden)
    placed = place_data(config, load_dataset(config.data.dataset))
    d, topo = placed.dataset, placed.topology
    features = discriminator_features(d.x_train, d.y_train, d.num_classes)
    D, _, _ = discriminator_distances(features, list(topo.client_samples), key(seed, "discriminators", 0, 0), spec,
                                      d.y_train)
    has = topo.label_counts > 0
    large, small = np.arange(10), np.arange(10, 20)
    disjoint = [(i, j) for i in large for j in small if not (has[i] & has[j]).any()]
    ls = np.array([D[i, j] for i, j in disjoint])
    same_type = [D[i, j] for i in large for j in large if i < j and (has[i] == has[j]).all()]
    sizes = topo.n_samples.astype(float)
    p = fedcollab_optimize(sizes, D, g["capacity"], np.random.default_rng(seed), g.get("restarts", 100))
    paper = np.repeat([0, 1, 2], [5, 5, 10])
    return {"setup": setup, "seed": seed, "hidden": hidden, "disjoint_pairs": len(disjoint),
            "large_small_mean": round(float(ls.mean()), 4),
            "large_small_min": round(float(ls.min()), 4), "large_small_at_least_0_99": int((ls >= 0.99).sum()),
            "large_same_type_mean": round(float(np.mean(same_type)), 4),
            "small_mean": round(float(D[np.ix_(small, small)][~np.eye(10, dtype=bool)].mean()), 4),
            "coalitions": str([sorted(map(int, np.flatnonzero(p == c))) for c in np.unique(p)]),
            "eq10": round(objective(p, sizes, D, g["capacity"]), 4),
            "eq10_paper_coalitions": round(objective(paper, sizes, D, g["capacity"]), 4)}


if __name__ == "__main__":
    row = check(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
    out = HERE / "discriminator-check.csv"
    new = not out.exists()
    with out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)
    print(row)
