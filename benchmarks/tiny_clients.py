"""Cross-device populations at scale: many clients holding a handful of samples each.

    python benchmarks/tiny_clients.py [--only NAME]

Runs ``groupfel run`` (2 global rounds, the MLP, Fashion-MNIST) on settings where perfectly
balanced groups (CoV exactly 0) and skewed sampling weights occur, and prints for each the exit
code, the wall time and the last line of output. Every setting must end in exit 0 or a one-line
error (exit 2), never a traceback:

* 10 edges x 1,000 clients of 2-6 samples (10,000 clients), CoVG at MinGS 5, ESRCoV/SRCoV/RCoV;
* 3 edges x 1,000 clients and 10 x 300 clients (the reported crashes);
* 10,000 clients of 1-2 samples;
* an edge with fewer clients than MinGS (an input error);
* groups_per_round near the number of groups.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = """name = "{name}"
seed = 0
[data]
dataset = "fashion-mnist"
alpha = 0.1
sizes = "uniform"
min_samples = {lo}
max_samples = {hi}
[topology]
edges = {edges}
clients_per_edge = {per_edge}
[train]
model = "mlp"
rounds = 2
group_rounds = 1
local_epochs = 1
[[arms]]
name = "a"
grouping = {{ policy = "covg", min_group_size = {mings} }}
sampling = {{ policy = "{sampling}", groups_per_round = {S} }}
"""

SETTINGS = {
    "10k-esrcov": dict(edges=10, per_edge=1000, lo=2, hi=6, mings=5, sampling="esrcov", S=10),
    "10k-srcov": dict(edges=10, per_edge=1000, lo=2, hi=6, mings=5, sampling="srcov", S=10),
    "10k-rcov": dict(edges=10, per_edge=1000, lo=2, hi=6, mings=5, sampling="rcov", S=10),
    "3x1000-esrcov": dict(edges=3, per_edge=1000, lo=2, hi=6, mings=5, sampling="esrcov", S=10),
    "10x300-esrcov": dict(edges=10, per_edge=300, lo=2, hi=6, mings=5, sampling="esrcov", S=10),
    "10k-1to2-samples": dict(edges=10, per_edge=1000, lo=1, hi=2, mings=5, sampling="esrcov", S=10),
    "edge-below-mings": dict(edges=3, per_edge="[1000, 1000, 3]", lo=2, hi=6, mings=5, sampling="esrcov", S=10),
    "S-near-groups": dict(edges=3, per_edge=100, lo=2, hi=6, mings=5, sampling="esrcov", S=55),
    "S-above-groups": dict(edges=3, per_edge=100, lo=2, hi=6, mings=5, sampling="esrcov", S=500),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(SETTINGS))
    args = ap.parse_args()
    bad = 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or SETTINGS:
            cfg = Path(tmp, f"{name}.toml")
            cfg.write_text(BASE.format(name=name, **SETTINGS[name]))
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "groupfel.experiments.cli", "run", str(cfg), "--quiet",
                                   "--output", str(Path(tmp, name))], env=env, cwd=ROOT,
                                  capture_output=True, text=True)
            wall = time.perf_counter() - t0
            out = (proc.stdout + proc.stderr).strip().splitlines()
            clean = proc.returncode in (0, 2) and "Traceback" not in proc.stderr
            bad += not clean
            first = next((ln for ln in out if ln.startswith("groupfel: error")), out[1] if len(out) > 1 else "")
            print(f"{name:18s} exit {proc.returncode}  {wall:6.1f} s  {'ok ' if clean else 'BAD'}  {first.strip()[:110]}")
    print(f"{bad} setting(s) crashed" if bad else "every setting ran or was refused with one line")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
