"""Reading back what a run wrote: every file of a run or sweep directory (config.json,
manifest.json, results.csv/parquet, ledger.parquet, sweep.json, clusters.json) is parsed inside a
check. A file damaged by a copy, a sync tool or a hand edit gets one line naming it and what to do,
never a parser's traceback; :func:`intact_arm` tells a rerun which arms to redo (only those).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from groupfel.errors import InputError
from groupfel.userfile import check_file, clip, parse_json
from groupfel.policies.plugins import upgrade_saved

RERUN = ("rerun the same command (or 'groupfel run --resume {run}'): the damaged arm is redone and the "
         "others are kept")


class DamagedFile(InputError):
    """A file groupfel wrote earlier no longer parses."""


def _run_of(path: Path) -> Path:
    """The top run or sweep directory above a file (the highest of its three nearest ancestors
    holding a config.json or sweep.json)."""
    top = path.parent
    for parent in list(path.parents)[:4]:
        if (parent / "config.json").exists() or (parent / "sweep.json").exists():
            top = parent
    return top


def damaged(path: str | Path, reason: str, fix: str | None = None) -> DamagedFile:
    path = Path(path)
    return DamagedFile(f"{path}: damaged ({reason}); " + (fix or RERUN.format(run=_run_of(path))))


def _gate(path: Path, fix: str | None) -> None:
    """A run's file through the gate of users' files (a regular file, within the size limit)."""
    if not path.exists() and not path.is_symlink():
        raise damaged(path, "missing", fix)
    check_file(path, str(path), "the file groupfel wrote", "run")


def load_json(path: str | Path, fix: str | None = None) -> Any:
    path = Path(path)
    _gate(path, fix)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise damaged(path, "missing", fix) from None
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text", fix) from None
    try:
        data = parse_json(text, str(path))
    except json.JSONDecodeError as exc:
        raise damaged(path, f"not valid JSON: {exc.msg}, line {exc.lineno} column {exc.colno}", fix) from None
    except ValueError as exc:     # a number beyond Python's 4,300 digits
        if isinstance(exc, InputError):
            raise
        raise damaged(path, f"not valid JSON: {clip(str(exc), 200)}", fix) from None
    if not isinstance(data, dict):   # every file groupfel writes holds one JSON object
        raise damaged(path, f"a JSON {type(data).__name__} where groupfel writes an object", fix)
    # a directory written before groupfel's modules moved beneath groupfel names them the old way
    return upgrade_saved(data)


def load_csv(path: str | Path, fix: str | None = None):
    import pandas as pd

    path = Path(path)
    _gate(path, fix)
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise damaged(path, "missing", fix) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise damaged(path, f"not a readable table: {clip(str(exc).splitlines()[0] or type(exc).__name__, 200)}", fix) from None
    if df.empty:
        raise damaged(path, "no rows", fix)
    if not csv_intact(path):   # pandas pads a short (truncated) row with NaN
        raise damaged(path, "not a readable table: a row with fewer cells than the header (truncated?)", fix)
    return df


def load_parquet(path: str | Path, fix: str | None = None):
    import pandas as pd

    path = Path(path)
    _gate(path, fix)
    try:
        return pd.read_parquet(path)
    except FileNotFoundError:
        raise damaged(path, "missing", fix) from None
    except Exception as exc:   # pyarrow's errors for a truncated or foreign file have no common base
        raise damaged(path, f"not a readable Parquet file ({type(exc).__name__})", fix) from None


def _regular(path: Path) -> bool:
    try:
        check_file(path, str(path), "a file", "run")
        return True
    except InputError:
        return False


def parquet_intact(path: Path) -> bool:
    """The file's footer parses (cheap: the metadata only)."""
    if not _regular(path):
        return False
    try:
        import pyarrow.parquet as pq

        pq.read_metadata(path)
        return True
    except Exception:
        return False


def csv_intact(path: Path) -> bool:
    """A header and at least one row of as many cells (cheap: the csv module)."""
    import csv

    if not _regular(path):
        return False
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows[1:])


def complete_manifest(arm_dir: Path) -> dict | None:
    """An arm's manifest if it parses and says the arm is complete, else None."""
    path = Path(arm_dir) / "manifest.json"
    if not _regular(path):
        return None
    try:
        m = parse_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError):     # a JSONDecodeError or UnicodeDecodeError is one
        return None
    return m if isinstance(m, dict) and m.get("complete") else None


def intact_arm(arm_dir: Path) -> bool:
    """Whether a finished arm's files all parse: its manifest (complete), results.csv,
    results.parquet and ledger.parquet. A rerun redoes an arm that is not intact, only that one."""
    arm_dir = Path(arm_dir)
    return (complete_manifest(arm_dir) is not None and csv_intact(arm_dir / "results.csv")
            and parquet_intact(arm_dir / "results.parquet") and parquet_intact(arm_dir / "ledger.parquet"))
