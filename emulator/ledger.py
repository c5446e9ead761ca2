"""The cost ledger: one row per (global round, group round, client, cost component).

Every Eq. 5 charge goes through :meth:`CostLedger.charge`, so the ledger's total is Eq. 5's
total and it can be summed any way (per client, group, edge, round or component) with pandas.
``start``/``end`` are the simulated times the charged work ran.

Rounds are numbered from 1 in every table (ledger, results, timeline, manifest): the ledger's
round r holds what global round r charged, including any (re)grouping work done at its start, and
results.csv's round r is the evaluation after r completed rounds (0: the initial model), so its
cost is the sum of the ledger's rounds 1..r. :meth:`CostLedger.charge` takes the 0-based round
index the run loop derives its seeds from; :meth:`CostLedger.frame` shows it as index + 1.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["round", "edge", "group", "group_round", "client", "device", "component", "amount", "start", "end"]
DTYPES = {"round": np.int32, "edge": np.int32, "group": np.int32, "group_round": np.int32, "client": np.int32,
          "device": object, "component": object, "amount": float, "start": float, "end": float}
SCALARS = ("round", "edge", "group", "group_round", "component")   # one value per charge call


class CostLedger:
    def __init__(self):
        # one block per charge call, in COLUMNS order: its scalar columns once, its per-client
        # columns as arrays (expanded only when read: a round makes a block per group round and
        # component)
        self._blocks: list[tuple] = []
        self._loaded: dict[str, np.ndarray] | None = None    # rows restored from a checkpoint
        self.total = 0.0
        self.by_component: dict[str, float] = {}

    def charge(self, *, round: int, edge: int, group: int, group_round: int, clients: np.ndarray,
               devices: list[str], component: str, amounts: np.ndarray, start: np.ndarray,
               end: np.ndarray) -> None:
        amounts = np.asarray(amounts, dtype=float)
        self._blocks.append((round, edge, group, group_round, np.asarray(clients, dtype=np.int32),
                             np.asarray(devices, dtype=object), component, amounts,
                             np.asarray(start, dtype=float), np.asarray(end, dtype=float)))
        total = float(amounts.sum())
        self.total += total
        self.by_component[component] = self.by_component.get(component, 0.0) + total

    def _columns(self) -> dict[str, np.ndarray]:
        """The charges as recorded (0-based round index)."""
        parts = [] if self._loaded is None else [self._loaded]
        if self._blocks:
            blocks = dict(zip(COLUMNS, zip(*self._blocks)))
            n = [len(c) for c in blocks["client"]]
            parts.append({c: np.repeat(np.array(v, dtype=DTYPES[c]), n) if c in SCALARS else np.concatenate(v)
                          for c, v in blocks.items()})
        if not parts:
            return {c: np.array([], dtype=DTYPES[c]) for c in COLUMNS}
        return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}

    def frame(self) -> pd.DataFrame:
        """Every charge, rounds numbered from 1."""
        cols = self._columns()
        df = pd.DataFrame({**cols, "round": (cols["round"] + 1).astype(np.int32)})
        for c in ("device", "component"):
            df[c] = df[c].astype("category")
        return df

    # Checkpoints store the ledger as plain arrays.
    def state(self) -> dict:
        cols = self._columns()
        return {"columns": {c: cols[c].astype(object) if c in ("device", "component") else cols[c]
                            for c in COLUMNS}, "total": self.total, "by_component": self.by_component}

    @classmethod
    def from_state(cls, state: dict) -> "CostLedger":
        led = cls()
        cols = state["columns"]
        if len(cols["amount"]):
            led._loaded = {c: np.asarray(cols[c]) for c in COLUMNS}
        led.total = float(state["total"])
        led.by_component = dict(state["by_component"])
        return led
