"""The cost ledger: one row per (global round, group round, client, cost component).

Every Eq. 5 charge goes through :meth:`CostLedger.charge`, so the ledger's total is Eq. 5's
total and it can be summed any way (per client, group, edge, round or component) with pandas.
``start``/``end`` are the simulated times the charged work ran.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["round", "edge", "group", "group_round", "client", "device", "component", "amount", "start", "end"]


class CostLedger:
    def __init__(self):
        self._blocks: list[dict[str, np.ndarray]] = []
        self.total = 0.0
        self.by_component: dict[str, float] = {}

    def charge(self, *, round: int, edge: int, group: int, group_round: int, clients: np.ndarray,
               devices: list[str], component: str, amounts: np.ndarray, start: np.ndarray,
               end: np.ndarray) -> None:
        n = len(clients)
        amounts = np.asarray(amounts, dtype=float)
        self._blocks.append({
            "round": np.full(n, round, dtype=np.int32), "edge": np.full(n, edge, dtype=np.int32),
            "group": np.full(n, group, dtype=np.int32), "group_round": np.full(n, group_round, dtype=np.int32),
            "client": np.asarray(clients, dtype=np.int32), "device": np.asarray(devices, dtype=object),
            "component": np.full(n, component, dtype=object), "amount": amounts,
            "start": np.asarray(start, dtype=float), "end": np.asarray(end, dtype=float)})
        self.total += float(amounts.sum())
        self.by_component[component] = self.by_component.get(component, 0.0) + float(amounts.sum())

    def frame(self) -> pd.DataFrame:
        if not self._blocks:
            return pd.DataFrame({c: pd.Series(dtype="float64" if c in ("amount", "start", "end") else "int32")
                                 for c in COLUMNS})
        df = pd.DataFrame({c: np.concatenate([b[c] for b in self._blocks]) for c in COLUMNS})
        for c in ("device", "component"):
            df[c] = df[c].astype("category")
        return df

    # Checkpoints store the ledger as plain arrays.
    def state(self) -> dict:
        df = self.frame()
        return {"columns": {c: df[c].to_numpy(dtype=object if c in ("device", "component") else None)
                            for c in COLUMNS}, "total": self.total, "by_component": self.by_component}

    @classmethod
    def from_state(cls, state: dict) -> "CostLedger":
        led = cls()
        cols = state["columns"]
        if len(cols["amount"]):
            led._blocks.append({c: np.asarray(cols[c]) for c in COLUMNS})
        led.total = float(state["total"])
        led.by_component = dict(state["by_component"])
        return led
