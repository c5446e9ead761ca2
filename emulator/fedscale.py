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
import json
import math
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from groupfel.errors import InputError
from groupfel.usercsv import read_user_csv

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
    files have no suffix)."""
    p = Path(path)
    src = f"{where}: {path}"
    if p.is_dir():
        raise InputError(f"{src}: is a directory; give the trace file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{src}: cannot read ({exc.strerror}); check the path") from None
    if p.suffix.lower() == ".json":
        try:
            return json.loads(raw.decode("utf-8-sig"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"{src}: not valid JSON ({exc}); write the dict of client id -> entry") from None
    try:
        return _SafeUnpickler(io.BytesIO(raw)).load()
    except _Refused as exc:
        raise InputError(f"{src}: the pickle refers to {exc}, which groupfel does not load (a pickle can run "
                         f"code; only dicts, lists, numbers and strings are read); convert it to JSON or CSV "
                         f"(see the network guide)") from None
    except Exception as exc:   # a damaged or foreign file: whatever the unpickler trips on, one line
        raise InputError(f"{src}: not a readable pickle ({type(exc).__name__}: {exc}); give FedScale's "
                         f"pickle, or the same data as .json or .csv") from None


def _entries(path: str, where: str, what: str) -> list[tuple[str, str, object]]:
    """(id, how messages name it, entry) of a pickle's or JSON's dict."""
    data = _load(path, where)
    if not isinstance(data, dict) or not data:
        got = "an empty dict" if isinstance(data, dict) else f"a {type(data).__name__}"
        raise InputError(f"{where}: {path}: holds {got}; give a dict of client id -> {what}")
    out, seen = [], {}
    for key, entry in data.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)) or not str(key).strip():
            raise InputError(f"{where}: {path}: entry key {key!r} is not a client id; use integers or strings")
        cid = str(key).strip()
        if cid in seen:
            raise InputError(f"{where}: {path}: client id {cid!r} appears twice ({seen[cid]!r} and {key!r}); keep one")
        seen[cid] = key
        out.append((cid, f"{where}: {path}: client id {cid!r}", entry))
    return out


def _number(value, at: str, name: str, unit: str, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > lo if lo_open else value >= lo) and value <= hi:
        return float(value)
    low = f"above {lo:g}" if lo_open else f"from {lo:g}"
    raise InputError(f"{at}: {name} = {value!r}; give a number {low} to {hi:g} {unit} (fix or delete the entry)")


def _csv_number(table, row, column: str) -> float:
    cell = row.get(column)
    try:
        return float(cell)
    except ValueError:
        raise InputError(f"{table.where(row)}: column '{column}' must be a number, got {cell!r}") from None


def sorted_ids(ids) -> list[str]:
    """Numeric order where every id is an integer (FedScale's are), else string order: a pickle's
    int keys and the same keys read from JSON or CSV as strings sort alike."""
    ids = list(ids)
    if all(re.fullmatch(r"[+-]?\d+", i) for i in ids):
        return sorted(ids, key=int)
    return sorted(ids)


def assign(n_trace: int, n_clients: int) -> np.ndarray:
    """The trace entry (index into the sorted ids) of each of our clients 0..n−1: the first
    n ids in order; where the trace has fewer, it cycles (client c takes entry c mod M, as
    FedScale cycles its own: aggregator.py maps client j to profile j mod M)."""
    return np.arange(n_clients) % n_trace


# -- the device-capacity trace -------------------------------------------------------------------

@dataclass(frozen=True)
class Capacity:
    ids: list[str]                 # sorted (see sorted_ids)
    ms_per_sample: np.ndarray      # FedScale's "computation"
    kbps: np.ndarray               # FedScale's "communication", 1024-bit kbit/s
    at: list[str]                  # how messages name each entry


def read_capacity(path: str, where: str) -> Capacity:
    rows: dict[str, tuple[float, float, str]] = {}
    if Path(path).suffix.lower() == ".csv":
        table = read_user_csv(path, f"{where}: {path}")
        table.require(CAPACITY_CSV, ", ".join(CAPACITY_CSV))
        table.unique(("client_id",), "client id")
        for row in table.rows:
            at = f"{table.where(row)} (client id {row.get('client_id')!r})"
            if not row.get("client_id"):
                raise InputError(f"{table.where(row)}: empty client_id; give every row an id")
            comp, comm = _csv_number(table, row, "computation"), _csv_number(table, row, "communication")
            rows[row.get("client_id")] = (_number(comp, at, "computation", "ms per sample", 0, 1e9, True),
                                          _number(comm, at, "communication", "kbit/s", 0, 1e12, True), at)
    else:
        for cid, at, entry in _entries(path, where, "{'computation': ms per sample, 'communication': kbit/s}"):
            if not isinstance(entry, dict) or not {"computation", "communication"} <= set(entry):
                raise InputError(f"{at}: the entry is {repr(entry)[:80]}; give {{'computation': ms per sample, "
                                 f"'communication': kbit/s}}")
            rows[cid] = (_number(entry["computation"], at, "computation", "ms per sample", 0, 1e9, True),
                         _number(entry["communication"], at, "communication", "kbit/s", 0, 1e12, True), at)
    ids = sorted_ids(rows)
    return Capacity(ids, np.array([rows[i][0] for i in ids]), np.array([rows[i][1] for i in ids]),
                    [rows[i][2] for i in ids])


# -- the behaviour (availability) trace ----------------------------------------------------------

@dataclass(frozen=True)
class Behaviour:
    ids: list[str]
    intervals: list[list[tuple[float, float]]]   # online [start, end) within [0, period), sorted
    period_s: np.ndarray                          # FedScale's finish_time: the trace repeats


def _intervals(active, inactive, finish, at: str) -> tuple[list[tuple[float, float]], float]:
    period = _number(finish, at, "finish_time", "s", 0, MAX_TIME_S, True)
    if not isinstance(active, (list, tuple)) or not isinstance(inactive, (list, tuple)):
        raise InputError(f"{at}: active and inactive must be lists of seconds; got {type(active).__name__} and "
                         f"{type(inactive).__name__}")
    if len(active) != len(inactive):
        raise InputError(f"{at}: active has {len(active)} times but inactive has {len(inactive)}; give one "
                         f"inactive time per active time")
    iv = []
    for a, b in zip(active, inactive):
        a = _number(a, at, "active time", "s", 0, MAX_TIME_S)
        b = _number(b, at, "inactive time", "s", 0, MAX_TIME_S)
        if b < a:
            raise InputError(f"{at}: online from {a:g} s until {b:g} s is reversed; each inactive time must "
                             f"follow its active time")
        # FedScale reads time modulo finish_time, so what lies beyond it is never reached
        if a < period and min(b, period) > a:
            iv.append((a, min(b, period)))
    iv.sort()
    for (a0, b0), (a1, b1) in zip(iv, iv[1:]):
        if a1 < b0:
            raise InputError(f"{at}: online intervals [{a0:g}, {b0:g}) and [{a1:g}, {b1:g}) overlap; merge them")
    return iv, period


def read_behaviour(path: str, where: str) -> Behaviour:
    got: dict[str, tuple[list, float]] = {}
    if Path(path).suffix.lower() == ".csv":
        table = read_user_csv(path, f"{where}: {path}")
        table.require(BEHAVIOUR_CSV, ", ".join(BEHAVIOUR_CSV) + " (one row per online interval)")
        per: dict[str, tuple[list, list, float, str, object]] = {}
        for row in table.rows:
            cid = row.get("client_id")
            if not cid:
                raise InputError(f"{table.where(row)}: empty client_id; give every row an id")
            at = f"{table.where(row)} (client id {cid!r})"
            finish = _csv_number(table, row, "finish_time")
            if cid in per and per[cid][2] != finish:
                first = per[cid][4]
                raise InputError(f"{at}: finish_time {finish:g} differs from row {first.n}'s {per[cid][2]:g}; "
                                 f"give one finish_time per client")
            act, ina, _, _, first = per.setdefault(cid, ([], [], finish, at, row))
            act.append(_csv_number(table, row, "active"))
            ina.append(_csv_number(table, row, "inactive"))
        for cid, (act, ina, finish, at, _) in per.items():
            got[cid] = _intervals(act, ina, finish, at)
    else:
        for cid, at, entry in _entries(path, where, "{'active': [s], 'inactive': [s], 'finish_time': s}"):
            if not isinstance(entry, dict) or not {"active", "inactive", "finish_time"} <= set(entry):
                raise InputError(f"{at}: the entry is {repr(entry)[:80]}; give {{'active': [s, ...], "
                                 f"'inactive': [s, ...], 'finish_time': s}}")
            got[cid] = _intervals(entry["active"], entry["inactive"], entry["finish_time"], at)
    ids = sorted_ids(got)
    return Behaviour(ids, [got[i][0] for i in ids], np.array([got[i][1] for i in ids]))
