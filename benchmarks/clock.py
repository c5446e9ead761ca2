"""The emulated clock end to end: real clients that train under a device's CPU cap, on a real network.

    sudo python benchmarks/clock.py                      # every scenario, several minutes
    sudo python benchmarks/clock.py --quick              # the slow test's small version
    sudo python benchmarks/clock.py --scenario "2 edges"  # the scenarios whose name holds it

The loop a user runs: measure a device, calibrate its cost curves, emulate a run of group and
global rounds, and expect the time a real deployment takes. For each scenario, on this machine
(root needed):

1. **Devices.** Each device is a share of one core: a cgroup CPU quota (v2 ``cpu.max`` or v1
   ``cpu.cfs_quota_us``, period 10 ms, ``--period-ms``). Each client process measures its own
   device, under its quota, among the other clients measuring theirs, just before the run and
   again just after it (so the machine's other work at calibration brackets the run's, and the
   process, its memory and its neighbours are the run's): training with
   ``groupfel.cost_models.measure("training")``, one epoch of the digits CNN at sample counts from
   half the shards to a whole round's epochs, so that most calls span many quota periods; secure
   aggregation as the round runs it, the client's part of the protocol right after an epoch of
   training on its shard, its CPU seconds at the pace the quota gave the loop that timed them. The
   edge's core is measured alone under its quota before and after
   (``measure("secagg", server=True, clock="wall")``). ``groupfel.cost_models.calibrate`` fits all
   of it together and writes the profile CSV a user would get. Nothing is fitted to the run.
2. **The real run.** ``benchmarks/network.py``'s namespaces for each edge (an edge, an access point
   with per-client HTB leaves under a shared class, a namespace per client) and, for scenarios
   with a cloud, a cloud namespace behind one WAN link (a bridge; HTB on both directions, one leaf
   per edge under the WAN's rate; netem's delay where the kernel has it) that every edge's traffic
   to the cloud shares. A client process loads its shard of scikit-learn's digits, builds the CNN
   (torch on one thread), connects to its edge and only then is moved into its quota's cgroup.
   Each global round the cloud sends every edge the model; each edge plays its groups' K group
   rounds: it sends each member the model's float32 bytes, the group's public keys and share
   ciphertexts; the client trains E epochs of minibatch SGD, runs its part of secure aggregation
   with the ``cryptography`` primitives ``measure`` times and uploads the masked model, its keys,
   boxes and unmasking shares (the bytes of ``groupfel.emulator.network.client_bytes``); when a
   group's uploads are in, one of the edge's cores (a worker process in its own quota's cgroup;
   groups wait in line) unmasks and sums them, and for a member that dropped out reconstructs its
   key and removes its pairwise masks (``secagg-server-recovery``). After its K group rounds the
   edge sends its groups' models to the cloud. A client that drops out (``drops``) closes its
   connection part-way through its training and is gone from then on. (The peers' keys are
   stand-ins made before the round: every operation and byte is the protocol's, the sum is not
   the group's mean.) Every event is timed on CLOCK_MONOTONIC, shared by all namespaces.
3. **The emulated run.** The emulator's own shared-edge processes
   (``groupfel.emulator.network.ContendedFederation``; ``groupfel.emulator.network.wan.WanFederation``
   where the edges share a WAN) play the same rounds with the calibrated profile: the same groups,
   sample counts, epochs, links (times TCP's 1448/1514 payload share, as ``network.py`` derives),
   access capacity, edge cores, the clients' quotas, and an availability trace that takes each
   dropping client offline where its emulated training reaches the same fraction.

Every phase is checked, not only the makespan: download, training, secure aggregation, upload
(means over the client rounds that finished), the queue for an edge core and the aggregation
(over group rounds), and the cloud's download and upload (over edge rounds). A phase is held to
``PHASE_GOAL_PCT`` where it lasts ``PHASE_MIN_S`` or more, else reported (its mean in ms, in
brackets). The testbed is checked too: each client's CPU share (its CPU seconds over its
training's wall seconds, over its quota) in the run and in both calibrations, and the cores other
work on the machine took meanwhile; a scenario where any client got less than ``STARVED`` of its
quota is refused in one line, because no emulator of the device can know the machine's
neighbours. Before the scenarios, a spin loop alone under each quota shows how the kernel
delivers it (bursts, gaps and their cycle: bandwidth control notices a spent quota at the next
tick, so a 10 % quota comes in bursts of a few ms some 25 ms apart, not 1 ms every 10 ms); a held
training or secure-aggregation phase that is out and lasts under two of its quota's cycles is
failed with that said, and with the same step's wall time in the calibration loop.
``finish spread`` bounds what the emulator's identical clients cannot show: the spread
of the upload starts of clients it starts together, measured; on a shared link an upload can end
up to that much earlier than the emulator's. ``upload error with the run's compute`` separates the
network model from the compute model: the same run emulated with each client's compute stretched
to what it took in the run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, fields
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
PHASES = ("download", "train", "secagg", "upload", "queue", "aggregation", "cloud down", "cloud up")
PHASE_GOAL_PCT = 10.0        # every phase that lasts PHASE_MIN_S or more, in every scenario
PHASE_MIN_S = 0.020
MAKESPAN_GOALS_PCT = (2.0, 5.0)      # median and worst over the scenarios
MIN_SCENARIOS = 9
STARVED = 0.9                # a client that got less of its quota than this was starved by other work
REPEATS = 3                  # measure's repeats in each calibration (two calibrations per scenario)
CLOUD_IP, WAN_PREFIX = "10.99.0.1", "10.99.0"


@dataclass
class Round:
    """A run of ``rounds`` global rounds of ``group_rounds`` group rounds on quota-limited devices.
    Clients are numbered edge by edge (the groups of edge 0 hold the first ones)."""

    name: str
    quotas: list[float]                  # each client's share of one core
    groups: list[list[int]]
    samples: list[int]                   # each client's shard of digits
    client_mbps: list[float]
    epochs: int = 5
    edge_mbps: float | None = None       # each edge's shared access capacity; None: dedicated links
    edge_cores: int = 1
    edge_quota: float = 1.0              # each edge core's share of a core
    rounds: int = 1                      # global rounds
    group_rounds: int = 1                # group rounds per global round (K)
    group_edge: list[int] | None = None  # each group's edge (None: every group on edge 0)
    wan_mbps: float | None = None        # a cloud behind one WAN link every edge shares; None: no cloud hop
    wan_latency_s: float = 0.0           # the WAN's one-way delay (needs netem)
    drops: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    # client -> (global round, group round, share of its training done when it goes offline)

    def __post_init__(self):
        self.drops = {int(c): tuple(v) for c, v in self.drops.items()}
        order = [c for j in range(self.edges) for c in self.edge_clients(j)]
        if order != list(range(self.n)):
            raise ValueError(f"{self.name}: clients must be numbered edge by edge and each in one group")

    @classmethod
    def from_json(cls, d: dict) -> Round:
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    @property
    def n(self) -> int:
        return len(self.quotas)

    @property
    def edges(self) -> int:
        return 1 + max(self.group_edge or [0])

    def edge_of(self, g: int) -> int:
        return self.group_edge[g] if self.group_edge else 0

    def edge_groups(self, j: int) -> list[int]:
        return [g for g in range(len(self.groups)) if self.edge_of(g) == j]

    def edge_clients(self, j: int) -> list[int]:
        return sorted(c for g in self.edge_groups(j) for c in self.groups[g])

    def group_of(self, i: int) -> int:
        return next(g for g, members in enumerate(self.groups) if i in members)

    def alive(self, t: int, k: int, g: int) -> list[int]:
        """Group g's members at the start of group round k of global round t: those that have not
        dropped out in an earlier group round."""
        return [c for c in self.groups[g] if c not in self.drops or tuple(self.drops[c][:2]) >= (t, k)]

    def device(self, i: int) -> str:
        return device_name(self.quotas[i])

    def network(self, j: int, model_bytes: int) -> net.Scenario:
        """network.py's scenario for edge j: its clients (numbered from 0), links and shaping."""
        local = self.edge_clients(j)
        pos = {c: i for i, c in enumerate(local)}
        return net.Scenario(f"{self.name} e{j}", [self.client_mbps[c] for c in local],
                            [[pos[c] for c in self.groups[g]] for g in self.edge_groups(j)], model_bytes,
                            secagg=True, edge_mbps=self.edge_mbps, edge_cores=self.edge_cores)


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
        Round("3 rounds, a client drops out mid-round", [0.25] * 4, [[0, 1, 2, 3]], [150] * 4, [2.0] * 4,
              epochs=6, edge_mbps=2.0, rounds=3, drops={3: (1, 0, 0.5)}),
        Round("2 edges, one WAN to the cloud", [0.25] * 4, [[0, 1], [2, 3]], [200] * 4, [2.0] * 4, epochs=8,
              edge_mbps=4.0, rounds=2, group_edge=[0, 1], wan_mbps=1.0, wan_latency_s=0.02),
        Round("group and global rounds: 2 edges, K = 2, T = 2", [0.125] * 8, [[0, 1], [2, 3], [4, 5], [6, 7]],
              [100] * 8, [2.0] * 8, epochs=5, edge_mbps=4.0, rounds=2, group_rounds=2, group_edge=[0, 0, 1, 1],
              wan_mbps=2.0, wan_latency_s=0.02),
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
# The machine's other work

