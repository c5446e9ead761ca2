"""The emulated clock end to end: real clients that train under a device's CPU cap, on a real network.

    sudo python benchmarks/clock.py             # every scenario, a few minutes
    sudo python benchmarks/clock.py --quick     # the slow test's small version

The loop a user runs: measure a device, calibrate its cost curves, emulate a group round, and
expect the time a real deployment takes. For each scenario, on this machine (root needed):

1. **Devices.** Each device is a share of one core: a cgroup CPU quota (v2 ``cpu.max`` or v1
   ``cpu.cfs_quota_us``, period 10 ms, ``--period-ms``). Each client's device is measured alone, under its quota,
   with ``groupfel.cost_models.measure`` (training: ``measure("training")``, one epoch of the
   digits CNN at several sample counts; secure aggregation: the client's part of the protocol,
   ``time_secagg_parts`` on the wall clock), the edge's cores likewise (``measure("secagg",
   server=True, clock="wall")``), and ``groupfel.cost_models.calibrate`` fits the curves and writes
   the profile CSV a user would get. Nothing is fitted to the round that is checked.
2. **The real round.** ``benchmarks/network.py``'s namespaces (an edge, an access point with
   per-client HTB leaves under a shared class, a namespace per client). A client process loads its
   shard of scikit-learn's digits, builds the CNN (torch on one thread), connects to the edge and
   only then is moved into its quota's cgroup (Python and torch start-up stay outside the round).
   The edge sends each client the model's float32 bytes, the group's public keys and share
   ciphertexts; the client trains E epochs of minibatch SGD, runs its part of secure aggregation
   with the ``cryptography`` primitives ``measure`` times (two X25519 key pairs, Shamir shares of
   its mask seed and key, AES-GCM boxes, the self mask and n - 1 pairwise ChaCha20 masks over the
   quantised model, opening n - 1 boxes) and uploads the masked model, its keys, boxes and
   unmasking shares: the bytes of ``groupfel.emulator.contention.client_bytes``. When a group's
   uploads are in, one of the edge's cores (a worker process in its own quota's cgroup; groups
   wait in line for a free one) sums the masked vectors, reconstructs each self-mask seed from its
   Shamir shares and removes its ChaCha20 mask: the aggregator's work that ``secagg-server`` times.
   (The peers' keys are stand-ins made by the edge before the round, so the pairwise masks do not
   cancel and the sum is not the group's mean; every operation and byte is the protocol's.)
   Every phase is timed on CLOCK_MONOTONIC, shared by all namespaces.
3. **The emulated round.** The emulator's own shared-edge processes
   (``groupfel.emulator.contention.ContendedFederation``) play the same round with the calibrated
   profile: the same group, sample counts, epochs, links (times TCP's 1448/1514 payload share, as
   ``network.py`` derives), access capacity and edge cores.

The table compares the makespan and each phase (mean over clients, or over groups for the edge's);
a phase's error is printed only where it lasts over 100 ms (else its mean in ms, in brackets).
``CPU share`` checks the testbed: each client's CPU seconds over its training's wall seconds,
divided by its quota (100 %: it got its whole quota; less: other processes on the machine took
the core from it, which no emulator of the device can know).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import network as net  # noqa: E402  (benchmarks/network.py: the namespaces and shaping)

# The quota's period: 10 ms, not the kernel's default 100 ms. A call's wall time under a quota
# comes in steps of about a period (by where in a period it starts and how much quota is left),
# so with 100 ms one-epoch calls of a few hundred samples scatter by +-50 % and the fit is noise;
# the docs (benchmarks.md, "The clock end to end") show both.
PERIOD_US = 10_000
BATCH, LR = 32, 0.05         # measure_training's minibatch SGD
TASK = "clock"
PHASES = ("download", "train", "secagg", "upload", "queue", "aggregation")


@dataclass
class Round:
    """One group round of one edge on quota-limited devices."""

    name: str
    quotas: list[float]                  # each client's share of one core
    groups: list[list[int]]
    samples: list[int]                   # each client's shard of digits
    client_mbps: list[float]
    epochs: int = 5
    edge_mbps: float | None = None       # shared access capacity; None: dedicated links
    edge_cores: int = 1
    edge_quota: float = 1.0              # each edge core's share of a core

    @property
    def n(self) -> int:
        return len(self.quotas)

    def device(self, i: int) -> str:
        return device_name(self.quotas[i])

    def network(self, model_bytes: int) -> net.Scenario:
        """network.py's scenario: the same namespaces, links and shaping."""
        return net.Scenario(self.name, self.client_mbps, self.groups, model_bytes, secagg=True,
                            edge_mbps=self.edge_mbps, edge_cores=self.edge_cores)

    def spec(self, model_bytes: int) -> dict:
        down, up = self.network(model_bytes).transfer_bytes()
        return {**asdict(self), "down": down, "up": up, "model_bytes": model_bytes}


