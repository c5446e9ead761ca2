"""Run a named list of full-size reproductions on one GPU machine, longest first, and pack each
finished one into one file (at most 8 names, so at most 8 files).

    python benchmarks/gpu_reproductions.py figs10-12 fig15 table2 --out results/gpu [--device cuda]

Each reproduction runs as ``groupfel reproduce NAME --device DEVICE --output OUT/NAME``; rerunning
the same command resumes: finished runs are kept, a killed one continues from its checkpoint, and
a reproduction already packed is skipped. ``OUT/NAME.tar.gz`` holds its results directory
(tables, figures, runs.csv, manifests; checkpoints left out). The order, longest first, is the one
``benchmarks/gpu.py`` projects; give the names in that order.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

MAX_FILES = 8


def pack(run_dir: Path, archive: Path) -> None:
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name, filter=lambda info: None if info.name.endswith(".pt") else info)
    partial.replace(archive)   # a killed pack leaves no archive that looks finished


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", metavar="NAME", help="reproductions (groupfel reproduce --list)")
    ap.add_argument("--out", default="results/gpu", help="results and archives (default results/gpu)")
    ap.add_argument("--device", default="cuda", help="default cuda")
    args = ap.parse_args()
    if len(args.names) > MAX_FILES:
        print(f"gpu_reproductions: {len(args.names)} names; give at most {MAX_FILES} (one archive each)",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        archive = out / f"{name}.tar.gz"
        if archive.exists():
            print(f"{name}: packed already ({archive})")
            continue
        done = subprocess.run([sys.executable, "-m", "groupfel.experiments.cli", "reproduce", name, "--device",
                               args.device, "--output", str(out / name), "--quiet"])
        if done.returncode != 0:
            print(f"{name}: groupfel reproduce exited {done.returncode}; rerun this command to resume",
                  file=sys.stderr)
            return done.returncode
        pack(out / name, archive)
        print(f"{name}: {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
