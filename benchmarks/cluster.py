"""A Ray cluster on loopback against the local pool, and what losing a worker costs.

    python benchmarks/cluster.py

Starts a one-node cluster with ``ray start`` (2 CPUs, 127.0.0.1, no token), then:

1. a small sweep (digits MLP, 2 points x 2 seeds x 2 arms, 20 rounds) on the local pool (2 workers)
   and on the cluster (``--address``): wall time of each, and whether the tables are equal;
   (the pool runs once more after the cluster, to show how much the machine's load moves a timing);
2. a 2-seed run on the cluster, undisturbed and with one worker killed (SIGKILL) right after the
   driver received a checkpoint: the extra wall time, the rounds the rerun task redid, and
   whether the tables are equal.

Stops only the processes it started (by PID) and removes the node's directory. Prints the numbers.
"""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # read when Ray is imported
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from groupfel.emulator.config import parse_config  # noqa: E402
from groupfel.experiments.backends import RayOptions  # noqa: E402
from groupfel.experiments.runner import run_experiment  # noqa: E402
from groupfel.experiments.sweep import run_sweep  # noqa: E402

BASE = """
name = "bench"
[data]
dataset = "digits"
alpha = 0.3
min_samples = 8
max_samples = 20
[topology]
edges = 2
clients_per_edge = 6
[train]
model = "mlp"
lr = 0.05
batch_size = 8
group_rounds = 2
local_epochs = 1
rounds = 20
[[arms]]
name = "covg"
grouping = { policy = "covg", min_group_size = 3, max_cov = 0.5 }
sampling = { policy = "esrcov", groups_per_round = 2 }
[[arms]]
name = "rg"
grouping = { policy = "rg", min_group_size = 3 }
sampling = { policy = "random", groups_per_round = 2 }
"""
SWEEP = 'name = "bench-cluster"\nbase = "base.toml"\nseeds = [0, 1]\n[axes]\n"data.alpha" = [0.3, 1.0]\n'


def session(leader: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == leader:
                    out.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return out


def task_workers(leader: int) -> list[int]:
    def cmd(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""
    return [p for p in session(leader) if cmd(p).startswith("ray::ray_task")]


def start_node(tmp: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp / "node.log", "w")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp / 'ray'}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while "Ray runtime started" not in (tmp / "node.log").read_text():
        if proc.poll() is not None:
            raise RuntimeError((tmp / "node.log").read_text())
        time.sleep(0.2)
    return proc, f"127.0.0.1:{port}"


def stop_node(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session(proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)
    proc.wait()


def equal(a: Path, b: Path, names=("runs.csv", "summary.csv")) -> bool:
    try:
        for name in names:
            pd.testing.assert_frame_equal(pd.read_csv(a / name), pd.read_csv(b / name), check_exact=True)
        return True
    except AssertionError:
        return False


def main() -> None:
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="rgfb", dir="/tmp"))
    proc = None
    try:
        (tmp / "base.toml").write_text(BASE)
        (tmp / "sweep.toml").write_text(SWEEP)
        t = time.perf_counter()
        run_sweep(tmp / "sweep.toml", output=tmp / "local", jobs=2, progress=False)
        local_s = time.perf_counter() - t
        proc, address = start_node(tmp)
        options = RayOptions(address=address)
        t = time.perf_counter()
        run_sweep(tmp / "sweep.toml", output=tmp / "cluster", backend="ray", ray=options, progress=False)
        cluster_s = time.perf_counter() - t
        t = time.perf_counter()   # the pool again: how much the machine's load moves a timing
        run_sweep(tmp / "sweep.toml", output=tmp / "local2", jobs=2, progress=False)
        local2_s = time.perf_counter() - t
        print(f"sweep (8 tasks): local pool {local_s:.1f} s, loopback cluster {cluster_s:.1f} s (incl. connecting "
              f"and shipping the code), local pool again {local2_s:.1f} s; load average {os.getloadavg()[0]:.1f}; "
              f"tables equal: {equal(tmp / 'local', tmp / 'cluster')}")

        import tomllib

        raw = {**tomllib.loads(BASE), "seeds": [0, 1]}
        raw["train"] = {**raw["train"], "rounds": 60, "eval_every": 5}
        raw["arms"] = raw["arms"][:1]
        config = parse_config(raw)
        t = time.perf_counter()
        run_experiment(config, tmp / "calm", backend="ray", ray=options, progress=False)
        calm_s = time.perf_counter() - t
        out, killed = tmp / "lossy", {}

        def kill_after_first_checkpoint():
            while not killed:
                ckpts = list(out.glob("seed-*/*/checkpoint.pt"))
                workers = task_workers(proc.pid)
                if ckpts and workers:
                    import torch

                    killed["at_round"] = int(torch.load(ckpts[0], weights_only=True)["t"])
                    os.kill(workers[0], signal.SIGKILL)
                    killed["pid"] = workers[0]
                    killed["time"] = time.perf_counter()
                time.sleep(0.005)

        killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
        t = time.perf_counter()
        killer.start()
        run_experiment(config, out, backend="ray", ray=options, progress=False)
        lossy_s = time.perf_counter() - t
        print(f"2-seed run, 60 rounds, checkpoint every 5: undisturbed {calm_s:.1f} s; one worker killed "
              f"(its last streamed checkpoint at round {killed.get('at_round')}) {lossy_s:.1f} s: a loss cost "
              f"{lossy_s - calm_s:+.1f} s (the rerun resumed at that round: at most 4 rounds redone, plus a fresh "
              f"worker's start-up); tables equal: {equal(tmp / 'calm', out)}")
        manifest = json.loads(next(out.glob("seed-0/*/manifest.json")).read_text())
        print(f"device recorded in the manifest: {manifest.get('device')}")
    finally:
        ray.shutdown()
        if proc is not None:
            stop_node(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
