"""The network room: the edge as a shared place (docs/guide/network.md).

One concern a file: :mod:`.payload` (what a client sends), :mod:`.heterogeneity` (each client's
link, slowdown and CPU quota), :mod:`.availability` (when each client is online), :mod:`.fedscale`
(FedScale's traces), :mod:`.links` (processor-shared links), :mod:`.edge` (a run's network),
:mod:`.federation` (the contended federation's SimPy processes) and :mod:`.whatif` (one edge's
round without training)."""
from .availability import Availability
from .edge import EdgeNetwork, build_network
from .federation import OFFLINE, TRACE_COLUMNS, ContendedFederation
from .heterogeneity import CFS_PERIOD_S, ClientNet, client_net, quota_seconds
from .payload import client_bytes, payload_vectors
from .whatif import edge_makespan

__all__ = ["Availability", "CFS_PERIOD_S", "ClientNet", "ContendedFederation", "EdgeNetwork", "OFFLINE",
           "TRACE_COLUMNS", "build_network", "client_bytes", "client_net", "edge_makespan", "payload_vectors",
           "quota_seconds"]
