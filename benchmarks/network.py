"""The emulator's clock against a real Linux network (issue 27, item 6).

    sudo python benchmarks/network.py             # every scenario, about a minute
    sudo python benchmarks/network.py --quick     # the slow test's small version

Builds, on this machine (root needed), one edge and N clients out of network namespaces:

    [edge ns]  up0 ── veth ── dn0  [access-point ns: bridge br0]  p<i> ── veth ── eth0  [client i ns]

* The edge's shared access capacity is two HTB trees: downloads on the edge's ``up0`` (every byte
  the edge sends to its clients leaves through it), uploads on the access point's ``dn0`` (every
  byte the clients send to the edge). Each tree has one shared class at the access capacity and
  one leaf per client, ``rate`` = its fair share, ``ceil`` = its own link's rate, one quantum for
  all, so the spare capacity goes round-robin to the clients still below their cap: max-min fair,
  as the emulator's processor sharing is. Dedicated links: the shared class is far above the sum
  of the caps. A client's leaf is picked by its IP address (u32 filters).
* Latency, where the kernel has netem: a netem delay on both ends of each client's veth.
* Real processes: a server in the edge namespace and one client process per client namespace
  (``ip netns exec``). The server sends each client its download, the client sleeps its compute
  time and sends its upload back: byte for byte what the emulator's accounting says they move
  (``groupfel.emulator.network.client_bytes``: the model, SCAFFOLD's second vector, secure
  aggregation's key and share messages). When a group's uploads are all in, the server hands its
  aggregation to one of ``edge_cores`` worker processes (groups wait in line for a free one), which
  holds its core for the aggregation time (a sleep: on a shared 2-core machine timed busy work
  would measure the neighbours, and the queue for cores is what is checked).
* The round's phases are timed on CLOCK_MONOTONIC, which every namespace shares.

The emulated side is the emulator's own clock: ``groupfel.emulator.network.ContendedFederation``, the
shared-edge processes a run uses, plays the same group round (``edge_access_mbps``, per-client
bandwidths and speed factors, ``edge_cores``, an edge ``aggregation`` curve).

What the emulator must assume (calibration, derived, not fitted): a link's ``bandwidth_mbps`` is
what tc shapes, counted in Ethernet frames; TCP moves 1448 payload bytes in each 1514-byte frame
(20 B IPv4 + 32 B TCP with timestamps + 14 B Ethernet), so the model's bytes go through at
``1448/1514 = 95.6 %`` of the shaped rate. The benchmark gives the emulator the shaped rates times
that efficiency, prints the error without it too, and measures one flow's goodput to check it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

# One full-size TCP segment on an Ethernet veth: 1448 payload bytes in a 1514-byte frame.
MSS, FRAME = 1448, 1514
EFFICIENCY = MSS / FRAME
EDGE_IP, PORT = "10.77.0.1", 5077
DEDICATED_BPS = 10_000_000_000      # the shared class of dedicated links: never the bottleneck
CNN_BYTES = 423_464                 # the Fashion-MNIST CNN's float32 parameters (Table 1's model)
HERE = os.path.abspath(__file__)


@dataclass
class Scenario:
    """One group round of one edge: who moves what over which links, and the edge's work."""

    name: str
    client_mbps: list[float]             # each client's own link (both directions)
    groups: list[list[int]]              # client indices per group
    model_bytes: int = CNN_BYTES         # the model's float32 parameters
    vectors: int = 1                     # model-sized vectors a client uploads (SCAFFOLD: 2)
    secagg: bool = False                 # secure aggregation's key and share messages too
    edge_mbps: float | None = None       # shared access capacity (each direction); None: dedicated
    compute_s: list[float] | float = 0.5
    aggregation_s: float = 0.2           # one group's aggregation on one edge core
    edge_cores: int | None = None        # None: unlimited
    latency_s: float = 0.0               # one-way, per client link (needs netem)

    @property
    def n(self) -> int:
        return len(self.client_mbps)

    def compute(self, i: int) -> float:
        return float(self.compute_s) if isinstance(self.compute_s, (int, float)) else float(self.compute_s[i])

    def cores(self) -> int:
        return self.edge_cores or len(self.groups)

    def transfer_bytes(self) -> tuple[list[int], list[int]]:
        """Each client's (download, upload) bytes: the emulator's own accounting
        (``groupfel.emulator.network.client_bytes``), which the real processes send byte for byte."""
        from groupfel.emulator.network import client_bytes

        down, up = [0] * self.n, [0] * self.n
        for members in self.groups:
            for i in members:
                down[i], up[i] = client_bytes(self.model_bytes, len(members), self.vectors, self.secagg)
        return down, up

    def spec(self) -> dict:
        """What the round's processes need (plain JSON: they import nothing of groupfel)."""
        down, up = self.transfer_bytes()
        return {"n": self.n, "groups": self.groups, "down": down, "up": up,
                "compute": [self.compute(i) for i in range(self.n)], "aggregation_s": self.aggregation_s,
                "cores": self.cores()}


