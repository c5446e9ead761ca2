"""The edge as a shared place: access capacity, server cores, heterogeneous clients, availability.

Used instead of :class:`~groupfel.emulator.federation.Federation` when any of the topology keys
``edge_access_mbps``, ``edge_cores``, ``edge_profile``, ``edge_link.shared``, ``heterogeneity``
or ``availability`` is set (without them time runs exactly as before, bit for bit).

One group round of a sampled group, in simulated time:

1. members offline at its start (``availability``) leave the group for the rest of the global
   round: they are charged nothing from then on, their updates are left out, and the survivors
   pay the dropout recovery (as a fault's dropout);
2. each remaining member downloads the group model plus its share of the secure-aggregation key
   messages (the edge's downlink, shared with every concurrent download of the edge when
   ``edge_access_mbps`` is set, capped by the client's own link);
3. trains and runs its group operations (its device curves × its slowdown factor, × any straggler
   slowdown in time only; on a device capped by a CPU quota, ``ClientNet.cpu_share``, the steps
   take :func:`quota_seconds` of their curve time: the quota unspent while it downloaded runs at
   the core's full speed);
4. uploads its payload (the model, the algorithm's extra vectors such as SCAFFOLD's variates, or
   under secure aggregation the masked vector in 32-bit words) plus its key and share messages
   (the edge's uplink, shared likewise);
5. the edge aggregates: it holds one of its ``edge_cores`` (a ``simpy.Resource``; groups queue)
   for the edge profile's ``aggregation`` + ``secagg-server`` + dropped × ``secagg-server-recovery``
   seconds. Waiting for a core or for the medium is simulated time, never Eq. 5 cost.

Who is offline depends on the round's clock, but the compute (which leaves offline clients out of
training) runs before the SimPy processes; so with ``availability`` the round is first played on
a scratch clock (:meth:`ContendedFederation.offline`, also what the budget check prices), and
:meth:`ContendedFederation.run_round` then replays that play's charges, statistics and end time.

The access capacity is full duplex: downloads share ``edge_access_mbps`` and uploads share another
``edge_access_mbps``. With ``edge_link.shared`` each group's model goes up to the cloud when its K
group rounds end, sharing the edge link with the edge's other groups' uploads.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from groupfel.cost_models import TRAINING

from .config import DAY_S, AvailabilityConfig, HeterogeneityConfig, RunConfig
from groupfel.errors import InputError, InputWarning
from groupfel.userfile import short
from groupfel.usercsv import read_user_csv
from .federation import Federation, Group, RoundContext, airtime, draw_faults
from .fedscale import FEDSCALE_DEFAULT, KBIT, assign, read_behaviour, read_capacity
from .ledger import CostLedger
from .links import SharedLink
from .rng import rng as stream

# secure aggregation's messages (cost_models/secagg.py): two X25519 public keys per client
# (AdvertiseKeys), per peer one AES-GCM ciphertext of two Shamir shares over GF(2^521 - 1)
# (ShareKeys: 2 × 66 bytes + 12 nonce + 16 tag + 8 for the sender and recipient ids), and per peer
# one share revealed to the edge at unmasking (66 bytes)
KEYS_BYTES = 2 * 32
SHARE_CIPHERTEXT_BYTES = 2 * 66 + 12 + 16 + 8
UNMASK_SHARE_BYTES = 66
TRACE_COLUMNS = ["kind", "round", "edge", "group", "group_round", "client", "bytes", "queued", "start", "end"]
OFFLINE = "offline"


def payload_vectors(algorithm) -> int:
    """Model-sized vectors a client uploads per group round: 2 for SCAFFOLD (model + control
    variate), else 1; an algorithm may declare ``upload_vectors`` itself."""
    return int(getattr(algorithm, "upload_vectors", 2 if getattr(algorithm, "name", "") == "scaffold" else 1))


def client_bytes(model_bytes: int, group_size: int, vectors: int = 1, secagg: bool = False) -> tuple[int, int]:
    """(download, upload) bytes of one client in one group round of a group of ``group_size``.

    Download: the group model (and, under secure aggregation, every member's public keys and the
    n − 1 ciphertexts of shares addressed to it, relayed by the edge). Upload: ``vectors`` model-
    sized vectors (under secure aggregation masked in 32-bit words: 4 bytes a parameter, the
    float32 size) and its keys, its n − 1 share ciphertexts and n − 1 unmasking shares."""
    down, up = model_bytes, vectors * model_bytes
    if secagg:
        peers = max(group_size - 1, 0)
        down += group_size * KEYS_BYTES + peers * SHARE_CIPHERTEXT_BYTES
        up += KEYS_BYTES + peers * (SHARE_CIPHERTEXT_BYTES + UNMASK_SHARE_BYTES)
    return down, up


# -- per-client links and slowdowns ---------------------------------------------------------------------

CFS_PERIOD_S = 0.1     # Linux's default CPU bandwidth period (cpu.cfs_period_us, cpu.max)


def quota_seconds(steady_s: float, share: float, period_s: float = CFS_PERIOD_S) -> float:
    """Expected wall seconds of compute that takes ``steady_s`` at the steady pace of a device held
    to ``share`` of a core by a CPU quota (share × period of CPU each period, Linux's CFS
    bandwidth control), when it starts after an idle spell of a period or more (a download).

    A device's curve is measured with calls back to back, so it gives the steady pace: CPU seconds
    / share. After idling, the current period's quota is unspent and runs at the core's full speed
    before the first throttle: compute of c = steady_s × share CPU seconds that starts at phase φ
    of a period gets min(q, P − φ) in that period (q = share × P), then q in each later one, and
    ends (P − φ) + k·P + r after it starts (c − min(q, P − φ) = k·q + r, 0 < r ≤ q). Averaged over
    φ uniform on [0, P) (midpoint rule on 256 points; the wall time is piecewise linear in φ).
    Short steps (c ≤ q) take c, their CPU time; long ones finish about P − q + φ early (on
    average up to one and a half periods)."""
    if share >= 1.0 or steady_s <= 0.0:
        return steady_s
    cpu, q = steady_s * share, share * period_s
    phase = (np.arange(256) + 0.5) / 256 * period_s
    first = np.minimum(q, period_s - phase)
    rest = cpu - first
    k = np.ceil(rest / q) - 1
    wall = np.where(rest <= 0, cpu, (period_s - phase) + k * period_s + (rest - k * q))
    return float(wall.mean())


@dataclass(frozen=True)
class ClientNet:
    bandwidth_mbps: np.ndarray
    latency_s: np.ndarray
    slowdown: np.ndarray        # compute factor: the device curves times it (2: twice as slow)
    trace_ids: list[str] | None = None     # each client's FedScale trace id (heterogeneity.fedscale_file)
    # each client's CPU quota as a share of one core (a cgroup's cpu.max / cfs_quota_us over its
    # period), for devices whose curves were measured under that quota; None: no quota
    cpu_share: np.ndarray | None = None
    cpu_period_s: float | np.ndarray = 0.1     # the quota's period, or each client's (Linux's default: 0.1)

    def compute_seconds(self, client: int, steady_s: float) -> float:
        """Wall seconds of compute steps that take ``steady_s`` on the client's curves, run back to
        back after a transfer (:func:`quota_seconds` under a CPU quota)."""
        if self.cpu_share is None:
            return steady_s
        period = self.cpu_period_s if np.isscalar(self.cpu_period_s) else self.cpu_period_s[client]
        return quota_seconds(steady_s, float(self.cpu_share[client]), float(period))

    def manifest(self) -> dict:
        out = {"bandwidth_mbps": self.bandwidth_mbps.tolist(), "latency_s": self.latency_s.tolist(),
               "slowdown": self.slowdown.tolist()}
        if self.cpu_share is not None:
            out["cpu_share"] = self.cpu_share.tolist()
            out["cpu_period_s"] = np.broadcast_to(self.cpu_period_s, self.cpu_share.shape).tolist()
        if self.trace_ids is not None:
            out["fedscale_ids"] = self.trace_ids
        return out


def _read_csv(path: str, where: str, columns: tuple[str, ...], optional: tuple[str, ...] = ()
              ) -> tuple[list[str], list[tuple[int, dict]]]:
    """A per-client table through the one reader of users' files (a spreadsheet's BOM and CRLF
    read like a plain file): its header and (line, row) pairs."""
    table = read_user_csv(path, f"{where}: {path}")
    table.require(columns, f"{', '.join(columns)} (optional: {', '.join(optional) or '-'})")
    return table.header, [(row.line, row.cells) for row in table.rows]


# each CSV column's bounds: the config's (docs/guide/config.md, "Limits")
_BOUNDS = {"bandwidth_mbps": (1e-6, 1e9, "Mbit/s"), "latency_s": (0.0, DAY_S, "s"),
           "slowdown": (1e-3, 1e3, ""), "cpu_share": (1e-3, 1.0, "of a core"), "cpu_period_s": (1e-3, 1.0, "s"), "start_s": (0.0, 1e12, "s"), "end_s": (0.0, 1e12, "s")}


def _num(row: dict, col: str, where: str, line: int) -> float:
    lo, hi, unit = _BOUNDS[col]
    try:
        v = float(row[col])
    except (TypeError, ValueError):
        v = math.nan
    if not lo <= v <= hi:    # NaN fails too
        raise InputError(f"{where}: line {line}: {col} = {short(row.get(col))}; give a number from {lo:g} to {hi:g}"
                         f"{' ' + unit if unit else ''}")
    return v


def _client_id(row: dict, where: str, line: int, n: int) -> int:
    try:
        c = int(row["client"])
    except (TypeError, ValueError):
        c = -1
    if not 0 <= c < n:
        raise InputError(f"{where}: line {line}: unknown client {short(row.get('client'))}; the topology's clients are 0..{n - 1}")
    return c


def _require_every_client(seen: set[int], n: int, where: str, path: str) -> None:
    if len(seen) != n:
        missing = sorted(set(range(n)) - seen)
        raise InputError(f"{where}: {path} has no row for client(s) {', '.join(map(str, missing[:5]))}"
                         f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of {n}); give every client a row")


def client_net(h: HeterogeneityConfig | None, n: int, bandwidth: float, latency: float, seed: int) -> ClientNet:
    """Every client's link and slowdown factor (``topology.heterogeneity``)."""
    bw, lat, slowdown = np.full(n, float(bandwidth)), np.full(n, float(latency)), np.ones(n)
    quota, period = None, CFS_PERIOD_S      # the file's optional cpu_share and cpu_period_s columns
    if h is None:
        return ClientNet(bw, lat, slowdown)
    draws = [stream(seed, "heterogeneity", c).normal(size=3) for c in range(n)]
    z = np.array(draws).reshape(n, 3)
    has_slowdown = False
    if h.fedscale_file is not None:
        return _fedscale_net(h, n, lat * np.exp(h.latency_sigma * z[:, 1]))
    if h.file is not None:
        where = "topology.heterogeneity.file"
        header, rows = _read_csv(h.file, where, ("client", "bandwidth_mbps", "latency_s"),
                                 ("slowdown", "cpu_share", "cpu_period_s"))
        if "speed" in header:
            raise InputError(f"{where}: {h.file}: column speed is now slowdown (a factor: 2 is twice as slow); "
                             f"rename the column")
        has_slowdown = "slowdown" in header
        if has_slowdown and h.slowdown_sigma:
            raise InputError(f"topology.heterogeneity.slowdown_sigma: {h.file} has a slowdown column, so the "
                             f"sigma would be ignored; remove slowdown_sigma or the column")
        if "cpu_period_s" in header and "cpu_share" not in header:
            raise InputError(f"{where}: {h.file} has cpu_period_s but no cpu_share column; add each client's "
                             f"CPU quota as a share of a core (cpu_share), or remove cpu_period_s")
        if "cpu_share" in header:
            quota, period = np.ones(n), np.full(n, CFS_PERIOD_S)
        seen: set[int] = set()
        for line, row in rows:
            c = _client_id(row, where, line, n)
            if c in seen:
                raise InputError(f"{where}: line {line}: client {c} appears twice; give one row per client")
            seen.add(c)
            bw[c] = _num(row, "bandwidth_mbps", where, line)
            lat[c] = _num(row, "latency_s", where, line)
            if has_slowdown:
                slowdown[c] = _num(row, "slowdown", where, line)
            if quota is not None:
                quota[c] = _num(row, "cpu_share", where, line)
            if "cpu_period_s" in header:
                period[c] = _num(row, "cpu_period_s", where, line)
        _require_every_client(seen, n, where, h.file)
    else:
        bw = bw * np.exp(h.bandwidth_sigma * z[:, 0])
        lat = lat * np.exp(h.latency_sigma * z[:, 1])
    if not has_slowdown:
        slowdown = np.exp(h.slowdown_sigma * z[:, 2])
    if quota is None:
        return ClientNet(bw, lat, slowdown)
    return ClientNet(bw, lat, slowdown, cpu_share=quota, cpu_period_s=period)


