"""Which coalitions FedCollab's solver forms on exact label distances (total variation) in the
Table 2 world of each setup, five seeds: on our partition (our-partition.base.toml) at full size
and at the quick size (large clients of 700 training samples), and on the authors' partition
(base.toml). No training: the world is dealt and the solver run (C = 10, 100 runs from local
training). Writes coalitions-label-tv.csv beside this file:

    python experiments/reproductions/fedcollab-table2/coalitions_label_tv.py
"""
from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import numpy as np

from groupfel.emulator.config import parse_config
from groupfel.emulator.config.parse import check_modes
from groupfel.emulator.world import place_data
from groupfel.policies.fedcollab import fedcollab_optimize, objective, tv_distance
from groupfel.topologies import load_dataset

HERE = Path(__file__).parent
SETUPS = {"our-partition": ("our-partition.base.toml", None), "our-partition-quick": ("our-partition.base.toml", 1050),
          "authors": ("base.toml", None)}


def main() -> None:
    dataset = load_dataset("fashion-mnist")
    rows = []
    for setup, (base, max_samples) in SETUPS.items():
        for seed in range(5):
            data = tomllib.loads((HERE / base).read_text()) | {"seed": seed}
            if max_samples:
                data["data"]["max_samples"] = max_samples
            topo = place_data(check_modes(data, parse_config(data)), dataset).topology
            D, sizes = tv_distance(topo.label_counts), topo.n_samples.astype(float)
            p = fedcollab_optimize(sizes, D, 10.0, np.random.default_rng(seed))
            coalitions = [sorted(map(int, np.flatnonzero(p == c))) for c in np.unique(p)]
            rows.append({"setup": setup, "seed": seed, "coalitions": str(coalitions),
                         "small_with_large": int(any(min(g) < 10 <= max(g) for g in coalitions)),
                         "eq10": round(objective(p, sizes, D, 10.0), 4)})
    with (HERE / "coalitions-label-tv.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
