"""A real Ray cluster (``ray start``) on loopback whose node cannot see the driver's disk: runs land
complete in the driver's directory with the local pool's numbers, also when a worker is killed."""
import json
import os
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from groupfel.emulator.config import parse_config
from groupfel.experiments.runner import run_experiment

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "name": "tiny", "seeds": [0, 1], "output_dir": "unused",
    "data": {"dataset": "digits", "alpha": 0.3, "min_samples": 8, "max_samples": 20},
    "topology": {"edges": 2, "clients_per_edge": 6},
    "train": {"model": "mlp", "lr": 0.05, "batch_size": 8, "group_rounds": 2, "local_epochs": 1, "rounds": 12},
    "arms": [{"name": "covg", "grouping": {"policy": "covg", "min_group_size": 3, "max_cov": 0.5},
              "sampling": {"policy": "esrcov", "groups_per_round": 2}},
             {"name": "rg", "grouping": {"policy": "rg", "min_group_size": 3},
              "sampling": {"policy": "random", "groups_per_round": 2}}]}
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(leader: int) -> list[int]:
    """The live processes of the session ``leader`` started (the node's: GCS, raylet, workers); a
    zombie is dead, only not yet reaped by its parent."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == leader and \
                        (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(entry.name))
            except (OSError, IndexError):
                pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Node:
    """A one-node cluster from ``ray start --head`` in a private mount namespace where ``hidden``
    (the driver's output directory) is an empty tmpfs and groupfel is not importable. Its Ray
    directory is ``tmpdir/ray``, so a driver with RAY_TMPDIR=tmpdir finds it as the machine's
    current cluster (/tmp/ray/ray_current_cluster, without touching the real one)."""

    def __init__(self, hidden: Path, cpus: int = 2):
        self.port = _free_port()
        self.tmpdir = Path(tempfile.mkdtemp(prefix="rgf", dir="/tmp"))   # short: Ray's socket paths
        self.log = self.tmpdir / "node.log"
        mounts = [f"mount -t tmpfs groupfel-hidden {hidden}", f"mount -t tmpfs groupfel-hidden {ROOT}"]
        prefix = Path(sys.prefix).resolve()
        if prefix.is_relative_to(ROOT):   # a virtual environment inside the checkout: kept, the code still hidden
            stage = self.tmpdir / "prefix"
            mounts = [f"mkdir {stage}", f"mount --bind {prefix} {stage}", *mounts,
                      f"mkdir -p {prefix}", f"mount --bind {stage} {prefix}"]
        for sp in site.getsitepackages():   # an editable install would import the code from disk
            mounts += [f"mount --bind /dev/null {p}" for p in Path(sp).glob("__editable__*groupfel*.pth")]
        script = " && ".join(mounts + [
            f"exec {sys.executable} -m ray.scripts.scripts start --head --block --node-ip-address=127.0.0.1 "
            f"--port={self.port} --num-cpus={cpus} --include-dashboard=false --disable-usage-stats "
            f"--temp-dir={self.tmpdir / 'ray'}"])
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")} | RAY_ENV
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                                         env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.time() + 180
        while "Ray runtime started" not in self.log.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                output = self.log.read_text()[-3000:]   # stop() deletes the log with the node's files
                self.stop()
                raise RuntimeError(f"ray start failed:\n{output}")
            time.sleep(0.2)
        self.address = f"127.0.0.1:{self.port}"

    def workers(self) -> list[int]:
        return [p for p in _session(self.proc.pid) if _cmdline(p).startswith("ray::ray_task")]

    def stop(self) -> None:
        """Only this node's processes, by PID; then the files Ray left (ray_current_cluster)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _session(self.proc.pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + (3 if sig == signal.SIGTERM else 10)   # a graceful exit saves nothing here
            while _session(self.proc.pid) and time.time() < deadline:
                self.proc.poll()   # reaps the node's own process once it exits (else a zombie for 10 s)
                time.sleep(0.1)
        self.proc.wait()
        subprocess.run(["rm", "-rf", str(self.tmpdir)], check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One node for the module; each test writes under ``cluster.hidden``, which the node cannot see."""
    hidden = tmp_path_factory.mktemp("driver")
    node = Node(hidden)
    node.hidden = hidden
    try:
        yield node
    finally:
        node.stop()
        assert not node.tmpdir.exists()   # ray_current_cluster and the session files are gone


def _driver(*args, env=None, **kw) -> subprocess.Popen:
    """A driver process as a user starts one (Ray reads these variables when it is imported)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **RAY_ENV, **(env or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _run_on(cluster, config_path: Path, out: Path, *flags: str, env=None) -> subprocess.Popen:
    return _driver("-m", "groupfel.experiments.cli", "run", str(config_path), "--output", str(out), "--quiet",
                   "--backend", "ray", *flags, env=env)


def _config(tmp_path, data=None, **train) -> tuple[Path, object]:
    import tomli_w

    raw = {**CONFIG, "train": {**CONFIG["train"], **train}, "data": {**CONFIG["data"], **(data or {})}}
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(raw))
    config = parse_config(raw)
    run_experiment(config, tmp_path / "local", backend="local", jobs=2, progress=False)
    return path, config


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """CONFIG as a file and its local pool's run, which the tests that run CONFIG unchanged compare with."""
    tmp = tmp_path_factory.mktemp("reference")
    path, config = _config(tmp)
    return path, config, tmp / "local"


def _assert_same_run(a: Path, b: Path, config) -> None:
    for name in ("runs.csv", "summary.csv", "per_seed.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(a / name), pd.read_csv(b / name), check_exact=True)
    for s in config.seed_list:
        for arm in config.arms:
            d = Path(f"seed-{s}") / arm.name
            pd.testing.assert_frame_equal(pd.read_parquet(a / d / "ledger.parquet"),
                                          pd.read_parquet(b / d / "ledger.parquet"), check_exact=True)
            assert json.loads((b / d / "manifest.json").read_text())["complete"]
            assert not (b / d / "checkpoint.pt").exists()


NODE_VIEW = """
import os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote(num_cpus=1)
def view(path):
    try:
        import groupfel.emulator as emulator
        code = groupfel.emulator.__file__
    except ImportError:
        code = None
    return os.listdir(path), code
print(ray.get(view.remote(sys.argv[2])))
"""


def test_a_cluster_without_the_drivers_disk_returns_complete_runs(cluster, reference):
    path, config, local = reference
    out = cluster.hidden / "run"
    # GPUs the cluster lacks: one line before any work (asked meanwhile: it waits on nothing of the run)
    gpu = _run_on(cluster, path, cluster.hidden / "gpu", "--address", cluster.address, "--gpus-per-task", "0.5")
    stdout, stderr = _run_on(cluster, path, out, "--address", cluster.address).communicate(timeout=600)
    assert "results:" in stdout, stderr
    _assert_same_run(local, out, config)
    assert all(json.loads(p.read_text())["device"].startswith("cpu (") for p in out.glob("seed-*/*/manifest.json"))
    # what the node sees: not the driver's directory, and no groupfel but what a job ships
    stdout, stderr = _driver("-c", NODE_VIEW, cluster.address, str(cluster.hidden)).communicate(timeout=300)
    assert stdout.strip() == "([], None)", stderr
    _, stderr = gpu.communicate(timeout=300)
    assert gpu.returncode == 2 and "--gpus-per-task 0.5: the cluster has 0 GPUs" in stderr
    assert not (cluster.hidden / "gpu").exists()


def test_a_local_run_does_not_join_the_cluster_left_on_the_machine(cluster, reference, tmp_path):
    """ray_current_cluster names the running node; without --address the run starts its own Ray."""
    path, config, local = reference
    assert (cluster.tmpdir / "ray" / "ray_current_cluster").exists()
    driver = _run_on(cluster, path, tmp_path / "own", env={"RAY_TMPDIR": str(cluster.tmpdir)})
    stdout, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 0, stderr
    _assert_same_run(local, tmp_path / "own", config)


def _fashion_files(directory: Path) -> None:
    """Small Fashion-MNIST in its real on-disk format (gzipped idx)."""
    import gzip

    import numpy as np

    rng = np.random.default_rng(0)
    directory.mkdir(parents=True)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (400, 28, 28)),
              "train-labels-idx1-ubyte": np.arange(400) % 10,
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (100, 28, 28)),
              "t10k-labels-idx1-ubyte": np.arange(100) % 10}
    for stem, a in arrays.items():
        header = bytes([0, 0, 8, a.ndim]) + np.array(a.shape, dtype=">u4").tobytes()
        with gzip.open(directory / f"{stem}.gz", "wb") as fh:
            fh.write(header + a.astype(np.uint8).tobytes())


