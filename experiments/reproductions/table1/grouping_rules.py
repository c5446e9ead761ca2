"""CoVG as Alg. 2 reads against CoVG as the authors' code runs it, on Table 1's worlds (no training).

For every Table 1 point (α × MaxCoV) at the paper's size and each seed, the script places the
data exactly as the runs do, on the base's client sizes (the paper's text: normal sizes, exact
Dirichlet counts) and on the authors' code's (uniform sizes, floored counts), and groups every
edge twice with the runs' grouping stream: once as our runs do (``grow = "alg2"``, ``leftover =
"merge"``) and once as Jiyao17/fl-grouping's ``__CV_greedy_grouping`` does (``grow =
"authors"``, ``leftover = "drop"``). It writes one row a (point, data, seed, rule): groups
formed, clients and samples left out of training, group sizes and CoVs::

    python experiments/reproductions/table1/grouping_rules.py experiments/reproductions/table1/grouping-rules
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from groupfel.emulator.config import parse_config
from groupfel.emulator.membership import form_groups
from groupfel.emulator.world import load_data, place_data
from groupfel.experiments.reproduce import load, point_configs
from groupfel.experiments.runner import seed_config
from groupfel.policies import groupings

RULES = {"ours": {"grow": "alg2", "leftover": "merge"}, "authors": {"grow": "authors", "leftover": "drop"}}
DATA = {"paper": {}, "authors": {"sizes": "uniform", "dirichlet_counts": "floor"}}


def rows(seeds=(0, 1, 2)) -> list[dict]:
    out, data = [], None
    for config in point_configs(load("table1"), quick=False):
        arm = config.arms[0].grouping
        for (setup, change), seed in ((d, s) for d in DATA.items() for s in seeds):
            raw = json.loads(seed_config(config, seed).model_dump_json())
            cfg = parse_config({**raw, "data": {**raw["data"], **change}})
            data = data or load_data(cfg)
            topology = place_data(cfg, data).topology
            world = SimpleNamespace(topology=topology, config=cfg)
            for rule, params in RULES.items():
                policy = groupings.make("covg", {**{k: v for k, v in arm.items() if k != "policy"}, **params})
                result = form_groups(world, policy, 0)
                sizes = np.array([g.size for g in result.groups])
                kept = sum(int(g.total_samples) for g in result.groups)
                total = int(topology.n_samples.sum())
                out.append({"alpha": cfg.data.alpha, "max_cov": arm["max_cov"], "data": setup, "seed": seed,
                            "rule": rule, "groups": len(sizes), "clients": int(sizes.sum()),
                            "clients_left_out": result.dropped, "samples_left_out": total - kept, "samples": total,
                            "size_mean": float(sizes.mean()), "size_max": int(sizes.max()),
                            "cov_mean": float(np.mean([g.cov for g in result.groups]))})
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows())
    table.to_csv(folder / "groups.csv", index=False)
    columns = ["groups", "clients_left_out", "samples_left_out", "size_mean", "cov_mean"]
    print(table.groupby(["data", "alpha", "max_cov", "rule"])[columns].mean().round(3).to_string())
