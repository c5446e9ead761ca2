"""The per-client CSVs of the network keys (heterogeneity, availability): one reader, each
column's bounds, client ids, every client present."""
from __future__ import annotations

import math

from groupfel.errors import InputError
from groupfel.userfile import short
from groupfel.usercsv import read_user_csv

from ..config import DAY_S

def read_csv(path: str, where: str, columns: tuple[str, ...], optional: tuple[str, ...] = ()
              ) -> tuple[list[str], list[tuple[int, dict]]]:
    """A per-client table through the one reader of users' files (a spreadsheet's BOM and CRLF
    read like a plain file): its header and (line, row) pairs."""
    table = read_user_csv(path, f"{where}: {path}")
    table.require(columns, f"{', '.join(columns)} (optional: {', '.join(optional) or '-'})")
    return table.header, [(row.line, row.cells) for row in table.rows]


# each CSV column's bounds: the config's (docs/guide/config.md, "Limits")
BOUNDS = {"bandwidth_mbps": (1e-6, 1e9, "Mbit/s"), "latency_s": (0.0, DAY_S, "s"),
           "slowdown": (1e-3, 1e3, ""), "cpu_share": (1e-3, 1.0, "of a core"), "cpu_period_s": (1e-3, 1.0, "s"), "start_s": (0.0, 1e12, "s"), "end_s": (0.0, 1e12, "s")}


def number(row: dict, col: str, where: str, line: int) -> float:
    lo, hi, unit = BOUNDS[col]
    try:
        v = float(row[col])
    except (TypeError, ValueError):
        v = math.nan
    if not lo <= v <= hi:    # NaN fails too
        raise InputError(f"{where}: line {line}: {col} = {short(row.get(col))}; give a number from {lo:g} to {hi:g}"
                         f"{' ' + unit if unit else ''}")
    return v


def client_id(row: dict, where: str, line: int, n: int) -> int:
    try:
        c = int(row["client"])
    except (TypeError, ValueError):
        c = -1
    if not 0 <= c < n:
        raise InputError(f"{where}: line {line}: unknown client {short(row.get('client'))}; the topology's clients are 0..{n - 1}")
    return c


def require_every_client(seen: set[int], n: int, where: str, path: str) -> None:
    if len(seen) != n:
        missing = sorted(set(range(n)) - seen)
        raise InputError(f"{where}: {path} has no row for client(s) {', '.join(map(str, missing[:5]))}"
                         f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of {n}); give every client a row")
