"""FedCollab's discriminator cache on FedCollab Table 1's world (the authors' label-shift setup,
20 clients, the authors' discriminator budget): the +FedCollab arm of two base algorithms run one
after the other on one seed, the first with an empty cache (its discriminators train), the second
reading what the first kept. Prints each arm's wall seconds, their ratio, and whether the two runs'
distance matrices are identical.

    python benchmarks/discriminator_cache.py                       # 5 training rounds, seed 0
    python benchmarks/discriminator_cache.py --rounds 20 --seed 1

Both runs are fresh ``groupfel run`` processes with their own output folders and one cache
folder (``GROUPFEL_CACHE``), so start-up and data loading are in both.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "experiments" / "reproductions" / "fedcollab-table1" / "base.toml"


def config(algorithm: str, rounds: int, seed: int) -> str:
    text = BASE.read_text()
    text = re.sub(r"(?m)^rounds = \d+", f"rounds = {rounds}", text)
    text = re.sub(r"(?m)^eval_every = \d+", f"eval_every = {rounds}", text)
    text = text.replace("[train]\n", f'[train]\nalgorithm = "{algorithm}"\n', 1)
    return f"seed = {seed}\n" + text


def run(algorithm: str, rounds: int, seed: int, where: Path, cache: Path) -> tuple[float, pd.DataFrame]:
    cfg = where / f"{algorithm}.toml"
    cfg.write_text(config(algorithm, rounds, seed))
    subprocess.run([sys.executable, "-m", "groupfel", "run", str(cfg), "--output", str(where / algorithm), "--quiet"],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "GROUPFEL_CACHE": str(cache)})
    arm = where / algorithm / "fedcollab"
    manifest = json.loads((arm / "manifest.json").read_text())
    return float(manifest["wall_seconds_last_session"]), pd.read_csv(arm / "distances.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="training rounds of each run (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        cold, d_cold = run("fedavg", a.rounds, a.seed, where, where / "cache")
        warm, d_warm = run("fedprox", a.rounds, a.seed, where, where / "cache")
    print(f"+FedCollab arm, {a.rounds} rounds, seed {a.seed}: cold cache (FedAvg) {cold:.1f} s, "
          f"warm cache (FedProx) {warm:.1f} s, cold / warm {cold / warm:.1f}x; "
          f"distances identical: {d_cold.equals(d_warm)}")


if __name__ == "__main__":
    main()