def _fedscale_net(h: HeterogeneityConfig, n: int, latency: np.ndarray) -> ClientNet:
    """Links and slowdowns from a FedScale device-capacity trace (docs/guide/network.md, "FedScale
    traces"): bandwidth = communication kbit/s × 1024 bit, slowdown = computation / reference."""
    where = "topology.heterogeneity.fedscale_file"
    cap = read_capacity(h.fedscale_file, where)
    ref = h.reference_ms_per_sample if h.reference_ms_per_sample is not None else float(np.median(cap.ms_per_sample))
    if h.fedscale_pairing == "fedscale":     # key (c + 1) mod M, FedScale's default entry where no key is that
        cap = cap.with_default(FEDSCALE_DEFAULT)
        pos = {k: i for i, k in enumerate(cap.ids[:-1])}
        idx = np.array([pos.get(str((c + 1) % (len(cap.ids) - 1)), len(cap.ids) - 1) for c in range(n)])
    else:
        idx = assign(len(cap.ids), n)
    bw = cap.kbps[idx] * KBIT / 1e6
    slowdown = cap.ms_per_sample[idx] / ref
    for c, i in enumerate(idx):
        lo, hi, _ = _BOUNDS["bandwidth_mbps"]
        if not lo <= bw[c] <= hi:
            raise InputError(f"{cap.at(i)} (client {c}): communication {cap.kbps[i]:g} kbit/s is {bw[c]:g} Mbit/s; "
                             f"give {lo / KBIT * 1e6:g} to {hi / KBIT * 1e6:g} kbit/s")
        lo, hi, _ = _BOUNDS["slowdown"]
        if not lo <= slowdown[c] <= hi:
            raise InputError(f"{cap.at(i)} (client {c}): computation {cap.ms_per_sample[i]:g} ms per sample is "
                             f"a slowdown of {slowdown[c]:g} against topology.heterogeneity.reference_ms_per_sample "
                             f"= {ref:g}; the slowdown must be {lo:g} to {hi:g}: set reference_ms_per_sample "
                             f"nearer, or fix the entry")
    return ClientNet(bw, latency, slowdown, [cap.ids[i] for i in idx])


