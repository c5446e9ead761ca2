"""The network of a run: each edge's access capacity and cores, the clients' links, availability and
batteries, and the edge server's curves (built once per world)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from groupfel.errors import InputError

from ..config import RunConfig
from .availability import Availability
from .battery import Battery
from .heterogeneity import ClientNet, client_net
from .payload import payload_vectors


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
    battery: Battery | None = None     # with a charging power: batteries that charge (train.client_charge_w)

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

    def server_parts(self, n_alive: int, n_dropped: int) -> dict[str, float]:
        """:meth:`server_time`'s seconds by server state: aggregation and secure aggregation's
        server part (with its dropout recovery)."""
        c, n = self.edge_curves, n_alive + n_dropped
        if n_alive <= 0:
            return {}
        out = {"aggregation": float(c["aggregation"](n)) if "aggregation" in c else 0.0, "secagg_server": 0.0}
        if self.secagg and "secagg-server" in c:
            out["secagg_server"] += float(c["secagg-server"](n))
        if self.secagg and n_dropped and "secagg-server-recovery" in c:
            out["secagg_server"] += n_dropped * float(c["secagg-server-recovery"](n))
        return {k: max(v, 0.0) for k, v in out.items()}

    def manifest(self) -> dict:
        return {"edge_access_mbps": None if self.access_bps is None else self.access_bps / 1e6,
                "edge_cores": self.cores, "edge_link_shared": self.cloud_shared, "upload_vectors": self.vectors,
                "secure_aggregation_messages": self.secagg, "edge_curves": sorted(self.edge_curves),
                "clients": self.clients.manifest(),
                **({"battery": self.battery.manifest()} if self.battery is not None else {}),
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
                         config.world_rng_seed)
    if tc.client_link.burst_bytes:
        clients = replace(clients, burst_bytes=np.full(n_clients, float(tc.client_link.burst_bytes)))
    avail = Availability(tc.availability, n_clients, config.seed) if tc.availability is not None else None
    return EdgeNetwork(None if tc.edge_access_mbps is None else tc.edge_access_mbps * 1e6, tc.edge_cores,
                       tc.edge_link.shared, clients, payload_vectors(algorithm),
                       any("secagg" in op for op in operations), curves, avail, battery,
                       _battery(config, n_clients, avail))


def _battery(config: RunConfig, n: int, avail: Availability | None) -> Battery | None:
    """Batteries that charge (``train.client_charge_w``); None: drain only, or no batteries."""
    t = config.train
    if t.client_charge_w is None:
        return None
    charging = None
    if t.client_charging_file is not None:
        from ..config import AvailabilityConfig

        charging = Availability(AvailabilityConfig(file=t.client_charging_file), n, config.seed,
                                "train.client_charging_file")
    elif t.client_charging_from_availability:
        if avail is None:
            raise InputError("train.client_charging_from_availability: reads topology.availability's online "
                             "intervals as charging; set topology.availability, or remove it")
        charging = avail
    return Battery(float(t.client_energy_budget), float(t.client_charge_w), charging, t.client_resume_share)
