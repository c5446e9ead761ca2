"""The `[topology]` section: edges, clients, links, per-client heterogeneity, availability and
arrivals."""
from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from .base import _Strict, path_of
from .limits import MAX_CLIENTS, Count, Latency, Mbps, RefMs, Rounds, Seconds, Sigma, Weight


class LinkConfig(_Strict):
    bandwidth_mbps: Mbps = Field(description="Link bandwidth in Mbit/s.")
    latency_s: Latency = Field(description="One-way latency in seconds.")
    burst_bytes: float = Field(0.0, ge=0.0, le=1e12, description="A shaper's token bucket on the link (tc's "
                               "burst, a cable or cellular link's boost): the first this many bytes of each "
                               "transfer leave at once, the rest at bandwidth_mbps; the bucket is full when the "
                               "link has idled. 0: an ideal link of the bandwidth.")


class EdgeLinkConfig(LinkConfig):
    shared: bool = Field(False, description="true: each sampled group's model goes up to the cloud as soon as "
                         "the group is done, and the edge's concurrent uploads share this link's bandwidth "
                         "(processor sharing); false: one transfer of all the edge's group models after its "
                         "last group (as before).")


class HeterogeneityConfig(_Strict):
    """Per-client links and compute slowdowns: read from a CSV or drawn around the defaults."""

    file: path_of("CSV file") | None = Field(None, description="A CSV with columns client, bandwidth_mbps, latency_s and "
                             "optionally slowdown; one row for every client (ids 0..N-1).")
    fedscale_file: path_of("trace file") | None = Field(None, description="A FedScale device-capacity trace (its "
                                      "client_device_capacity pickle, or the same as .json or .csv): each "
                                      "client takes one entry (see fedscale_pairing); "
                                      "bandwidth = communication × 1024 bit/s, slowdown = computation / "
                                      "reference_ms_per_sample; latency stays client_link.latency_s.")
    fedscale_pairing: Literal["sorted", "fedscale"] = Field(
        "sorted", description="With fedscale_file: which entry each client takes. sorted: client c the (c mod "
        "M)-th id in sorted order; fedscale: as FedScale's aggregator, client c the entry whose key is (c + 1) "
        "mod M (its clients count from 1), or FedScale's default (1.0 ms per sample, 1.0 kbit/s) where no entry "
        "has that key.")
    reference_ms_per_sample: RefMs | None = Field(None, description="With fedscale_file: the trace's "
                                                  "computation (ms per sample) of a client as fast as its device "
                                                  "profile (slowdown 1); unset: the median over the whole trace.")
    bandwidth_sigma: Sigma = Field(0.0, description="Without file: each client's "
                                   "bandwidth is client_link.bandwidth_mbps × exp(N(0, σ²)) (lognormal, median "
                                   "the default).")
    latency_sigma: Sigma = Field(0.0, description="Without file: each client's "
                                 "latency is client_link.latency_s × exp(N(0, σ²)).")
    slowdown_sigma: Sigma = Field(0.0, description="Each client's slowdown factor "
                                  "exp(N(0, σ²)) (without file, or a file without a slowdown column): its device "
                                  "curves times the factor (2: twice as slow), in its Eq. 5 charges and in "
                                  "simulated time.")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "speed_sigma" in data:
            raise ValueError("speed_sigma is now slowdown_sigma (a factor: 2 is twice as slow); rename the key")
        return data

    @model_validator(mode="after")
    def _file_or_sigmas(self):
        given = [k for k in ("bandwidth_sigma", "latency_sigma") if getattr(self, k)]
        if self.file is not None and given:
            raise ValueError(f"{given[0]}: the file gives every client's link, so {given[0]} would be ignored; "
                             f"remove {given[0]} or the file")
        if self.file is not None and self.fedscale_file is not None:
            raise ValueError("fedscale_file: give file (groupfel's CSV) or fedscale_file (a FedScale trace), not both")
        traced = [k for k in ("bandwidth_sigma", "slowdown_sigma") if getattr(self, k)]
        if self.fedscale_file is not None and traced:
            raise ValueError(f"{traced[0]}: fedscale_file gives every client's bandwidth and slowdown, so "
                             f"{traced[0]} would be ignored; remove {traced[0]} or fedscale_file")
        if self.reference_ms_per_sample is not None and self.fedscale_file is None:
            raise ValueError("reference_ms_per_sample: only used with fedscale_file; remove it or give fedscale_file")
        return self


class AvailabilityConfig(_Strict):
    """When each client is online, in simulated seconds: a CSV of intervals or an on/off process."""

    file: path_of("CSV file") | None = Field(None, description="A CSV with columns client, start_s, end_s: the intervals each "
                             "client is online; every client needs at least one row.")
    fedscale_file: path_of("trace file") | None = Field(None, description="A FedScale behaviour trace (its client_behave_trace "
                                      "pickle, or the same as .json or .csv): each client takes one id (see "
                                      "fedscale_pairing) and is online within [active[i], inactive[i]) seconds, "
                                      "repeating every finish_time seconds.")
    fedscale_pairing: Literal["fedscale", "sorted"] = Field(
        "fedscale", description="With fedscale_file: which id each client takes. fedscale: as FedScale's client "
        "manager, client c the ((c + 1) mod M)-th id in the file's order (its clients count from 1); sorted: "
        "the (c mod M)-th id in sorted order.")
    mean_on_s: Seconds | None = Field(None, description="Without file: online periods last Exp(mean_on_s).")
    mean_off_s: Seconds | None = Field(None, description="Without file: offline periods last Exp(mean_off_s).")

    @model_validator(mode="after")
    def _one(self):
        process = self.mean_on_s is not None or self.mean_off_s is not None
        if (self.file is not None) + (self.fedscale_file is not None) + process != 1:
            raise ValueError("give file, fedscale_file, or both mean_on_s and mean_off_s (one of them)")
        if process and (self.mean_on_s is None or self.mean_off_s is None):
            raise ValueError("give file, fedscale_file, or both mean_on_s and mean_off_s (one of them)")
        return self