# -- availability ------------------------------------------------------------------------------------

class Availability:
    """Each client's online intervals [start, end) in simulated seconds, read from a CSV, from a
    FedScale behaviour trace (repeating every finish_time s, as FedScale reads it) or drawn as an
    alternating on/off process (exponential durations), extended lazily as time goes on."""

    def __init__(self, cfg: AvailabilityConfig, n: int, seed: int):
        self.cfg, self.n, self.seed = cfg, n, seed
        self._iv: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self._gen: list[tuple[np.random.Generator, float, bool]] = []
        self._period: np.ndarray | None = None      # a FedScale trace repeats every finish_time s
        self.trace_ids: list[str] | None = None
        if cfg.fedscale_file is not None:
            trace = read_behaviour(cfg.fedscale_file, "topology.availability.fedscale_file")
            idx = trace.pair(n, cfg.fedscale_pairing)
            used = [int(i) for i in idx if int(i) in trace.bad]
            if used:
                raise InputError(trace.bad[used[0]])
            for i in sorted(trace.bad):    # an id no client takes: reported, never read
                warnings.warn(f"{trace.bad[i]} (client id {trace.ids[i]!r} is paired with none of the {n} "
                              f"clients, so it is ignored)", InputWarning, stacklevel=2)
            self._iv = [list(trace.intervals[i]) for i in idx]
            self._period = trace.period_s[idx]
            self.trace_ids = [trace.ids[i] for i in idx]
        elif cfg.file is not None:
            self._read(cfg.file)
        else:
            on, off = cfg.mean_on_s, cfg.mean_off_s
            for c in range(n):
                r = stream(seed, "availability", c)
                self._gen.append((r, 0.0, bool(r.random() < on / (on + off))))

    def _read(self, path: str) -> None:
        where = "topology.availability.file"
        _, rows = _read_csv(path, where, ("client", "start_s", "end_s"))
        for line, row in rows:
            c = _client_id(row, where, line, self.n)
            a, b = _num(row, "start_s", where, line), _num(row, "end_s", where, line)
            if b <= a:
                raise InputError(f"{where}: line {line}: client {c}'s interval [{a:g}, {b:g}) is reversed or empty; "
                                 f"end_s must be after start_s")
            self._iv[c].append((a, b))
        for c, iv in enumerate(self._iv):
            iv.sort()
            for (a0, b0), (a1, b1) in zip(iv, iv[1:]):
                if a1 < b0:
                    raise InputError(f"{where}: client {c}'s intervals [{a0:g}, {b0:g}) and [{a1:g}, {b1:g}) overlap; "
                                     f"merge them")
        _require_every_client({c for c, iv in enumerate(self._iv) if iv}, self.n, where, path)

    def _extend(self, c: int, until: float) -> None:
        r, t, on = self._gen[c]
        iv = self._iv[c]
        while t <= until:
            d = r.exponential(self.cfg.mean_on_s if on else self.cfg.mean_off_s)
            if on:
                iv.append((t, t + d))
            t, on = t + d, not on
        self._gen[c] = (r, t, on)

    def online(self, c: int, time: float) -> bool:
        if self._gen:
            self._extend(c, time)
        if self._period is not None:
            time = time % self._period[c]
        return any(a <= time < b for a, b in self._iv[c])

    def online_until(self, c: int, time: float) -> float:
        """When client c's online stretch that holds ``time`` ends (``time`` itself if it is
        offline then; inf if it never ends: a trace online over its whole period)."""
        end = time
        for _ in range(len(self._iv[c]) + 2):   # adjacent intervals, and across a period's end
            if not self.online(c, end):
                return end
            if self._period is not None:
                p = float(self._period[c])
                base, local = end - end % p, end % p
                b = next(b for a, b in self._iv[c] if a <= local < b)
                end = base + b if b < p else base + p
            else:
                end = next(b for a, b in self._iv[c] if a <= end < b)
        return math.inf

    def next_online(self, c: int, time: float) -> float | None:
        """The first time ≥ ``time`` at which client c is online, None if never again."""
        if self.online(c, time):
            return time
        if self._gen:
            while not any(a > time for a, _ in self._iv[c]):
                self._extend(c, self._gen[c][1])
            return next(a for a, _ in self._iv[c] if a > time)
        iv = self._iv[c]
        if self._period is None:
            return next((a for a, _ in iv if a > time), None)
        if not iv:
            return None
        p = float(self._period[c])
        base, local = time - time % p, time % p
        return next((base + a for a, _ in iv if a > local), base + p + iv[0][0])


