"""What-if: one edge's global round on the shared-edge model, without training."""
from __future__ import annotations

import numpy as np
import simpy

from ..federation import Group, RoundContext
from ..ledger import CostLedger
from .edge import EdgeNetwork
from .federation import ContendedFederation
from .heterogeneity import ClientNet

def edge_makespan(group_sizes: list[int], n_samples: np.ndarray, training, overhead, *, group_rounds: int,
                  local_epochs: int, model_bytes: int, client_mbps, latency_s,
                  access_mbps: float | None, cores: int | None, edge_curves: dict | None = None,
                  secagg: bool = True, edge_mbps: float = 1000.0, edge_latency_s: float = 0.01,
                  operation: str = "secagg", power=None, server_power=None,
                  carbon_intensity: float | None = None) -> dict:
    """One global round of one edge whose sampled groups have ``group_sizes`` members (holding
    ``n_samples`` in order), on the shared-edge model: its makespan, Eq. 5 cost, time waiting for
    a core and the access links' utilisation (``groupfel whatif``'s makespan columns).
    ``client_mbps`` and ``latency_s``: one value for every client or one per client. ``power``:
    the clients' :class:`~groupfel.cost_models.power.DevicePower`, adding the round's joules
    (``edge_energy_j`` and one ``energy_<state>_j`` column per state); ``server_power``: the edge
    server's :class:`~groupfel.cost_models.power.DevicePower` (its aggregation, secure-aggregation
    and idle joules: ``edge_server_energy_j``; with the clients', ``edge_total_energy_j``);
    ``carbon_intensity`` (g/kWh): their grams CO2e (``carbon_g``, ``edge_server_carbon_g``,
    ``edge_total_carbon_g``)."""
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

        servers = {"edge-server": server_power} if server_power is not None else {}
        carbon = None
        if carbon_intensity is not None:
            from groupfel.cost_models.carbon import read_intensity

            carbon = read_intensity(carbon_intensity)
        ledger.power = PowerModel({"d": DevicePower("d", power.states), **servers},
                                  edge="edge-server" if servers else None, carbon=carbon)
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
                **{k: v for k, v in ledger.energy_row().items()
                   if k not in ("energy_j", "edge_energy_j", "edge_carbon_g")}}
               if power is not None else {}),
            **({"edge_server_carbon_g": ledger.carbon_g.get("edge", 0.0),
                "edge_total_carbon_g": ledger.carbon_g.get("client", 0.0) + ledger.carbon_g.get("edge", 0.0)}
               if power is not None and server_power is not None and carbon_intensity is not None else {}),
            **({"edge_server_energy_j": ledger.site_energy.get("edge", 0.0),
                "edge_total_energy_j": ledger.energy_total + ledger.site_energy.get("edge", 0.0)}
               if power is not None and server_power is not None else {})}
