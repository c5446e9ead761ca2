"""Run a named list of full-size reproductions on one GPU machine, longest first, their runs
stacked, in resumable chunks; pack each finished one into one file (at most 8 names, so at most
8 files).

    python benchmarks/gpu_reproductions.py figs10-12 fig15 table2 --out results/gpu [--device cuda]
        [--stack N] [--chunk-minutes 8]

Each reproduction runs as ``groupfel reproduce NAME --device DEVICE --stack N --output OUT/NAME``
(``--stack``: default the device's, see docs/benchmarks.md "Runs that train together"). One
invocation works for at most ``--chunk-minutes`` (default 8: GPU time often comes in short,
preemptible slices), then stops the reproduction (SIGTERM: its runs keep their checkpoints) and
exits 75 saying so; rerunning the same command resumes: finished runs are kept, a stopped one
continues from its checkpoint, and a reproduction already packed is skipped. It exits 0 once every
name is packed. ``OUT/NAME.tar.gz`` holds its results directory (tables, figures, runs.csv,
manifests; checkpoints left out). The order, longest first, is the one ``benchmarks/gpu.py``
projects; give the names in that order. ``--quick`` and ``--set`` pass through to ``groupfel
reproduce`` (the test suite runs a stacked campaign of quick reproductions on the CPU).
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

MAX_FILES = 8
MORE_TO_DO = 75   # EX_TEMPFAIL: the chunk ended with work left; rerun to resume


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
    ap.add_argument("--stack", type=int, help="runs that train together (default: the device's)")
    ap.add_argument("--chunk-minutes", type=float, default=8.0, help="work at most this long, then stop (default 8)")
    ap.add_argument("--quick", action="store_true", help="the quick reproductions (a test of this script)")
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="passed to groupfel reproduce")
    args = ap.parse_args()
    if len(args.names) > MAX_FILES:
        print(f"gpu_reproductions: {len(args.names)} names; give at most {MAX_FILES} (one archive each)",
              file=sys.stderr)
        return 2
    if not 0 < args.chunk_minutes <= 8:
        print(f"gpu_reproductions: --chunk-minutes {args.chunk_minutes:g}: give more than 0 and at most 8",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * args.chunk_minutes
    for name in args.names:
        archive = out / f"{name}.tar.gz"
        if archive.exists():
            print(f"{name}: packed already ({archive})")
            continue
        command = [sys.executable, "-m", "groupfel.experiments.cli", "reproduce", name, "--device", args.device,
                   "--output", str(out / name), "--quiet", *(["--stack", str(args.stack)] if args.stack else []),
                   *(["--quick"] if args.quick else []), *(f"--set={s}" for s in args.set)]
        proc = subprocess.Popen(command)
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)   # the runs stop; their checkpoints stay
            proc.wait()
            print(f"{name}: the {args.chunk_minutes:g}-minute chunk is used up; rerun this command to resume",
                  file=sys.stderr)
            return MORE_TO_DO
        if code != 0:
            print(f"{name}: groupfel reproduce exited {code}; rerun this command to resume", file=sys.stderr)
            return code
        pack(out / name, archive)
        print(f"{name}: {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
