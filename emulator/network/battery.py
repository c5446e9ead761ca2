"""Client batteries (``train.client_energy_budget``): drained by the joules a client spends and,
with ``train.client_charge_w``, charged while it is plugged in; an empty one takes its client
offline until it is charged again.

Without a charging power a battery only drains: a client whose spent joules reach its capacity is
offline for good (the simple case). With one, each battery has a level, updated at every check (a
group round's start, a round's start, a wait for someone online): the charging power × the
seconds it charged since the last check (always, the intervals of ``train.client_charging_file``,
or topology.availability's online intervals as FedScale reads a trace), less the joules it spent,
at most its capacity. A client found at or below 0 J is empty from that check on; it is back once
its level reaches ``train.client_resume_share`` of its capacity (at the time the charge gets
there). The levels live in the ledger (:attr:`~groupfel.emulator.ledger.CostLedger.battery`), so a
checkpoint keeps them and a dry play of a round works on a copy."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .availability import Availability


@dataclass(frozen=True)
class Battery:
    capacity_j: float
    charge_w: float | None = None                # None: drain only
    charging: Availability | None = None         # when it charges; None: always (plugged in)
    resume_share: float = 1.0

    @property
    def charges(self) -> bool:
        return self.charge_w is not None

    def fresh(self, n: int) -> dict:
        """Every battery full at time 0 (the ledger's ``battery``)."""
        return {"level": np.full(n, float(self.capacity_j)), "flat": np.zeros(n, bool), "last_t": np.zeros(n),
                "last_spent": np.zeros(n), "events": []}

    def charging_seconds(self, c: int, start: float, end: float) -> float:
        if end <= start:
            return 0.0
        return end - start if self.charging is None else self.charging.seconds_between(c, start, end)

    def charged_by(self, c: int, start: float, joules: float) -> float | None:
        """When, charging from ``start``, client c has taken in ``joules`` (None: never)."""
        if joules <= 0:
            return start
        need = joules / self.charge_w
        if self.charging is None:
            return start + need
        x = start
        for _ in range(100_000):       # interval by interval
            if not self.charging.online(c, x):
                nxt = self.charging.next_online(c, x)
                if nxt is None:
                    return None
                x = nxt
            until = self.charging.online_until(c, x)
            if until - x >= need:
                return x + need
            if until == math.inf:
                return x + need
            need -= until - x
            x = until
        return None

    def flat(self, state: dict, c: int, now: float, spent: float) -> bool:
        """Whether client c's battery is empty at ``now`` (its spent joules ``spent``), after
        bringing its level up to date."""
        if not self.charges:
            return spent >= self.capacity_j
        level, flat = state["level"], state["flat"]
        cap, last = self.capacity_j, float(state["last_t"][c])
        used = spent - float(state["last_spent"][c])
        if flat[c]:
            back = self.charged_by(c, last, self.resume_share * cap - (level[c] - used))
            level[c] = min(cap, level[c] - used + self.charge_w * self.charging_seconds(c, last, now))
            if back is not None and back <= now:
                flat[c] = False
                state["events"].append((float(back), int(c), "charged"))
        else:
            level[c] = min(cap, level[c] - used + self.charge_w * self.charging_seconds(c, last, now))
            if level[c] <= 0:
                flat[c] = True
                state["events"].append((float(now), int(c), "empty"))
        state["last_t"][c], state["last_spent"][c] = now, spent
        return bool(flat[c])

    def back_at(self, state: dict, c: int, now: float) -> float | None:
        """When an empty battery is charged enough for its client to come back (None: never)."""
        if not self.charges:
            return None
        return self.charged_by(c, now, self.resume_share * self.capacity_j - float(state["level"][c]))

    def manifest(self) -> dict:
        return {"capacity_j": self.capacity_j, **({"charge_w": self.charge_w, "resume_share": self.resume_share,
                "charging": "always" if self.charging is None else "intervals"} if self.charges else {})}
