"""Per-group mode's local-training reference in a stack: found by the data's content (one
reference for the stack) against the arrays' identity (before: one per run, since label shift
copies the arrays in every run's world).

    python benchmarks/shared_reference.py [--rounds 2] [--repeats 2] [--arms 0,1,2,3,5,6]

Runs one seed of FedCollab Table 2's config (experiments/reproductions/fedcollab-table2/base.toml,
full size: 20 clients, up to 2,100 training samples each) for ``--rounds`` rounds, the given arms
in one stack (the sweep's default width on a CPU puts 6 of its 12 arms in each of 2 stacks), once
keyed each way, interleaved. Prints per run: the references trained, the wall time of the
reference phase (first start to last end) per round, the arms' time per round after their first
(rounds >= 2) and the whole run; then the ratios, and both 200-round projections of one seed's
stack (200 x (the reference's time per round + the arms'), fixed costs left out). The two ways'
tables must be equal: their numbers are bitwise the same.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from groupfel.emulator.config import parse_config
from groupfel.emulator.config.parse import read_toml
from groupfel.emulator.rounds import per_group
from groupfel.experiments.tasks import execute_stack

BASE = Path(__file__).resolve().parents[1] / "experiments" / "reproductions" / "fedcollab-table2" / "base.toml"


def config_json(rounds: int) -> str:
    raw = read_toml(BASE, "the FedCollab Table 2 base")
    raw["seed"] = 0
    raw["train"]["rounds"] = rounds
    return parse_config(raw).model_dump_json()


def run(config: str, arms: list[int], out: Path, by_content: bool) -> dict:
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()
    real_train, real_digest = per_group._train_reference, per_group._data_digest

    def timed(world, data):
        start = time.perf_counter()
        try:
            return real_train(world, data)
        finally:
            with lock:
                spans.append((start, time.perf_counter()))

    rounds: dict[int, float] = {}   # round -> when the last run reported it

    def on_round(i, t, cost, acc):
        with lock:
            rounds[t] = time.perf_counter()

    per_group._train_reference = timed
    if not by_content:   # the key before: the identity of the run's data arrays
        per_group._data_digest = lambda world: str(id(world.dataset.x_train))
    try:
        start = time.perf_counter()
        execute_stack([(config, out / f"a{arm}", arm) for arm in arms], len(arms), on_round=on_round)
        total = time.perf_counter() - start
    finally:
        per_group._train_reference, per_group._data_digest = real_train, real_digest
    phase = max(e for _, e in spans) - min(s for s, _ in spans)
    tables = pd.concat([pd.read_csv(p).assign(arm=p.parent.name) for p in sorted(out.glob("a*/*/results.csv"))])
    last = max(rounds)
    arms_round = (rounds[last] - rounds[1]) / (last - 1)
    return {"references": len(spans), "phase_s": phase, "total_s": total, "arms_round_s": arms_round,
            "tables": tables}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--arms", default="0,1,2,3,5,6", help="arm indices of base.toml, one stack")
    args = ap.parse_args()
    arms = [int(a) for a in args.arms.split(",")]
    config = config_json(args.rounds)
    names = [json.loads(config)["arms"][a]["name"] for a in arms]
    print(f"FedCollab Table 2 config, seed 0, {args.rounds} rounds, one stack of {len(arms)}: {', '.join(names)}")
    got: dict[str, list[dict]] = {"identity": [], "content": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for way in ("identity", "content"):
                res = run(config, arms, Path(tmp) / f"{way}{r}", way == "content")
                got[way].append(res)
                print(f"  {way:8s} #{r}: {res['references']} references, reference phase {res['phase_s']:7.1f} s "
                      f"({res['phase_s'] / args.rounds:6.1f} s/round), arms {res['arms_round_s']:5.1f} s/round after "
                      f"the first, whole run {res['total_s']:7.1f} s")
    first = got["identity"][0]["tables"].reset_index(drop=True)
    for res in got["identity"][1:] + got["content"]:
        pd.testing.assert_frame_equal(first, res["tables"].reset_index(drop=True), check_exact=True)
    print("  tables: bitwise equal")
    mean = {w: {k: sum(r[k] for r in rs) / len(rs) for k in ("phase_s", "total_s", "arms_round_s")}
            for w, rs in got.items()}
    per_round = {w: m["phase_s"] / args.rounds for w, m in mean.items()}
    arms_round = {w: m["arms_round_s"] for w, m in mean.items()}
    print(f"reference phase: content / identity = {per_round['content'] / per_round['identity']:.3f}")
    print(f"whole run:       content / identity = {mean['content']['total_s'] / mean['identity']['total_s']:.3f}")
    for w in got:
        hours = 200 * (per_round[w] + arms_round[w]) / 3600
        print(f"200 rounds, this stack, one seed ({w}): {hours:.2f} h "
              f"({per_round[w]:.1f} s/round reference + {arms_round[w]:.1f} s/round arms)")


if __name__ == "__main__":
    main()