def test_a_dataset_the_node_lacks_fails_in_one_line_or_is_shipped(cluster, tmp_path):
    data = cluster.hidden / "fashion"          # the driver has it; the node cannot see it
    _fashion_files(data)
    path, config = _config(tmp_path, data={"dataset": "fashion-mnist", "path": str(data)}, rounds=3)
    driver = _run_on(cluster, path, tmp_path / "lacks", "--address", cluster.address)
    _, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "on node 127.0.0.1" in stderr and str(data) in stderr and "--ship-data" in stderr
    driver = _run_on(cluster, path, tmp_path / "shipped", "--address", cluster.address, "--ship-data")
    _, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 0, stderr
    _assert_same_run(tmp_path / "local", tmp_path / "shipped", config)


def test_a_killed_worker_is_rerun_from_its_streamed_checkpoint(cluster, tmp_path):
    path, config = _config(tmp_path, rounds=40)
    out = cluster.hidden / "killed"
    driver = _run_on(cluster, path, out, "--address", cluster.address)
    killed = []
    deadline = time.time() + 300
    while not killed and driver.poll() is None and time.time() < deadline:
        if list(out.glob("seed-*/*/checkpoint.pt")):       # a checkpoint reached the driver
            for pid in cluster.workers()[:1]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.01)
    stdout, stderr = driver.communicate(timeout=600)
    assert len(killed) == 1 and driver.returncode == 0, stderr
    assert "its Ray worker or node died (" in stderr and "again from its last checkpoint" in stderr
    _assert_same_run(tmp_path / "local", out, config)
