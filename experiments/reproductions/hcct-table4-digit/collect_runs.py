"""Every finished run's evaluations of a sweep folder as one ``runs.csv`` (the table the README's
renderer reads), for a sweep run with ``groupfel sweep`` rather than ``groupfel reproduce``: into
``FOLDER/runs.csv`` from ``FOLDER`` itself, or from the sweep folders given after it (their rows
concatenated; a run still running or killed is left out), and every finished run's ``groups.csv``
(the groups of each round, HCCT-E's layer by module name) as ``FOLDER/groups.csv``.

    python experiments/reproductions/hcct-table4-digit/collect_runs.py \
        experiments/reproductions/hcct-table4-digit/quick-authors-model

``--independent`` adds an arm ``independent`` read off the local-training reference that every
per-group run trains (each client alone, the engine's local SGD, for the run's rounds): its
``local_error_mean`` is 1 − ``local_accuracy_reference`` of the first arm that has one, per seed
and round, which is an Independent arm's own value (equal to the last bit in ``full/``); its
other columns are left empty (the reference keeps no per-client best).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd


def collect(folder: Path, file: str = "results.csv") -> pd.DataFrame:
    parts = []
    for results in sorted(folder.glob("p*/seed-*/*/results.csv")):
        if (results.parent / "checkpoint.pt").exists():   # still running (or killed): not finished
            continue
        if not (results.parent / file).exists():
            continue
        point = json.loads((results.parents[2] / "config.json").read_text())
        runs = pd.read_csv(results.parent / file)
        runs.insert(0, "point", results.parents[2].name)
        runs.insert(1, "train.algorithm", point["train"]["algorithm"])
        if "seed" not in runs:
            runs.insert(2, "arm", results.parent.name)
            runs.insert(3, "seed", int(results.parent.parent.name.removeprefix("seed-")))
        parts.append(runs)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def independent(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows of an arm ``independent`` from the local-training reference (see the module's text)."""
    ref = runs.dropna(subset=["local_accuracy_reference"])
    if ref.empty:
        return ref
    first = ref.groupby("seed")["arm"].transform(lambda arms: arms.iloc[0])
    ref = ref[ref["arm"] == first]
    return pd.DataFrame({"point": ref["point"], "train.algorithm": ref["train.algorithm"], "arm": "independent",
                         "seed": ref["seed"], "round": ref["round"], "groups_sampled": 10,
                         "local_error_mean": 1.0 - ref["local_accuracy_reference"],
                         "local_accuracy_reference": ref["local_accuracy_reference"]})


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("sweeps", type=Path, nargs="*", help="sweep folders to read (default: FOLDER)")
    ap.add_argument("--independent", action="store_true", help="add the arm read off the local-training reference")
    a = ap.parse_args()
    runs = pd.concat([collect(s) for s in a.sweeps or [a.folder]], ignore_index=True)
    if a.independent and not runs.empty:
        runs = pd.concat([runs, independent(runs)], ignore_index=True)
    a.folder.mkdir(parents=True, exist_ok=True)
    runs.to_csv(a.folder / "runs.csv", index=False)
    groups = pd.concat([collect(s, "groups.csv") for s in a.sweeps or [a.folder]], ignore_index=True)
    if not groups.empty:
        groups.to_csv(a.folder / "groups.csv", index=False)