def device_name(quota: float) -> str:
    return f"q{round(100 * quota)}"


def scenarios(quick: bool = False) -> list[Round]:
    """Every client's quota, group, shard and link. The quotas of clients training at once add up to
    about one core: the machine has two, shared with other work."""
    if quick:
        return [Round("stragglers 50/25/25 %, shared access", [0.5, 0.25, 0.25], [[0, 1, 2]], [200, 150, 150],
                      [2.0] * 3, epochs=8, edge_mbps=2.0)]
    return [
        Round("2 clients at 50 %, dedicated", [0.5, 0.5], [[0, 1]], [300, 300], [1.0, 1.0], epochs=20),
        Round("4 clients at 25 %, shared access", [0.25] * 4, [[0, 1, 2, 3]], [200] * 4, [2.0] * 4,
              epochs=15, edge_mbps=2.0),
        Round("10 clients at 10 %, shared access", [0.1] * 10, [list(range(10))], [120] * 10, [2.0] * 10,
              epochs=10, edge_mbps=4.0),
        Round("100 % after a slow link's 50 %", [1.0, 0.5], [[0, 1]], [300, 200], [8.0, 0.4], epochs=20),
        Round("stragglers 50/25/25 %, shared access", [0.5, 0.25, 0.25], [[0, 1, 2]], [300, 200, 200],
              [2.0] * 3, epochs=12, edge_mbps=2.0),
        Round("edge contended: 4 groups, 1 core at 10 %", [0.125] * 8, [[0, 1], [2, 3], [4, 5], [6, 7]],
              [150] * 8, [2.0] * 8, epochs=8, edge_mbps=8.0, edge_cores=1, edge_quota=0.1),
    ]


# ---------------------------------------------------------------------------------------------
# CPU quotas

class Refused(RuntimeError):
    """No CPU quota can be set here."""


