"""SimPy processes for the cloud, the edge servers and the clients: one global round of Alg. 1.

Simulated time: a client downloads the group model (client link), trains for E·H_i(n_i),
performs the group operations for Σ O_g(|g|), and uploads (client link); a group round ends when
its slowest member is done; an edge receives x_t from the cloud (edge link), runs its sampled
groups in parallel, and sends their models back (edge link); the cloud waits for its slowest edge.
The processes only model time and charge the ledger; the training itself (torch) runs apart, in
:func:`groupfel.emulator.compute.run_group_rounds`, which draws the same dropouts and seeds.

Faults (``[faults]``): each client, in each group round, may drop out after training (it pays
its training, not the group operations; its update is left out of the group aggregate and the
survivors pay the secure-aggregation dropout recovery) and may straggle (its compute takes a
drawn factor ≥ 1 longer in simulated time; the Eq. 5 charge stays the curve's value, which is
the device's work, not its waiting).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np
import simpy

from groupfel.cost_models import TRAINING, CostModel
from groupfel.topologies import Topology

from .config import FaultsConfig

from .ledger import COLUMNS, DTYPES, CostLedger
from .rng import key, rng as stream


Environment = simpy.Environment   # the simulated clock's type, for callers that do not import simpy


@dataclass(frozen=True)
class Group:
    edge: int
    clients: np.ndarray   # global client ids
    n_samples: np.ndarray  # per member
    cov: float

    @property
    def size(self) -> int:
        return len(self.clients)

    @property
    def total_samples(self) -> int:
        return int(self.n_samples.sum())


_M32 = 0xFFFFFFFF
# numpy's SeedSequence constants (numpy/random/bit_generator.pyx)
_INIT_A, _MULT_A, _INIT_B, _MULT_B, _MIX_L, _MIX_R = 0x43b0d7e5, 0x931e8875, 0x8b51f9dd, 0x58f38ded, 0xca01f9dd, 0x4973f715


def client_seeds(seed: int, t: int, k: int, clients: np.ndarray) -> np.ndarray:
    """Each client's training seed in group round k of round t:
    ``SeedSequence(key(seed, "client-seed", t, k, client)).generate_state(1)[0]``. Per-event seeds make a resumed
    run draw exactly what an uninterrupted one draws.

    The same numbers, computed for all clients at once: with 5 entropy words and SeedSequence's
    pool of 4, the client word is mixed in last, so the pool from (seed, 2, t, k) is shared and
    only the last mixing step and the output hash run per client (the per-client SeedSequence
    object took 30 % of the emulator's share of an MLP round)."""
    clients = np.asarray(clients, dtype=np.int64)
    head = key(seed, "client-seed", t, k)
    if min(head) < 0 or max(head) > _M32 or (len(clients) and (clients.min() < 0 or clients.max() > _M32)):
        return np.array([np.random.SeedSequence((*head, int(c))).generate_state(1)[0] for c in clients],
                        dtype=np.uint32)
    hc = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hc
        value ^= hc
        hc = (hc * _MULT_A) & _M32
        value = (value * hc) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        r = (_MIX_L * x - _MIX_R * y) & _M32
        return r ^ (r >> 16)

    pool = [hashmix(w) for w in head]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    # the client word, into pool[0] only (generate_state(1) reads nothing else), vectorised
    value = clients.astype(np.uint64) ^ np.uint64(hc)
    value = (value * np.uint64((hc * _MULT_A) & _M32)) & np.uint64(_M32)
    value ^= value >> np.uint64(16)
    word = (np.uint64((_MIX_L * pool[0]) & _M32) - np.uint64(_MIX_R) * value) & np.uint64(_M32)
    word ^= word >> np.uint64(16)
    word ^= np.uint64(_INIT_B)                                          # generate_state's hash
    word = (word * np.uint64((_INIT_B * _MULT_B) & _M32)) & np.uint64(_M32)
    word ^= word >> np.uint64(16)
    return word.astype(np.uint32)


def airtime(nbytes, mbps) -> np.ndarray:
    """Seconds a radio at ``mbps`` (its own link rate) is on the air to move ``nbytes``."""
    return 8.0 * np.asarray(nbytes, dtype=float) / (np.asarray(mbps, dtype=float) * 1e6)


def draw_faults(faults: FaultsConfig | None, seed: int, t: int, k: int, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dropped, slowdown) per client of one group round, each from its own (seed, t, k, client)
    stream so a resumed run draws the same faults."""
    n = len(clients)
    if faults is None or (faults.dropout == 0 and faults.straggler is None):   # nothing to draw
        return np.zeros(n, dtype=bool), np.ones(n)
    dropped, slow = np.zeros(n, dtype=bool), np.ones(n)
    st = faults.straggler
    for i, c in enumerate(clients):
        rng = stream(seed, "faults", t, k, int(c))
        dropped[i] = rng.random() < faults.dropout
        if st is not None:
            slow[i] = max(1.0, rng.lognormal(0.0, st.sigma)) if st.distribution == "lognormal" \
                else 1.0 + rng.pareto(st.shape)
    return dropped, slow


@dataclass
class RoundContext:
    """Everything one global round's processes share."""

    env: simpy.Environment
    model_bytes: int          # what a model upload or download moves
    cost: CostModel
    ledger: CostLedger
    topology: Topology
    seed: int
    group_rounds: int
    local_epochs: int
    faults: FaultsConfig | None = None
    training_passes: float = 1.0   # the algorithm's training per group round, in units of E·H_i(n_i)


class Federation:
    """Runs global rounds as SimPy processes over a topology."""

    def __init__(self, ctx: RoundContext):
        self.ctx = ctx
        self._priced: dict[bytes, tuple[list[str], dict[str, np.ndarray]]] = {}
        self._transfer: dict[int, float] = {}     # a model over each client's link, in seconds
        self._cost: dict[bytes, float] = {}       # a group round's nominal Eq. 5 charge, per group
        self._site_busy: dict[int, float] = {}    # this round's seconds each edge's server held a core

    @staticmethod
    def environment(initial_time: float = 0.0) -> simpy.Environment:
        """A simulated clock (callers need not import simpy)."""
        return simpy.Environment(initial_time=initial_time)

    def run_round(self, t: int, sampled: list[tuple[int, Group]]) -> None:
        """Play round t's time and charges to its end on the context's clock."""
        env = self.ctx.env
        start = float(env.now)
        if not self._computed(t, sampled):
            env.run(until=env.process(self.global_round(t, sampled)))
        self.charge_sites(t, start, sampled)

    def charge_sites(self, t: int, start: float, sampled: list[tuple[int, Group]]) -> None:
        """The edge servers' idle over round t's stretch of the clock (less the seconds each held a
        core, charged as they ran) and the cloud's aggregation of the round's group models
        (``cost.edge_power``, ``cost.cloud_power``). Under group-rounds an edge is charged for the
        rounds it serves, under full-fleet every edge for every round, under marginal no idle."""
        led, busy, self._site_busy = self.ctx.ledger, self._site_busy, {}
        if led.charges_site("edge") and led.power.accounting != "marginal":
            span = float(self.ctx.env.now) - start
            edges = range(self.ctx.topology.n_edges) if led.power.accounting == "full-fleet" \
                else sorted({g.edge for _, g in sampled})
            for j in edges:
                led.charge_site(round=t, site="edge", edge=j, state="idle", seconds=max(span - busy.get(j, 0.0), 0.0),
                                at=start)
        seconds = self.cloud_seconds(len(sampled))
        if led.charges_site("cloud") and seconds > 0:
            led.charge_site(round=t, site="cloud", edge=-1, state="aggregation", seconds=seconds, x=len(sampled),
                            at=start)

    def cloud_seconds(self, n_models: int) -> float:
        """Seconds the cloud spends averaging ``n_models`` group models: none here (no edge curves)."""
        return 0.0

    def _computed(self, t: int, sampled: list[tuple[int, Group]]) -> bool:
        """Play round t as :meth:`global_round` would, without its SimPy events, where that gives
        the same clock and ledger; False (nothing done) where it would not.

        The play's only choices are its group rounds' end times and the order it charges them in.
        A group round (one timeout, then its process and condition at the same time) is charged
        when it ends; SimPy processes same-time events in the order they were scheduled, and a
        group round's timeout is scheduled as the previous one's charges are made (or as its
        edge's model arrives, in the play's edge and group order). So a heap of (end, order
        scheduled) gives SimPy's order, ties included, and each group round's clocks are the same
        sums as :meth:`_spans`' (now + delay, step by step), for every group's members at once.
        Left to SimPy: subclasses that play otherwise (shared edges, availability), energy (it
        charges per state), dropouts, other events pending on the clock, and any float rounding
        that makes :meth:`_spans` fall back to one process per member."""
        ctx, env, cls = self.ctx, self.ctx.env, type(self)
        if (cls.global_round is not Federation.global_round or cls._edge is not Federation._edge
                or cls._group is not Federation._group or cls.charges is not Federation.charges
                or cls._spans is not Federation._spans or "_spans" in vars(self)
                or ctx.ledger.power is not None or (ctx.faults is not None and ctx.faults.dropout != 0)
                or not sampled or ctx.group_rounds < 1 or not self._idle(env)):
            return False
        by_edge: dict[int, list[tuple[int, Group]]] = {}
        for gid, g in sampled:
            by_edge.setdefault(g.edge, []).append((gid, g))
        edges = sorted(by_edge.items())
        order = [(j, gid, g) for j, groups in edges for gid, g in groups]   # the play's start order
        priced = [self._price(g) for _, _, g in order]
        comps = list(priced[0][1])
        if any(list(p[1]) != comps for p in priced):
            return False
        G, C, K, now = len(order), len(comps), ctx.group_rounds, env.now
        sizes = np.array([g.size for _, _, g in order])
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        of_member = np.repeat(np.arange(G), sizes)
        transfer = np.concatenate([self._transfers(g) for _, _, g in order])
        amounts = np.stack([np.concatenate([p[1][c] for p in priced]) for c in comps], axis=1)   # member × component
        arrive = {j: now + ctx.topology.edge_link(j).transfer_time(ctx.model_bytes) for j, _ in edges}
        start = np.array([arrive[j] for j, _, _ in order])
        ends = np.empty((K, G))
        times = np.empty((K, len(transfer), C + 1))   # each member's components' start and end times
        steps = np.empty((len(transfer), C + 3))
        steps[:, 1], steps[:, -1] = transfer, transfer                    # edge -> client, client -> edge
        for k in range(K):
            steps[:, 0] = start[of_member]
            if ctx.faults is None:
                steps[:, 2:2 + C] = amounts
            else:   # stragglers only (no dropout): their drawn slowdowns
                slow = np.concatenate([draw_faults(ctx.faults, ctx.seed, t, k, g.clients)[1] for _, _, g in order])
                steps[:, 2:2 + C] = slow[:, None] * amounts
            clock = np.cumsum(steps, axis=1)                               # SimPy's own sums: now + delay
            t0, last = steps[:, 0], clock[:, -1]
            if not (t0 + (last - t0) == last).all():
                return False
            ends[k] = np.maximum.reduceat(last, offsets)
            if not (ends[k] > start).all():
                return False      # a group round taking no time could order itself among the others differently
            times[k] = t0[:, None] + (clock[:, 1:-1] - t0[:, None])       # start + each span, as _group charges it
            start = ends[k]
        # the round's end: each edge waits for its slowest group, sends their models back; the cloud its slowest edge
        edge_of = np.array([j for j, _, _ in order])
        end = max(float(ends[-1][edge_of == j].max()) + ctx.topology.edge_link(j).transfer_time(ctx.model_bytes * len(groups))
                  for j, groups in edges)
        if now + (end - now) != end:
            return False
        # SimPy's order of the group rounds' charges: (time, order scheduled); edges' arrivals first
        seq = itertools.count()
        heap = [(arrive[j], next(seq), -1 - j, 0) for j, _ in edges]
        first = {j: [i for i in range(G) if edge_of[i] == j] for j, _ in edges}
        done: list[tuple[int, int]] = []
        while heap:
            _, _, i, k = heapq.heappop(heap)
            if i < 0:
                for i2 in first[-1 - i]:
                    heapq.heappush(heap, (ends[0, i2], next(seq), i2, 0))
                continue
            done.append((i, k))
            if k + 1 < K:
                heapq.heappush(heap, (ends[k + 1, i], next(seq), i, k + 1))
        ev_i, ev_k = np.array(done).T
        block_i, block_k, block_c = np.repeat(ev_i, C), np.repeat(ev_k, C), np.tile(np.arange(C), len(done))
        counts = sizes[block_i]
        m = np.repeat(offsets[block_i] - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
        kk, cc = np.repeat(block_k, counts), np.repeat(block_c, counts)
        clients = np.concatenate([g.clients for _, _, g in order]).astype(DTYPES["client"])
        devices = np.array([d for p in priced for d in p[0]], dtype=object)
        gids = np.array([gid for _, gid, _ in order])
        columns = {"round": np.full(len(m), t, dtype=DTYPES["round"]),
                   "edge": np.repeat(edge_of[block_i], counts).astype(DTYPES["edge"]),
                   "group": np.repeat(gids[block_i], counts).astype(DTYPES["group"]),
                   "group_round": kk.astype(DTYPES["group_round"]), "client": clients[m], "device": devices[m],
                   "component": np.array(comps, dtype=object)[cc], "amount": amounts[m, cc],
                   "start": times[kk, m, cc], "end": times[kk, m, cc + 1]}
        sums = [[float(p[1][c].sum()) for c in comps] for p in priced]    # each charge's total, as charge() sums it
        ctx.ledger.charge_rows({c: columns[c] for c in COLUMNS},
                               [(comps[c], sums[i][c]) for i, c in zip(block_i.tolist(), block_c.tolist())])
        env.run(until=end)
        return True

    def global_round(self, t: int, sampled: list[tuple[int, Group]]):
        """The cloud's process for round t: its time and charges (the models are computed apart)."""
        env = self.ctx.env
        by_edge: dict[int, list[tuple[int, Group]]] = {}
        for gid, g in sampled:
            by_edge.setdefault(g.edge, []).append((gid, g))
        yield env.all_of([env.process(self._edge(t, j, groups)) for j, groups in sorted(by_edge.items())])

    def _edge(self, t, j, groups):
        env, link = self.ctx.env, self.ctx.topology.edge_link(j)
        nbytes = self.ctx.model_bytes
        yield env.timeout(link.transfer_time(nbytes))                    # cloud -> edge: x_t
        yield env.all_of([env.process(self._group(t, j, gid, g)) for gid, g in groups])
        yield env.timeout(link.transfer_time(nbytes * len(groups)))     # edge -> cloud: x^g

    def _group(self, t, j, gid, g: Group):
        """K group rounds (Alg. 1, Lines 8-14) for one sampled group."""
        ctx, env = self.ctx, self.ctx.env
        devices = self._price(g)[0]
        transfer = self._transfers(g)
        for k in range(ctx.group_rounds):
            charges, dropped, slow = self.charges(t, k, g)
            start = env.now
            spans, end = self._spans(start, transfer, charges, slow, dropped)
            if end is None:   # float rounding: each member on its own clock, step by step
                members = [env.process(self._client(int(c), i, charges, slow[i], bool(dropped[i])))
                           for i, c in enumerate(g.clients)]
            else:             # the members' processes as one, ending with the slowest (see _spans)
                members = [env.process(self._members(end - start))]
            yield env.all_of(members)                                    # wait for the slowest member
            if end is None:
                spans = np.array([p.value for p in members])             # (member, component, [start,end])
            for ci, comp in enumerate(charges):
                ctx.ledger.charge(round=t, edge=j, group=gid, group_round=k, clients=g.clients,
                                  devices=devices, component=comp, amounts=charges[comp],
                                  start=start + spans[:, ci, 0], end=start + spans[:, ci, 1])
            if ctx.ledger.power is not None:
                rate = np.array([ctx.topology.client_link(int(c)).bandwidth_mbps for c in g.clients])
                sent = np.stack([transfer, np.where(dropped, 0.0, transfer)], axis=1)
                air = np.minimum(airtime(ctx.model_bytes, rate)[:, None], sent) * (sent > 0)
                self.charge_energy((t, j, gid, k), g, devices, list(charges), spans, np.stack([sent, air], axis=2),
                                   rate, np.ones(g.size, bool), ~dropped, env.now - start)

    def _transfers(self, g: Group) -> np.ndarray:
        """Seconds of a model over each member's link."""
        for c in g.clients.tolist():
            if c not in self._transfer:
                self._transfer[c] = self.ctx.topology.client_link(c).transfer_time(self.ctx.model_bytes)
        return np.array([self._transfer[c] for c in g.clients.tolist()])

    @staticmethod
    def _idle(env: simpy.Environment) -> bool:
        """Whether nothing is pending on the clock but what a finished ``env.run(until=...)``
        leaves: its stop event, requeued now with no callbacks (processing it does nothing)."""
        return all(when == env.now and event.callbacks == [] for when, _, _, event in env._queue)

    def _spans(self, t0: float, transfer: np.ndarray, charges: dict[str, np.ndarray], slow: np.ndarray,
               dropped: np.ndarray) -> tuple[np.ndarray, float | None]:
        """Every member's (start, end) offset of each component in a group round starting at
        ``t0`` (:meth:`_client`'s steps, all members at once: the same sums in the same order), and
        the group round's end, the slowest member's: None where float rounding would land a
        member's single timeout off its step-by-step clock (then :meth:`_client` plays each).

        One process with one timeout stands for the members' processes: it is started where they
        were and ends its round through as many same-time events (timeout, process, condition),
        so simultaneous events of other groups keep their order (and the ledger its rows)."""
        n = len(transfer)
        steps = np.empty((n, len(charges) + 3))
        steps[:, 0], steps[:, 1] = t0, transfer                          # edge -> client
        for c, (comp, amounts) in enumerate(charges.items()):            # E·H_i(n_i), each O_g, recovery
            steps[:, 2 + c] = np.where(dropped & (comp != TRAINING), 0.0, slow * amounts)
        steps[:, -1] = np.where(dropped, 0.0, transfer)                  # client -> edge (a dropped one: none)
        clock = np.cumsum(steps, axis=1)                                 # SimPy's own sums: now + delay
        # (member, component, [start, end]): consecutive offsets, as a view
        spans = np.lib.stride_tricks.sliding_window_view(clock[:, 1:-1] - t0, 2, axis=1)
        ends = clock[:, -1]
        if not (t0 + (ends - t0) == ends).all():
            return spans, None
        return spans, float(ends.max())

    def _members(self, duration: float):
        yield self.ctx.env.timeout(duration)

    def charge_energy(self, where: tuple, g: Group, devices: list[str], components: list[str], spans: np.ndarray,
                      radio: np.ndarray, rate: np.ndarray, present: np.ndarray, completed: np.ndarray,
                      duration: float) -> None:
        """Energy of one group round, per member and state: power × the seconds the SimPy play
        spent in it (``spans``: each component's (start, end); ``radio[:, d]``: (seconds, airtime)
        of the download (d = 0) and upload (d = 1); ``rate``: each member's link Mbit/s). The radio
        receives or transmits for its airtime and listens for the rest of the transfer (its share
        of a shared medium, the latency). A member that completed the group round was idle while
        online for the rest of its ``duration``; an absent one is charged nothing."""
        t, j, gid, k = where
        led = self.ctx.ledger
        comp = spans[:, :, 1] - spans[:, :, 0]
        ti = components.index(TRAINING)
        seconds = {"receive": radio[:, 0, 1], "training": comp[:, ti],
                   "group_operation": comp.sum(axis=1) - comp[:, ti], "transmit": radio[:, 1, 1],
                   "listen": np.maximum(radio[:, :, 0] - radio[:, :, 1], 0.0).sum(axis=1)}
        busy = sum(seconds.values())
        seconds["idle"] = np.where(completed, np.maximum(duration - busy, 0.0), 0.0)
        x = {"training": g.n_samples, "group_operation": np.full(g.size, g.size), "transmit": rate, "receive": rate}
        clients, devs = g.clients[present], [d for d, p in zip(devices, present) if p]
        at = float(self.ctx.env.now) - duration        # the group round's start: its carbon intensity
        for state, sec in seconds.items():
            led.charge_energy(round=t, edge=j, group=gid, group_round=k, clients=clients, devices=devs, state=state,
                              seconds=sec[present], x=np.asarray(x[state])[present] if state in x else None, at=at)

    def charges(self, t: int, k: int, g: Group) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Group round k of round t: each member's Eq. 5 charge per component, who drops, and
        each member's straggler slowdown. Deterministic, so the cloud can price a round first."""
        ctx = self.ctx
        devices, nominal = self._price(g)
        dropped, slow = draw_faults(ctx.faults, ctx.seed, t, k, g.clients)
        if not dropped.any():
            return dict(nominal), dropped, slow
        alive = ~dropped
        # a dropped client trained, then left before the group operations (Eq. 5 charges what it
        # spent); survivors pay the secure-aggregation recovery for it
        charges = {c: np.where(alive, v, 0.0) if c != TRAINING else v for c, v in nominal.items()}
        if alive.any():
            charges.update({c: np.where(alive, v, 0.0) for c, v in
                            ctx.cost.recovery(devices, g.size, int(dropped.sum())).items()})
        return charges, dropped, slow

    def _price(self, g: Group) -> tuple[list[str], dict[str, np.ndarray]]:
        """A group's members' devices and nominal Eq. 5 charges per group round (no faults),
        priced once per group: groups persist across rounds, and pricing every group round
        was a third of the emulator's time in an MLP round."""
        key = g.clients.tobytes() + g.n_samples.tobytes()
        if key not in self._priced:
            devices = [self.ctx.topology.client_device[c] for c in g.clients]
            nominal = self.ctx.cost.group_round(devices, g.n_samples, self.ctx.local_epochs)
            if self.ctx.training_passes != 1.0:
                nominal[TRAINING] = nominal[TRAINING] * self.ctx.training_passes
            for v in nominal.values():
                v.flags.writeable = False     # shared by every group round's charges
            self._priced[key] = devices, nominal
        return self._priced[key]

    def offline(self, t: int, sampled: list[tuple[int, Group]]) -> frozenset[tuple[int, int]]:
        """(group round, client) pairs of round t whose client is offline: none here (see
        :class:`groupfel.emulator.network.ContendedFederation`)."""
        return frozenset()

    def absent(self, t: int) -> set[int]:
        """The sampled clients of round t offline at its start (none here)."""
        return set()

    def online_seconds(self, start: float, end: float) -> np.ndarray:
        """Each client's seconds online in [start, end): all of them here."""
        return np.full(self.ctx.topology.n_clients, max(end - start, 0.0))

    def charge_fleet_idle(self, t: int, start: float, charged: np.ndarray) -> None:
        """The full-fleet accounting (``cost.energy_accounting``): every client online in round t's
        stretch of the clock [``start``, now) and not accounted for in it (its seconds ``charged``
        before the stretch) was idle for the rest: charged idle power (group −1)."""
        led, topo = self.ctx.ledger, self.ctx.topology
        n = topo.n_clients
        rest = self.online_seconds(start, float(self.ctx.env.now)) - (led.seconds_of(n) - charged)
        for j in range(topo.n_edges):
            members = topo.clients_of(j)
            members = members[rest[members] > 0]
            if len(members):
                led.charge_energy(round=t, edge=j, group=-1, group_round=-1, clients=members,
                                  devices=[topo.client_device[c] for c in members], state="idle",
                                  seconds=rest[members], at=start)

    def online_now(self) -> np.ndarray | None:
        """Which clients are online at the clock's time: None, everyone (see
        :class:`groupfel.emulator.network.ContendedFederation`)."""
        return None

    def await_online(self, clients: np.ndarray | None = None) -> str | None:
        """Wait until someone is online, or say why nobody will be: everyone always is here."""
        return None

    def manifest(self, ledger: CostLedger | None = None) -> dict:
        """The federation's own manifest entries (none here)."""
        return {}

    def write_outputs(self, arm_dir) -> None:
        """Files besides the ledger (none here)."""

    def scratch(self) -> "Federation":
        """A copy on a scratch clock and ledger at this one's time (a dry play of a round)."""
        ctx = self.ctx
        dry = Federation(RoundContext(Federation.environment(ctx.env.now), ctx.model_bytes, ctx.cost,
                                      ctx.ledger.scratch(), ctx.topology, ctx.seed, ctx.group_rounds,
                                      ctx.local_epochs, ctx.faults, ctx.training_passes))
        dry._priced, dry._transfer = self._priced, self._transfer
        return dry

    def round_energy(self, t: int, groups: list[Group]) -> float:
        """The joules round t will charge: its play on a scratch clock (energy needs the times),
        with the fleet's idle in it under the full-fleet accounting."""
        dry, start = self.scratch(), float(self.ctx.env.now)
        dry.run_round(t, list(enumerate(groups)))
        return dry.ctx.ledger.energy_total + dry.fleet_idle_joules(start)

    def fleet_idle_joules(self, start: float) -> float:
        """What :meth:`charge_fleet_idle` will charge for [``start``, now) after a dry play on a
        scratch ledger (whose seconds are the play's alone); 0 outside the full-fleet accounting."""
        led, topo = self.ctx.ledger, self.ctx.topology
        if led.power is None or led.power.accounting != "full-fleet":
            return 0.0
        n = topo.n_clients
        rest = self.online_seconds(start, float(self.ctx.env.now)) - led.seconds_of(n)
        idle = np.flatnonzero(rest > 0)
        return float(led.power.joules([topo.client_device[c] for c in idle], "idle", rest[idle]).sum())

    def round_cost(self, t: int, groups: list[Group]) -> float:
        """What round t will charge to the ledger (Eq. 5 plus any dropout recovery)."""
        ctx = self.ctx
        if type(self).charges is Federation.charges and (ctx.faults is None or ctx.faults.dropout == 0):
            # no member drops: every group round charges its group's nominal prices (the same sum)
            per_group = [self._nominal_cost(g) for g in groups]
            return float(sum(c for c in per_group for _ in range(ctx.group_rounds)))
        return float(sum(sum(v.sum() for v in self.charges(t, k, g)[0].values())
                         for g in groups for k in range(ctx.group_rounds)))

    def _nominal_cost(self, g: Group) -> float:
        key = g.clients.tobytes() + g.n_samples.tobytes()
        if key not in self._cost:
            self._cost[key] = sum(v.sum() for v in self._price(g)[1].values())
        return self._cost[key]

    def _client(self, client: int, member: int, charges: dict[str, np.ndarray], slow: float = 1.0,
                dropped: bool = False):
        """One client's group round; returns each component's (start, end) offset in the round.
        A dropped client stops after training: its later components are empty spans."""
        env = self.ctx.env
        transfer = self._transfer.get(client)
        if transfer is None:
            transfer = self._transfer[client] = self.ctx.topology.client_link(client).transfer_time(self.ctx.model_bytes)
        steps = [transfer]                                               # edge -> client
        for comp, amounts in charges.items():                            # E·H_i(n_i), each O_g, recovery
            steps.append(0.0 if dropped and comp != TRAINING else slow * float(amounts[member]))
        if not dropped:
            steps.append(transfer)                                       # client -> edge
        t0 = env.now
        clock = list(itertools.accumulate(steps, initial=t0))            # SimPy's own sums: now + delay
        spans = [(clock[1 + c] - t0, clock[2 + c] - t0) for c in range(len(charges))]
        # the steps run back to back, so one timeout spans them (a timeout per step was half of
        # SimPy's time), unless float rounding would land it off the step-by-step clock
        if t0 + (clock[-1] - t0) == clock[-1]:
            yield env.timeout(clock[-1] - t0)
        else:
            for d in steps:
                yield env.timeout(d)
        return spans