# -- the network of a run ----------------------------------------------------------------------------

@dataclass
class EdgeNetwork:
    """What the shared-edge model needs besides the round context (built once per world)."""

    access_bps: float | None
    cores: int | None
    cloud_shared: bool
    clients: ClientNet
    vectors: int = 1
    secagg: bool = False
    edge_curves: dict = field(default_factory=dict)     # aggregation, secagg-server, secagg-server-recovery
    availability: Availability | None = None
    battery_j: float | None = None     # each client's energy budget: an empty battery takes it offline

    def server_time(self, n_alive: int, n_dropped: int) -> float:
        """Seconds an edge core spends aggregating a group round of ``n_alive`` survivors."""
        c, s = self.edge_curves, 0.0
        if n_alive <= 0:
            return 0.0
        if "aggregation" in c:
            s += float(c["aggregation"](n_alive + n_dropped))
        if self.secagg and "secagg-server" in c:
            s += float(c["secagg-server"](n_alive + n_dropped))
        if self.secagg and n_dropped and "secagg-server-recovery" in c:
            s += n_dropped * float(c["secagg-server-recovery"](n_alive + n_dropped))
        return max(s, 0.0)

    def manifest(self) -> dict:
        return {"edge_access_mbps": None if self.access_bps is None else self.access_bps / 1e6,
                "edge_cores": self.cores, "edge_link_shared": self.cloud_shared, "upload_vectors": self.vectors,
                "secure_aggregation_messages": self.secagg, "edge_curves": sorted(self.edge_curves),
                "clients": self.clients.manifest(),
                **({"availability_fedscale_ids": self.availability.trace_ids}
                   if self.availability is not None and self.availability.trace_ids is not None else {})}


def build_network(config: RunConfig, n_clients: int, algorithm, operations: tuple[str, ...],
                  profiles_file: str | None = None) -> EdgeNetwork | None:
    """The run's :class:`EdgeNetwork`, or None when no shared-edge key is set."""
    tc = config.topology
    battery = config.train.client_energy_budget
    if not (tc.contended or battery is not None):
        return None
    curves = {}
    if tc.edge_profile is not None:
        from groupfel.cost_models.profiles import get_profile

        from groupfel.cost_models import read_profiles

        try:
            prof = get_profile(tc.edge_profile, read_profiles(profiles_file) if profiles_file else None)
        except InputError as exc:
            raise InputError(f"topology.edge_profile: {exc}") from None
        curves = {k: v for k, v in prof.group_overhead.items()
                  if k in ("aggregation", "secagg-server", "secagg-server-recovery")}
        if not curves:
            raise InputError(f"topology.edge_profile: profile {tc.edge_profile} has no group_overhead curve "
                             f"aggregation, secagg-server or secagg-server-recovery; add one (cost.profiles_file)")
    clients = client_net(tc.heterogeneity, n_clients, tc.client_link.bandwidth_mbps, tc.client_link.latency_s,
                         config.seed)
    avail = Availability(tc.availability, n_clients, config.seed) if tc.availability is not None else None
    return EdgeNetwork(None if tc.edge_access_mbps is None else tc.edge_access_mbps * 1e6, tc.edge_cores,
                       tc.edge_link.shared, clients, payload_vectors(algorithm),
                       any("secagg" in op for op in operations), curves, avail, battery)


