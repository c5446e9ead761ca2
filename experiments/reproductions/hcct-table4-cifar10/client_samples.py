"""Samples a client holds and trains on in HCCT's CIFAR-10 setting (Fashion-MNIST standing in,
hcct-table4-cifar10/base.toml), as our shards deal them (``shards_deal = "sizes"``: Table 3's
mean) and as the HCCT authors' utils/sampling.py does (``"authors"``: the whole training set; with
``shard_samples = 500`` the 50,000 samples of CIFAR-10's training set), at each of Fig. 4's train
ratios and at ours (0.8, test fraction 0.2), seeds 0-4. One row per deal × train ratio: the mean
over seeds of the mean over clients of the samples it holds, trains on and is tested on.

    python experiments/reproductions/hcct-table4-cifar10/client_samples.py \
        experiments/reproductions/hcct-table4-cifar10/client-samples/client-samples.csv
"""
from __future__ import annotations

import csv
import sys
import tomllib
from pathlib import Path

import numpy as np

from groupfel.emulator.config import parse_config
from groupfel.emulator.world import place_data
from groupfel.topologies import load_dataset

DEALS = {"sizes": {}, "authors": {"shards_deal": "authors"},
         "authors-500": {"shards_deal": "authors", "shard_samples": 500}}
RATIOS = (0.05, 0.1, 0.2, 0.5, 0.8)
SEEDS = range(5)


def main() -> None:
    base = tomllib.loads((Path(__file__).parent / "base.toml").read_text())
    data = load_dataset(base["data"]["dataset"])
    rows = []
    for deal, extra in DEALS.items():
        for ratio in RATIOS:
            held, trained, tested = [], [], []
            for seed in SEEDS:
                raw = {k: v for k, v in base.items() if k != "seeds"} | {"seed": seed}
                raw["data"] = base["data"] | {"test_fraction": round(1 - ratio, 10)} | extra
                placed = place_data(parse_config(raw), data)
                held.append(np.mean([len(a) + len(b) for a, b in zip(placed.topology.client_samples,
                                                                     placed.local_test)]))
                trained.append(np.mean([len(a) for a in placed.topology.client_samples]))
                tested.append(np.mean([len(b) for b in placed.local_test]))
            rows.append({"deal": deal, "train_ratio": ratio, "seeds": len(SEEDS),
                         "samples_held": float(np.mean(held)), "samples_trained": float(np.mean(trained)),
                         "samples_tested": float(np.mean(tested))})
            print(rows[-1])
    out = Path(sys.argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
