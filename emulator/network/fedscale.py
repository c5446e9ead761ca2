"""FedScale's device traces: per-client capacity and availability, read safely.

FedScale (github.com/SymbioticLab/FedScale) ships two pickled dicts keyed by client id
(``benchmark/dataset/data/device_info/README.md``):

* ``client_device_capacity``: ``{id: {"computation": ms per sample, "communication": kbit/s}}``;
  ``fedscale/cloud/internal/client_metadata.py`` times a client's training as
  3 × batch × steps × computation / 1000 s and its transfers as (upload + download) kbit /
  communication, the model's size counted as ``bytes / 1024 * 8`` kbit (``aggregator.py``), so
  one kbit is 1024 bits.
* ``client_behave_trace``: ``{id: {"active": [s, ...], "inactive": [s, ...], "finish_time": s, ...}}``;
  ``ClientMetadata.is_active`` reads time modulo ``finish_time`` and finds the client online
  within ``[active[i], inactive[i]]``.

A pickle can run any code while it loads, so it is read with :class:`_SafeUnpickler`, which
refuses every class and function: only the pickle's own dicts, lists, tuples, sets, numbers,
strings and None come out. The same data is read from JSON (the dict) or CSV (one row per client,
or per online interval). Every message names the file and the entry (or CSV row) and the fix.
"""
from __future__ import annotations

import io
import math
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from groupfel.errors import InputError
from groupfel.usercsv import read_user_csv
from groupfel.userfile import check_tree, clip, parse_json, read_bytes, short

KBIT = 1024             # bits in FedScale's kbit (aggregator.py: model size = bytes / 1024 * 8 kbits)
MAX_TIME_S = 1e12       # the bound of availability times (as topology.availability.file's)
CAPACITY_CSV = ("client_id", "computation", "communication")
BEHAVIOUR_CSV = ("client_id", "active", "inactive", "finish_time")


class _SafeUnpickler(pickle.Unpickler):
    """Refuses every global: a pickle of builtin containers, numbers and strings needs none."""

    def find_class(self, module: str, name: str):
        raise _Refused(f"{module}.{name}")


class _Refused(Exception):
    pass


