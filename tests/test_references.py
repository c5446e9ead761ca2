"""Stored reference runs: refactors change no number.

Small runs covering every round strategy (global and per-group mode), every shipped training
algorithm, regrouping, faults, budgets and every policy that changes membership while training
(HCCT's Alg. 1, IFCA, FedCLAR, FedCollab) are compared with result tables and ledgers stored in
``tests/references/``: exactly, to the last bit. A change that alters numbers on purpose refreshes
them in its own commit, saying why:

    GROUPFEL_WRITE_REFERENCES=1 python -m pytest tests/test_references.py
"""
import copy
import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from groupfel.experiments import api

from conftest import TINY

REFERENCES = Path(__file__).parent / "references"
WRITE = bool(os.environ.get("GROUPFEL_WRITE_REFERENCES"))


def _config(name: str, arms: list[dict], *, train: dict | None = None, **top) -> dict:
    d = copy.deepcopy(TINY)
    d["name"] = name
    d["train"].update({"rounds": 4, **(train or {})})
    d["arms"] = arms
    d.update(top)
    return d


CONCEPTS = {"partition": "concept-shift", "test_fraction": 0.2,
            "types": [{"clients": 3, "samples": 30, "permutation": list(range(10))}, {"clients": 3, "samples": 30,
                                                       "permutation": [1, 0, 3, 2, 5, 4, 7, 6, 9, 8]}]}

CASES = {
    "global-fedavg": _config("global-fedavg", [
        *TINY["arms"],
        {"name": "regroup-unbiased", "grouping": {"policy": "covg", "min_group_size": 3, "max_cov": 0.5},
         "sampling": {"policy": "srcov", "groups_per_round": 2}, "aggregation": "stabilized", "regroup_every": 2},
        {"name": "hcct-once", "grouping": {"policy": "hcct", "alpha": 1.0, "schedule": "once"},
         "sampling": {"policy": "random", "groups_per_round": 2}},
    ], faults={"dropout": 0.2, "straggler": {"sigma": 0.5}}),
    "global-scaffold": _config("global-scaffold", [
        {"name": "covg", "grouping": {"policy": "covg", "min_group_size": 3, "max_cov": 0.5},
         "sampling": {"policy": "esrcov", "groups_per_round": 2}},
        {"name": "fedclar", "grouping": {"policy": "fedclar", "min_group_size": 2, "cluster_round": 2},
         "sampling": {"policy": "random", "groups_per_round": 2}},
    ], train={"algorithm": "scaffold", "momentum": 0.5, "client_state": "persistent"}, faults={"dropout": 0.2}),
    "global-fedprox-budget": _config("global-fedprox-budget", [
        {"name": "kldg", "grouping": {"policy": "kldg", "min_group_size": 3},
         "sampling": {"policy": "random", "groups_per_round": 2}},
    ], train={"algorithm": "fedprox", "mu": 0.1, "rounds": None, "budget": 1000.0}),
    "per-group": _config("per-group", [
        {"name": "hcct", "grouping": {"policy": "hcct", "alpha": 1.0}},
        {"name": "ifca", "grouping": {"policy": "ifca", "n_clusters": 2}},
        {"name": "fedclar", "grouping": {"policy": "fedclar", "min_group_size": 2, "cluster_round": 1}},
        {"name": "fedcollab", "grouping": {"policy": "fedcollab"}},
        {"name": "local", "grouping": {"policy": "local"}},
        {"name": "sampled", "grouping": {"policy": "covg", "min_group_size": 2, "max_cov": 0.5},
         "sampling": {"policy": "random", "groups_per_round": 1}},
    ], mode="per-group", topology={"edges": 1, "clients_per_edge": 6}, data={**TINY["data"], **CONCEPTS}),
}


def _digest(frame: pd.DataFrame) -> str:
    return hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()


@pytest.fixture
def one_thread():
    """One torch thread, as every backend's task runs: a reduction's float sums depend on the
    thread count, and the references must not depend on the machine's cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_runs_are_bitwise_unchanged(case, tmp_path, one_thread):
    study = api.run(CASES[case], tmp_path / case, jobs=1, progress=False)
    got = {}
    for arm in study.arms:
        d = study.arm_dir(None, arm)
        results = pd.read_csv(d / "results.csv")
        got[arm] = {"results": results.to_csv(index=False), "ledger_sha256": _digest(study.ledger(None, arm)),
                    "rounds_run": study.manifest(None, arm)["rounds_run"]}
    path = REFERENCES / f"{case}.json"
    if WRITE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert sorted(got) == sorted(want)
    for arm in want:
        assert got[arm]["results"] == want[arm]["results"], f"{case}/{arm}: the result table changed"
        assert got[arm]["ledger_sha256"] == want[arm]["ledger_sha256"], f"{case}/{arm}: the ledger changed"
        assert got[arm]["rounds_run"] == want[arm]["rounds_run"]
