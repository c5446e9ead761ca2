"""Each client's link, latency, slowdown factor and CPU quota (``topology.heterogeneity``): drawn,
read from a CSV or from a FedScale device-capacity trace."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from groupfel.errors import InputError

from ..config import HeterogeneityConfig
from ..rng import rng as stream
from .clientcsv import BOUNDS, client_id, number, read_csv, require_every_client
from .fedscale import FEDSCALE_DEFAULT, KBIT, assign, read_capacity

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
    # each client's link's token bucket in bytes (Link.burst_bytes); None: ideal links
    burst_bytes: np.ndarray | None = None

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
        if self.burst_bytes is not None:
            out["burst_bytes"] = self.burst_bytes.tolist()
        return out

    def burst(self, client: int) -> float:
        """The bytes of a transfer that leave at once on the client's link."""
        return 0.0 if self.burst_bytes is None else float(self.burst_bytes[client])


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
        header, rows = read_csv(h.file, where, ("client", "bandwidth_mbps", "latency_s"),
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
            c = client_id(row, where, line, n)
            if c in seen:
                raise InputError(f"{where}: line {line}: client {c} appears twice; give one row per client")
            seen.add(c)
            bw[c] = number(row, "bandwidth_mbps", where, line)
            lat[c] = number(row, "latency_s", where, line)
            if has_slowdown:
                slowdown[c] = number(row, "slowdown", where, line)
            if quota is not None:
                quota[c] = number(row, "cpu_share", where, line)
            if "cpu_period_s" in header:
                period[c] = number(row, "cpu_period_s", where, line)
        require_every_client(seen, n, where, h.file)
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
        lo, hi, _ = BOUNDS["bandwidth_mbps"]
        if not lo <= bw[c] <= hi:
            raise InputError(f"{cap.at(i)} (client {c}): communication {cap.kbps[i]:g} kbit/s is {bw[c]:g} Mbit/s; "
                             f"give {lo / KBIT * 1e6:g} to {hi / KBIT * 1e6:g} kbit/s")
        lo, hi, _ = BOUNDS["slowdown"]
        if not lo <= slowdown[c] <= hi:
            raise InputError(f"{cap.at(i)} (client {c}): computation {cap.ms_per_sample[i]:g} ms per sample is "
                             f"a slowdown of {slowdown[c]:g} against topology.heterogeneity.reference_ms_per_sample "
                             f"= {ref:g}; the slowdown must be {lo:g} to {hi:g}: set reference_ms_per_sample "
                             f"nearer, or fix the entry")
    return ClientNet(bw, latency, slowdown, [cap.ids[i] for i in idx])
