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
   (the edge's uplink, shared likewise); a member offline before its work or its upload ends
   drops out then (its flow leaves the link), as FedScale drops a client not online at the end
   of its compute and communication;
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from groupfel.cost_models import TRAINING
from groupfel.errors import InputError

from ..federation import Federation, Group, RoundContext, airtime, draw_faults
from ..ledger import CostLedger
from .edge import EdgeNetwork
from .links import SharedLink
from .payload import client_bytes

TRACE_COLUMNS = ["kind", "round", "edge", "group", "group_round", "client", "bytes", "queued", "start", "end"]
OFFLINE = "offline"


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
        battery = ledger.battery if ledger is not None else None
        events = {"battery_events": [{"time_s": a, "client": c, "event": e} for a, c, e in battery["events"]]} \
            if battery is not None else {}
        return {"network": {**self.net.manifest(), "bytes_total": totals, "offline": offline, "rounds": self.stats,
                            **events}}

    def write_outputs(self, arm_dir) -> None:
        """network.parquet: every transfer and core hold (the timeline's), this session's added to
        what an earlier session of the arm wrote."""
        import pandas as pd

        from ..io import atomic_write

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
                out[c] = avail.seconds_between(c, start, end)
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
        charging = net.battery is not None
        if not alive and not charging:
            return (f"batteries: every client's battery (train.client_energy_budget = {net.battery_j:g} J) is empty "
                    f"at {now:g} s simulated")
        times = [net.availability.next_online(c, now) for c in alive] if net.availability is not None else []
        if charging:        # an empty battery's client is back once charged (and online)
            for c in (int(c) for c in clients if self._flat(int(c))):
                back = net.battery.back_at(self.ctx.ledger.battery, c, now)
                if back is not None and net.availability is not None:
                    back = net.availability.next_online(c, back)
                times.append(back)
        times = [x for x in times if x is not None]
        if not times and not alive:
            return (f"batteries: every client's battery (train.client_energy_budget = {net.battery_j:g} J) is empty "
                    f"at {now:g} s simulated and none charges again (train.client_charge_w)")
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
            return plan[1].ctx.ledger.energy_total + plan[1].fleet_idle_joules(plan[0][0])
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
            # left while uploading: its group operations were done, and are charged
            sent_work = dict(zip(g.clients[~off].tolist(), [p.value[3] for p in members]))
            unfinished = left & ~np.array([sent_work.get(int(c), False) for c in g.clients], dtype=bool)
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
                if ctx.ledger.charges_site("edge"):     # the edge server's busy states, as they ran
                    self._site_busy[j] = self._site_busy.get(j, 0.0) + hold
                    for state, sec in net.server_parts(n_alive, int((lost | left).sum())).items():
                        if sec > 0:
                            ctx.ledger.charge_site(round=t, site="edge", edge=j, state=state, seconds=sec,
                                                   x=n_alive + int((lost | left).sum()), at=got)
                e.waits.append((gid, k, queued, got, env.now))
                self.trace.append({"kind": "core", "round": t + 1, "edge": j, "group": gid, "group_round": k,
                                   "client": -1, "bytes": 0, "queued": queued, "start": got, "end": env.now})
            for ci, comp in enumerate(charges):
                amounts = charges[comp] if comp == TRAINING or not unfinished.any() else np.where(unfinished, 0.0, charges[comp])
                ctx.ledger.charge(round=t, edge=j, group=gid, group_round=k, clients=g.clients,
                                  devices=devices, component=comp, amounts=amounts,
                                  start=start + spans[:, ci, 0], end=start + spans[:, ci, 1])
            if ctx.ledger.power is not None:
                self.charge_energy((t, j, gid, k), g, devices, list(charges), spans, radio,
                                   net.clients.bandwidth_mbps[g.clients], ~off, ~(lost | left), env.now - start)
        if net.cloud_shared:
            up = ctx.model_bytes * net.vectors
            self._bytes["edge_to_cloud"] += up
            link = ctx.topology.edge_link(j)
            yield env.process(e.cloud.transfer(up, None, link.latency_s, link.burst_bytes))

    def _send(self, link: SharedLink, nbytes: float, bps: float, latency: float, burst: float = 0.0):
        """One client transfer through its edge's side of ``link``: on a dedicated link (size -
        its link's burst) / rate plus latency in one timeout (one event per step where it can),
        else a shared flow."""
        if link.capacity_bps is None:
            yield self.ctx.env.timeout(8.0 * (max(nbytes - burst, 0.0) if burst else nbytes) / bps + latency)
            return
        yield link.send(nbytes, bps, burst)
        if latency:
            yield self.ctx.env.timeout(latency)

    def _send_until(self, link: SharedLink, nbytes: float, bps: float, latency: float, deadline: float,
                    burst: float = 0.0):
        """:meth:`_send` by a client that goes offline at ``deadline``: None where the transfer
        (its latency included) ends by then, else the bits still unsent when it went (the flow
        leaves the shared link then)."""
        env = self.ctx.env
        if link.capacity_bps is None:
            paced = 8.0 * (max(nbytes - burst, 0.0) if burst else nbytes)
            start, end = env.now, paced / bps + latency
            if start + end <= deadline:
                yield env.timeout(end)
                return None
            yield env.timeout(max(deadline - start, 0.0))
            return max(paced - bps * (env.now - start), 0.0)
        done = link.send(nbytes, bps, burst)
        yield done | env.timeout(max(deadline - env.now, 0.0))
        if not done.triggered:
            return link.cancel(done)
        if env.now + latency > deadline:
            yield env.timeout(deadline - env.now)
            return 0.0
        if latency:
            yield env.timeout(latency)
        return None

    def _c_client(self, where, e: _Edge, client, member, charges, slow, dropped, down, up):
        env, cn = self.ctx.env, self.net.clients
        bps, lat = cn.bandwidth_mbps[client] * 1e6, float(cn.latency_s[client])
        t0 = env.now
        self._bytes["edge_to_client"] += down
        yield from self._send(e.down, down, bps, lat, cn.burst(client))
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
        left = cut = gone_at < a      # offline before it finished its work: it drops out then, sending nothing
        if left:
            a = max(gone_at, env.now)
            spans = [(min(x, a - t0), min(y, a - t0)) for x, y in spans]
        if a > env.now:
            yield env.timeout(a - env.now)
        if not (dropped or left):
            a = env.now
            self._bytes["client_to_edge"] += up
            if gone_at == math.inf:
                yield from self._send(e.up, up, bps, lat, cn.burst(client))
                up_air = min(float(airtime(up, cn.bandwidth_mbps[client])), env.now - a)
            else:       # offline before its upload ends: it drops out then (FedScale's check)
                unsent = yield from self._send_until(e.up, up, bps, lat, gone_at, cn.burst(client))
                left = unsent is not None
                up_air = min((8.0 * up - (unsent or 0.0)) / bps, env.now - a)
            self.trace.append(dict(zip(TRACE_COLUMNS, ("upload", *where, client, up, a, a, env.now))))
            up_s = env.now - a
            if left:
                a = env.now
        return spans, ((down_s, down_air), (up_s, up_air)), a if left else None, left and not cut

    def cloud_seconds(self, n_models: int) -> float:
        """The edge profile's aggregation curve at the round's group models (the cloud averages them)."""
        curve = self.net.edge_curves.get("aggregation")
        return max(float(curve(n_models)), 0.0) if curve is not None and n_models else 0.0

    def _flat(self, c: int, now: float | None = None) -> bool:
        """Whether client c's battery (``train.client_energy_budget``) is empty (at ``now``, default
        the clock's time: a battery that charges is brought up to date then)."""
        led, battery = self.ctx.ledger, self.net.battery
        spent = led.client_energy
        if battery is None:
            return self.net.battery_j is not None and c < len(spent) and spent[c] >= self.net.battery_j
        if led.battery is None:
            led.battery = battery.fresh(self.ctx.topology.n_clients)
        return battery.flat(led.battery, c, float(self.ctx.env.now if now is None else now),
                            float(spent[c]) if c < len(spent) else 0.0)
