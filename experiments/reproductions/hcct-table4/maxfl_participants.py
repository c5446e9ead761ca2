"""MAXFL's participants in the first rounds of HCCT Table 4 (FMNIST and Digit) in the committed
setting (MAXFL as the HCCT authors run it: threshold = "distance", prior = "once"; the shipped
configs' models and the parameters' vector), 5 seeds, 2 rounds evaluated after each. Round 0 is the authors' epoch-0
FedAvg (every client joins); the row of evaluation round 2 counts who joined in training round
t = 1, the first that decides. Where nobody joins there, the authors' code raises (KeyError).

    python experiments/reproductions/hcct-table4/maxfl_participants.py \
        experiments/reproductions/hcct-table4/maxfl-participants/maxfl-participants.csv [fmnist] [digit]
"""
from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

from groupfel import experiments
from groupfel.emulator.config import load_config
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.emulator.world import build_world

TASKS = {"fmnist": "hcct-fmnist.toml", "digit": "hcct-digits.toml"}


def participants(base: str, seed: int) -> list[dict]:
    cfg = load_config(Path(experiments.__file__).parent / "configs" / base)
    train = cfg.train.model_copy(update={"rounds": 2, "eval_every": 1, "algorithm": "maxfl", "workers": 1,
                                         "algorithm_params": {"threshold": "distance", "prior": "once"}})
    arm = cfg.arms[0].model_copy(update={"name": "maxfl", "grouping": cfg.arms[1].grouping})   # global
    cfg = cfg.model_copy(update={"seed": seed, "train": train, "arms": [arm]})
    world = build_world(cfg)
    with tempfile.TemporaryDirectory() as d:
        out = run_arm(world, plan_arm(world, 0), Path(d) / "maxfl")
    return [{"seed": seed, "round": int(r["round"]), "maxfl_participants": r["maxfl_participants"],
             "clients": world.topology.n_clients} for _, r in out.iterrows()]


def main() -> None:
    rows = []
    for task in sys.argv[2:] or TASKS:
        base = TASKS[task]
        for seed in range(5):
            got = [{"task": task, **r} for r in participants(base, seed)]
            print(task, seed, [r["maxfl_participants"] for r in got], flush=True)
            rows += got
    with open(sys.argv[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