def scenarios(quick: bool = False) -> list[Scenario]:
    """The validation scenarios (``quick``: the slow test's small version, a few seconds)."""
    def split(n: int, size: int) -> list[list[int]]:
        return [list(range(s, min(n, s + size))) for s in range(0, n, size)]
    if quick:
        b = 200_000      # about 0.4 s a transfer: long beside the processes' scheduling jitter
        return [
            Scenario("dedicated links", [4.0] * 3, [[0, 1, 2]], b, compute_s=0.3, aggregation_s=0.1),
            Scenario("edge shared by 4, mixed links", [2.0, 4.0, 8.0, 8.0], [[0, 1], [2, 3]], b,
                     edge_mbps=8.0, compute_s=0.2, aggregation_s=0.1),
            Scenario("core-limited edge", [8.0] * 4, [[0], [1], [2], [3]], b, compute_s=0.2,
                     aggregation_s=0.3, edge_cores=1),
        ]
    return [
        Scenario("dedicated links", [4.0] * 10, split(10, 5)),
        Scenario("edge shared by 10", [8.0] * 10, split(10, 5), edge_mbps=16.0),
        Scenario("edge shared by 40", [8.0] * 40, split(40, 10), edge_mbps=40.0),
        Scenario("mixed client bandwidths", [1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32], split(10, 5),
                 edge_mbps=24.0, compute_s=[0.2 + 0.1 * i for i in range(10)]),
        Scenario("SCAFFOLD + secure aggregation, shared by 10", [8.0] * 10, split(10, 5), vectors=2, secagg=True,
                 edge_mbps=16.0),
        Scenario("core-limited edge", [8.0] * 12, split(12, 2),
                 compute_s=[0.3 + 0.1 * (i // 2) for i in range(12)], aggregation_s=0.6, edge_cores=2),
        Scenario("latency 20 ms, shared by 10", [8.0] * 10, split(10, 5), edge_mbps=16.0, latency_s=0.02),
    ]


# ---------------------------------------------------------------------------------------------
# The emulated side

def emulate(sc: Scenario, efficiency: float = EFFICIENCY) -> dict:
    """The round on the emulator's own clock (``groupfel.emulator.network.ContendedFederation``: the
    shared-edge processes a run uses), with every link's rate times ``efficiency``. Returns the
    makespan and each client's and group's phase ends, in seconds from the first download."""
    import numpy as np

    from groupfel.cost_models import CostModel
    from groupfel.cost_models.curves import linear
    from groupfel.cost_models.profiles import DeviceProfile
    from groupfel.emulator.network import ClientNet, ContendedFederation, EdgeNetwork
    from groupfel.emulator.federation import Federation, Group, RoundContext
    from groupfel.emulator.ledger import CostLedger
    from groupfel.topologies.topology import Link, build_topology

    n = sc.n
    # training takes 1 s on the device curve, times each client's slowdown factor = its compute time
    device = DeviceProfile("bench", "network", training={"sgd": linear(0.0, 1.0)})
    cost = CostModel({"bench": device}, operations=())
    topology = build_topology([n], ["bench"] * n, [np.arange(1)] * n, np.ones((n, 1), dtype=int),
                              Link(1.0, 0.0), Link(1e9, 0.0))       # the cloud's link: no part of the check
    clients = ClientNet(np.array(sc.client_mbps, dtype=float) * efficiency, np.full(n, sc.latency_s),
                        np.array([sc.compute(i) for i in range(n)]))
    net = EdgeNetwork(None if sc.edge_mbps is None else sc.edge_mbps * 1e6 * efficiency, sc.edge_cores, False,
                      clients, sc.vectors, sc.secagg, {"aggregation": linear(0.0, sc.aggregation_s)})
    env = Federation.environment()
    fed = ContendedFederation(RoundContext(env, sc.model_bytes, cost, CostLedger(), topology, 0, 1, 1), net)
    groups = [Group(0, np.array(m), np.ones(len(m), dtype=int), 0.0) for m in sc.groups]
    fed.run_round(0, list(enumerate(groups)))
    tr = fed.trace
    t0 = min(r["start"] for r in tr if r["kind"] == "download")
    dl, ul, agg = [0.0] * n, [0.0] * n, [0.0] * len(groups)
    for r in tr:
        if r["kind"] == "download":
            dl[r["client"]] = r["end"] - t0
        elif r["kind"] == "upload":
            ul[r["client"]] = r["end"] - t0
        else:
            agg[r["group"]] = r["end"] - t0
    return {"makespan": max(agg), "download_end": dl, "upload_end": ul, "aggregation_end": agg,
            "bytes": fed.stats[-1]["bytes"]}


# ---------------------------------------------------------------------------------------------
# The real network

class Refused(RuntimeError):
    """Namespaces or shaping are not available here (not root, no iproute2, EPERM)."""


def _run(*cmd: str, stdin: str | None = None) -> None:
    r = subprocess.run(cmd, input=stdin, text=True, capture_output=True, check=False)
    if r.returncode:
        raise subprocess.CalledProcessError(r.returncode, cmd, r.stdout, r.stderr)


def check_available() -> str | None:
    """Why the real network cannot be built here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (Debian: apt-get install iproute2)"
    probe = f"gfprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "-n", probe, "link", "add", "gfa0", "type", "veth", "peer", "name", "gfb0")
        _run("tc", "-n", probe, "qdisc", "add", "dev", "gfa0", "root", "handle", "1:", "htb")
        _run("ip", "-n", probe, "link", "add", "gfbr0", "type", "bridge")
    except (subprocess.CalledProcessError, OSError) as e:
        err = getattr(e, "stderr", "") or str(e)
        return f"network namespaces, veth, bridge or HTB refused: {err.strip().splitlines()[-1] if err.strip() else e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


_SIZE = {"b": 1, "kb": 1024, "mb": 1024 ** 2, "gb": 1024 ** 3}   # tc's sprint_size units


def class_burst_bytes(ns: str, dev: str, classid: str) -> float:
    """An HTB class's token bucket in bytes, as the kernel holds it (``tc -d class show``: ``burst
    1600b``): a class idle long enough sends that much at once before its rate holds it."""
    shown = subprocess.run(["tc", "-n", ns, "-d", "class", "show", "dev", dev, "classid", classid],
                           capture_output=True, text=True, check=True).stdout
    m = re.search(r"\bburst (\d+(?:\.\d+)?)([KMG]?b)\b", shown)
    if m is None:
        raise RuntimeError(f"no burst in tc's class {classid} on {ns}/{dev}: {shown.strip()!r}")
    return float(m.group(1)) * _SIZE[m.group(2).lower()]


def netem_available() -> bool:
    probe = f"gfprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "-n", probe, "link", "add", "gfa0", "type", "veth", "peer", "name", "gfb0")
        _run("tc", "-n", probe, "qdisc", "add", "dev", "gfa0", "root", "netem", "delay", "1ms")
        return True
    except (subprocess.CalledProcessError, OSError):
        return False
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces of earlier runs that were killed outright (SIGKILL skips cleanup):
    ours are named gfn<pid>x..., and that process is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    ours = [(ns, m.group(1)) for ns in listed if (m := re.fullmatch(r"gfn(\d+)x\d+[eac]\d*", ns))]
    stale = [ns for ns, pid in ours if not os.path.exists(f"/proc/{pid}")]
    for ns in stale:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    return stale


def client_ip(i: int) -> str:
    return f"10.77.{1 + i // 250}.{1 + i % 250}"


class Namespaces:
    """Network namespaces this process made (``made``), deleted again on exit or when building
    them fails half way (deleting a namespace deletes its veths and qdiscs)."""

    made: list[str]

    def _build(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self.made.clear()


class Network(Namespaces):
    """The namespaces, veths and tc trees of one scenario; ``close`` removes them all."""

    def __init__(self, sc: Scenario):
        self.sc = sc
        self.prefix = f"gfn{os.getpid()}x{int(time.monotonic() * 1000) % 100000}"
        self.edge, self.ap = f"{self.prefix}e", f"{self.prefix}a"
        self.clients = [f"{self.prefix}c{i}" for i in range(sc.n)]
        self.made: list[str] = []

    def _ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        sc, edge, ap = self.sc, self.edge, self.ap
        for ns in (edge, ap, *self.clients):
            self._ns(ns)
        # gso_max_segs 1: TCP hands the qdisc one segment per packet, not 64 KB bursts
        veth = ("gso_max_segs", "1")
        _run("ip", "link", "add", "up0", "netns", edge, *veth, "type", "veth", "peer", "name", "dn0",
             "netns", ap, *veth)
        batch = ["link add br0 type bridge", "link set br0 up", "link set dn0 master br0", "link set dn0 up"]
        for i, ns in enumerate(self.clients):
            _run("ip", "link", "add", "eth0", "netns", ns, *veth, "type", "veth", "peer", "name", f"p{i}",
                 "netns", ap, *veth)
            batch += [f"link set p{i} master br0", f"link set p{i} up"]
        _run("ip", "-n", ap, "-batch", "-", stdin="\n".join(batch) + "\n")
        _run("ip", "-n", edge, "addr", "add", f"{EDGE_IP}/16", "dev", "up0")
        _run("ip", "-n", edge, "link", "set", "up0", "up")
        for i, ns in enumerate(self.clients):
            _run("ip", "-n", ns, "-batch", "-", stdin=f"addr add {client_ip(i)}/16 dev eth0\nlink set eth0 up\n")
        self._shape(edge, "up0", "dst")      # downloads: everything the edge sends its clients
        self._shape(ap, "dn0", "src")        # uploads: everything the clients send the edge
        if sc.latency_s > 0:
            delay = f"{sc.latency_s * 1000:g}ms"
            for i, ns in enumerate(self.clients):
                _run("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", delay, "limit", "10000")
                _run("tc", "-n", ap, "qdisc", "add", "dev", f"p{i}", "root", "netem", "delay", delay, "limit", "10000")

    def _shape(self, ns: str, dev: str, match: str) -> None:
        """HTB: a shared class at the access capacity, a leaf per client capped at its link."""
        sc = self.sc
        shared = DEDICATED_BPS if sc.edge_mbps is None else int(sc.edge_mbps * 1e6)
        lines = [f"qdisc add dev {dev} root handle 1: htb default 2",
                 f"class add dev {dev} parent 1: classid 1:1 htb rate {shared}bit ceil {shared}bit",
                 # ARP and anything unmatched: unshaped, outside the shared class
                 f"class add dev {dev} parent 1: classid 1:2 htb rate {DEDICATED_BPS}bit"]
        for i in range(sc.n):
            cap = int(sc.client_mbps[i] * 1e6)
            rate = min(cap, shared // sc.n)      # its fair share, assured; the rest is borrowed
            cid = f"1:{10 + i:x}"
            lines += [f"class add dev {dev} parent 1:1 classid {cid} htb rate {rate}bit ceil {cap}bit quantum {FRAME}",
                      f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip {match} {client_ip(i)}/32 flowid {cid}"]
        _run("tc", "-n", ns, "-batch", "-", stdin="\n".join(lines) + "\n")


def measure(sc: Scenario, timeout_s: float = 120.0) -> dict:
    """Build the network, run the round with real processes, return its measured phases."""
    spec = json.dumps(sc.spec())
    with Network(sc) as net:
        procs: list[subprocess.Popen] = []
        try:
            server = subprocess.Popen(["ip", "netns", "exec", net.edge, sys.executable, HERE, "--role", "server",
                                       "--spec", spec], stdout=subprocess.PIPE, text=True)
            procs.append(server)
            if server.stdout.readline().strip() != "ready":
                raise RuntimeError("the edge server did not start")
            for i, ns in enumerate(net.clients):
                procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, HERE, "--role", "client",
                                               "--spec", spec, "--id", str(i)], stdout=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
            if any(p.returncode for p in procs):
                raise RuntimeError(f"a round process failed: exit codes {[p.returncode for p in procs]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    srv = json.loads(outs[0].splitlines()[-1])
    t0 = srv["t0"]
    clients = [json.loads(o.splitlines()[-1]) for o in outs[1:]]
    return {"makespan": max(srv["aggregation_end"]) - t0,
            "first_byte": [c["first_byte"] - t0 for c in clients], "first_bytes": [c["first_bytes"] for c in clients],
            "download_end": [c["download_end"] - t0 for c in clients],
            "upload_start": [c["upload_start"] - t0 for c in clients],
            "upload_end": [u - t0 for u in srv["upload_end"]],
            "aggregation_end": [a - t0 for a in srv["aggregation_end"]],
            "aggregation_start": [a - t0 for a in srv["aggregation_start"]]}


def measure_goodput(mbps: float = 8.0, nbytes: int = 1_000_000) -> float:
    """One flow's goodput over a shaped link, as a share of the shaped rate (checks EFFICIENCY):
    the bytes after the first read over the time from that read to the last byte, so processes
    starting late do not count; the median of three downloads."""
    sc = Scenario("goodput", [mbps], [[0]], nbytes, compute_s=0.0, aggregation_s=0.0)

    def once() -> float:
        m = measure(sc)
        bits = 8 * (nbytes - m["first_bytes"][0])
        return bits / (m["download_end"][0] - m["first_byte"][0]) / (mbps * 1e6)
    return statistics.median(once() for _ in range(3))


# ---------------------------------------------------------------------------------------------
# The round's processes (run inside the namespaces; standard library only, so they start fast)

def _recv_bytes(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise ConnectionError("peer closed early")
        data += got
    return data


def _recv_exactly(conn: socket.socket, n: int) -> tuple[float, int]:
    """Receive n bytes; returns when the first of them came and how many came with it."""
    buf = bytearray(1 << 16)
    first: tuple[float, int] | None = None
    while n > 0:
        got = conn.recv_into(buf, min(n, len(buf)))
        if not got:
            raise ConnectionError("peer closed early")
        first = first or (time.monotonic(), got)
        n -= got
    return first or (time.monotonic(), 0)


def worker(conn, work=time.sleep) -> None:
    """One edge core: a process that runs ``work(job)`` for each job it is handed and answers its
    (start, end) times, until it is handed None. Here the job is an aggregation's seconds, slept
    (see the module docstring)."""
    while True:
        job = conn.recv()
        if job is None:
            return
        start = time.monotonic()
        work(job)
        conn.send((start, time.monotonic()))


class Cores:
    """K worker processes; a group takes a free one or waits in line (FIFO) for the next.
    ``work(job)``: what a core does with a job (default: sleep its seconds); ``warm``: a job each
    core answers before the round (None: none)."""

    def __init__(self, k: int, work=None, warm=0.0):
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self.pipes, self.procs = [], []
        for _ in range(k):
            a, b = ctx.Pipe()
            p = ctx.Process(target=worker, args=(b, work or time.sleep), daemon=True)
            p.start()
            self.pipes.append(a)
            self.procs.append(p)
        for a in self.pipes if warm is not None else ():     # each core has started and answered once
            a.send(warm)
            a.recv()
        self.free = list(self.pipes)
        self.cond = threading.Condition()
        self.line: list[int] = []     # tickets of the groups waiting for a core, first come first served
        self.tickets = 0

    def run(self, job) -> tuple[float, float]:
        with self.cond:
            ticket = self.tickets
            self.tickets += 1
            self.line.append(ticket)
            self.cond.wait_for(lambda: self.free and self.line[0] == ticket)
            self.line.pop(0)
            pipe = self.free.pop()
            self.cond.notify_all()
        pipe.send(job)
        times = pipe.recv()
        with self.cond:
            self.free.append(pipe)
            self.cond.notify_all()
        return times

    def close(self) -> None:
        for a, p in zip(self.pipes, self.procs):
            a.send(None)
            p.join()


def accept_clients(n: int) -> dict[int, socket.socket]:
    """The edge's socket, once each of the n clients has connected and said its id."""
    lsock = socket.create_server((EDGE_IP, PORT), backlog=n + 8)
    conns: dict[int, socket.socket] = {}
    while len(conns) < n:
        conn, _ = lsock.accept()
        conns[int.from_bytes(_recv_bytes(conn, 4), "big")] = conn
    return conns


def serve_round(conns: dict[int, socket.socket], one) -> float:
    """Runs ``one(i, conn)`` for every client at once (a thread each); returns when they started
    (CLOCK_MONOTONIC). The clients exit only after, outside the timed round."""
    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i, c)) for i, c in sorted(conns.items())]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for conn in conns.values():
        conn.sendall(b"k")
        conn.close()
    return t0


