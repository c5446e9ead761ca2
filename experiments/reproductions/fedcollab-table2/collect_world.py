"""FedCollab Table 2 in the authors' world (``authors-world.sweep.toml``: ``world_seed = 0``,
training seeds 1-4) as one ``runs.csv`` and ``groups.csv`` in ``full-authors-world/``: seed 0 of
``full-authors-partial/`` for the sweep's arms (that run is seed 0 of this world: ``world_seed``
equal to the seed is the plain run, bitwise, ``tests/test_world_seed.py``), then every finished
run of the sweep folder.

    python experiments/reproductions/fedcollab-table2/collect_world.py results/fedcollab-table2/full-authors-world
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ARMS = ("local", "ifca", "fedcollab", "fedcollab-ignore-quantities")


def _collector():
    spec = importlib.util.spec_from_file_location("collect_runs", HERE.parent / "hcct-table4-digit" / "collect_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.collect


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", type=Path, help="the folder of groupfel sweep authors-world.sweep.toml")
    sweep = ap.parse_args().sweep
    collect = _collector()
    out = HERE / "full-authors-world"
    out.mkdir(exist_ok=True)
    for file, per_run in (("runs.csv", "results.csv"), ("groups.csv", "groups.csv")):
        seed0 = pd.read_csv(HERE / "full-authors-partial" / file, dtype={"clients": str})
        seed0 = seed0[(seed0["seed"] == 0) & seed0["arm"].isin(ARMS)]
        rows = pd.concat([seed0, collect(sweep, per_run)], ignore_index=True)
        rows.to_csv(out / file, index=False)
    runs = pd.read_csv(out / "runs.csv")
    print({arm: sorted(g["seed"].unique().tolist()) for arm, g in runs.groupby("arm")})


if __name__ == "__main__":
    main()