# -- the federation ----------------------------------------------------------------------------------

@dataclass
class _Edge:
    down: SharedLink
    up: SharedLink
    cloud: SharedLink
    cores: simpy.Resource | None
    core_busy_s: float = 0.0
    waits: list = field(default_factory=list)     # (group, group round, queued at, got a core at, done at)


class ContendedFederation(Federation):
    """:class:`Federation` with shared edges (see the module docstring)."""

    def __init__(self, ctx: RoundContext, net: EdgeNetwork, stats: list | None = None):
        super().__init__(ctx)
        self.net = net
        self.stats = stats if stats is not None else []      # one dict per round (the manifest's)
        self._offline: dict[int, dict[tuple[int, int], float]] = {}   # round -> {(k, client): time}
        self._left: dict[int, dict[tuple[int, int], float]] = {}      # went offline during group round k
        self._planned: dict[int, tuple] = {}
        self.trace: list[dict] = []                           # transfers and core holds (timeline)

    def manifest(self, ledger: CostLedger | None = None) -> dict:
        totals: dict[str, float] = {}
        for r in self.stats:
            for k, v in r["bytes"].items():
                totals[k] = totals.get(k, 0) + v
        offline = []
        if ledger is not None and OFFLINE in ledger.by_component:
            led = ledger.frame()
            rows = led[led["component"] == OFFLINE]
            offline = [{"round": int(r.round), "group_round": int(r.group_round), "client": int(r.client),
                        "edge": int(r.edge), "group": int(r.group), "time_s": float(r.start)}
                       for r in rows.itertuples(index=False)]
        return {"network": {**self.net.manifest(), "bytes_total": totals, "offline": offline, "rounds": self.stats}}

    def write_outputs(self, arm_dir) -> None:
        """network.parquet: every transfer and core hold (the timeline's), this session's added to
        what an earlier session of the arm wrote."""
        import pandas as pd

        from .io import atomic_write

        path = Path(arm_dir) / "network.parquet"
        new = pd.DataFrame(self.trace, columns=TRACE_COLUMNS)
        if path.exists() and self.trace:
            old = pd.read_parquet(path)
            new = pd.concat([old[old["round"] < new["round"].min()], new], ignore_index=True)
        elif path.exists():
            return
        atomic_write(path, lambda p: new.to_parquet(p, index=False))

    # -- who is offline: the round's time decides it, so a dry run on a scratch clock finds it first
    def offline(self, t: int, sampled: list[tuple[int, Group]]) -> frozenset[tuple[int, int]]:
        """(group round, client) pairs of round t whose client is offline (left the group)."""
        if self.net.availability is None and self.net.battery_j is None:
            return frozenset()
        key_ = (float(self.ctx.env.now), tuple(gid for gid, _ in sampled))
        if self._planned.get(t, (None,))[0] != key_:
            dry = self.scratch()
            dry.run_round(t, sampled)
            self._offline[t] = dry._offline.get(t, {})
            self._left[t] = dry._left.get(t, {})
            self._planned = {t: (key_, dry)}   # run_round replays it: the same clock, charges and stats
            if t == 0:
                self._refuse_empty_start(sampled)
        return frozenset(self._offline.get(t, {})) | frozenset(self._left.get(t, {}))

    def online_seconds(self, start: float, end: float) -> np.ndarray:
        avail = self.net.availability
        out = super().online_seconds(start, end)
        for c in range(len(out)):
            if self._flat(c):       # an empty battery: offline since it emptied (within this stretch)
                out[c] = 0.0
            elif avail is not None:
                out[c], x = 0.0, start
                while x < end:
                    if avail.online(c, x):
                        y = min(avail.online_until(c, x), end)
                        out[c], x = out[c] + (y - x), y
                    else:
                        nxt = avail.next_online(c, x)
                        if nxt is None or nxt >= end:
                            break
                        x = nxt
        return out

    def absent(self, t: int) -> set[int]:
        return {c for k, c in self._offline.get(t, {}) if k == 0}

    def online_now(self) -> np.ndarray | None:
        """Which clients are online (and have charge left) at the clock's time; None: all, always."""
        net = self.net
        if net.availability is None and net.battery_j is None:
            return None
        now = float(self.ctx.env.now)
        return np.array([not self._flat(c) and (net.availability is None or net.availability.online(c, now))
                         for c in range(self.ctx.topology.n_clients)], dtype=bool)

    def await_online(self, clients: np.ndarray | None = None) -> str | None:
        """Where nobody is online, move the clock to the first time someone is (no charge, no
        round); where nobody ever will be, say why (the run stops): FedScale's rounds sample the
        clients online at the round's time and never play a round with nobody. ``clients``: those
        a round can sample (default every client)."""
        online = self.online_now()
        clients = np.arange(self.ctx.topology.n_clients) if clients is None else np.asarray(clients)
        if online is None or online[clients].any():
            return None
        env, net, n = self.ctx.env, self.net, len(clients)
        now = float(env.now)
        alive = [int(c) for c in clients if not self._flat(int(c))]
        if not alive:
            return (f"batteries: every client's battery (train.client_energy_budget = {net.battery_j:g} J) is empty "
                    f"at {now:g} s simulated")
        times = [net.availability.next_online(c, now) for c in alive] if net.availability is not None else []
        times = [x for x in times if x is not None]
        if not times:
            flat = n - len(alive)
            return (f"availability: no client is online at or after {now:g} s simulated"
                    f"{f' ({flat} more have an empty battery)' if flat else ''} (topology.availability)")
        env.run(until=min(times))
        return None

    def scratch(self) -> "ContendedFederation":
        ctx = self.ctx
        dry = ContendedFederation(RoundContext(Federation.environment(ctx.env.now), ctx.model_bytes, ctx.cost,
                                               ctx.ledger.scratch(), ctx.topology, ctx.seed, ctx.group_rounds,
                                               ctx.local_epochs, ctx.faults, ctx.training_passes), self.net, [])
        dry._priced = self._priced
        return dry

    def round_energy(self, t: int, groups: list[Group]) -> float:
        sampled = list(enumerate(groups))
        self.offline(t, sampled)
        plan = self._planned.get(t)
        if plan is not None:
            return plan[1].ctx.ledger.energy_total
        return super().round_energy(t, groups)

    def _refuse_empty_start(self, sampled: list[tuple[int, Group]]) -> None:
        """A first round in which every sampled client is offline trains nothing, and its clock
        barely moves, so every later round would find the same: refused before any training."""
        members = {int(c) for _, g in sampled for c in g.clients}
        if members and all((0, c) in self._offline[0] for c in members):
            online = self.online_now()
            if online is not None and online[sorted(members)].any():   # online at the start, gone before the round ends
                raise InputError(f"topology.availability: the {len(members)} clients sampled in round 1 are online at "
                                 f"its start ({self.ctx.env.now:g} s simulated) but go offline before their first "
                                 f"group round ends, so nothing would train; let clients stay online longer "
                                 f"(intervals that end later, or a longer mean_on_s)")
            raise InputError(f"topology.availability: all {len(members)} clients sampled in round 1 are offline "
                             f"at its start ({self.ctx.env.now:g} s simulated), so nothing would train; let "
                             f"clients be online from 0 s (an interval with start_s = 0, or a shorter mean_off_s)")

    def run_round(self, t, sampled):
        env = self.ctx.env
        plan = self._planned.get(t)
        if plan is None or plan[0] != (float(env.now), tuple(gid for gid, _ in sampled)):
            return super().run_round(t, sampled)
        dry = plan[1]
        self.ctx.ledger.replay(dry.ctx.ledger)      # the dry run's charges, as charged (same times)
        self.stats.extend(dry.stats)
        self.trace.extend(dry.trace)
        self._planned = {}
        if dry.ctx.env.now > env.now:
            env.run(until=dry.ctx.env.now)

    def round_cost(self, t: int, groups: list[Group]) -> float:
        self.offline(t, list(enumerate(groups)))
        return super().round_cost(t, groups)

    def charges(self, t, k, g):
        ctx = self.ctx
        devices, nominal = self._price(g)
        dropped, slow = draw_faults(ctx.faults, ctx.seed, t, k, g.clients)
        gone = self._offline.get(t, {})
        off = np.array([(k, int(c)) in gone for c in g.clients], dtype=bool) if gone else np.zeros(g.size, bool)
        if not (dropped.any() or off.any()):
            return dict(nominal), dropped, slow
        lost = dropped | off
        alive = ~lost
        # a dropped client trained, then left; an offline one did nothing (no charge at all)
        charges = {c: np.where(alive, v, 0.0) if c != TRAINING else np.where(off, 0.0, v) for c, v in nominal.items()}
        if alive.any():
            charges.update({c: np.where(alive, v, 0.0) for c, v in
                            ctx.cost.recovery(devices, g.size, int(lost.sum())).items()})
        return charges, lost, slow

    def _price(self, g: Group):
        key_ = g.clients.tobytes() + g.n_samples.tobytes()
        if key_ not in self._priced:
            devices, nominal = super()._price(g)
            slowdown = self.net.clients.slowdown[g.clients]
            if not np.all(slowdown == 1.0):
                nominal = {c: v * slowdown for c, v in nominal.items()}
                for v in nominal.values():
                    v.flags.writeable = False
            self._priced[key_] = devices, nominal
        return self._priced[key_]

    # -- the processes
    def global_round(self, t, sampled):
        env, net = self.ctx.env, self.net
        start = env.now
        cloud_bps = None
        by_edge: dict[int, list[tuple[int, Group]]] = {}
        for gid, g in sampled:
            by_edge.setdefault(g.edge, []).append((gid, g))
        edges = {}
        for j in by_edge:
            link = self.ctx.topology.edge_link(j)
            cloud_bps = link.bandwidth_mbps * 1e6
            edges[j] = _Edge(SharedLink(env, net.access_bps, f"edge{j}-down"), SharedLink(env, net.access_bps, f"edge{j}-up"),
                             SharedLink(env, cloud_bps if net.cloud_shared else None, f"edge{j}-cloud"),
                             simpy.Resource(env, net.cores) if net.cores is not None else None)
        self._bytes = {"cloud_to_edge": 0, "edge_to_cloud": 0, "edge_to_client": 0, "client_to_edge": 0}
        yield env.all_of([env.process(self._c_edge(t, j, edges[j], groups)) for j, groups in sorted(by_edge.items())])
        span = env.now - start
        rows = []
        for j, e in sorted(edges.items()):
            def util(link):
                cap = link.capacity_bps
                return None if cap is None or span <= 0 else link.carried_bits / (cap * span)
            rows.append({"edge": j, "access_down_utilisation": util(e.down), "access_up_utilisation": util(e.up),
                         "edge_link_utilisation": util(e.cloud),
                         "core_utilisation": (e.core_busy_s / (net.cores * span)) if net.cores and span > 0 else None,
                         "core_wait_s": float(sum(w[3] - w[2] for w in e.waits)),
                         "core_busy_s": e.core_busy_s})
        self.stats.append({"round": t + 1, "start_s": start, "makespan_s": span, "edges": rows,
                           "bytes": dict(self._bytes)})

    def _c_edge(self, t, j, e: _Edge, groups):
        env, link = self.ctx.env, self.ctx.topology.edge_link(j)
        nbytes = self.ctx.model_bytes
        self._bytes["cloud_to_edge"] += nbytes
        yield env.timeout(link.transfer_time(nbytes))                    # cloud -> edge: x_t
        yield env.all_of([env.process(self._c_group(t, j, e, gid, g)) for gid, g in groups])
        if not self.net.cloud_shared:
            up = nbytes * self.net.vectors * len(groups)
            self._bytes["edge_to_cloud"] += up
            yield env.timeout(link.transfer_time(up))                    # edge -> cloud: every x^g

    def _c_group(self, t, j, e: _Edge, gid, g: Group):
        ctx, env, net = self.ctx, self.ctx.env, self.net
        devices = self._price(g)[0]
        gone = self._offline.setdefault(t, {})
        for k in range(ctx.group_rounds):
            start = env.now
            for c in g.clients:
                c = int(c)
                if (k - 1, c) in gone or (k - 1, c) in self._left.get(t, {}) or (net.availability is not None and not net.availability.online(c, start)) \
                        or self._flat(c):
                    if (k - 1, c) not in gone and (k - 1, c) not in self._left.get(t, {}):
                        # found offline now: a zero charge says who and when
                        ctx.ledger.charge(round=t, edge=j, group=gid, group_round=k, clients=np.array([c]),
                                          devices=[ctx.topology.client_device[c]], component=OFFLINE,
                                          amounts=np.zeros(1), start=np.array([start]), end=np.array([start]))
                    gone[(k, c)] = start
            charges, lost, slow = self.charges(t, k, g)
            off = np.array([(k, int(c)) in gone for c in g.clients], dtype=bool)
            n_here = int((~off).sum())
            down, up = client_bytes(ctx.model_bytes, n_here, net.vectors, net.secagg)
            where = (t + 1, j, gid, k)
            members = [env.process(self._c_client(where, e, int(c), i, charges, slow[i], bool(lost[i]), down, up))
                       for i, c in enumerate(g.clients) if not off[i]]
            yield env.all_of(members)
            spans, radio = np.zeros((g.size, len(charges), 2)), np.zeros((g.size, 2, 2))
            if members:
                spans[~off] = np.array([p.value[0] for p in members]).reshape(n_here, len(charges), 2)
                radio[~off] = np.array([p.value[1] for p in members]).reshape(n_here, 2, 2)
            left_at = dict(zip(g.clients[~off].tolist(), [p.value[2] for p in members]))
            left = np.array([left_at.get(int(c)) is not None for c in g.clients], dtype=bool)
            for c in g.clients[left]:     # left before finishing: out from this group round on
                at = left_at[int(c)]
                self._left.setdefault(t, {})[(k, int(c))] = at
                ctx.ledger.charge(round=t, edge=j, group=gid, group_round=k, clients=np.array([c]),
                                  devices=[ctx.topology.client_device[c]], component=OFFLINE,
                                  amounts=np.zeros(1), start=np.array([at]), end=np.array([at]))
            n_alive = int((~(lost | left)).sum())
            hold = net.server_time(n_alive, int((lost | left).sum()) if n_alive else 0)
            if n_alive and (e.cores is not None or hold > 0):
                queued = env.now
                if e.cores is not None:
                    with e.cores.request() as req:
                        yield req
                        got = env.now
                        yield env.timeout(hold)
                else:
                    got = env.now
                    yield env.timeout(hold)
                e.core_busy_s += hold
                e.waits.append((gid, k, queued, got, env.now))
                self.trace.append({"kind": "core", "round": t + 1, "edge": j, "group": gid, "group_round": k,
                                   "client": -1, "bytes": 0, "queued": queued, "start": got, "end": env.now})
            for ci, comp in enumerate(charges):
                amounts = charges[comp] if comp == TRAINING or not left.any() else np.where(left, 0.0, charges[comp])
                ctx.ledger.charge(round=t, edge=j, group=gid, group_round=k, clients=g.clients,
                                  devices=devices, component=comp, amounts=amounts,
                                  start=start + spans[:, ci, 0], end=start + spans[:, ci, 1])
            if ctx.ledger.power is not None:
                self.charge_energy((t, j, gid, k), g, devices, list(charges), spans, radio,
                                   net.clients.bandwidth_mbps[g.clients], ~off, ~(lost | left), env.now - start)
        if net.cloud_shared:
            up = ctx.model_bytes * net.vectors
            self._bytes["edge_to_cloud"] += up
            lat = ctx.topology.edge_link(j).latency_s
            yield env.process(e.cloud.transfer(up, None, lat))

    def _send(self, link: SharedLink, nbytes: float, bps: float, latency: float):
        """One client transfer through its edge's side of ``link``: on a dedicated link size / rate
        plus latency in one timeout (one event per step where it can), else a shared flow."""
        if link.capacity_bps is None:
            yield self.ctx.env.timeout(8.0 * nbytes / bps + latency)
            return
        yield link.send(nbytes, bps)
        if latency:
            yield self.ctx.env.timeout(latency)

    def _c_client(self, where, e: _Edge, client, member, charges, slow, dropped, down, up):
        env, cn = self.ctx.env, self.net.clients
        bps, lat = cn.bandwidth_mbps[client] * 1e6, float(cn.latency_s[client])
        t0 = env.now
        self._bytes["edge_to_client"] += down
        yield from self._send(e.down, down, bps, lat)
        self.trace.append(dict(zip(TRACE_COLUMNS, ("download", *where, client, down, t0, t0, env.now))))
        a, spans, up_s, up_air = env.now, [], 0.0, 0.0
        down_s = a - t0
        down_air = min(float(airtime(down, cn.bandwidth_mbps[client])), down_s)
        begin, steady = a, 0.0
        for comp, amounts in charges.items():   # the compute steps back to back: one timeout
            d = 0.0 if dropped and comp != TRAINING else slow * float(amounts[member])
            if cn.cpu_share is None:
                spans.append((a - t0, a + d - t0))
                a += d
            else:                                # a quota's wall time: of the steps so far, together
                steady += d
                end = begin + cn.compute_seconds(client, steady)
                spans.append((a - t0, end - t0))
                a = end
        avail = self.net.availability
        gone_at = avail.online_until(client, t0) if avail is not None and not dropped else math.inf
        left = gone_at < a      # offline before it finished its work: it drops out then, sending nothing
        if left:
            a = max(gone_at, env.now)
            spans = [(min(x, a - t0), min(y, a - t0)) for x, y in spans]
        if a > env.now:
            yield env.timeout(a - env.now)
        if not (dropped or left):
            a = env.now
            self._bytes["client_to_edge"] += up
            yield from self._send(e.up, up, bps, lat)
            self.trace.append(dict(zip(TRACE_COLUMNS, ("upload", *where, client, up, a, a, env.now))))
            up_s = env.now - a
            up_air = min(float(airtime(up, cn.bandwidth_mbps[client])), up_s)
        return spans, ((down_s, down_air), (up_s, up_air)), a if left else None

    def _flat(self, c: int) -> bool:
        """Whether client c's battery (``train.client_energy_budget``) is empty."""
        spent = self.ctx.ledger.client_energy
        return self.net.battery_j is not None and c < len(spent) and spent[c] >= self.net.battery_j


