"""The cost ledger: one row per (global round, group round, client, cost component).

Every Eq. 5 charge goes through :meth:`CostLedger.charge`, so the ledger's total is Eq. 5's
total and it can be summed any way (per client, group, edge, round or component) with pandas.
``start``/``end`` are the simulated times the charged work ran.

With a power model (``cost.energy``) the ledger also keeps joules: one row per (global round,
group round, client, state) with the seconds the client spent in the state and the energy,
power(state) × seconds (:mod:`groupfel.cost_models.power`), beside the Eq. 5 charges. Without
one it keeps none and reports none (never a zero that was not measured).

Rounds are numbered from 1 in every table (ledger, results, timeline, manifest): the ledger's
round r holds what global round r charged, including any (re)grouping work done at its start, and
results.csv's round r is the evaluation after r completed rounds (0: the initial model), so its
cost is the sum of the ledger's rounds 1..r. :meth:`CostLedger.charge` takes the 0-based round
index the run loop derives its seeds from; :meth:`CostLedger.frame` shows it as index + 1.
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd

COLUMNS = ["round", "edge", "group", "group_round", "client", "device", "component", "amount", "start", "end"]
DTYPES = {"round": np.int32, "edge": np.int32, "group": np.int32, "group_round": np.int32, "client": np.int32,
          "device": object, "component": object, "amount": float, "start": float, "end": float}
SCALARS = ("round", "edge", "group", "group_round", "component")   # one value per charge call
TEXT = ("device", "component")   # kept as codes into their names once expanded
ENERGY_COLUMNS = ["round", "edge", "group", "group_round", "client", "device", "state", "seconds", "joules"]
ENERGY_DTYPES = {**{c: DTYPES[c] for c in ENERGY_COLUMNS[:6]}, "state": object, "seconds": float, "joules": float}
ENERGY_SCALARS = ("round", "edge", "group", "group_round", "state")
# the edge servers' and the cloud's joules (cost.edge_power, cost.cloud_power): one row per charge;
# edge is -1 for the cloud
SITE_COLUMNS = ["round", "site", "edge", "state", "seconds", "joules"]


class Rows:
    """Charges already laid out as columns (COLUMNS, in charge order), with each charge's
    (component, amount total) in the order they were made: a round computed at once appends one
    of these where it would have made a block per group round and component."""

    __slots__ = ("columns", "sums")

    def __init__(self, columns: dict[str, np.ndarray], sums: list[tuple[str, float]]):
        self.columns, self.sums = columns, sums


def _expand(blocks: list, loaded: dict | None, columns: list[str], dtypes: dict,
            scalars) -> dict[str, np.ndarray]:
    parts = [] if loaded is None else [loaded]
    run: list[tuple] = []   # consecutive blocks, expanded together

    def flush() -> None:
        if run:
            cols = dict(zip(columns, zip(*run)))
            n = [len(c) for c in cols["client"]]
            parts.append({c: np.repeat(np.array(v, dtype=dtypes[c]), n) if c in scalars else np.concatenate(v)
                          for c, v in cols.items()})
            run.clear()

    for block in blocks:
        if isinstance(block, Rows):
            flush()
            parts.append(block.columns)
        else:
            run.append(block)
    flush()
    if not parts:
        return {c: np.array([], dtype=dtypes[c]) for c in columns}
    return {c: np.concatenate([p[c] for p in parts]) for c in columns}


def _array(v) -> np.ndarray:
    return np.asarray(v, dtype=object) if isinstance(v, list) else np.asarray(v.numpy() if hasattr(v, "numpy") else v)


class CostLedger:
    def __init__(self):
        # one block per charge call, in COLUMNS order: its scalar columns once, its per-client
        # columns as arrays (expanded only when read: a round makes a block per group round and
        # component)
        self._blocks: list[tuple] = []
        # rows expanded so far (restored from a checkpoint, or read at one), the TEXT columns as
        # int32 codes into _names: a checkpoint then expands only the blocks since the last one
        # and pickles numeric arrays, where a string per row made a late checkpoint the run's
        # slowest step
        self._loaded: dict[str, np.ndarray] | None = None
        self._names: dict[str, list[str]] = {c: [] for c in TEXT}
        self.total = 0.0
        self.by_component: dict[str, float] = {}
        self.power = None     # a PowerModel: the run charges energy (set by the run, never checkpointed)
        self._energy: list[tuple] = []
        self._energy_loaded: dict[str, np.ndarray] | None = None
        self.energy_total = 0.0
        self.energy_by_state: dict[str, float] = {}
        self.client_energy = np.zeros(0)    # joules spent so far by each client (a battery's level)
        self.client_seconds = np.zeros(0)   # seconds charged energy so far (full-fleet accounting's mark)
        self._sites: list[tuple] = []       # the edges' and the cloud's charges (SITE_COLUMNS)
        self.site_energy: dict[str, float] = {}
        self.edge_energy: dict[int, float] = {}     # each edge server's joules
        # grams CO2e (cost.carbon_intensity*): one array per energy block, one number per site row
        self._grams: list[np.ndarray] = []
        self._grams_loaded: np.ndarray | None = None
        self._site_grams: list[float] = []
        self.carbon_g: dict[str, float] = {}     # client, edge, cloud -> grams
        self.battery: dict | None = None         # batteries that charge: their levels (network.battery)

    @property
    def measures_energy(self) -> bool:
        return self.power is not None or bool(self._energy) or self._energy_loaded is not None

    def charge_energy(self, *, round: int, edge: int, group: int, group_round: int, clients: np.ndarray,
                      devices, state: str, seconds: np.ndarray, x=None, at: float = 0.0) -> np.ndarray:
        """Charge power(state) × ``seconds`` to each client (``x``: the state curve's argument);
        returns the joules. ``at``: the simulated time the carbon intensity is read at."""
        clients = np.asarray(clients, dtype=np.int32)
        seconds = np.asarray(seconds, dtype=float)
        joules = self.power.joules(list(devices), state, seconds, x)
        self._energy.append((round, edge, group, group_round, clients, np.asarray(devices, dtype=object), state,
                             seconds, joules))
        self._add_energy(clients, state, joules, seconds)
        if self.power.carbon is not None:
            self._add_grams("client", self.power.carbon.grams("client", joules, at))
        return joules

    def _add_grams(self, site: str, grams) -> None:
        if site == "client":
            self._grams.append(np.asarray(grams, dtype=float))
        else:
            self._site_grams.append(float(grams))
        self.carbon_g[site] = self.carbon_g.get(site, 0.0) + float(np.sum(grams))

    def _add_energy(self, clients: np.ndarray, state: str, joules: np.ndarray, seconds: np.ndarray) -> None:
        total = float(joules.sum())
        self.energy_total += total
        self.energy_by_state[state] = self.energy_by_state.get(state, 0.0) + total
        if len(clients) and clients.max() >= len(self.client_energy):
            grow = np.zeros(clients.max() + 1 - len(self.client_energy))
            self.client_energy = np.concatenate([self.client_energy, grow])
        if len(clients) and clients.max() >= len(self.client_seconds):
            grow = np.zeros(clients.max() + 1 - len(self.client_seconds))
            self.client_seconds = np.concatenate([self.client_seconds, grow])
        np.add.at(self.client_energy, clients, joules)
        np.add.at(self.client_seconds, clients, seconds)

    def charges_site(self, site: str) -> bool:
        """Whether the run charges ``site``'s ("edge" or "cloud") energy."""
        return self.power is not None and getattr(self.power, site, None) is not None

    def charge_site(self, *, round: int, site: str, edge: int, state: str, seconds: float, x: float = 0.0,
                    at: float = 0.0) -> float:
        """Charge an edge server (``site`` "edge") or the cloud power(state) × ``seconds`` (× its
        PUE); returns the joules (0 where the run does not charge the site)."""
        if not self.charges_site(site):
            return 0.0
        joules = self.power.site_joules(site, state, seconds, x)
        self._add_site_row((int(round), site, int(edge), state, float(seconds), joules))
        if self.power.carbon is not None:
            self._add_grams(site, self.power.carbon.grams(site, joules, at))
        return joules

    def _add_site_row(self, row: tuple) -> None:
        """A site charge made elsewhere (a dry play, a checkpoint), with its totals."""
        self._sites.append(row)
        self.site_energy[row[1]] = self.site_energy.get(row[1], 0.0) + row[5]
        if row[1] == "edge":
            self.edge_energy[int(row[2])] = self.edge_energy.get(int(row[2]), 0.0) + row[5]

    def site_frame(self) -> pd.DataFrame | None:
        """Every edge and cloud charge, rounds numbered from 1; None where the run charges neither."""
        if not self._sites and not self.site_energy:
            return None
        df = pd.DataFrame(self._sites, columns=SITE_COLUMNS)
        df["round"] = (df["round"] + 1).astype(np.int32)
        if self._site_grams:
            df["grams"] = self._site_grams
        return df

    def seconds_of(self, n: int) -> np.ndarray:
        """Each of ``n`` clients' seconds charged energy so far (a resume carries them on)."""
        out = np.zeros(n)
        out[:min(n, len(self.client_seconds))] = self.client_seconds[:n]
        return out

    def energy_row(self) -> dict:
        """A results row's energy columns (none where the run measures no energy)."""
        if not self.measures_energy:
            return {}
        from groupfel.cost_models.power import STATES

        return {"energy_j": self.energy_total, **{f"energy_{s}_j": self.energy_by_state.get(s, 0.0) for s in STATES},
                **{f"{site}_energy_j": self.site_energy.get(site, 0.0) for site in ("edge", "cloud")
                   if self.charges_site(site) or site in self.site_energy},
                **({f"edge{j}_energy_j": self.edge_energy.get(j, 0.0) for j in range(self.power.n_edges)}
                   if self.charges_site("edge") else {}),
                **self._carbon_row(),
                **({"energy_accounting": self.power.accounting} if self.power is not None else {})}

    def _carbon_row(self) -> dict:
        """The results row's grams CO2e (clients', each site's) and the intensity they follow."""
        if self.power is None or self.power.carbon is None:
            return {}
        sites = [s for s in ("edge", "cloud") if self.charges_site(s)]
        return {"carbon_g": self.carbon_g.get("client", 0.0),
                **{f"{s}_carbon_g": self.carbon_g.get(s, 0.0) for s in sites},
                "carbon_intensity": self.power.carbon.source}

    def scratch(self) -> "CostLedger":
        """An empty ledger for a dry play of a round: the same power model and battery levels."""
        led = CostLedger()
        led.power, led.client_energy = self.power, self.client_energy.copy()
        if self.battery is not None:
            led.battery = copy.deepcopy(self.battery)
        return led

    def replay(self, other: "CostLedger") -> None:
        """Charge what ``other`` (a scratch ledger's dry play) charged, as charged."""
        for block in other._blocks:
            if isinstance(block, Rows):
                self.charge_rows(block.columns, block.sums)
                continue
            self.charge(**dict(zip(("round", "edge", "group", "group_round", "clients", "devices", "component",
                                    "amounts", "start", "end"), block)))
        for block in other._energy:
            self._energy.append(block)
            self._add_energy(block[4], block[6], block[8], block[7])
        if other.battery is not None:     # the play's battery levels are the run's from now on
            self.battery = copy.deepcopy(other.battery)
        for row in other._sites:
            self._add_site_row(row)
        for grams in other._grams:
            self._add_grams("client", grams)
        for (_, site, *_rest), grams in zip(other._sites, other._site_grams):
            self._add_grams(site, grams)

    def energy_frame(self) -> pd.DataFrame | None:
        """Every energy charge, rounds numbered from 1; None where the run measures no energy."""
        if not self.measures_energy:
            return None
        cols = _expand(self._energy, self._energy_loaded, ENERGY_COLUMNS, ENERGY_DTYPES, ENERGY_SCALARS)
        df = pd.DataFrame({**cols, "round": (cols["round"] + 1).astype(np.int32)})
        for c in ("device", "state"):
            df[c] = df[c].astype("category")
        grams = self._all_grams()
        if grams is not None:
            df["grams"] = grams
        return df

    def _all_grams(self) -> np.ndarray | None:
        """Each energy row's grams CO2e, in row order (None: the run prices no carbon)."""
        if self._grams_loaded is None and not self._grams:
            return None
        return np.concatenate([self._grams_loaded if self._grams_loaded is not None else np.zeros(0),
                               *self._grams])

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

    def charge_rows(self, columns: dict[str, np.ndarray], sums: list[tuple[str, float]]) -> None:
        """Charges laid out as columns (COLUMNS, each of its dtype), ``sums`` each charge's
        (component, amount total) in order: the ledger's totals add them one by one, as
        :meth:`charge` would have (the same float sums)."""
        self._blocks.append(Rows(columns, sums))
        total, by = self.total, self.by_component
        for component, amount in sums:
            total += amount
            by[component] = by.get(component, 0.0) + amount
        self.total = total

    def _coded(self) -> dict[str, np.ndarray]:
        """The charges as recorded (0-based round index), the TEXT columns as codes."""
        if self._blocks or self._loaded is None:
            new = _expand(self._blocks, None, COLUMNS, DTYPES, SCALARS)
            for c in TEXT:
                new[c] = self._encode(c, new[c])
            self._loaded = new if self._loaded is None else {c: np.concatenate([self._loaded[c], new[c]])
                                                             for c in COLUMNS}
            self._blocks = []
        return self._loaded

    def _encode(self, column: str, values: np.ndarray) -> np.ndarray:
        codes, uniques = pd.factorize(values)
        names = self._names[column]
        known = {n: i for i, n in enumerate(names)}
        for u in uniques:
            if u not in known:
                known[u] = len(names)
                names.append(u)
        return np.array([known[u] for u in uniques], dtype=np.int32)[codes] if len(codes) else \
            np.empty(0, dtype=np.int32)

    def _columns(self) -> dict[str, np.ndarray]:
        """The charges as recorded (0-based round index)."""
        coded = self._coded()
        return {c: np.asarray(self._names[c] or [""], dtype=object)[coded[c]] if c in TEXT else coded[c]
                for c in COLUMNS}

    def frame(self) -> pd.DataFrame:
        """Every charge, rounds numbered from 1."""
        cols = self._columns()
        df = pd.DataFrame({**cols, "round": (cols["round"] + 1).astype(np.int32)})
        for c in ("device", "component"):
            df[c] = df[c].astype("category")
        return df

    # Checkpoints store the ledger as plain arrays.
    def state(self) -> dict:
        out = {"columns": dict(self._coded()), "names": {c: list(self._names[c]) for c in TEXT},
               "total": self.total, "by_component": self.by_component}
        if self._energy or self._energy_loaded is not None:
            e = _expand(self._energy, self._energy_loaded, ENERGY_COLUMNS, ENERGY_DTYPES, ENERGY_SCALARS)
            out["energy"] = {"columns": {c: e[c].astype(object) if c in ("device", "state") else e[c]
                                         for c in ENERGY_COLUMNS},
                             "total": self.energy_total, "by_state": self.energy_by_state,
                             "client": self.client_energy, "seconds": self.client_seconds}
            grams = self._all_grams()
            if grams is not None:
                out["energy"]["grams"] = grams
        if self._sites:
            out["sites"] = list(self._sites)
            if self._site_grams:
                out["site_grams"] = list(self._site_grams)
        if self.carbon_g:
            out["carbon_g"] = dict(self.carbon_g)
        if self.battery is not None:
            out["battery"] = copy.deepcopy(self.battery)
        return out

    @classmethod
    def from_state(cls, state: dict) -> "CostLedger":
        led = cls()
        cols = {c: np.asarray(v) for c, v in state["columns"].items()}
        if "names" in state:
            led._names = {c: list(state["names"][c]) for c in TEXT}
        else:   # a checkpoint from before the codes: the text columns as strings
            cols.update({c: led._encode(c, cols[c]) for c in TEXT})
        if len(cols["amount"]):
            led._loaded = {c: cols[c] for c in COLUMNS}
        led.total = float(state["total"])
        led.by_component = dict(state["by_component"])
        energy = state.get("energy")
        if energy:
            cols = {c: _array(v) for c, v in energy["columns"].items()}
            if len(cols["joules"]):
                led._energy_loaded = {c: cols[c] for c in ENERGY_COLUMNS}
            led.energy_total = float(energy["total"])
            led.energy_by_state = dict(energy["by_state"])
            led.client_energy = np.asarray(_array(energy["client"]), dtype=float)
            # full-fleet accounting takes differences of these sums: a resume carries them on
            # rather than starting from 0, so its differences round as an uninterrupted run's do
            if "seconds" in energy:
                led.client_seconds = np.asarray(_array(energy["seconds"]), dtype=float)
            if "grams" in energy:
                led._grams_loaded = np.asarray(energy["grams"], dtype=float)
        for row in state.get("sites", []):
            led._add_site_row(tuple(row))
        led._site_grams = list(state.get("site_grams", []))
        led.carbon_g = dict(state.get("carbon_g", {}))
        if state.get("battery") is not None:
            led.battery = copy.deepcopy(state["battery"])
        return led