class ArrivalsConfig(_Strict):
    """Clients that join a run after it started (HCCT Sec. 7.3, Fig. 3): clients 0..initial−1
    train from round 0; the others join in index order, ``per_arrival`` at rounds ``every``,
    2·``every``, ... (a newcomer starts from the initial model). Per-group mode, with a grouping
    that places clients every round."""

    initial: Count = Field(description="Clients present at round 0 (the first ones by index).")
    every: Rounds = Field(10, description="Rounds between arrivals.")
    per_arrival: int = Field(1, ge=0, le=MAX_CLIENTS, description="Clients that join at each arrival (HCCT: N_new).")


class TopologyConfig(_Strict):
    edges: Count = Field(3, description="Number of edge servers.")
    clients_per_edge: Count | list[Count] = Field(100, description="Clients on each edge, or a list with one "
                                              "count per edge.")
    devices: dict[str, Weight] = Field(default_factory=lambda: {"raspberry-pi-4": 1.0},
                                      description="Device name → share of the clients (normalised, with a "
                                      "warning, if the shares do not sum to 1). Each device needs a profile "
                                      "`<device>/<cost.task>`.")
    client_link: LinkConfig = Field(LinkConfig(bandwidth_mbps=20.0, latency_s=0.02),
                                    description="The link between a client and its edge.")
    edge_link: EdgeLinkConfig = Field(EdgeLinkConfig(bandwidth_mbps=1000.0, latency_s=0.01),
                                      description="The link between an edge and the cloud.")
    edge_access_mbps: Mbps | None = Field(None, description="Each edge's access capacity in Mbit/s, "
                                              "shared by its clients' concurrent transfers in each direction "
                                              "(processor sharing; each client's own link still caps it); "
                                              "unset: every client has a dedicated link.")
    edge_cores: int | None = Field(None, ge=1, le=10**6, strict=True, description="Cores of each edge server: group "
                                   "aggregations queue for them; unset: unlimited.")
    edge_profile: str | None = Field(None, description="The edge server's profile `<device>/<task>`: its "
                                     "group_overhead curves aggregation, secagg-server and secagg-server-recovery "
                                     "(seconds per group vs group size) time each group aggregation; unset: "
                                     "aggregation takes no time.")
    heterogeneity: HeterogeneityConfig | None = Field(None, description="Per-client bandwidth, latency and "
                                                      "compute speed; unset: every client alike.")
    availability: AvailabilityConfig | None = Field(None, description="When clients are online; unset: "
                                                    "always.")
    arrivals: ArrivalsConfig | None = Field(None, description="Clients joining mid-run (HCCT Fig. 3); "
                                            "unset: every client from round 0.")

    @model_validator(mode="after")
    def _sizes(self):
        # compared before anything is built from them (the list of edge sizes included)
        per_edge = self.clients_per_edge if isinstance(self.clients_per_edge, int) else max(self.clients_per_edge)
        total = self.edges * per_edge if isinstance(self.clients_per_edge, int) else sum(self.clients_per_edge)
        if total > MAX_CLIENTS:
            raise ValueError(f"{self.edges:,} edges x {per_edge:,} clients = {total:,} clients is more than "
                             f"{MAX_CLIENTS:,}, beyond the samples of any dataset (every client holds "
                             f"data.min_samples of them); lower edges or clients_per_edge")
        sizes = self.sizes
        if len(sizes) != self.edges:
            raise ValueError(f"clients_per_edge lists {len(sizes)} edges but edges = {self.edges}")
        if min(sizes) < 1:
            raise ValueError("clients_per_edge must be >= 1 for every edge")
        return self

    @property
    def contended(self) -> bool:
        """Whether any of the shared-edge keys is set (else time runs as dedicated links)."""
        return (self.edge_access_mbps is not None or self.edge_cores is not None or self.edge_link.shared
                or self.edge_profile is not None or self.heterogeneity is not None or self.availability is not None)

    @property
    def sizes(self) -> list[int]:
        c = self.clients_per_edge
        return [c] * self.edges if isinstance(c, int) else list(c)


def arrival_rounds(arrivals: ArrivalsConfig | None, n_clients: int) -> np.ndarray:
    """The round each client joins (HCCT Sec. 7.3, Fig. 3): 0 for the first ``initial``, then
    ``per_arrival`` clients at each multiple of ``every``, in index order."""
    out = np.zeros(n_clients, dtype=np.int64)
    if arrivals is not None and n_clients > arrivals.initial:
        later = np.arange(n_clients - arrivals.initial)
        out[arrivals.initial:] = arrivals.every * (1 + later // max(arrivals.per_arrival, 1))
    return out
