"""Sweep backends: 4 points on the local process pool against the same 4 points one after another.

    python benchmarks/sweep.py

Both runs happen here, side by side, on the same sweep (digits, CoVG at MinGS 3, 5, 8 and 10, one
seed, the default demo's setting); their tables must be equal. Goal: the pool takes ≤ 0.6× the
sequential time on 2 cores. Also times Ray's start-up (ray.init of a local instance) when Ray is
installed.
"""
from __future__ import annotations

import os
import resource
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

from groupfel.experiments.sweep import run_sweep

BASE = """
name = "bench"
seed = 0
[data]
dataset = "digits"
alpha = 0.1
min_samples = 8
max_samples = 30
[topology]
edges = 3
clients_per_edge = 20
[train]
model = "cnn"
engine = "batched"
lr = 0.05
batch_size = 16
group_rounds = 5
local_epochs = 2
rounds = 200
budget = 8000
eval_every = 2
[[arms]]
name = "covg"
grouping = { policy = "covg", min_group_size = 5, max_cov = 0.5 }
sampling = { policy = "esrcov", data_fraction = 0.25 }
"""
SWEEP = """
name = "bench-sweep"
base = "base.toml"
seeds = [0]
[axes]
"arms.0.grouping.min_group_size" = [3, 5, 8, 10]
"""


class TreeCPU:
    """CPU seconds of this process and every descendant (the pool's forkserver and workers are not
    this process's children), polled from /proc while they run."""

    def __init__(self):
        self.seen: dict[int, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        tick = os.sysconf("SC_CLK_TCK")
        while not self.done.wait(0.05):
            parent = {}
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                parent[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
            for pid, (ppid, cpu) in parent.items():
                p = ppid
                while p in parent and p != os.getpid():
                    p = parent[p][0]
                if p == os.getpid():
                    self.seen[pid] = max(cpu, self.seen.get(pid, 0.0))

    def __enter__(self):
        me = resource.getrusage(resource.RUSAGE_SELF)
        self.start = me.ru_utime + me.ru_stime
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        me = resource.getrusage(resource.RUSAGE_SELF)
        self.seconds = me.ru_utime + me.ru_stime - self.start + sum(self.seen.values())


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "base.toml").write_text(BASE)
        (tmp / "sweep.toml").write_text(SWEEP)
        t0 = time.perf_counter()
        with TreeCPU() as c_seq:
            run_sweep(tmp / "sweep.toml", output=tmp / "seq", jobs=1, progress=False)
        t_seq = time.perf_counter() - t0
        t0 = time.perf_counter()
        with TreeCPU() as c_pool:
            run_sweep(tmp / "sweep.toml", output=tmp / "pool", backend="local", progress=False)
        t_pool = time.perf_counter() - t0
        for name in ("runs.csv", "summary.csv"):
            pd.testing.assert_frame_equal(pd.read_csv(tmp / "seq" / name), pd.read_csv(tmp / "pool" / name),
                                          check_exact=True)
    print(f"4 points: one after another {t_seq:.1f} s, local pool ({cores} workers) {t_pool:.1f} s, "
          f"ratio {t_pool / t_seq:.2f} (goal <= 0.6; same tables); load average {os.getloadavg()[0]:.1f}")
    # On a busy machine the wall clock shows the other processes; the CPU seconds do not: with
    # the cores to itself the pool takes about its CPU / cores (plus a serial part, bounded by
    # the sequential run's non-task work), the sequential run its CPU.
    print(f"CPU seconds: one after another {c_seq.seconds:.1f}, pool {c_pool.seconds:.1f} (workers' start-up "
          f"included); with {cores} idle cores the ratio would be about "
          f"{c_pool.seconds / cores / c_seq.seconds:.2f}")
    try:
        import ray
    except ImportError:
        print("ray not installed: pip install 'groupfel[ray]' to time its start-up")
        return
    t0 = time.perf_counter()
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    ray.get([ray.remote(lambda: None).remote() for _ in range(cores)])
    t_first = time.perf_counter() - t0
    ray.shutdown()
    print(f"ray start-up: ray.init of a local instance {t_init:.1f} s, first {cores} tasks (worker start) "
          f"{t_first:.1f} s")


if __name__ == "__main__":
    main()
