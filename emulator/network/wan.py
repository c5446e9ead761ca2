"""Edges that reach the cloud through one shared wide-area link.

:class:`~groupfel.emulator.network.ContendedFederation` gives each edge a link of its own to
the cloud (``topology.edge_link``). Where several edges sit behind one uplink (a site's WAN
connection), the cloud's model x_t going down to every edge and every edge's group models coming
back share that link's capacity: :class:`WanFederation` plays them as flows of a
:class:`~groupfel.emulator.network.links.SharedLink` per direction (max-min fair, each flow capped by its
edge's ``edge_link`` rate, the link's latency after its last byte). The hops appear in the trace
as ``cloud-down`` and ``cloud-up`` rows (``group`` -1).
"""
from __future__ import annotations

from ..federation import Federation, RoundContext
from .edge import EdgeNetwork
from .federation import ContendedFederation
from .links import SharedLink


class WanFederation(ContendedFederation):
    """:class:`ContendedFederation` whose edges share one link of ``wan_bps`` to the cloud, each
    direction apart (full duplex)."""

    def __init__(self, ctx: RoundContext, net: EdgeNetwork, wan_bps: float, stats: list | None = None):
        if net.cloud_shared:
            raise ValueError("a shared WAN carries each edge's models after its group rounds; "
                             "edge_link.shared (one upload per group) is not modelled with it")
        super().__init__(ctx, net, stats)
        self.wan_bps = float(wan_bps)
        self._wan: dict[int, tuple[SharedLink, SharedLink]] = {}

    def scratch(self) -> WanFederation:
        ctx = self.ctx
        dry = WanFederation(RoundContext(Federation.environment(ctx.env.now), ctx.model_bytes, ctx.cost,
                                         ctx.ledger.scratch(), ctx.topology, ctx.seed, ctx.group_rounds,
                                         ctx.local_epochs, ctx.faults, ctx.training_passes), self.net, self.wan_bps, [])
        dry._priced = self._priced
        return dry

    def _hop(self, t: int, j: int, kind: str, link: SharedLink, nbytes: int):
        env, edge_link = self.ctx.env, self.ctx.topology.edge_link(j)
        start = env.now
        yield env.process(link.transfer(nbytes, edge_link.bandwidth_mbps * 1e6, edge_link.latency_s,
                                        edge_link.burst_bytes))
        self.trace.append({"kind": kind, "round": t + 1, "edge": j, "group": -1, "group_round": -1, "client": -1,
                           "bytes": nbytes, "queued": start, "start": start, "end": env.now})

    def _c_edge(self, t, j, e, groups):
        env = self.ctx.env
        if t not in self._wan:      # one pair of links per global round: every edge of the round on them
            self._wan = {t: (SharedLink(env, self.wan_bps, "wan-down"), SharedLink(env, self.wan_bps, "wan-up"))}
        down, up = self._wan[t]
        nbytes = self.ctx.model_bytes
        self._bytes["cloud_to_edge"] += nbytes
        yield from self._hop(t, j, "cloud-down", down, nbytes)                          # cloud -> edge: x_t
        yield env.all_of([env.process(self._c_group(t, j, e, gid, g)) for gid, g in groups])
        back = nbytes * self.net.vectors * len(groups)
        self._bytes["edge_to_cloud"] += back
        yield from self._hop(t, j, "cloud-up", up, back)                                # edge -> cloud: every x^g