def _cgroup_roots() -> tuple[str, Path, Path] | None:
    """(version, the cpu controller's root, the CPU-time accounting root), or None."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists():
        return "v2", v2, v2
    cpu = next((p for p in (v2 / "cpu", v2 / "cpu,cpuacct") if (p / "cpu.cfs_quota_us").exists()), None)
    acct = next((p for p in (v2 / "cpuacct", v2 / "cpu,cpuacct", v2 / "cpu") if (p / "cpuacct.usage").exists()), None)
    return ("v1", cpu, acct) if cpu and acct else None


class CpuQuota:
    """A cgroup that holds its processes to ``share`` of one core (quota = share x period each
    ``PERIOD_US``); reads their CPU time and how long the kernel throttled them.

    Its weight is the largest the kernel takes (v1 ``cpu.shares``, v2 ``cpu.weight``), so that on a
    machine busy with other work the group still gets its whole quota when it asks: the quota caps
    a device, the weight makes it that device's own."""

    def __init__(self, name: str, share: float):
        roots = _cgroup_roots()
        if roots is None:
            raise Refused("no cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us) is mounted")
        self.version, cpu_root, acct_root = roots
        self.cpu, self.acct = cpu_root / name, acct_root / name
        if self.version == "v2":
            (cpu_root / "cgroup.subtree_control").write_text("+cpu")
        self.dirs = list(dict.fromkeys([self.cpu, self.acct]))
        for d in self.dirs:
            d.mkdir()
        quota = max(1000, round(share * PERIOD_US))
        if self.version == "v2":
            (self.cpu / "cpu.weight").write_text("10000")
            (self.cpu / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.cpu / "cpu.shares").write_text("262144")
            (self.cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def cpu_s(self) -> float:
        if self.version == "v2":
            return self._stat("usage_usec") / 1e6
        return int((self.acct / "cpuacct.usage").read_text()) / 1e9

    def throttled_s(self) -> float:
        return self._stat("throttled_usec") / 1e6 if self.version == "v2" else self._stat("throttled_time") / 1e9

    def _stat(self, key: str) -> int:
        for line in (self.cpu / "cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
        return 0

    def close(self) -> None:
        for d in self.dirs:
            if not d.exists():
                continue
            for pid in (d / "cgroup.procs").read_text().split():   # leftovers back to the root
                try:
                    (d.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            for _ in range(50):            # a process that just exited may hold it a moment
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)


def check_quota() -> str | None:
    """Why no CPU quota can be set here, or None when one can."""
    if os.geteuid() != 0:
        return "needs root (cgroup CPU quotas)"
    q = None
    probe = subprocess.Popen(["sleep", "5"])
    try:
        q = CpuQuota(f"gfq{os.getpid()}probe", 0.5)
        q.add(probe.pid)
    except (Refused, OSError) as e:
        return f"cgroup CPU quota refused: {e}"
    finally:
        probe.kill()
        probe.wait()
        if q is not None:
            q.close()
    return None


def sweep_stale_cgroups() -> None:
    """Remove the cgroups of earlier runs killed outright (named gfq<pid>..., that pid gone)."""
    roots = _cgroup_roots()
    for root in ({roots[1], roots[2]} if roots else ()):
        for d in root.glob("gfq*"):
            m = re.match(r"gfq(\d+)", d.name)
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                try:
                    d.rmdir()
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# Helper processes: started, told their cgroup, then let go

def _spawn(cmd: list[str], boot: CpuQuota | None = None) -> subprocess.Popen:
    """A helper process; ``boot``: the cgroup it starts up in (imports, data, model), before the
    caller moves it into its device's."""
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if boot is not None:
        boot.add(p.pid)
    return p


def _ready(p: subprocess.Popen) -> subprocess.Popen:
    line = p.stdout.readline().strip()      # "" if it died
    if line != "ready":
        p.kill()
        raise RuntimeError(f"{' '.join(p.args[-4:])}: did not start ({line!r})")
    return p


def _start(cmd: list[str], boot: CpuQuota | None = None) -> subprocess.Popen:
    return _ready(_spawn(cmd, boot))


def _go(p: subprocess.Popen) -> None:
    p.stdin.write("go\n")
    p.stdin.flush()


def _wait_go() -> None:
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("told to stop before the round")


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a round process failed: exit codes {[p.returncode for p in procs]}")
    return outs


# ---------------------------------------------------------------------------------------------
# 1. Devices measured and calibrated under their quotas

def calibrate_devices(rd: Round, model_bytes: int, workdir: Path) -> tuple[dict, dict]:
    """Measure each distinct client device and the edge's core alone under its quota, fit with
    ``calibrate``; returns the profiles (``read_profiles`` of the written CSV) and each device's
    CPU share during its training measurement (as a share of its quota)."""
    from groupfel.cost_models import read_profiles
    from groupfel.cost_models.calibrate import calibrate, profile_csv, read_measurements

    group_sizes = sorted({2, 3, 4, *(len(g) for g in rd.groups)})
    files, shares = [], {}
    jobs = [(device_name(q), q, "client") for q in sorted(set(rd.quotas))] + \
        [(f"edge{device_name(rd.edge_quota)}", rd.edge_quota, "edge")]
    for name, share, kind in jobs:
        spec = {"kind": kind, "device": name, "sizes": training_sizes(rd.samples), "group_sizes": group_sizes,
                "params": model_bytes // 4}
        boot, quota = CpuQuota(f"gfq{os.getpid()}boot", 1.0), CpuQuota(f"gfq{os.getpid()}cal", share)
        try:
            p = _start([sys.executable, HERE, "--role", "calibrate", "--spec", json.dumps(spec)], boot)
            quota.add(p.pid)
            _go(p)
            out = _finish([p], 600.0)[0]
        finally:
            quota.close()
            boot.close()
        text, _, tail = out.rpartition("\n#share ")
        shares[name] = float(tail) / share
        path = workdir / f"measurements-{name}.csv"
        path.write_text(text)
        files.append(path)
    fits = calibrate(read_measurements(files))
    profile = workdir / "profile.csv"
    profile.write_text(profile_csv(fits, TASK))
    return read_profiles(profile), shares


def training_sizes(samples: list[int]) -> list[int]:
    """Sample counts for one-epoch calls that bracket the clients' shards (a fit is surest where it
    is used)."""
    return sorted({max(32, min(samples) // 2), *samples, 2 * max(samples)})


def run_calibration(spec: dict) -> None:
    """(In the device's cgroup) its measurement CSV on stdout, then ``#share`` and the CPU share
    its training measurement got."""
    import torch

    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES, Measurement, measure, measurements_csv
    from groupfel.cost_models.secagg import time_secagg_parts
    from groupfel.emulator.models import build_model

    torch.set_num_threads(1)
    _wait_go()
    device, params = spec["device"], spec["params"]
    if spec["kind"] == "edge":
        rows, header = measure("secagg", spec["group_sizes"], lambda: build_model("cnn", INPUT_SHAPE, NUM_CLASSES),
                               params=params, device=device, server=True, clock="wall")
        print(measurements_csv([r for r in rows if r.operation == "secagg-server"], header), end="")
        print("\n#share 1")
        return
    cpu0, wall0 = _cpu(), time.monotonic()
    rows, header = measure("training", spec["sizes"], lambda: build_model("cnn", INPUT_SHAPE, NUM_CLASSES),
                           repeats=5, device=device)
    share = (_cpu() - cpu0) / (time.monotonic() - wall0)
    # the client's part of secure aggregation on the wall clock (the edge does the aggregator's)
    sizes = spec["group_sizes"]
    for n in sizes:                     # one untimed pass, as measure's sweeps
        time_secagg_parts(n, params, clock="wall")
    for _ in range(3):
        for n in sizes:
            rows.append(Measurement("secagg", "secagg", device, n, None,
                                    time_secagg_parts(n, params, clock="wall")[0]))
    print(measurements_csv(rows, header), end="")
    print(f"\n#share {share}")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_SPIN = r"""
import sys, time
def spin(c):
    t = time.thread_time()
    while time.thread_time() - t < c:
        pass
sys.stdin.readline()
for c in map(float, sys.argv[1:]):
    time.sleep(0.5)
    t = time.monotonic()
    spin(c)
    print(c, time.monotonic() - t, flush=True)
"""


def burst_check(share: float = 0.25, cpu_s: tuple[float, ...] = (0.06, 0.2), repeats: int = 5,
                periods_us: tuple[int, ...] = (10_000, 100_000), out=print) -> list[dict]:
    """The quota term against the kernel: a process that sleeps 0.5 s, then spins ``cpu_s`` of CPU
    under ``share`` of a core; its median wall time against ``quota_seconds``, for each period."""
    from groupfel.emulator.contention import quota_seconds

    rows = []
    for period in periods_us:
        q = CpuQuota(f"gfq{os.getpid()}spin", share)
        try:
            (q.cpu / ("cpu.max" if q.version == "v2" else "cpu.cfs_period_us")).write_text(
                f"{round(share * period)} {period}" if q.version == "v2" else str(period))
            if q.version == "v1":
                (q.cpu / "cpu.cfs_quota_us").write_text(str(round(share * period)))
            p = _spawn([sys.executable, "-c", _SPIN, *[str(c) for c in cpu_s for _ in range(repeats)]])
            q.add(p.pid)
            _go(p)
            got = [tuple(map(float, line.split())) for line in _finish([p], 120.0)[0].splitlines()]
        finally:
            q.close()
        for c in cpu_s:
            wall = statistics.median(w for cc, w in got if cc == c)
            rows.append({"period_ms": period / 1000, "cpu_s": c, "steady_s": c / share, "measured_s": wall,
                         "modelled_s": quota_seconds(c / share, share, period / 1e6)})
            r = rows[-1]
            out(f"quota {100 * share:g} % of a core, period {r['period_ms']:g} ms, {1000 * c:g} ms of CPU after 0.5 s "
                f"asleep: {r['measured_s']:.3f} s measured (median of {repeats}), {r['modelled_s']:.3f} s by "
                f"quota_seconds, {r['steady_s']:.3f} s at the steady pace")
    return rows


# ---------------------------------------------------------------------------------------------
# 2. The real round

def measure_round(rd: Round, model_bytes: int, timeout_s: float = 300.0) -> dict:
    spec = json.dumps(rd.spec(model_bytes))
    boot = CpuQuota(f"gfq{os.getpid()}boot", 1.0)
    quotas: list[CpuQuota] = [boot]
    procs: list[subprocess.Popen] = []
    try:
        with net.Network(rd.network(model_bytes)) as nw:
            server = _start(["ip", "netns", "exec", nw.edge, sys.executable, HERE, "--role", "edge", "--spec", spec],
                            boot)
            procs.append(server)
            cores = [int(pid) for pid in server.stdout.readline().split()]
            for k, pid in enumerate(cores):
                quotas.append(CpuQuota(f"gfq{os.getpid()}e{k}", rd.edge_quota))
                quotas[-1].add(pid)
            _go(server)
            clients = [_spawn(["ip", "netns", "exec", ns, sys.executable, HERE, "--role", "client",
                               "--spec", spec, "--id", str(i)], boot) for i, ns in enumerate(nw.clients)]
            procs += clients
            for i, p in enumerate(clients):
                _ready(p)   # start-up done: from now on each runs on its device's share
                quotas.append(CpuQuota(f"gfq{os.getpid()}c{i}", rd.quotas[i]))
                quotas[-1].add(p.pid)
            for p in clients:
                _go(p)
            outs = _finish(procs, timeout_s)
            throttled = [q.throttled_s() for q in quotas[1 + len(cores):]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for q in quotas:
            q.close()
    srv = json.loads(outs[0].splitlines()[-1])
    t0 = srv["t0"]
    cl = [json.loads(o.splitlines()[-1]) for o in outs[1:]]
    return {"makespan": max(srv["aggregation_end"]) - t0,
            "download": [c["download_end"] - t0 for c in cl],
            "train": [c["train_end"] - c["download_end"] for c in cl],
            "secagg": [c["upload_start"] - c["train_end"] for c in cl],
            "upload": [u - c["upload_start"] for u, c in zip(srv["upload_end"], cl)],
            "queue": [s - q for s, q in zip(srv["aggregation_start"], srv["queued"])],
            "aggregation": [e - s for e, s in zip(srv["aggregation_end"], srv["aggregation_start"])],
            "train_cpu": [c["train_cpu"] for c in cl], "throttled": throttled,
            "share": [c["train_cpu"] / c["train"] / q for c, q in zip(cl, rd.quotas)]}


def _group_keys(n: int) -> bytes:
    """Stand-in public keys of a group's members (two X25519 keys each), made before the round."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return b"".join(X25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(2 * n))


def _aggregate(job) -> None:
    """One group on an edge core: the aggregator's part of secure aggregation."""
    import numpy as np

    from groupfel.cost_models.secagg import KEY_BYTES, dequantize, prg, shamir_reconstruct

    n, m, uploads = job
    t = n // 2 + 1
    masked = np.stack([np.frombuffer(u[:4 * m], dtype=np.uint32) for u in uploads])
    total = np.sum(masked, axis=0, dtype=np.uint32)
    for u in uploads:
        tail = u[len(u) - 66 * (n - 1):]
        shares = [(k + 1, int.from_bytes(tail[66 * k:66 * (k + 1)], "big")) for k in range(n - 1)]
        seed = shamir_reconstruct(shares[:t]) % (1 << 8 * KEY_BYTES)
        total -= prg(seed.to_bytes(KEY_BYTES, "big"), m)
    dequantize(total, 2.0**16) / n


def serve(spec: dict) -> None:
    """The edge: every client's download (the model's float32 bytes, the group's keys, the share
    ciphertexts addressed to it), its upload, each group's aggregation on a core."""
    import numpy as np
    import torch

    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES
    from groupfel.emulator.models import build_model

    n, groups, m = len(spec["quotas"]), spec["groups"], spec["model_bytes"] // 4
    cores = net.Cores(spec["edge_cores"], _aggregate, warm=None)   # the edge's cores: a line for free ones
    print("ready", flush=True)
    print(" ".join(str(p.pid) for p in cores.procs), flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("told to stop before the round")
    torch.manual_seed(0)
    model = torch.cat([p.detach().flatten() for p in build_model("cnn", INPUT_SHAPE, NUM_CLASSES).parameters()])
    weights = model.numpy().astype(np.float32).tobytes()
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    downloads = {}
    for members in groups:
        keys = _group_keys(len(members))
        for i in members:
            downloads[i] = weights + keys + os.urandom(spec["down"][i] - len(weights) - len(keys))
    left = [len(g) for g in groups]
    uploads: list[list[bytes]] = [[] for _ in groups]
    upload_end, queued = [0.0] * n, [0.0] * len(groups)
    agg = [(0.0, 0.0)] * len(groups)
    lock = threading.Lock()
    conns = net.accept_clients(n)

    def one(i: int, conn) -> None:
        conn.sendall(downloads[i])
        data = net._recv_bytes(conn, spec["up"][i])
        upload_end[i] = time.monotonic()
        g = group_of[i]
        with lock:
            uploads[g].append(data)
            left[g] -= 1
            ready = left[g] == 0
        if ready:
            queued[g] = upload_end[i]
            agg[g] = cores.run((len(groups[g]), m, uploads[g]))

    t0 = net.serve_round(conns, one)
    cores.close()
    print(json.dumps({"t0": t0, "upload_end": upload_end, "queued": queued,
                      "aggregation_start": [a[0] for a in agg], "aggregation_end": [a[1] for a in agg]}), flush=True)


def client_secagg(u: int, n: int, q, keys: bytes) -> bytes:
    """Client u's part of secure aggregation (``cost_models/secagg.py``'s steps 0-3 for one
    client) over its quantised model ``q``; returns what it uploads besides nothing else."""
    import numpy as np
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from groupfel.cost_models.secagg import KEY_BYTES, _kdf, _pair_mask, _raw, prg, shamir_share

    t, m = n // 2 + 1, len(q)
    peers = [v for v in range(n) if v != u]
    c_pk = [X25519PublicKey.from_public_bytes(keys[64 * v:64 * v + 32]) for v in range(n)]
    s_pk = [X25519PublicKey.from_public_bytes(keys[64 * v + 32:64 * v + 64]) for v in range(n)]
    c_sk, s_sk = X25519PrivateKey.generate(), X25519PrivateKey.generate()          # AdvertiseKeys
    b_seed = os.urandom(KEY_BYTES)                                                   # ShareKeys
    s_shares = shamir_share(_raw(s_sk), n, t)
    b_shares = shamir_share(int.from_bytes(b_seed, "big"), n, t)
    boxes = {}
    for v in peers:
        aead = AESGCM(_kdf(c_sk.exchange(c_pk[v]), b"groupfel secagg share box"))
        nonce = u.to_bytes(6, "big") + v.to_bytes(6, "big")
        plain = b"".join(s.to_bytes(66, "big") for s in (s_shares[v][1], b_shares[v][1]))
        boxes[v] = (aead, nonce, aead.encrypt(nonce, plain, None))
    acc = q + prg(b_seed, m)                                                         # MaskedInput
    for v in peers:
        mask = _pair_mask(s_sk, s_pk[v], m)
        acc = acc + mask if u < v else acc - mask
    for v in peers:   # Unmasking: open n - 1 boxes (the stand-in peers' boxes are the same AES-GCM work)
        aead, nonce, box = boxes[v]
        aead.decrypt(nonce, box, None)
    ids = u.to_bytes(4, "big")
    return (np.asarray(acc, dtype=np.uint32).tobytes()
            + c_sk.public_key().public_bytes_raw() + s_sk.public_key().public_bytes_raw()
            + b"".join(nonce + ids + v.to_bytes(4, "big") + box for v, (_, nonce, box) in boxes.items())
            + b"".join(b_shares[v][1].to_bytes(66, "big") for v in peers))


def client(spec: dict, i: int) -> None:
    """Client i: its shard and model ready before the round; then download, E epochs, its part of
    secure aggregation, upload."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES
    from groupfel.cost_models.secagg import quantize
    from groupfel.emulator.models import build_model

    torch.set_num_threads(1)
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    start = sum(spec["samples"][:i])
    idx = order[np.arange(start, start + spec["samples"][i]) % len(order)]
    x = torch.tensor(digits.data[idx] / 16.0, dtype=torch.float32).reshape(-1, *INPUT_SHAPE)
    y = torch.tensor(digits.target[idx])
    model = build_model("cnn", INPUT_SHAPE, NUM_CLASSES)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    loss = nn.CrossEntropyLoss()
    # one untimed step on each batch shape first, as measure's sweeps do: a process's first calls
    # pay one-off costs (allocator, oneDNN kernel selection) that a client that has trained before has paid
    for b in sorted({0, len(y) - len(y) % BATCH} - {len(y)}):
        loss(model(x[b:b + BATCH]), y[b:b + BATCH]).backward()
    opt.zero_grad(set_to_none=True)
    group = next(g for g in spec["groups"] if i in g)
    n, u = len(group), group.index(i)
    m = spec["model_bytes"] // 4
    # and one untimed run of its part of secure aggregation: the first calls into OpenSSL (X25519,
    # HKDF, AES-GCM, ChaCha20) cost some 10 ms of CPU once, 100 ms on a 10 % device
    client_secagg(u, n, quantize(np.zeros(m), 1.0), _group_keys(n))
    _wait_go()
    conn = net.connect(i)
    data = net._recv_bytes(conn, spec["down"][i])
    download_end = time.monotonic()
    cpu0 = _cpu()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(np.frombuffer(data[:4 * m], dtype=np.float32).copy()), params)
    for _ in range(spec["epochs"]):
        for b in range(0, len(y), BATCH):
            opt.zero_grad(set_to_none=True)
            loss(model(x[b:b + BATCH]), y[b:b + BATCH]).backward()
            opt.step()
    train_end = time.monotonic()
    train_cpu = _cpu() - cpu0
    q = quantize(torch.nn.utils.parameters_to_vector(params).detach().numpy(), 2.0**16)
    payload = client_secagg(u, n, q, data[4 * m:4 * m + 64 * n])
    upload_start = time.monotonic()
    conn.sendall(payload)
    net._recv_exactly(conn, 1)
    conn.close()
    print(json.dumps({"download_end": download_end, "train_end": train_end, "upload_start": upload_start,
                      "train_cpu": train_cpu, "train": train_end - download_end}), flush=True)


# ---------------------------------------------------------------------------------------------
# 3. The emulated round

def emulate(rd: Round, profiles: dict, model_bytes: int, efficiency: float = net.EFFICIENCY,
            quota_term: bool = True) -> dict:
    """The round on the emulator's clock with the calibrated profiles: each phase per client (and
    per group for the edge's), as ``measure_round`` returns them. ``quota_term``: tell the emulator
    each client's CPU quota (``ClientNet.cpu_share``: the quota unspent during the download runs
    at full speed, ``groupfel.emulator.contention.quota_seconds``); without it the steps take
    their curves' steady time."""
    import numpy as np

    from groupfel.cost_models import CostModel
    from groupfel.emulator.contention import ClientNet, ContendedFederation, EdgeNetwork
    from groupfel.emulator.federation import Federation, Group, RoundContext
    from groupfel.emulator.ledger import CostLedger
    from groupfel.topologies.topology import Link, build_topology

    n = rd.n
    devices = [rd.device(i) for i in range(n)]
    cost = CostModel({d: profiles[f"{d}/{TASK}"] for d in set(devices)}, "sgd", ("secagg",))
    topology = build_topology([n], devices, [np.arange(1)] * n, np.ones((n, 1), dtype=int),
                              Link(1.0, 0.0), Link(1e9, 0.0))
    edge = profiles[f"edge{device_name(rd.edge_quota)}/{TASK}"].group_overhead
    clients = ClientNet(np.array(rd.client_mbps, dtype=float) * efficiency, np.zeros(n), np.ones(n),
                        cpu_share=np.array(rd.quotas, dtype=float) if quota_term else None,
                        cpu_period_s=PERIOD_US / 1e6)
    access = None if rd.edge_mbps is None else rd.edge_mbps * 1e6 * efficiency
    netw = EdgeNetwork(access, rd.edge_cores, False, clients, 1, True, {"secagg-server": edge["secagg-server"]})
    ledger = CostLedger()
    fed = ContendedFederation(RoundContext(Federation.environment(), model_bytes, cost, ledger, topology, 0, 1,
                                           rd.epochs), netw)
    groups = [Group(0, np.array(g), np.array([rd.samples[i] for i in g]), 0.0) for g in rd.groups]
    fed.run_round(0, list(enumerate(groups)))
    t0 = min(r["start"] for r in fed.trace if r["kind"] == "download")
    out = {p: [0.0] * (len(rd.groups) if p in ("queue", "aggregation") else n) for p in PHASES}
    ends = []
    for r in fed.trace:
        if r["kind"] == "download":
            out["download"][r["client"]] = r["end"] - t0
        elif r["kind"] == "upload":
            out["upload"][r["client"]] = r["end"] - r["start"]
        else:
            out["queue"][r["group"]] = r["start"] - r["queued"]
            out["aggregation"][r["group"]] = r["end"] - r["start"]
            ends.append(r["end"] - t0)
    frame = ledger.frame()
    for row in frame.itertuples(index=False):
        out["train" if row.component == "training" else "secagg"][int(row.client)] = row.end - row.start
    out["makespan"] = max(ends)
    return out


# ---------------------------------------------------------------------------------------------

def error_pct(emulated: float, measured: float) -> float:
    return 100.0 * (emulated - measured) / measured


def validate(rds: list[Round], out=print, workdir: Path | None = None) -> list[dict]:
    """Calibrate, run and emulate each round; print and return the table's rows."""
    for why in (net.check_available(), check_quota()):
        if why:
            raise Refused(why)
    net.sweep_stale()
    sweep_stale_cgroups()
    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES, param_count
    from groupfel.emulator.models import build_model

    model_bytes = 4 * param_count(build_model("cnn", INPUT_SHAPE, NUM_CLASSES))
    out(f"digits CNN ({model_bytes // 4} parameters, {model_bytes} bytes); CFS period {PERIOD_US // 1000} ms; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out("| scenario | clients | measured s | emulated s | makespan error % | "
        + " | ".join(f"{p} error %" for p in PHASES)
        + " | without the quota term: makespan, train error % | CPU share of quota (round; calibration) "
        + "| training CPU, curve vs round % |")
    out("| --- " * (8 + len(PHASES)) + "|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, rd in enumerate(rds):
            wd = Path(workdir or tmp) / f"s{k}"
            wd.mkdir(parents=True, exist_ok=True)
            profiles, cal_share = calibrate_devices(rd, model_bytes, wd)
            m = measure_round(rd, model_bytes)
            e = emulate(rd, profiles, model_bytes)
            steady = emulate(rd, profiles, model_bytes, quota_term=False)
            # the CPU the calibrated curve says the training takes (its steady time x the quota)
            # against the CPU it took in the round: the device measured alone vs among the others
            drift = [100 * (t * q / c - 1) for t, q, c in zip(steady["train"], rd.quotas, m["train_cpu"])]
            phases = {}
            for p in PHASES:
                mm, ee = statistics.fmean(m[p]), statistics.fmean(e[p])
                phases[p] = {"measured": mm, "emulated": ee, "error_pct": error_pct(ee, mm) if mm > 0 else None}
            row = {"scenario": rd.name, "clients": rd.n, "measured": m["makespan"], "emulated": e["makespan"],
                   "error_pct": error_pct(e["makespan"], m["makespan"]), "phases": phases,
                   "emulated_steady": steady["makespan"], "error_steady_pct": error_pct(steady["makespan"], m["makespan"]),
                   "train_error_steady_pct": error_pct(statistics.fmean(steady["train"]), phases["train"]["measured"]),
                   "round_share": min(m["share"]), "calibration_share": min(cal_share[rd.device(i)] for i in range(rd.n)),
                   "throttled_s": m["throttled"], "training_cpu_drift_pct": drift, "measured_phases": m, "emulated_phases": e, "round": asdict(rd)}
            rows.append(row)

            def cell(p: str) -> str:
                ph = phases[p]
                return f"{ph['error_pct']:+.1f}" if ph["measured"] > 0.1 else f"({1000 * ph['measured']:.0f} ms)"
            out(f"| {rd.name} | {rd.n} | {row['measured']:.3f} | {row['emulated']:.3f} | {row['error_pct']:+.1f} | "
                + " | ".join(cell(p) for p in PHASES)
                + f" | {row['error_steady_pct']:+.1f}, {row['train_error_steady_pct']:+.1f}"
                + f" | {100 * row['round_share']:.0f} %; {100 * row['calibration_share']:.0f} % "
                + f"| {statistics.fmean(drift):+.1f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    global PERIOD_US
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the slow test's small version")
    p.add_argument("--json", help="also write the rows (every client's phases) to this file")
    p.add_argument("--burst-check", action="store_true", help="only check the quota term against the kernel "
                   "(a spin loop after a sleep, at 10 and 100 ms periods)")
    p.add_argument("--period-ms", type=float, default=PERIOD_US / 1000, help="the CPU quota's period "
                   "(default %(default)g; the kernel's default is 100)")
    p.add_argument("--role", choices=["edge", "client", "calibrate"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--id", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    if a.role:
        spec = json.loads(a.spec)
        {"edge": lambda: serve(spec), "client": lambda: client(spec, a.id),
         "calibrate": lambda: run_calibration(spec)}[a.role]()
        sys.stdout.flush()
        os._exit(0)      # no interpreter teardown: under a 10 % quota torch's takes seconds
    PERIOD_US = round(a.period_ms * 1000)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t = time.monotonic()
    if a.burst_check:
        why = check_quota()
        if why:
            print(f"clock benchmark skipped: {why}")
        else:
            burst_check()
        return 0
    try:
        rows = validate(scenarios(a.quick))
    except (Refused, net.Refused) as e:
        print(f"clock benchmark skipped: {e}")
        return 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    errs = sorted(abs(r["error_pct"]) for r in rows)
    print(f"makespan error: median {statistics.median(errs):.1f} %, worst {errs[-1]:.1f} % "
          f"(goals 5 % and 10 %); {time.monotonic() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
