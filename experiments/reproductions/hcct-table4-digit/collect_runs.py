"""Every finished run's evaluations of a sweep folder as one ``runs.csv`` (the table the README's
renderer reads), for a sweep run with ``groupfel sweep`` rather than ``groupfel reproduce``.

    python experiments/reproductions/hcct-table4-digit/collect_runs.py \
        experiments/reproductions/hcct-table4-digit/quick-authors-model
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def collect(folder: Path) -> pd.DataFrame:
    parts = []
    for results in sorted(folder.glob("p*/seed-*/*/results.csv")):
        if (results.parent / "checkpoint.pt").exists():   # still running (or killed): not finished
            continue
        point = json.loads((results.parents[2] / "config.json").read_text())
        runs = pd.read_csv(results)
        runs.insert(0, "point", results.parents[2].name)
        runs.insert(1, "train.algorithm", point["train"]["algorithm"])
        parts.append(runs)
    return pd.concat(parts, ignore_index=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    a = ap.parse_args()
    collect(a.folder).to_csv(a.folder / "runs.csv", index=False)