# -- what-if: one edge's round without training ------------------------------------------------------

def edge_makespan(group_sizes: list[int], n_samples: np.ndarray, training, overhead, *, group_rounds: int,
                  local_epochs: int, model_bytes: int, client_mbps, latency_s,
                  access_mbps: float | None, cores: int | None, edge_curves: dict | None = None,
                  secagg: bool = True, edge_mbps: float = 1000.0, edge_latency_s: float = 0.01,
                  operation: str = "secagg", power=None) -> dict:
    """One global round of one edge whose sampled groups have ``group_sizes`` members (holding
    ``n_samples`` in order), on the shared-edge model: its makespan, Eq. 5 cost, time waiting for
    a core and the access links' utilisation (``groupfel whatif``'s makespan columns).
    ``client_mbps`` and ``latency_s``: one value for every client or one per client. ``power``:
    the clients' :class:`~groupfel.cost_models.power.DevicePower`, adding the round's joules
    (``edge_energy_j`` and one ``energy_<state>_j`` column per state)."""
    from groupfel.cost_models import CostModel, DeviceProfile
    from groupfel.topologies import Link, build_topology

    n = int(sum(group_sizes))
    n_samples = np.asarray(n_samples[:n], dtype=float)
    parts = [np.arange(1) for _ in range(n)]
    bw = np.broadcast_to(np.asarray(client_mbps, dtype=float), (n,)).copy()
    lat = np.broadcast_to(np.asarray(latency_s, dtype=float), (n,)).copy()
    topo = build_topology([n], ["d"] * n, parts, np.ones((n, 1), dtype=int),
                          client_link=Link(float(bw[0]), float(lat[0])), edge_link=Link(edge_mbps, edge_latency_s))
    prof = DeviceProfile("d", "whatif", training={"h": training}, group_overhead={operation: overhead})
    cost = CostModel({"d": prof}, "h", (operation,))
    net = EdgeNetwork(None if access_mbps is None else access_mbps * 1e6, cores, False,
                      ClientNet(bw, lat, np.ones(n)), 1, secagg, dict(edge_curves or {}))
    env = simpy.Environment()
    ledger = CostLedger()
    if power is not None:
        from groupfel.cost_models.power import DevicePower, PowerModel

        ledger.power = PowerModel({"d": DevicePower("d", power.states)})
    fed = ContendedFederation(RoundContext(env, model_bytes, cost, ledger, topo, 0, group_rounds,
                                           local_epochs), net)
    starts = np.concatenate([[0], np.cumsum(group_sizes)[:-1]]).astype(int)
    sampled = [(g, Group(0, np.arange(a, a + s), n_samples[a:a + s].astype(np.int64), 0.0))
               for g, (a, s) in enumerate(zip(starts, group_sizes))]
    fed.run_round(0, sampled)
    r = fed.stats[0]
    e = r["edges"][0]
    return {"makespan_s": r["makespan_s"], "edge_cost": fed.ctx.ledger.total, "core_wait_s": e["core_wait_s"],
            "core_utilisation": e["core_utilisation"], "access_down_utilisation": e["access_down_utilisation"],
            "access_up_utilisation": e["access_up_utilisation"],
            "bytes_client_edge": r["bytes"]["edge_to_client"] + r["bytes"]["client_to_edge"],
            **({"edge_energy_j": ledger.energy_total,
                **{k: v for k, v in ledger.energy_row().items() if k != "energy_j"}} if power is not None else {})}