def serve(spec: dict) -> None:
    """The edge: sends every client its download, takes its upload, aggregates each complete group
    on one of its cores; prints the round's times (CLOCK_MONOTONIC) as one JSON line."""
    n, groups = spec["n"], spec["groups"]
    cores = Cores(spec["cores"])                             # the edge's cores, started before the round
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    left = [len(m) for m in groups]
    upload_end = [0.0] * n
    agg = [(0.0, 0.0)] * len(groups)
    lock = threading.Lock()
    print("ready", flush=True)
    conns = accept_clients(n)
    payload = {size: b"\x5a" * size for size in set(spec["down"])}

    def one(i: int, conn: socket.socket) -> None:
        conn.sendall(payload[spec["down"][i]])               # edge -> client: the group model (+ messages)
        _recv_exactly(conn, spec["up"][i])                   # client -> edge: its upload
        upload_end[i] = time.monotonic()
        g = group_of[i]
        with lock:
            left[g] -= 1
            ready = left[g] == 0
        if ready:                                            # the group's uploads are all in
            agg[g] = cores.run(spec["aggregation_s"])

    t0 = serve_round(conns, one)
    cores.close()
    print(json.dumps({"t0": t0, "upload_end": upload_end, "aggregation_start": [a[0] for a in agg],
                      "aggregation_end": [a[1] for a in agg]}), flush=True)


