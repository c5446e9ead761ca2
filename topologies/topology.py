"""Who sits where: one cloud, J edge servers, clients attached to edges (a networkx graph).

Nodes are ``"cloud"``, ``"edge:j"`` and ``"client:i"`` with attributes ``role``; edges and
clients carry ``edge``; clients carry ``device`` and ``n_samples``. Links carry
``bandwidth_mbps``, ``latency_s`` and ``burst_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from groupfel.errors import InputError


@dataclass(frozen=True)
class Link:
    bandwidth_mbps: float
    latency_s: float
    # a shaper's token bucket (tc's burst): the first this many bytes of a transfer leave at once,
    # the bucket being full when the link has idled (0: an ideal link of the bandwidth)
    burst_bytes: float = 0.0

    def transfer_time(self, n_bytes: float) -> float:
        """Seconds to move ``n_bytes`` over the link: latency + (size - burst) / bandwidth."""
        return self.latency_s + 8.0 * max(n_bytes - self.burst_bytes, 0.0) / (self.bandwidth_mbps * 1e6)


@dataclass
class Topology:
    graph: nx.Graph
    client_edge: np.ndarray          # edge index of each client
    client_device: list[str]         # device type of each client
    client_samples: list[np.ndarray]  # training-set indices held by each client
    label_counts: np.ndarray         # clients × labels (Sec. 4.2's L)

    @property
    def n_clients(self) -> int:
        return len(self.client_edge)

    @property
    def n_edges(self) -> int:
        return int(self.client_edge.max()) + 1 if self.n_clients else 0

    @property
    def n_samples(self) -> np.ndarray:
        return self.label_counts.sum(axis=1)

    def clients_of(self, edge: int) -> np.ndarray:
        return np.flatnonzero(self.client_edge == edge)

    def client_link(self, client: int) -> Link:
        d = self.graph.edges[f"client:{client}", f"edge:{int(self.client_edge[client])}"]
        return Link(d["bandwidth_mbps"], d["latency_s"], d.get("burst_bytes", 0.0))

    def edge_link(self, edge: int) -> Link:
        d = self.graph.edges[f"edge:{edge}", "cloud"]
        return Link(d["bandwidth_mbps"], d["latency_s"], d.get("burst_bytes", 0.0))


def assign_devices(n_clients: int, mix: dict[str, float], rng: np.random.Generator) -> list[str]:
    """Device types in the given proportions (largest remainder), shuffled."""
    names = sorted(mix)
    share = np.array([mix[n] for n in names], dtype=float)
    if not names or np.any(share < 0) or share.sum() <= 0:
        raise InputError("topology.devices: give at least one device type with a positive share, "
                         "e.g. {\"raspberry-pi-4\" = 1.0}")
    exact = share / share.sum() * n_clients
    counts = np.floor(exact).astype(int)
    counts[np.argsort(-(exact - counts), kind="stable")[: n_clients - counts.sum()]] += 1
    devices = np.repeat(np.array(names, dtype=object), counts)
    return [str(d) for d in rng.permutation(devices)]


def build_topology(clients_per_edge: list[int], devices: list[str], client_samples: list[np.ndarray],
                   label_counts: np.ndarray, client_link: Link, edge_link: Link) -> Topology:
    """Assemble the graph: clients are numbered edge by edge."""
    g = nx.Graph()
    g.add_node("cloud", role="cloud")
    client_edge = np.repeat(np.arange(len(clients_per_edge)), clients_per_edge)
    for j in range(len(clients_per_edge)):
        g.add_node(f"edge:{j}", role="edge", edge=j)
        g.add_edge(f"edge:{j}", "cloud", bandwidth_mbps=edge_link.bandwidth_mbps, latency_s=edge_link.latency_s,
                   **_bucket(edge_link))
    for i, j in enumerate(client_edge):
        g.add_node(f"client:{i}", role="client", edge=int(j), device=devices[i],
                   n_samples=int(label_counts[i].sum()))
        g.add_edge(f"client:{i}", f"edge:{j}", bandwidth_mbps=client_link.bandwidth_mbps,
                   latency_s=client_link.latency_s, **_bucket(client_link))
    return Topology(g, client_edge, devices, client_samples, label_counts)


def _bucket(link: Link) -> dict:
    """A link's token bucket as an edge attribute, where it has one."""
    return {"burst_bytes": link.burst_bytes} if link.burst_bytes else {}