def _busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]   # user nice system idle iowait irq softirq steal
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _pressure_s() -> float | None:
    """Seconds in which some runnable task waited for a CPU (PSI, /proc/pressure/cpu), or None."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rpartition("total=")[2]) / 1e6
    except (OSError, ValueError):
        return None


def _load(s0: tuple, s1: tuple) -> dict:
    """Other work between two samples (time, machine busy s, our cgroups' CPU s, PSI s)."""
    wall = s1[0] - s0[0]
    if wall <= 0:
        return {"others_cores": 0.0, "ours_cores": 0.0, "cpu_pressure": None, "load_average": os.getloadavg()[0],
                "wall_s": 0.0}
    busy, cpu = s1[1] - s0[1], s1[2] - s0[2]
    return {"others_cores": max(0.0, busy - cpu) / wall, "ours_cores": cpu / wall,
            "cpu_pressure": None if s0[3] is None or s1[3] is None else (s1[3] - s0[3]) / wall,
            "load_average": os.getloadavg()[0], "wall_s": wall}


class Window:
    """The machine's other work while ours ran: the cores it took (the machine's busy CPU seconds
    over a stretch, less those of our cgroups, over the stretch's wall seconds), and the share of
    the stretch in which some task waited for a CPU (PSI's cpu "some"; None where the kernel has
    no PSI). The first is what was left to others; the second says whether anyone wanted more.
    Sampled every ``every_s`` on a thread (``start``), it gives the figures of any stretch after."""

    def __init__(self, ours: list[CpuQuota], every_s: float = 0.1):
        self.ours, self.every_s = ours, every_s
        self.samples = [self._sample()]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> tuple:
        return time.monotonic(), _busy_s(), sum(q.cpu_s() for q in self.ours), _pressure_s()

    def start(self) -> Window:
        def loop() -> None:
            while not self._stop.wait(self.every_s):
                self.samples.append(self._sample())
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def close(self) -> dict:
        """Stop sampling; the figures of the whole stretch."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self.samples.append(self._sample())
        return _load(self.samples[0], self.samples[-1])

    def between(self, a: float, b: float) -> dict:
        """The figures from the last sample at or before ``a`` to the first at or after ``b``."""
        s0 = max((s for s in self.samples if s[0] <= a), key=lambda s: s[0], default=self.samples[0])
        s1 = min((s for s in self.samples if s[0] >= b), key=lambda s: s[0], default=self.samples[-1])
        return _load(s0, s1)


def starved(rd: Round, shares: list[float], where: str) -> str | None:
    """Why a scenario's numbers say nothing of the emulator: a client that got less than
    ``STARVED`` of its quota (other work on the machine took the core), or None."""
    measured = [i for i in range(rd.n) if shares[i] is not None]     # None: not measured (it dropped out)
    worst = min(measured, key=lambda i: shares[i])
    if shares[worst] >= STARVED:
        return None
    return (f"client {worst} got {100 * shares[worst]:.0f} % of its {100 * rd.quotas[worst]:g} % quota {where}, "
            f"under {100 * STARVED:.0f} %: other work on the machine starved it")


# ---------------------------------------------------------------------------------------------
# 1. Devices measured and calibrated under their quotas, together, before and after the run

def training_sizes(samples: list[int], epochs: int = 1) -> list[int]:
    """Sample counts for one-epoch calls, from half the smallest shard to a whole round's epochs of
    the largest: a fit is surest where it is used, and the long calls span many quota periods,
    whose steps make a short call's wall time jump by a period."""
    return sorted({max(32, min(samples) // 2), *samples, 2 * max(samples), epochs * max(samples)})


def calibrate_edge(rd: Round, model_bytes: int, workdir: Path, tag: str) -> Path:
    """Measure the edge's core alone under its quota: the aggregator's part of secure aggregation
    and its dropout recovery, on the wall clock. Returns the measurement file."""
    edge = f"edge{device_name(rd.edge_quota)}"
    spec = {"device": edge, "group_sizes": group_sizes(rd), "params": model_bytes // 4}
    boot, quota = CpuQuota(f"gfq{os.getpid()}boot", 1.0), CpuQuota(f"gfq{os.getpid()}cale", rd.edge_quota)
    try:
        p = _start([sys.executable, HERE, "--role", "calibrate", "--spec", json.dumps(spec)], boot)
        quota.add(p.pid)
        _go(p)
        out = _finish([p], 600.0)[0]
    finally:
        quota.close()
        boot.close()
    path = workdir / f"measurements-{tag}-{edge}.csv"
    path.write_text(out)
    return path


def group_sizes(rd: Round) -> list[int]:
    return sorted({2, 3, 4, 5, *(len(g) for g in rd.groups)})   # recovery is timed from 3: three sizes


def fit_profiles(files: list[Path], workdir: Path) -> dict:
    """``calibrate``'s fits of every measurement file, as the profile CSV a user gets, read back."""
    from groupfel.cost_models import read_profiles
    from groupfel.cost_models.calibrate import calibrate, profile_csv, read_measurements

    profile = workdir / "profile.csv"
    profile.write_text(profile_csv(calibrate(read_measurements(files)), TASK))
    return read_profiles(profile)


def run_calibration(spec: dict) -> None:
    """(In the edge core's cgroup) its measurement CSV on stdout."""
    import torch

    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES, measure, measurements_csv
    from groupfel.emulator.models import build_model

    torch.set_num_threads(1)
    _wait_go()
    rows, header = measure("secagg", spec["group_sizes"], lambda: build_model("cnn", INPUT_SHAPE, NUM_CLASSES),
                           params=spec["params"], device=spec["device"], server=True, clock="wall", repeats=REPEATS)
    print(measurements_csv(rows, header), end="")


def calibrate_client(rd: Round, i: int, model_bytes: int, train_epoch, secagg_step) -> dict:
    """(In client i's process, under its quota) its device measured with ``measure``: one epoch of
    the CNN at ``training_sizes`` of the shards of the clients on its device; and its part of
    secure aggregation as the round runs it, ``secagg_step(n)`` for a group of n right after
    ``train_epoch()``. Returns the measurement CSV, the CPU share of its quota its training
    measurement got, and when it ran."""
    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES, Measurement, measure, measurements_csv
    from groupfel.emulator.models import build_model

    same = [rd.samples[c] for c in range(rd.n) if rd.quotas[c] == rd.quotas[i]]
    start = time.monotonic()
    cpu0 = _cpu()
    rows, header = measure("training", training_sizes(same, rd.epochs),
                           lambda: build_model("cnn", INPUT_SHAPE, NUM_CLASSES), repeats=REPEATS, device=rd.device(i))
    share = (_cpu() - cpu0) / (time.monotonic() - start) / rd.quotas[i]
    # The step follows training in every round, and a millisecond of crypto run in a 10 % quota's
    # 1 ms slices after training has taken the caches costs 2-3 times its CPU back to back (1.2
    # against 2.7 ms for a group of 10 here). Its CPU seconds times the loop's wall over CPU
    # seconds is the device's pace: on the wall clock a quota's throttling gaps land wherever.
    parts, walls, cpu0, wall0 = [], [], _cpu(), time.monotonic()
    for _ in range(REPEATS):
        for n in group_sizes(rd):
            train_epoch()
            c, w = _cpu(), time.monotonic()
            secagg_step(n)
            parts.append((n, _cpu() - c))
            walls.append((n, time.monotonic() - w))
    pace = (time.monotonic() - wall0) / (_cpu() - cpu0)
    rows += [Measurement("secagg", "secagg", rd.device(i), n, None, cpu * pace) for n, cpu in parts]
    secagg_cpu = {n: statistics.fmean(c for k, c in parts if k == n) for n in group_sizes(rd)}
    # the same steps on the wall clock, not fitted: what the tick and the period's phase gave them
    secagg_wall = {n: statistics.fmean(w for k, w in walls if k == n) for n in group_sizes(rd)}
    return {"csv": measurements_csv(rows, header), "share": share, "start": start, "end": time.monotonic(),
            "secagg_cpu": secagg_cpu, "secagg_wall": secagg_wall}


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
    from groupfel.emulator.network import quota_seconds

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


_DELIVERY = r"""
import json, sys, time
sys.stdin.readline()
bursts, gaps, end = [], [], time.monotonic() + float(sys.argv[1])
last = start = time.monotonic()
while last < end:
    now = time.monotonic()
    if now - last > float(sys.argv[2]):      # the loop was off the CPU: a throttle (or a neighbour)
        bursts.append(last - start)
        gaps.append(now - last)
        start = now
    last = now
print(json.dumps({"bursts": bursts, "gaps": gaps}), flush=True)
"""
GAP_S = 0.0003           # a pause of the spin loop longer than this is a gap in the CPU it gets


def delivery_summary(bursts: list[float], gaps: list[float]) -> dict:
    """How a quota's CPU arrives: its bursts (stretches on a core) and the gaps between them.
    ``cycle_s``: a burst and a gap on average, the span over which the quota's pace holds."""
    if not bursts or not gaps:
        return {"bursts": 0, "burst_median_s": None, "burst_range_s": None, "gap_median_s": None,
                "cycle_s": None, "share": None}
    b, g = statistics.fmean(bursts), statistics.fmean(gaps)
    ordered = sorted(bursts)
    return {"bursts": len(bursts), "burst_median_s": statistics.median(bursts),
            "burst_range_s": [ordered[len(ordered) // 10], ordered[(9 * len(ordered)) // 10]],
            "gap_median_s": statistics.median(gaps), "cycle_s": b + g, "share": b / (b + g)}


def kernel_hz() -> int | None:
    """The kernel's tick rate (CONFIG_HZ), where its config is readable: CFS bandwidth control
    notices a spent quota at the next tick, so a burst runs past the quota by up to a tick."""
    import gzip

    for path in ("/proc/config.gz", f"/boot/config-{os.uname().release}"):
        try:
            with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
                text = f.read()
        except OSError:
            continue
        m = re.search(r"^CONFIG_HZ=(\d+)$", text, re.M)
        if m:
            return int(m.group(1))
    return None


def delivery(share: float, seconds: float = 2.0) -> dict:
    """A spin loop alone under ``share`` of a core for ``seconds``: how the kernel delivers the
    quota (``delivery_summary``). A step shorter than about a cycle takes whatever wall time the
    tick and the period's phase give it, not its CPU over the share."""
    q = CpuQuota(f"gfq{os.getpid()}dlv", share)
    try:
        p = _spawn([sys.executable, "-c", _DELIVERY, str(seconds), str(GAP_S)])
        q.add(p.pid)
        _go(p)
        got = json.loads(_finish([p], 60.0 + 20 * seconds)[0])
    finally:
        q.close()
    return delivery_summary(got["bursts"], got["gaps"])


def delivery_text(share: float, d: dict) -> str:
    if d["cycle_s"] is None:
        return f"{100 * share:g} %: no throttle seen"
    lo, hi = d["burst_range_s"]
    return (f"{100 * share:g} %: bursts {1000 * d['burst_median_s']:.1f} ms ({1000 * lo:.1f}-{1000 * hi:.1f}), "
            f"gaps {1000 * d['gap_median_s']:.1f} ms, a cycle {1000 * d['cycle_s']:.1f} ms, {100 * d['share']:.0f} % got")


# ---------------------------------------------------------------------------------------------
# 2. The real run

def _edge_network(rd: Round, j: int, model_bytes: int, stamp: str) -> net.Network:
    """network.py's namespaces for edge j, named apart from the other edges'."""
    nw = net.Network(rd.network(j, model_bytes))
    nw.prefix = f"gfn{os.getpid()}x{stamp}{j}"
    nw.edge, nw.ap = f"{nw.prefix}e", f"{nw.prefix}a"
    nw.clients = [f"{nw.prefix}c{i}" for i in range(len(nw.clients))]
    return nw


def edge_wan_ip(j: int) -> str:
    return f"{WAN_PREFIX}.{10 + j}"


class Wan(net.Namespaces):
    """A cloud namespace and a WAN router (a bridge) joined to every edge namespace: one link of
    ``mbps`` each way that the edges share (HTB: a shared class, one leaf per edge with its fair
    share assured and the whole link as its ceiling), a netem delay on each edge's side where the
    kernel has netem."""

    def __init__(self, edges: list[str], mbps: float, latency_s: float, stamp: str, netem: bool):
        self.prefix = f"gfn{os.getpid()}x{stamp}"
        self.cloud, self.router = f"{self.prefix}k", f"{self.prefix}w"
        self.edges, self.mbps, self.latency_s, self.netem = edges, mbps, latency_s, netem
        self.made: list[str] = []


    def _build(self) -> None:
        for ns in (self.cloud, self.router):
            net._run("ip", "netns", "add", ns)
            self.made.append(ns)
            net._run("ip", "-n", ns, "link", "set", "lo", "up")
        veth = ("gso_max_segs", "1")
        net._run("ip", "link", "add", "wan0", "netns", self.cloud, *veth, "type", "veth", "peer", "name", "pk",
                 "netns", self.router, *veth)
        batch = ["link add br0 type bridge", "link set br0 up", "link set pk master br0", "link set pk up"]
        for j, edge in enumerate(self.edges):
            net._run("ip", "link", "add", "wan0", "netns", edge, *veth, "type", "veth", "peer", "name", f"pe{j}",
                     "netns", self.router, *veth)
            batch += [f"link set pe{j} master br0", f"link set pe{j} up"]
            net._run("ip", "-n", edge, "-batch", "-", stdin=f"addr add {edge_wan_ip(j)}/24 dev wan0\nlink set wan0 up\n")
        net._run("ip", "-n", self.router, "-batch", "-", stdin="\n".join(batch) + "\n")
        net._run("ip", "-n", self.cloud, "-batch", "-", stdin=f"addr add {CLOUD_IP}/24 dev wan0\nlink set wan0 up\n")
        self._shape(self.cloud, "wan0", "dst")       # cloud -> edges
        self._shape(self.router, "pk", "src")        # edges -> cloud
        if self.latency_s > 0 and self.netem:
            delay = f"{self.latency_s * 1000:g}ms"
            for j, edge in enumerate(self.edges):
                net._run("tc", "-n", edge, "qdisc", "add", "dev", "wan0", "root", "netem", "delay", delay, "limit", "10000")
                net._run("tc", "-n", self.router, "qdisc", "add", "dev", f"pe{j}", "root", "netem", "delay", delay,
                         "limit", "10000")

    def _shape(self, ns: str, dev: str, match: str) -> None:
        rate = int(self.mbps * 1e6)
        lines = [f"qdisc add dev {dev} root handle 1: htb default 2",
                 f"class add dev {dev} parent 1: classid 1:1 htb rate {rate}bit ceil {rate}bit",
                 f"class add dev {dev} parent 1: classid 1:2 htb rate {net.DEDICATED_BPS}bit"]
        for j in range(len(self.edges)):
            cid = f"1:{10 + j:x}"
            lines += [f"class add dev {dev} parent 1:1 classid {cid} htb rate {rate // len(self.edges)}bit "
                      f"ceil {rate}bit quantum {net.FRAME}",
                      f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip {match} {edge_wan_ip(j)}/32 "
                      f"flowid {cid}"]
        net._run("tc", "-n", ns, "-batch", "-", stdin="\n".join(lines) + "\n")


def sweep_stale_wan() -> None:
    """Delete the cloud and router namespaces of earlier runs killed outright (that pid gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    for ns in listed:
        m = re.fullmatch(r"gfn(\d+)x\d+[kw]", ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def measure_round(rd: Round, model_bytes: int, netem: bool = False, timeout_s: float = 600.0) -> dict:
    """Build the namespaces, run the scenario's rounds with real processes under their quotas;
    returns every phase as measured, each client's CPU share, and the other work meanwhile."""
    spec = json.dumps({**asdict(rd), "model_bytes": model_bytes})
    boot = CpuQuota(f"gfq{os.getpid()}boot", 1.0)
    quotas: list[CpuQuota] = [boot]
    procs: list[subprocess.Popen] = []
    stamp = str(int(time.monotonic() * 1000) % 100000)
    try:
        with contextlib.ExitStack() as stack:
            nws = [stack.enter_context(_edge_network(rd, j, model_bytes, stamp)) for j in range(rd.edges)]
            if rd.wan_mbps is not None:
                wan = stack.enter_context(Wan([nw.edge for nw in nws], rd.wan_mbps, rd.wan_latency_s, stamp, netem))
                procs.append(_start(["ip", "netns", "exec", wan.cloud, sys.executable, HERE, "--role", "cloud",
                                     "--spec", spec], boot))
            edges = []
            for j, nw in enumerate(nws):
                edges.append(_start(["ip", "netns", "exec", nw.edge, sys.executable, HERE, "--role", "edge",
                                     "--spec", spec, "--id", str(j)], boot))
                for k, pid in enumerate(int(p) for p in edges[-1].stdout.readline().split()):
                    quotas.append(CpuQuota(f"gfq{os.getpid()}e{j}x{k}", rd.edge_quota))
                    quotas[-1].add(pid)
            # each client's HTB leaf (downloads; the uploads' leaves are alike) and each edge's
            # WAN leaf: the buckets the emulator is given, read from the kernel
            buckets = {"client": [0.0] * rd.n, "wan": []}
            for j, nw in enumerate(nws):
                for k, i in enumerate(rd.edge_clients(j)):
                    buckets["client"][i] = net.class_burst_bytes(nw.edge, "up0", f"1:{10 + k:x}")
            if rd.wan_mbps is not None:
                buckets["wan"] = [net.class_burst_bytes(wan.cloud, "wan0", f"1:{10 + j:x}") for j in range(rd.edges)]
            clients = []
            for j, nw in enumerate(nws):
                clients += [_spawn(["ip", "netns", "exec", ns, sys.executable, HERE, "--role", "client",
                                    "--spec", spec, "--id", str(i)], boot)
                            for i, ns in zip(rd.edge_clients(j), nw.clients)]
            for i, p in enumerate(clients):
                _ready(p)   # start-up done: from now on each runs on its device's share
                quotas.append(CpuQuota(f"gfq{os.getpid()}c{i}", rd.quotas[i]))
                quotas[-1].add(p.pid)
            window = Window(quotas).start()
            for p in edges + clients:
                _go(p)
            procs += edges + clients
            outs = _finish(procs, timeout_s)
            window.close()
            throttled = [q.throttled_s() for q in quotas[-rd.n:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for q in quotas:
            q.close()
    outs = [json.loads(o.splitlines()[-1]) for o in outs]
    cloud = outs.pop(0) if rd.wan_mbps is not None else None
    clients = outs[rd.edges:]
    m = measured_phases(rd, cloud, outs[:rd.edges], [c["records"] for c in clients])
    cals = [c["calibrations"] for c in clients]
    after = [b for _, b in cals if b is not None]
    loads = [window.between(min(a["start"] for a, _ in cals), max(a["end"] for a, _ in cals)),
             window.between(m["start"], m["end"]),
             window.between(min(b["start"] for b in after), max(b["end"] for b in after))]
    return m | {"throttled": throttled, "loads": loads, "calibrations": cals, "buckets": buckets}


def measured_phases(rd: Round, cloud: dict | None, edges: list[dict], clients: list[list[dict]]) -> dict:
    """Every phase of the real run from its processes' records (CLOCK_MONOTONIC)."""
    out: dict = {p: [] for p in PHASES}
    groups = {(r["t"], r["k"], r["g"]): r for e in edges for r in e["groups"]}
    cpu, wall, busy, span = [0.0] * rd.n, [0.0] * rd.n, [0.0] * rd.n, [0.0] * rd.n
    secagg_cpu: list[float] = []
    compute: list[list[float]] = [[] for _ in range(rd.n)]
    starts: dict[tuple, list[float]] = {}
    for i, recs in enumerate(clients):
        for r in recs:
            gr = groups[(r["t"], r["k"], rd.group_of(i))]
            busy[i] += r["train_cpu"]        # the share of its quota: every training, cut short or not
            span[i] += r["train_end"] - r["download_end"]
            if r["dropped"]:
                continue
            out["download"].append(r["download_end"] - gr["start"])
            out["train"].append(r["train_end"] - r["download_end"])
            out["secagg"].append(r["upload_start"] - r["train_end"])
            secagg_cpu.append(r["secagg_cpu"])
            out["upload"].append(gr["upload_end"][str(i)] - r["upload_start"])
            compute[i].append(r["upload_start"] - r["download_end"])
            cpu[i] += r["train_cpu"]
            wall[i] += r["train_end"] - r["download_end"]
            starts.setdefault((r["t"], r["k"], rd.group_of(i), rd.quotas[i], rd.samples[i]), []).append(r["upload_start"])
    for gr in groups.values():
        out["queue"].append(gr["aggregation_start"] - gr["queued"])
        out["aggregation"].append(gr["aggregation_end"] - gr["aggregation_start"])
    first = min(gr["start"] for gr in groups.values())
    last = max(gr["aggregation_end"] for gr in groups.values())
    if cloud is not None:
        for j, e in enumerate(edges):
            for t, c in enumerate(e["cloud"]):
                out["cloud down"].append(c["down_end"] - cloud["rounds"][t]["start"])
                out["cloud up"].append(cloud["rounds"][t]["end"][j] - c["up_start"])
        first = cloud["rounds"][0]["start"]
        last = max(max(r["end"]) for r in cloud["rounds"])
    return {**out, "makespan": last - first, "start": first, "end": last, "train_cpu": cpu, "train_wall": wall,
            "compute": compute, "secagg_cpu": secagg_cpu,
            "share": [c / w / q if w > 0 else None for c, w, q in zip(busy, span, rd.quotas)],
            "spread": max((max(v) - min(v) for v in starts.values()), default=0.0),
            "dropped": [i for i, recs in enumerate(clients) if any(r["dropped"] for r in recs)]}


def _group_keys(n: int) -> bytes:
    """Stand-in public keys of a group's members (two X25519 keys each), made before the round."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return b"".join(X25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(2 * n))


def _aggregate(job) -> None:
    """One group round on an edge core: the aggregator's part of secure aggregation, and for each
    member that dropped out, its key reconstructed and its pairwise masks with every survivor
    removed (``secure_sum``'s recovery)."""
    import numpy as np
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    from groupfel.cost_models.secagg import KEY_BYTES, _key, _pair_mask, dequantize, prg, shamir_reconstruct

    n, m, uploads, dropped = job
    t = n // 2 + 1
    masked = np.stack([np.frombuffer(u[:4 * m], dtype=np.uint32) for u in uploads])
    total = np.sum(masked, axis=0, dtype=np.uint32)
    shares = []
    for u in uploads:
        tail = u[len(u) - 66 * (n - 1):]
        shares = [(k + 1, int.from_bytes(tail[66 * k:66 * (k + 1)], "big")) for k in range(n - 1)]
        seed = shamir_reconstruct(shares[:t]) % (1 << 8 * KEY_BYTES)
        total -= prg(seed.to_bytes(KEY_BYTES, "big"), m)
    for _ in range(dropped):
        sk = _key(shamir_reconstruct(shares[:t]) % (1 << 8 * KEY_BYTES))
        for u in uploads:       # each survivor's pairwise mask key, as it advertised it
            mask = _pair_mask(sk, X25519PublicKey.from_public_bytes(u[4 * m + 32:4 * m + 64]), m)
            total += mask
    dequantize(total, 2.0**16) / max(1, n - dropped)


def _downloads(rd: Round, j: int, model_bytes: int) -> dict:
    """What edge j sends each member in each group round (made before the run): the model's
    float32 bytes, the group round's public keys and the share ciphertexts addressed to it."""
    import numpy as np
    import torch

    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES
    from groupfel.emulator.network import client_bytes
    from groupfel.emulator.models import build_model

    torch.manual_seed(0)
    model = torch.cat([p.detach().flatten() for p in build_model("cnn", INPUT_SHAPE, NUM_CLASSES).parameters()])
    weights = model.numpy().astype(np.float32).tobytes()
    out = {}
    for t in range(rd.rounds):
        for k in range(rd.group_rounds):
            for g in rd.edge_groups(j):
                alive = rd.alive(t, k, g)
                down = client_bytes(model_bytes, len(alive), 1, True)[0]
                keys = _group_keys(len(alive))
                for i in alive:
                    out[(t, k, i)] = weights + keys + os.urandom(down - len(weights) - len(keys))
    return out


def serve(spec: dict, j: int) -> None:
    """Edge j: each global round, the model from the cloud (if any); its groups' group rounds, each
    on its own thread (downloads, uploads, a core for the aggregation); its groups' models to the
    cloud. Prints every event's time (CLOCK_MONOTONIC) as one JSON line."""
    from groupfel.emulator.network import client_bytes

    import numpy as np

    from groupfel.cost_models.secagg import quantize

    rd, model_bytes = Round.from_json(spec), spec["model_bytes"]
    m = model_bytes // 4
    # the edge's cores: a line for free ones. Each unmasks one group of two before the run: its
    # first calls into OpenSSL and numpy (imports, set-up: tens of ms) are an edge's start-up
    keys, q = _group_keys(2), quantize(np.zeros(m), 1.0)
    cores = net.Cores(rd.edge_cores, _aggregate, warm=(2, m, [client_secagg(u, 2, q, keys) for u in range(2)], 1))
    downloads = _downloads(rd, j, model_bytes)
    print("ready", flush=True)
    print(" ".join(str(p.pid) for p in cores.procs), flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("told to stop before the round")
    local = rd.edge_clients(j)
    conns = {local[i]: c for i, c in net.accept_clients(len(local)).items()}
    cloud = _connect((CLOUD_IP, net.PORT), j) if rd.wan_mbps is not None else None
    records: list[dict] = []
    hops: list[dict] = []
    gone: set[int] = set()

    def group(t: int, g: int) -> None:
        for k in range(rd.group_rounds):
            alive = rd.alive(t, k, g)
            up = client_bytes(model_bytes, len(alive), 1, True)[1]
            ends, uploads = {}, {}

            def one(i: int) -> None:
                conns[i].sendall(downloads[(t, k, i)])
                try:
                    uploads[i] = net._recv_bytes(conns[i], up)
                    ends[str(i)] = time.monotonic()
                except (ConnectionError, OSError):       # it went offline: out from now on
                    gone.add(i)
            start = time.monotonic()
            threads = [threading.Thread(target=one, args=(i,)) for i in alive]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            queued = time.monotonic()
            got = [uploads[i] for i in alive if i in uploads]
            # as the emulator charges it: every member of the group that sent nothing, whether it
            # left in this group round or was gone at its start, is a dropout to recover
            a, b = cores.run((len(rd.groups[g]), m, got, len(rd.groups[g]) - len(got)))
            records.append({"t": t, "k": k, "g": g, "start": start, "upload_end": ends, "queued": queued,
                            "aggregation_start": a, "aggregation_end": b})

    for t in range(rd.rounds):
        hop = {}
        if cloud is not None:
            net._recv_bytes(cloud, model_bytes)                        # x_t
            hop["down_end"] = time.monotonic()
        threads = [threading.Thread(target=group, args=(t, g)) for g in rd.edge_groups(j)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if cloud is not None:
            hop["up_start"] = time.monotonic()
            cloud.sendall(os.urandom(model_bytes * len(rd.edge_groups(j))))      # every group's model
        hops.append(hop)
    if cloud is not None:
        net._recv_exactly(cloud, 1)
        cloud.close()
    cores.close()
    for i, conn in conns.items():
        if i not in gone:
            conn.sendall(b"k")
        conn.close()
    print(json.dumps({"groups": records, "cloud": hops}), flush=True)


def _connect(addr: tuple[str, int], ident: int) -> socket.socket:
    for _ in range(200):
        try:
            conn = socket.create_connection(addr)
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise ConnectionError(f"{ident} cannot reach {addr[0]}")
    conn.sendall(ident.to_bytes(4, "big"))
    return conn


def cloud(spec: dict) -> None:
    """The cloud: each global round, the model to every edge at once and every edge's group models
    back; prints each round's start and each edge's last byte in."""
    rd, model_bytes = Round.from_json(spec), spec["model_bytes"]
    lsock = socket.create_server((CLOUD_IP, net.PORT), backlog=rd.edges + 4)
    print("ready", flush=True)
    conns: dict[int, socket.socket] = {}
    while len(conns) < rd.edges:
        conn, _ = lsock.accept()
        conns[int.from_bytes(net._recv_bytes(conn, 4), "big")] = conn
    model = os.urandom(model_bytes)
    rounds = []
    for _ in range(rd.rounds):
        ends = [0.0] * rd.edges

        def one(j: int) -> None:
            conns[j].sendall(model)
            net._recv_bytes(conns[j], model_bytes * len(rd.edge_groups(j)))
            ends[j] = time.monotonic()
        start = time.monotonic()
        threads = [threading.Thread(target=one, args=(j,)) for j in range(rd.edges)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        rounds.append({"start": start, "end": ends})
    for conn in conns.values():
        conn.sendall(b"k")
        conn.close()
    print(json.dumps({"rounds": rounds}), flush=True)


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
    """Client i: its shard and model ready before the run; then, in each group round it is part
    of, download, E epochs, its part of secure aggregation, upload. A client in ``drops`` closes
    its connection when it has done that share of its training in that group round, and is gone."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES
    from groupfel.cost_models.secagg import quantize
    from groupfel.emulator.network import client_bytes
    from groupfel.emulator.models import build_model

    rd, model_bytes = Round.from_json(spec), spec["model_bytes"]
    torch.set_num_threads(1)
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    start = sum(rd.samples[:i])
    idx = order[np.arange(start, start + rd.samples[i]) % len(order)]
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
    g = rd.group_of(i)
    m = model_bytes // 4
    # and one untimed run of its part of secure aggregation: the first calls into OpenSSL (X25519,
    # HKDF, AES-GCM, ChaCha20) cost some 10 ms of CPU once, 100 ms on a 10 % device
    keys = {n: _group_keys(n) for n in group_sizes(rd)}
    client_secagg(0, len(rd.groups[g]), quantize(np.zeros(m), 1.0), keys[len(rd.groups[g])])
    batches = [b for _ in range(rd.epochs) for b in range(0, len(y), BATCH)]
    drop = rd.drops.get(i)

    def train_epoch() -> None:
        for b in range(0, len(y), BATCH):
            opt.zero_grad(set_to_none=True)
            loss(model(x[b:b + BATCH]), y[b:b + BATCH]).backward()
            opt.step()

    def secagg_step(n: int) -> None:    # what the round runs between training and upload
        client_secagg(0, n, quantize(torch.nn.utils.parameters_to_vector(params).detach().numpy(), 2.0**16), keys[n])

    _wait_go()
    # the device measured here, under the quota, among the other clients measuring theirs: before
    # the run and again after it, each client in its own process as it runs the rounds
    calibrations = [calibrate_client(rd, i, model_bytes, train_epoch, secagg_step)]
    conn = net.connect(rd.edge_clients(rd.edge_of(g)).index(i))
    records = []
    for t in range(rd.rounds):
        for k in range(rd.group_rounds):
            alive = rd.alive(t, k, g)
            if i not in alive:
                continue
            n, u = len(alive), alive.index(i)
            down, up = client_bytes(model_bytes, n, 1, True)
            data = net._recv_bytes(conn, down)
            download_end = time.monotonic()
            cpu0 = _cpu()
            stop = round(drop[2] * len(batches)) if drop is not None and tuple(drop[:2]) == (t, k) else None
            torch.nn.utils.vector_to_parameters(torch.from_numpy(np.frombuffer(data[:4 * m], dtype=np.float32).copy()),
                                                params)
            for done, b in enumerate(batches):
                if done == stop:
                    break
                opt.zero_grad(set_to_none=True)
                loss(model(x[b:b + BATCH]), y[b:b + BATCH]).backward()
                opt.step()
            train_end = time.monotonic()
            rec = {"t": t, "k": k, "download_end": download_end, "train_end": train_end,
                   "train_cpu": _cpu() - cpu0, "dropped": stop is not None}
            records.append(rec)
            if stop is not None:          # offline: the connection goes, nothing is sent
                conn.close()          # (and no second calibration: the others still run)
                print(json.dumps({"records": records, "calibrations": calibrations + [None]}), flush=True)
                return
            cpu1 = _cpu()
            q = quantize(torch.nn.utils.parameters_to_vector(params).detach().numpy(), 2.0**16)
            payload = client_secagg(u, n, q, data[4 * m:4 * m + 64 * n])
            rec["upload_start"] = time.monotonic()
            rec["secagg_cpu"] = _cpu() - cpu1
            conn.sendall(payload)
            assert len(payload) == up
    net._recv_exactly(conn, 1)           # the last client round of the run is over
    conn.close()
    calibrations.append(calibrate_client(rd, i, model_bytes, train_epoch, secagg_step))
    print(json.dumps({"records": records, "calibrations": calibrations}), flush=True)


# ---------------------------------------------------------------------------------------------
# 3. The emulated run

def emulate(rd: Round, profiles: dict, model_bytes: int, efficiency: float = net.EFFICIENCY,
            quota_term: bool = True, drop_at: dict[int, float] | None = None,
            slowdown: list[float] | None = None, buckets: dict | None = None) -> dict:
    """The run on the emulator's clock with the calibrated profiles: each phase of each client
    round that finished and of each group round and edge round, as ``measure_round`` returns them,
    and each client's training spans. ``quota_term``: tell the emulator each client's CPU quota
    (``ClientNet.cpu_share``: the quota unspent during the download runs at full speed,
    ``groupfel.emulator.network.quota_seconds``); without it the steps take their curves'
    steady time. ``drop_at``: client -> the simulated second it goes offline (an availability
    trace); :func:`drop_times` finds them. ``slowdown``: each client's compute times this
    (``ClientNet.slowdown``). ``buckets``: the HTB leaves' bursts in bytes (``client``: each
    client's, ``wan``: each edge's on the WAN), given to the emulator as its links' token buckets
    (``Link.burst_bytes``) in payload bytes, as their rates are; None: ideal links."""
    import numpy as np

    from groupfel.cost_models import CostModel
    from groupfel.emulator.config import AvailabilityConfig
    from groupfel.emulator.network import Availability, ClientNet, ContendedFederation, EdgeNetwork
    from groupfel.emulator.federation import Federation, Group, RoundContext
    from groupfel.emulator.ledger import CostLedger
    from groupfel.emulator.network.wan import WanFederation
    from groupfel.topologies.topology import Link, build_topology

    n = rd.n
    devices = [rd.device(i) for i in range(n)]
    cost = CostModel({d: profiles[f"{d}/{TASK}"] for d in set(devices)}, "sgd", ("secagg",))
    wan = None if rd.wan_mbps is None else rd.wan_mbps * 1e6 * efficiency
    wan_burst = max(buckets["wan"]) * efficiency if buckets and buckets["wan"] else 0.0
    edge_link = Link(1e9, 0.0) if wan is None else Link(wan / 1e6, rd.wan_latency_s, wan_burst)
    topology = build_topology([len(rd.edge_clients(j)) for j in range(rd.edges)], devices, [np.arange(1)] * n,
                              np.ones((n, 1), dtype=int), Link(1.0, 0.0), edge_link)
    edge = profiles[f"edge{device_name(rd.edge_quota)}/{TASK}"].group_overhead
    clients = ClientNet(np.array(rd.client_mbps, dtype=float) * efficiency, np.zeros(n),
                        np.ones(n) if slowdown is None else np.array(slowdown, dtype=float),
                        cpu_share=np.array(rd.quotas, dtype=float) if quota_term else None,
                        cpu_period_s=PERIOD_US / 1e6,
                        burst_bytes=np.array(buckets["client"], dtype=float) * efficiency if buckets else None)
    access = None if rd.edge_mbps is None else rd.edge_mbps * 1e6 * efficiency
    with tempfile.TemporaryDirectory() as tmp:
        avail = None
        if drop_at:
            trace = Path(tmp) / "availability.csv"
            trace.write_text("client,start_s,end_s\n" + "".join(f"{c},0,{drop_at.get(c, 1e12)!r}\n" for c in range(n)))
            avail = Availability(AvailabilityConfig(file=str(trace)), n, 0)
        netw = EdgeNetwork(access, rd.edge_cores, False, clients, 1, True,
                           {k: edge[k] for k in ("secagg-server", "secagg-server-recovery") if k in edge}, avail)
        ledger = CostLedger()
        ctx = RoundContext(Federation.environment(), model_bytes, cost, ledger, topology, 0, rd.group_rounds, rd.epochs)
        fed = ContendedFederation(ctx, netw) if wan is None else WanFederation(ctx, netw, wan)
        sampled = [(g, Group(rd.edge_of(g), np.array(members), np.array([rd.samples[i] for i in members]), 0.0))
                   for g, members in enumerate(rd.groups)]
        for t in range(rd.rounds):
            fed.offline(t, sampled)          # who is offline, as a run plays it
            fed.run_round(t, sampled)
    out: dict = {p: [] for p in PHASES}
    # trace and ledger both count global rounds from 1
    done = {(r["round"], r["group_round"], r["client"]) for r in fed.trace if r["kind"] == "upload"}
    name = {"upload": "upload", "cloud-down": "cloud down", "cloud-up": "cloud up"}
    for r in fed.trace:
        if r["kind"] == "download":
            if (r["round"], r["group_round"], r["client"]) in done:
                out["download"].append(r["end"] - r["start"])
        elif r["kind"] == "core":
            out["queue"].append(r["start"] - r["queued"])
            out["aggregation"].append(r["end"] - r["start"])
        else:
            out[name[r["kind"]]].append(r["end"] - r["start"])
    spans, train, secagg = {}, [0.0] * n, {}
    for row in ledger.frame().itertuples(index=False):
        key = (int(row.round), int(row.group_round), int(row.client))
        if row.component == "training":
            spans[key] = (row.start, row.end)
        if row.component == "training" and key in done:
            out["train"].append(row.end - row.start)
            train[key[2]] += row.end - row.start
        elif row.component.startswith("secagg") and key in done:
            # secagg, and secagg-recovery where a member is gone: back to back before the upload
            a, b = secagg.get(key, (row.start, row.end))
            secagg[key] = (min(a, row.start), max(b, row.end))
    out["secagg"] = [b - a for a, b in secagg.values()]
    compute: list[list[float]] = [[] for _ in range(n)]      # training start to secagg end
    for key, (_, end) in sorted(secagg.items()):
        compute[key[2]].append(end - spans[key][0])
    if wan is None:
        first = min(r["start"] for r in fed.trace if r["kind"] == "download")
        last = max(r["end"] for r in fed.trace if r["kind"] == "core")
    else:
        first = min(r["start"] for r in fed.trace if r["kind"] == "cloud-down")
        last = max(r["end"] for r in fed.trace if r["kind"] == "cloud-up")
    return {**out, "makespan": last - first, "train_by_client": train, "training_spans": spans, "compute": compute,
            "offline": sorted({int(c) for c in (ledger.frame().query("component == 'offline'")["client"])})}


def drop_times(rd: Round, profiles: dict, model_bytes: int, buckets: dict | None = None) -> dict[int, float]:
    """When each dropping client goes offline on the emulator's clock: where its training in that
    group round (played without drop-outs, the same up to then) reaches its share."""
    spans = emulate(rd, profiles, model_bytes, buckets=buckets)["training_spans"]
    out = {}
    for c, (t, k, share) in rd.drops.items():
        a, b = spans[(t + 1, k, c)]
        out[c] = a + share * (b - a)
    return out


# ---------------------------------------------------------------------------------------------

def error_pct(emulated: float, measured: float) -> float:
    return 100.0 * (emulated - measured) / measured


def compare(rd: Round, m: dict, e: dict) -> dict:
    """Each phase's measured and emulated mean, its error, and whether it is held to the goal."""
    phases = {}
    for p in PHASES:
        if not m[p] and not e[p]:
            continue
        mm = statistics.fmean(m[p]) if m[p] else 0.0
        ee = statistics.fmean(e[p]) if e[p] else 0.0
        held = mm >= PHASE_MIN_S
        err = error_pct(ee, mm) if mm > 0 else None
        phases[p] = {"measured": mm, "emulated": ee, "error_pct": err, "held": held, "count": [len(m[p]), len(e[p])],
                     "within": (not held) or (err is not None and abs(err) <= PHASE_GOAL_PCT and len(m[p]) == len(e[p]))}
    return phases


def phase_cell(ph: dict | None) -> str:
    if ph is None:
        return "-"
    if not ph["held"]:
        return f"({1000 * ph['measured']:.0f} ms)"
    cell = f"{ph['error_pct']:+.1f}"
    return cell if ph["within"] else f"**{cell}**"


def _load_text(load: dict) -> str:
    p = load.get("cpu_pressure")
    return f"{load['others_cores']:.2f}" + ("" if p is None else f" ({100 * p:.0f} %)")


def validate(rds: list[Round], out=print, workdir: Path | None = None) -> list[dict]:
    """Calibrate, run and emulate each scenario; print and return the table's rows."""
    for why in (net.check_available(), check_quota()):
        if why:
            raise Refused(why)
    net.sweep_stale()
    sweep_stale_wan()
    sweep_stale_cgroups()
    netem = net.netem_available()
    from groupfel.cost_models.measure import INPUT_SHAPE, NUM_CLASSES, param_count
    from groupfel.emulator.models import build_model

    model_bytes = 4 * param_count(build_model("cnn", INPUT_SHAPE, NUM_CLASSES))
    out(f"digits CNN ({model_bytes // 4} parameters, {model_bytes} bytes); CFS period {PERIOD_US // 1000} ms; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; netem {'yes' if netem else 'no'}")
    hz = kernel_hz()
    dlv = {q: delivery(q) for q in sorted({q for rd in rds for q in rd.quotas if q < 1.0})}
    dlv.update({q: None for rd in rds for q in rd.quotas if q >= 1.0})
    if any(d is not None for d in dlv.values()):
        out(f"quota delivery (a spin loop alone, 2 s; kernel tick {'unknown' if hz is None else f'{1000 / hz:g} ms'}): "
            + "; ".join(delivery_text(q, d) for q, d in dlv.items() if d is not None))
    out("| scenario | clients | measured s | emulated s | makespan error % | "
        + " | ".join(f"{p} error %" for p in PHASES)
        + " | finish spread ms (upload bound %) | upload error with the run's compute % "
        + "| CPU share of quota: run; calibrations "
        + "| other work, cores (CPU pressure): calibration; run; calibration | training CPU, curve vs run % |")
    out("| --- " * (10 + len(PHASES)) + "|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for s, rd in enumerate(rds):
            wd = Path(workdir or tmp) / f"s{s}"
            wd.mkdir(parents=True, exist_ok=True)
            name = rd.name
            if rd.wan_latency_s > 0 and not netem:
                rd = Round.from_json({**asdict(rd), "wan_latency_s": 0.0})
                name += " (WAN delay 0: no netem here)"
            files = [calibrate_edge(rd, model_bytes, wd, "before")]
            m = measure_round(rd, model_bytes, netem)
            files.append(calibrate_edge(rd, model_bytes, wd, "after"))
            for i, cal in enumerate(m["calibrations"]):
                for tag, c in zip(("before", "after"), cal):
                    if c is not None:
                        files.append(wd / f"measurements-{tag}-c{i}.csv")
                        files[-1].write_text(c["csv"])
            before = [a["share"] for a, _ in m["calibrations"]]
            after = [None if b is None else b["share"] for _, b in m["calibrations"]]
            loads = m["loads"]
            load_cell = "; ".join(_load_text(x) for x in loads)
            why = (starved(rd, m["share"], "in the run") or starved(rd, before, "at the first calibration")
                   or starved(rd, after, "at the second calibration"))
            if why:
                out(f"| {name} | {rd.n} | refused: {why} (other work {load_cell} cores; load average "
                    f"{loads[1]['load_average']:.1f}) |")
                rows.append({"scenario": name, "clients": rd.n, "refused": why, "loads": loads,
                             "round_share": m["share"], "calibration_share": [before, after]})
                continue
            profiles = fit_profiles(files, wd)
            drop_at = drop_times(rd, profiles, model_bytes, m["buckets"]) if rd.drops else None
            e = emulate(rd, profiles, model_bytes, drop_at=drop_at, buckets=m["buckets"])
            steady = emulate(rd, profiles, model_bytes, quota_term=False, drop_at=drop_at, buckets=m["buckets"])
            # the CPU the calibrated curve says the training takes (its steady time x the quota)
            # against the CPU it took in the run
            curve = sum(t * q for t, q in zip(steady["train_by_client"], rd.quotas))
            drift = 100 * (curve / sum(m["train_cpu"]) - 1)
            phases = compare(rd, m, e)
            upload = phases["upload"]["measured"]
            # the network model apart from the compute model: the same run with each client's
            # compute stretched to what it took in the run (its mean over its client rounds)
            slow = [statistics.fmean(mc) / statistics.fmean(ec) if mc and ec else 1.0
                    for mc, ec in zip(m["compute"], e["compute"])]
            replay = emulate(rd, profiles, model_bytes, drop_at=drop_at, slowdown=slow, buckets=m["buckets"])
            replay_upload = error_pct(statistics.fmean(replay["upload"]), upload)
            row = {"scenario": name, "clients": rd.n, "measured": m["makespan"], "emulated": e["makespan"],
                   "error_pct": error_pct(e["makespan"], m["makespan"]), "phases": phases,
                   "emulated_steady": steady["makespan"], "error_steady_pct": error_pct(steady["makespan"], m["makespan"]),
                   "finish_spread_s": m["spread"], "upload_bound_pct": 100 * m["spread"] / upload,
                   "upload_error_replay_pct": replay_upload, "replay_phases": compare(rd, m, replay),
                   "replay_makespan_error_pct":
                       error_pct(replay["makespan"], m["makespan"]), "replay_slowdown": slow,
                   "round_share": m["share"], "calibration_share": [before, after],
                   "loads": loads, "throttled_s": m["throttled"], "training_cpu_drift_pct": drift,
                   "dropped": [m["dropped"], e["offline"]], "drop_at": drop_at,
                   "measured_phases": {k: v for k, v in m.items() if k != "calibrations"}, "emulated_phases": {k: v for k, v in e.items() if k != "training_spans"},
                   "round": asdict(rd),
                   # a client's part of secure aggregation, CPU ms: in the run against the calibrations'
                   # (the same step after an epoch of training)
                   "secagg_cpu_ms": {"run": 1000 * statistics.fmean(m["secagg_cpu"]) if m["secagg_cpu"] else None,
                                     "calibrated": 1000 * statistics.fmean(
                                         c["secagg_cpu"][str(len(rd.groups[rd.group_of(i)]))]
                                         for i, cal in enumerate(m["calibrations"]) for c in cal if c is not None)},
                   # and on the wall clock: the run's phase against the calibration loop's steps
                   "secagg_wall_ms": {"run": 1000 * statistics.fmean(m["secagg"]) if m["secagg"] else None,
                                      "calibration": 1000 * statistics.fmean(
                                          c["secagg_wall"][str(len(rd.groups[rd.group_of(i)]))]
                                          for i, cal in enumerate(m["calibrations"]) for c in cal if c is not None)},
                   "delivery": {str(q): dlv[q] for q in sorted(set(rd.quotas))}}
            rows.append(row)
            shares = (f"{100 * min(x for x in m['share'] if x is not None):.0f} %; {100 * min(before):.0f}, "
                      f"{100 * min(x for x in after if x is not None):.0f} %")
            out(f"| {name} | {rd.n} | {row['measured']:.3f} | {row['emulated']:.3f} | {row['error_pct']:+.1f} | "
                + " | ".join(phase_cell(phases.get(p)) for p in PHASES)
                + f" | {1000 * m['spread']:.0f} ({row['upload_bound_pct']:.1f}) | {replay_upload:+.1f} | {shares} "
                + f"| {load_cell} | {drift:+.1f} |")
    return rows


def check(rows: list[dict], quick: bool) -> list[str]:
    """What keeps the goals from being shown: each a short reason; none: every goal met."""
    done = [r for r in rows if "refused" not in r]
    why = [f"{r['scenario']}: refused" for r in rows if "refused" in r]
    if not quick and len(done) < MIN_SCENARIOS:
        why.append(f"{len(done)} scenarios reported, the goals need {MIN_SCENARIOS}")
    if done:
        errs = sorted(abs(r["error_pct"]) for r in done)
        if statistics.median(errs) > MAKESPAN_GOALS_PCT[0]:
            why.append(f"makespan median {statistics.median(errs):.2f} % > {MAKESPAN_GOALS_PCT[0]:g} %")
        if errs[-1] > MAKESPAN_GOALS_PCT[1]:
            why.append(f"makespan worst {errs[-1]:.2f} % > {MAKESPAN_GOALS_PCT[1]:g} %")
    for r in done:
        for p, ph in r["phases"].items():
            if not ph["within"]:
                what = (f"{ph['error_pct']:+.1f} %" if ph["count"][0] == ph["count"][1]
                        else f"{ph['count'][0]} measured, {ph['count'][1]} emulated")
                why.append(f"{r['scenario']}: {p} {what}{_granularity(r, p, ph)}")
    return why


def _granularity(r: dict, phase: str, ph: dict) -> str:
    """Where a compute phase lasts under two of its slowest quota's delivery cycles: that, and
    (secure aggregation) what the same step took in the calibration loop. Said, not excused."""
    if phase not in ("train", "secagg"):
        return ""
    cycles = [d["cycle_s"] for d in r.get("delivery", {}).values() if d and d["cycle_s"]]
    if not cycles or ph["measured"] >= 2 * max(cycles):
        return ""
    q = min(float(k) for k, d in r["delivery"].items() if d and d["cycle_s"])
    text = f" ({1000 * ph['measured']:.0f} ms: under two {100 * q:g} % delivery cycles, {1000 * max(cycles):.0f} ms"
    wall = r.get("secagg_wall_ms") if phase == "secagg" else None
    if wall and wall["calibration"] is not None:
        text += f"; {wall['calibration']:.1f} ms a step in the calibration loop"
    return text + ")"


def main(argv: list[str] | None = None) -> int:
    global PERIOD_US
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the slow test's small version")
    p.add_argument("--scenario", action="append", default=[],
                   help="only the scenarios whose name holds this text (repeat for more)")
    p.add_argument("--json", help="also write the rows (every client's phases) to this file")
    p.add_argument("--keep", help="keep each scenario's measurement files and fitted profile CSV in this new "
                   "folder (sN/: what the emulated run was calibrated with)")
    p.add_argument("--burst-check", action="store_true", help="only check the quota term against the kernel "
                   "(a spin loop after a sleep, at 10 and 100 ms periods)")
    p.add_argument("--period-ms", type=float, default=PERIOD_US / 1000, help="the CPU quota's period "
                   "(default %(default)g; the kernel's default is 100)")
    p.add_argument("--role", choices=["edge", "client", "cloud", "calibrate"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--id", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    if a.role:
        spec = json.loads(a.spec)
        {"edge": lambda: serve(spec, a.id), "client": lambda: client(spec, a.id), "cloud": lambda: cloud(spec),
         "calibrate": lambda: run_calibration(spec)}[a.role]()
        sys.stdout.flush()
        os._exit(0)      # no interpreter teardown: under a 10 % quota torch's takes seconds
    PERIOD_US = round(a.period_ms * 1000)
    chosen = [rd for rd in scenarios(a.quick) if not a.scenario or any(s in rd.name for s in a.scenario)]
    if not chosen:
        names = "; ".join(rd.name for rd in scenarios())
        print(f"--scenario: no scenario's name holds {' or '.join(map(repr, a.scenario))}; the names: {names}")
        return 2
    for flag, path in (("--json", a.json), ("--keep", a.keep)):
        if path and os.path.exists(path):
            print(f"{flag}: {path} exists; give a new one (a run never overwrites another's)")
            return 2
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
        rows = validate(chosen, workdir=Path(a.keep) if a.keep else None)
    except (Refused, net.Refused) as e:
        print(f"clock benchmark skipped: {e}")
        return 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    done = [r for r in rows if "refused" not in r]
    if done:
        errs = sorted(abs(r["error_pct"]) for r in done)
        print(f"makespan error over {len(done)} scenarios ({len(rows) - len(done)} refused): median "
              f"{statistics.median(errs):.1f} %, worst {errs[-1]:.1f} % (goals: median {MAKESPAN_GOALS_PCT[0]:g} %, "
              f"worst {MAKESPAN_GOALS_PCT[1]:g} %, every phase of {1000 * PHASE_MIN_S:g} ms or more within "
              f"{PHASE_GOAL_PCT:g} %); {time.monotonic() - t:.0f} s")
    why = check(rows, a.quick or bool(a.scenario))
    print("check passed" if not why else "check failed: " + "; ".join(why))
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