def connect(i: int) -> socket.socket:
    """Client i's connection to the edge (retried while the edge starts listening), its id sent."""
    for _ in range(200):
        try:
            conn = socket.create_connection((EDGE_IP, PORT))
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise ConnectionError(f"client {i} cannot reach the edge")
    conn.sendall(i.to_bytes(4, "big"))
    return conn


def client(spec: dict, i: int) -> None:
    """Client i: takes its download, trains (sleeps its compute time), sends its upload."""
    conn = connect(i)
    first, first_bytes = _recv_exactly(conn, spec["down"][i])
    download_end = time.monotonic()
    time.sleep(spec["compute"][i])                           # the client's training
    upload_start = time.monotonic()
    conn.sendall(b"\xa5" * spec["up"][i])
    _recv_exactly(conn, 1)
    conn.close()
    print(json.dumps({"first_byte": first, "first_bytes": first_bytes, "download_end": download_end,
                      "upload_start": upload_start}), flush=True)


# ---------------------------------------------------------------------------------------------

def error_pct(emulated: float, measured: float) -> float:
    return 100.0 * (emulated - measured) / measured


def validate(scs: list[Scenario], goodput: bool = True, out=print) -> list[dict]:
    """Measure and emulate each scenario; print and return the validation table's rows."""
    why = check_available()
    if why:
        raise Refused(why)
    sweep_stale()
    netem = netem_available()
    if goodput:
        g = measure_goodput()
        out(f"one flow's goodput over an 8 Mbit/s htb class (median of 3): {100 * g:.2f} % of the shaped rate "
            f"(1448/1514 = {100 * EFFICIENCY:.2f} %)")
    out("| scenario | clients | measured s | emulated s | error % | emulated at the shaped rate s | error % "
        "| latest first byte ms | worst sleep overshoot ms |")
    out("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for sc in scs:
        if sc.latency_s > 0 and not netem:
            out(f"| {sc.name} | {sc.n} | skipped: this kernel has no netem (CONFIG_NET_SCH_NETEM) | | | | | | |")
            continue
        m = measure(sc)
        e, raw = emulate(sc), emulate(sc, efficiency=1.0)
        row = {"scenario": sc.name, "clients": sc.n, "measured": m["makespan"], "emulated": e["makespan"],
               "error_pct": error_pct(e["makespan"], m["makespan"]), "emulated_raw": raw["makespan"],
               "error_raw_pct": error_pct(raw["makespan"], m["makespan"]), "measured_phases": m,
               "emulated_phases": e,
               # what the processes add that no network does: the server's threads starting to send,
               # and each client's sleep running past its training time
               "first_byte_ms": 1000 * max(m["first_byte"]),
               "overshoot_ms": 1000 * max(u - d - sc.compute(i) for i, (u, d) in
                                          enumerate(zip(m["upload_start"], m["download_end"])))}
        rows.append(row)
        out(f"| {sc.name} | {sc.n} | {row['measured']:.3f} | {row['emulated']:.3f} | {row['error_pct']:+.1f} "
            f"| {row['emulated_raw']:.3f} | {row['error_raw_pct']:+.1f} | {row['first_byte_ms']:.0f} "
            f"| {row['overshoot_ms']:.0f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the slow test's small version")
    p.add_argument("--json", help="also write the rows (with every phase) to this file")
    p.add_argument("--role", choices=["server", "client"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--id", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.role:
        spec = json.loads(a.spec)
        serve(spec) if a.role == "server" else client(spec, a.id)
        return 0
    # a SIGTERM still runs the finally blocks that delete the namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    try:
        rows = validate(scenarios(a.quick))
    except Refused as e:
        print(f"network benchmark skipped: {e}")
        return 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    worst = max(abs(r["error_pct"]) for r in rows)
    print(f"worst error {worst:.1f} % (goal: within 10 % in every scenario)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