def _load(path: str, where: str):
    """The file's top-level object: JSON by its ``.json`` suffix, else a pickle (FedScale's
    files have no suffix), through the gate of users' files (:mod:`groupfel.userfile`)."""
    if not path.strip():
        raise InputError(f"{where}: empty; give the trace file's path")
    p = Path(path)
    src = f"{where}: {path}"
    fix = "give FedScale's pickle, or the same data as .json or .csv"
    raw = read_bytes(p, src, "the trace file", "trace")
    if p.suffix.lower() == ".json":
        try:
            data = parse_json(raw.decode("utf-8-sig"), src, object_pairs_hook=_no_repeats(src))
        except (UnicodeDecodeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{src}: not valid JSON ({clip(str(exc), 200)}); write the dict of client id -> entry") from None
    else:
        try:
            data = _SafeUnpickler(io.BytesIO(raw)).load()
        except _Refused as exc:
            raise InputError(f"{src}: the pickle refers to {clip(str(exc), 200)}, which groupfel does not load (a pickle "
                             f"can run code; only dicts, lists, numbers and strings are read); convert it to JSON or "
                             f"CSV (see the network guide)") from None
        except Exception as exc:   # a damaged or foreign file: whatever the unpickler trips on, one line
            if "integer string conversion" in str(exc):   # protocol 0's text digits beyond Python's limit
                raise InputError(f"{src}: an integer of more than 4,300 digits, beyond any value groupfel reads; "
                                 f"fix the trace") from None
            raise InputError(f"{src}: not a readable pickle ({type(exc).__name__}: {clip(str(exc), 200)}); {fix}") from None
    check_tree(data, src, fix)
    return data


def _no_repeats(src: str):
    """A JSON object hook refusing a key given twice (json keeps the last one silently)."""
    def hook(pairs: list) -> dict:
        out = dict(pairs)
        if len(out) < len(pairs):
            seen = set()
            key = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise InputError(f"{src}: key {short(key)} appears twice in one object; keep one")
        return out
    return hook


def _entries(path: str, where: str, what: str) -> tuple[list[str], list, bool]:
    """The ids and entries of a pickle's or JSON's dict, and whether every key is an int."""
    data = _load(path, where)
    if not isinstance(data, dict) or not data:
        got = "an empty dict" if isinstance(data, dict) else f"a {type(data).__name__}"
        raise InputError(f"{where}: {path}: holds {got}; give a dict of client id -> {what}")
    keys = list(data)
    if all(type(k) is int for k in keys):     # FedScale's: distinct by construction
        return [str(k) for k in keys], list(data.values()), True
    seen: dict[str, object] = {}
    for key in keys:
        if type(key) not in (int, str) or not str(key).strip():
            raise InputError(f"{where}: {path}: entry key {short(key)} is not a client id; use integers or strings")
        cid = str(key).strip()
        if cid in seen:
            raise InputError(f"{where}: {path}: client id {short(cid)} appears twice ({short(seen[cid])} and {short(key)}); keep one")
        seen[cid] = key
    return list(seen), list(data.values()), False


def _number(value, at: str, name: str, unit: str, lo: float, hi: float, lo_open: bool = False) -> float:
    try:
        v = float(value) if type(value) in (int, float) else math.nan
    except OverflowError:      # an int beyond any float
        v = math.nan
    if math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi:
        return v
    low = f"above {lo:g}" if lo_open else f"from {lo:g}"
    raise InputError(f"{at}: {name} = {short(value)}; give a number {low} to {hi:g} {unit} (fix or delete the entry)")


def _numbers(values: list, at, name: str, unit: str, lo: float, hi: float, lo_open: bool = False) -> np.ndarray:
    """:func:`_number` over a whole column at once (a trace has 10^5 clients and more): the first
    bad value raises its message; ``at(i)`` names value i's entry."""
    try:   # the common case at C speed: only ints and floats (no bools, no strings)
        if not set(map(type, values)) <= {int, float}:
            raise TypeError
        arr = np.array(values, dtype=float)
    except (TypeError, OverflowError):
        arr = np.fromiter((v if type(v) is float or (type(v) is int and abs(v) < 2**1000) else math.nan
                           for v in values), float, len(values))
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(arr) & (arr > lo if lo_open else arr >= lo) & (arr <= hi)
    if not ok.all():
        i = int(np.argmin(ok))
        _number(values[i], at(i), name, unit, lo, hi, lo_open)
    return arr


def _csv_number(table, row, column: str) -> float:
    cell = row.get(column)
    try:
        return float(cell)
    except ValueError:
        raise InputError(f"{table.where(row)}: column '{column}' must be a number, got {short(cell)}") from None


_INTEGER = re.compile(r"[+-]?\d+")


def sorted_order(ids: list[str], integers: bool = False) -> list[int]:
    """Positions of ``ids`` in numeric order where every id is an integer (FedScale's are), else
    in string order: a pickle's int keys and the same keys read from JSON or CSV sort alike."""
    if integers or all(_INTEGER.fullmatch(i) for i in ids):
        return sorted(range(len(ids)), key=lambda i: int(ids[i]))
    return sorted(range(len(ids)), key=ids.__getitem__)


def assign(n_trace: int, n_clients: int) -> np.ndarray:
    """The trace entry (index into the sorted ids) of each of our clients 0..n−1: the first
    n ids in order; where the trace has fewer, it cycles (client c takes entry c mod M, as
    FedScale cycles its own: aggregator.py maps client j to profile j mod M)."""
    return np.arange(n_clients) % n_trace


# -- the device-capacity trace -------------------------------------------------------------------

@dataclass(frozen=True)
class Capacity:
    ids: list[str]                 # sorted (see sorted_order)
    ms_per_sample: np.ndarray      # FedScale's "computation"
    kbps: np.ndarray               # FedScale's "communication", 1024-bit kbit/s
    names: list[str]               # how messages name each entry: its CSV row, or the file
    csv: bool = False

    def at(self, i: int) -> str:
        return f"{self.names[i]} (client id {short(self.ids[i])})" if self.csv else f"{self.names[i]}: client id {short(self.ids[i])}"

    def with_default(self, entry: dict[str, float]) -> "Capacity":
        """These entries and, last, FedScale's default one (id ``default``)."""
        return Capacity([*self.ids, "default"], np.append(self.ms_per_sample, entry["computation"]),
                        np.append(self.kbps, entry["communication"]), [*self.names, "FedScale's default"], self.csv)


_MISSING = object()
# what FedScale's aggregator gives a client whose key the capacity trace lacks
# (client_register_handler: client_profiles.get(mapped_id, {'computation': 1.0, 'communication': 1.0}))
FEDSCALE_DEFAULT = {"computation": 1.0, "communication": 1.0}


def read_capacity(path: str, where: str) -> Capacity:
    if Path(path).suffix.lower() == ".csv":
        table = read_user_csv(path, f"{where}: {path}")
        table.require(CAPACITY_CSV, ", ".join(CAPACITY_CSV))
        if not table.rows:
            raise InputError(f"{where}: {path}: no rows below the header; give one row per client")
        table.unique(("client_id",), "client id")
        for row in table.rows:
            if not row.get("client_id"):
                raise InputError(f"{table.where(row)}: empty client_id; give every row an id")
        ids = [row.get("client_id") for row in table.rows]
        comp = [_csv_number(table, row, "computation") for row in table.rows]
        comm = [_csv_number(table, row, "communication") for row in table.rows]
        names, integers = [table.where(row) for row in table.rows], False
    else:
        ids, entries, integers = _entries(path, where, "{'computation': ms per sample, 'communication': kbit/s}")
        comp = [e.get("computation", _MISSING) if type(e) is dict else _MISSING for e in entries]
        comm = [e.get("communication", _MISSING) if type(e) is dict else _MISSING for e in entries]
        names = [f"{where}: {path}"] * len(ids)
        for i, (a, b) in enumerate(zip(comp, comm)):
            if a is _MISSING or b is _MISSING:
                raise InputError(f"{names[i]}: client id {short(ids[i])}: the entry is {short(entries[i])}; give "
                                 f"{{'computation': ms per sample, 'communication': kbit/s}}")
    csv = Path(path).suffix.lower() == ".csv"
    cap = Capacity(ids, np.empty(0), np.empty(0), names, csv)
    ms = _numbers(comp, cap.at, "computation", "ms per sample", 0, 1e9, True)
    kbps = _numbers(comm, cap.at, "communication", "kbit/s", 0, 1e12, True)
    order = sorted_order(ids, integers)
    return Capacity([ids[i] for i in order], ms[order], kbps[order], [names[i] for i in order], csv)


# -- the behaviour (availability) trace ----------------------------------------------------------

@dataclass(frozen=True)
class Behaviour:
    ids: list[str]                                # in the file's order (FedScale pairs by it)
    intervals: list[list[tuple[float, float]]]   # online [start, end) within [0, period), sorted
    period_s: np.ndarray                          # FedScale's finish_time: the trace repeats
    order: list[int]                              # positions of the ids in sorted order (see sorted_order)
    bad: dict[int, str]                           # position -> why its intervals are unusable

    def pair(self, n_clients: int, pairing: str) -> np.ndarray:
        """The entry (position) of each of our clients 0..n−1. ``fedscale``: as FedScale's
        client manager pairs them, its client j (from 1) takes the (j mod M)-th id in the
        file's order, so our client c takes position (c + 1) mod M. ``sorted``: client c takes
        the (c mod M)-th id in sorted order."""
        if pairing == "fedscale":
            return (np.arange(n_clients) + 1) % len(self.ids)
        return np.asarray(self.order)[assign(len(self.ids), n_clients)]


def _behaviour(ids: list[str], integers: bool, finish: list, owner: np.ndarray, active: list, inactive: list,
               at_id, at_interval) -> Behaviour:
    """Checks the flattened intervals (interval j belongs to id ``owner[j]``) all at once; a
    reversed or overlapping interval marks its id unusable (:attr:`Behaviour.bad`), refused only
    where a run uses that id."""
    period = _numbers(finish, at_id, "finish_time", "s", 0, MAX_TIME_S, True)
    a = _numbers(active, at_interval, "active time", "s", 0, MAX_TIME_S)
    b = _numbers(inactive, at_interval, "inactive time", "s", 0, MAX_TIME_S)
    bad: dict[int, str] = {}
    for j in np.flatnonzero(b < a).tolist():
        bad.setdefault(int(owner[j]), f"{at_interval(j)}: online from {a[j]:g} s until {b[j]:g} s is reversed; "
                                      f"each inactive time must follow its active time")
    # FedScale reads time modulo finish_time, so what lies beyond it is never reached
    p = period[owner]
    b = np.minimum(b, p)
    keep = a < b
    owner, a, b = owner[keep], a[keep], b[keep]
    order = np.lexsort((a, owner))
    owner, a, b = owner[order], a[order], b[order]
    clash = (owner[1:] == owner[:-1]) & (a[1:] < b[:-1])
    for j in np.flatnonzero(clash).tolist():
        bad.setdefault(int(owner[j]), f"{at_id(int(owner[j]))}: online intervals [{a[j]:g}, {b[j]:g}) and "
                                      f"[{a[j + 1]:g}, {b[j + 1]:g}) overlap; merge them")
    intervals: list[list[tuple[float, float]]] = [[] for _ in ids]
    for o, x, y in zip(owner.tolist(), a.tolist(), b.tolist()):
        intervals[o].append((x, y))
    return Behaviour(list(ids), intervals, period, sorted_order(ids, integers), bad)


def read_behaviour(path: str, where: str) -> Behaviour:
    if Path(path).suffix.lower() == ".csv":
        table = read_user_csv(path, f"{where}: {path}")
        table.require(BEHAVIOUR_CSV, ", ".join(BEHAVIOUR_CSV) + " (one row per online interval)")
        if not table.rows:
            raise InputError(f"{where}: {path}: no rows below the header; give one row per online interval")
        first: dict[str, tuple[int, float]] = {}      # id -> (its position, finish_time)
        rows, owner, where_id = table.rows, [], []
        for row in rows:
            cid = row.get("client_id")
            if not cid:
                raise InputError(f"{table.where(row)}: empty client_id; give every row an id")
            finish = _csv_number(table, row, "finish_time")
            if cid not in first:
                where_id.append(table.where(row))
            k, f = first.setdefault(cid, (len(first), finish))
            if f != finish:
                raise InputError(f"{table.where(row)} (client id {short(cid)}): finish_time {finish:g} differs from an "
                                 f"earlier row's {f:g}; give one finish_time per client")
            owner.append(k)
        ids = list(first)
        return _behaviour(ids, False, [f for _, f in first.values()], np.array(owner, dtype=np.int64),
                          [_csv_number(table, r, "active") for r in rows],
                          [_csv_number(table, r, "inactive") for r in rows],
                          lambda i: f"{where_id[i]} (client id {short(ids[i])})",
                          lambda j: f"{table.where(rows[j])} (client id {short(rows[j].get('client_id'))})")
    ids, entries, integers = _entries(path, where, "{'active': [s], 'inactive': [s], 'finish_time': s}")
    src = f"{where}: {path}"
    lengths = []
    for cid, e in zip(ids, entries):
        at = f"{src}: client id {short(cid)}"
        if type(e) is not dict or not {"active", "inactive", "finish_time"} <= e.keys():
            raise InputError(f"{at}: the entry is {short(e)}; give {{'active': [s, ...], 'inactive': [s, ...], "
                             f"'finish_time': s}}")
        act, ina = e["active"], e["inactive"]
        if type(act) not in (list, tuple) or type(ina) not in (list, tuple):
            raise InputError(f"{at}: active and inactive must be lists of seconds; got {type(act).__name__} and "
                             f"{type(ina).__name__}")
        if len(act) != len(ina):
            raise InputError(f"{at}: active has {len(act)} times but inactive has {len(ina)}; give one inactive "
                             f"time per active time")
        lengths.append(len(act))
    owner = np.repeat(np.arange(len(ids)), lengths)
    at_id = lambda i: f"{src}: client id {short(ids[i])}"    # noqa: E731
    return _behaviour(ids, integers, [e["finish_time"] for e in entries], owner,
                      [x for e in entries for x in e["active"]], [x for e in entries for x in e["inactive"]],
                      at_id, lambda j: at_id(int(owner[j])))
