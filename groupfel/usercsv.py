"""The one reader of users' CSV files: calibration timings, cost profiles, label matrices.

A file saved by a spreadsheet reads exactly like a plain one: a UTF-8 byte-order mark and CRLF
line ends are dropped, cells and header names are stripped, ``#`` comment lines and blank lines
skipped (measurement files record the machine there). Each row keeps its data-row number and its
line in the file, so every message can name both. Numbers must be finite, and rows that give the
same key twice are refused naming both rows (:meth:`CsvTable.unique`).

Plain csv module, no pandas: ``groupfel group`` reads a label matrix and must start fast.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from groupfel.errors import InputError
from groupfel.userfile import read_bytes, short


@dataclass(frozen=True, slots=True)
class Row:
    cells: dict[str, str]
    n: int        # 1-based data-row number (the header is row 0)
    line: int     # 1-based line in the file

    def get(self, column: str, default: str = "") -> str:
        return self.cells.get(column, default)


@dataclass(frozen=True)
class CsvTable:
    source: str
    header: list[str]
    rows: list[Row]

    def where(self, row: Row) -> str:
        return f"{self.source} row {row.n}"

    def require(self, columns: tuple[str, ...] | set[str], needs: str) -> None:
        """Refuse a file without ``columns``, hinting at a ';' separator (a spreadsheet's locale)."""
        missing = [c for c in columns if c not in self.header]
        if missing:
            hint = ""
            if len(self.header) == 1 and ";" in self.header[0]:
                hint = " (the header is separated by ';': save it with commas)"
            names = ", ".join(repr(c) for c in missing)
            raise InputError(f"{self.source}: missing column{'s' if len(missing) > 1 else ''} {names}{hint}; "
                             f"the header needs {needs}")

    def number(self, row: Row, column: str, *, required: bool = True) -> float | None:
        """A finite number from ``row[column]`` (None for an empty cell that is not ``required``)."""
        cell = row.get(column)
        if cell == "" and not required:
            return None
        try:
            value = float(cell)
        except ValueError:
            raise InputError(f"{self.where(row)}: column '{column}' must be a number, got {short(cell)}") from None
        if not math.isfinite(value):
            raise InputError(f"{self.where(row)}: column '{column}' must be a finite number, got {short(cell)}; "
                             f"fix or delete the row")
        return value

    def unique(self, key: tuple[str, ...], what: str) -> None:
        """Refuse two rows with the same ``key`` cells, naming both (e.g. one device, task, operation
        and method with two curves: which one counts would depend on the order)."""
        seen: dict[tuple[str, ...], Row] = {}
        for row in self.rows:
            k = tuple(row.get(c) for c in key)
            if k in seen:
                first = seen[k]
                raise InputError(f"{self.source}: rows {first.n} (line {first.line}) and {row.n} (line {row.line}) "
                                 f"both give the {what} {'/'.join(k)}; keep one of them")
            seen[k] = row


def read_user_csv(path: str | Path, what: str = "") -> CsvTable:
    """Read a user's CSV file (see the module docstring); ``what`` names it in messages
    (e.g. ``"--label-matrix data.csv"``; default: the path)."""
    path = Path(path)
    source = what or str(path)
    raw = read_bytes(path, source, "a CSV file", "table")
    try:
        text = raw.decode("utf-8-sig")   # drops a byte-order mark
    except UnicodeDecodeError:
        try:   # a spreadsheet's UTF-16 export starts with its own byte-order mark
            text = raw.decode("utf-16") if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            raise InputError(f"{source}: not a UTF-8 text file; save it as 'CSV UTF-8' (comma-separated)") from None
    lines = text.splitlines()
    del text, raw
    starts: list[int] = []     # the line each record the csv module is parsing started on

    def records():      # streamed: no copy of the file joined again, no list of parsed records
        for i, ln in enumerate(lines, start=1):
            if ln.strip() and not ln.lstrip().startswith("#"):
                starts.append(i)
                yield ln + "\n"

    header: list[str] | None = None
    rows = []
    try:
        for cells in csv.reader(records()):
            line = starts[0]
            starts.clear()
            if header is None:
                header = [c.strip() for c in cells]
                continue
            n = len(rows) + 1
            if len(cells) > len(header) and any(c.strip() for c in cells[len(header):]):
                raise InputError(f"{source} row {n}: {len(cells)} cells but the header has {len(header)}; "
                                 f"give every row one cell per header column")
            rows.append(Row({h: (cells[i].strip() if i < len(cells) else "") for i, h in enumerate(header)}, n, line))
    except csv.Error as exc:
        raise InputError(f"{source}: not a readable CSV ({exc}); write a header line and one row per line") from None
    if header is None:
        raise InputError(f"{source}: the file is empty; write a CSV: a header line and one row per line")
    return CsvTable(source, header, rows)
