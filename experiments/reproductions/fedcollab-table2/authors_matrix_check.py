"""The authors' own saved distance matrix for Table 2 (their disc.py's estimate on their partition,
data, discriminator and solver seeds all 0; vendored with its source in
``tests/fixtures/fedcollab-authors-fmnist-divergence.csv``, clipped at 0 as their collab_opt.py
clips it), read as ``discriminator_check.py`` reads ours: appends its row (setup
``authors-saved-matrix``, 200 hidden units, the authors' width) to discriminator-check.csv.

    python experiments/reproductions/fedcollab-table2/authors_matrix_check.py
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from groupfel.policies.fedcollab import fedcollab_optimize, objective

HERE = Path(__file__).parent
MATRIX = HERE.parents[2] / "tests" / "fixtures" / "fedcollab-authors-fmnist-divergence.csv"
CAPACITY, RESTARTS = 10.0, 100   # base.toml's fedcollab arm


def check() -> dict:
    D = np.loadtxt(MATRIX, delimiter=",", comments="#", skiprows=6).clip(min=0.0)
    large, small = np.arange(10), np.arange(10, 20)
    ls = D[np.ix_(large, small)].ravel()   # every large-small pair has disjoint labels on this partition
    same_type = [D[i, j] for t in (range(5), range(5, 10)) for i in t for j in t if i < j]
    sizes = np.array([2100.0] * 10 + [14.0] * 10)
    p = fedcollab_optimize(sizes, D, CAPACITY, np.random.default_rng(0), RESTARTS)
    paper = np.repeat([0, 1, 2], [5, 5, 10])
    return {"setup": "authors-saved-matrix", "seed": 0, "hidden": 200, "disjoint_pairs": len(ls),
            "large_small_mean": round(float(ls.mean()), 4), "large_small_min": round(float(ls.min()), 4),
            "large_small_at_least_0_99": int((ls >= 0.99).sum()),
            "large_same_type_mean": round(float(np.mean(same_type)), 4),
            "small_mean": round(float(D[np.ix_(small, small)][~np.eye(10, dtype=bool)].mean()), 4),
            "coalitions": str([sorted(map(int, np.flatnonzero(p == c))) for c in np.unique(p)]),
            "eq10": round(objective(p, sizes, D, CAPACITY), 4),
            "eq10_paper_coalitions": round(objective(paper, sizes, D, CAPACITY), 4)}


if __name__ == "__main__":
    row = check()
    with (HERE / "discriminator-check.csv").open("a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(row)).writerow(row)
    print(row)
