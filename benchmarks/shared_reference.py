"""Per-group mode's local-training reference in a stack: one stack of FedCollab Table 2's arms
timed under this checkout and, beside it, under another interpreter (``--baseline``: for example a
checkout from before stacked runs on equal data shared one reference, where each run of the
stack trained its own).

    python benchmarks/shared_reference.py [--rounds 3] [--repeats 2] [--arms 0,1,2,3,5,6]
        [--baseline PYTHON]

Runs one seed of FedCollab Table 2's config (experiments/reproductions/fedcollab-table2/base.toml,
full size: 20 clients, up to 2,100 training samples each) for ``--rounds`` rounds, the given arms
in one stack (the sweep's default width on a CPU puts 6 of its 12 arms in each of 2 stacks), each
interpreter in its own process, interleaved. Prints per run the wall time per round and of the
whole run, then the ratios and each one's 200-round projection of one seed's stack (fixed costs
left out). Both interpreters' result tables must be equal: the sharing changes no number.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BASE = Path(__file__).resolve().parents[1] / "experiments" / "reproductions" / "fedcollab-table2" / "base.toml"


def child(rounds: int, arms: list[int], out: Path) -> None:
    """Run the stack in this process; print its timings and a digest of its result tables."""
    import pandas as pd

    from groupfel.emulator.config import parse_config
    from groupfel.emulator.config.parse import read_toml
    from groupfel.experiments.tasks import execute_stack

    raw = read_toml(BASE, "the FedCollab Table 2 base")
    raw["seed"] = 0
    raw["train"]["rounds"] = rounds
    config = parse_config(raw).model_dump_json()
    seen: dict[int, float] = {}     # round -> when the last run of the stack reported it
    lock = threading.Lock()

    def on_round(i, t, cost, acc):
        with lock:
            seen[t] = time.perf_counter()

    start = time.perf_counter()
    execute_stack([(config, out / f"a{arm}", arm) for arm in arms], len(arms), on_round=on_round)
    total = time.perf_counter() - start
    tables = pd.concat([pd.read_csv(p).assign(arm=p.parent.name) for p in sorted(out.glob("a*/*/results.csv"))])
    digest = hashlib.sha256(pd.util.hash_pandas_object(tables, index=False).values.tobytes()).hexdigest()
    print(json.dumps({"round_s": (seen[max(seen)] - start) / len(seen), "total_s": total, "digest": digest}))


def timed(python: str, rounds: int, arms: list[int], out: Path) -> dict:
    cmd = [python, __file__, "--child", "--rounds", str(rounds), "--arms", ",".join(map(str, arms)), "--out", str(out)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--arms", default="0,1,2,3,5,6", help="arm indices of base.toml, one stack")
    ap.add_argument("--baseline", help="also time under this Python (another checkout's groupfel)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    arms = [int(a) for a in args.arms.split(",")]
    if args.child:
        child(args.rounds, arms, args.out)
        return
    pythons = {"this": sys.executable, **({"baseline": args.baseline} if args.baseline else {})}
    print(f"FedCollab Table 2 config, seed 0, {args.rounds} rounds, one stack of arms {args.arms}")
    got: dict[str, list[dict]] = {name: [] for name in pythons}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, python in pythons.items():
                res = timed(python, args.rounds, arms, Path(tmp) / f"{name}{r}")
                got[name].append(res)
                print(f"  {name:8s} #{r}: {res['round_s']:6.1f} s/round, whole run {res['total_s']:7.1f} s", flush=True)
    digests = {res["digest"] for runs in got.values() for res in runs}
    print("  tables: " + ("bitwise equal" if len(digests) == 1 else "DIFFER"))
    per_round = {name: statistics.median(r["round_s"] for r in runs) for name, runs in got.items()}
    for name, s in per_round.items():
        print(f"200 rounds, this stack, one seed ({name}): {200 * s / 3600:.2f} h ({s:.1f} s/round, median)")
    if args.baseline:
        print(f"per round: baseline / this = {per_round['baseline'] / per_round['this']:.2f}x")


if __name__ == "__main__":
    main()
