"""Live experiment tracking: every evaluated round of every (seed, arm) run of a run, a study or a
sweep logged to TensorBoard or MLflow while it goes.

The tracker reads the results on disk: each arm's ``results.csv`` is rewritten at every evaluation
on every backend (the pool's workers write it, Ray's driver lands it, a stack's runs write theirs),
so it looks every ``track.every_s`` seconds and logs the rows it has not logged yet. TensorBoard's
tracker is a thread of the driver; MLflow's is a process of its own beside it
(``groupfel.experiments.track_agent``), so that MLflow's import, its store and its calls take no
time from the run's process, which waits for it only at the end while it logs the study's summary.
It never writes a result: tracking on or off, every output is the same.

Per arm and seed, one tracker run (MLflow: a child of the study's run; TensorBoard: a run folder
``<seed>/<arm>`` beneath the study's log folder) gets every column of ``results.csv`` with the
round as the step, ``accuracy_by_cost`` and ``loss_by_cost`` with the Eq. 5 cost (rounded to a
whole unit) as the step, the resolved config as params / hparams, and its final row; the study's
run gets the summary table, the verdicts, and (MLflow) the plots and report.html as artifacts.

Resumable: ``track.json`` in the run folder records the tracker, its runs and the last step logged
of each series, written after the tracker has the rows. A killed run resumed logs from the step
after the record, so no step is missing; none is logged twice: a TensorBoard writer reopens with
``purge_step`` (TensorBoard's readers drop events logged after the record), and MLflow's last steps
are read back from the tracker. A finished run rerun logs nothing. A tracker failing mid-run is
warned about once and dropped; the run goes on and a rerun logs what is missing.

mlflow and tensorboard are optional (``pip install 'groupfel[track]'``) and imported only when a
run tracks (mlflow only in the tracker's process): this module's top level imports neither, nor
pandas or pydantic.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from groupfel.errors import InputError

TRACKERS = ("tensorboard", "mlflow")
STATE = "track.json"
TB_DIR = "tensorboard"
BY_COST = ("accuracy", "loss")       # the series also logged against the Eq. 5 cost
NOT_METRICS = ("arm", "seed", "round")
INSTALL = "pip install 'groupfel[track]'"
CONNECT_TIMEOUT_S = 5.0
RESULTS_DEPTH = 3                    # arm/, seed-s/arm/, point/seed-s/arm/


class TrackWarning(UserWarning):
    """The tracker failed or was skipped; the run's own results are unaffected."""


# ---- command line -------------------------------------------------------------------------------

def add_track_arguments(parser) -> None:
    parser.add_argument("--track", choices=[*TRACKERS, "none"],
                        help="log every evaluated round, the config and the verdicts to TensorBoard (under the run "
                             "folder's tensorboard/) or MLflow (MLFLOW_TRACKING_URI) as the runs go; none: do not, "
                             "even where the run folder was tracked before (default: the config's [track], else "
                             "the run folder's own)")
    parser.add_argument("--track-optional", action="store_true",
                        help="a tracker that cannot be reached at the start: run without it, with a warning "
                             "(default: refuse the run)")


def from_args(args) -> str | dict | None:
    """What ``--track`` and ``--track-optional`` ask for, as :func:`open_session` takes it."""
    if args.track == "none":
        return "none"
    out = {**({"tracker": args.track} if args.track else {}), **({"optional": True} if args.track_optional else {})}
    return out or None


# ---- which tracker ------------------------------------------------------------------------------

def resolve(asked: Any, configured: Any, root: Path) -> Any:
    """The tracking in effect (a TrackConfig, or None): ``asked`` (``--track`` / the API's ``track``:
    a tracker's name, a dict of ``[track]`` keys, a TrackConfig, or "none") over the config's
    ``[track]``; without either, the run folder's own (a resumed run keeps its tracker)."""
    from groupfel.emulator.config import TrackConfig

    if isinstance(asked, str) and asked == "none":
        return None
    if isinstance(asked, TrackConfig):
        return asked
    if isinstance(asked, str):
        asked = {"tracker": asked}
    if asked is not None and not isinstance(asked, dict):
        raise InputError(f"track: expected tensorboard, mlflow, none, a dict of [track] keys or a TrackConfig, "
                         f"got {type(asked).__name__}")
    if asked is None:
        return configured if configured is not None else _recorded(root)
    base = configured.model_dump() if configured is not None and \
        asked.get("tracker", configured.tracker) == configured.tracker else {}
    merged = {**base, **asked}
    if "tracker" not in merged:
        raise InputError("--track-optional: needs --track tensorboard|mlflow (or a [track] table in the config)")
    return _parse(merged)


def _parse(raw: dict):
    from pydantic import ValidationError

    from groupfel.emulator.config import TrackConfig, _one_line

    try:
        return TrackConfig.model_validate(raw)
    except ValidationError as exc:
        raise InputError(_one_line(exc, "track")) from None


def _recorded(root: Path):
    state = _read_state(root)
    last = state.get("last") if state else None
    if not isinstance(last, dict):
        return None
    try:
        return _parse(last)
    except InputError:
        return None


def _read_state(root: Path) -> dict:
    path = Path(root) / STATE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):   # none yet, or damaged: logging starts over (TensorBoard purges, MLflow anew)
        return {}
    return data if isinstance(data, dict) else {}


# ---- a session ------------------------------------------------------------------------------------

def open_session(asked: Any, configured: Any, root: Path, *, force: bool = False) -> Session | None:
    """The tracking session of the run, sweep or study in ``root`` (None when off). A missing
    library or a tracker that cannot be reached (nothing answers at its URI, no folder for its
    store) is refused here, before any work, in one line (or, with ``optional``, skipped after a
    warning); MLflow's process then opens it while the run starts."""
    settings = resolve(asked, configured, Path(root))
    if settings is None:
        return None
    try:
        (_TensorBoard if settings.tracker == "tensorboard" else _MLflow).check(settings, Path(root))
    except InputError as exc:
        if not settings.optional:
            raise
        warnings.warn(f"{exc}; running without tracking (track.optional)", TrackWarning, stacklevel=2)
        return None
    host = _ThreadSession if settings.tracker == "tensorboard" else _ProcessSession
    return host(settings, Path(root), force=force)


AGENT = "groupfel.experiments.track_agent"   # MLflow's tracker process
AGENT_WAIT_S = 900.0   # the most the run waits at its end for the tracker (MLflow's HTTP retries are bounded)


class Session:
    """The run's side of tracking: ``with session:`` while the runs go, then :meth:`finish`. Where
    the :class:`Tracker` lives is the tracker's: TensorBoard's writer in a thread of the run's own
    process (it appends to local files, and torch, which holds it, is loaded there already);
    MLflow's client in a process of its own (its import, its store and every call to it, and
    report.html, take no time from the run's process)."""

    stats: dict   # the tracker's process's CPU seconds and the run's wait for it at the end (MLflow's)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        pass

    def finish(self, summary, text: str) -> None:
        """Log the study's summary table and verdicts (``text``) and, with MLflow, its plots and
        report.html, once per change of its tables: a finished run rerun logs nothing."""


def _warn(text: str) -> None:
    warnings.warn(text, TrackWarning, stacklevel=2)


class _ThreadSession(Session):
    """The tracker in a thread that looks every ``every_s``, then once more when the runs end."""

    def __init__(self, settings, root: Path, *, force: bool = False):
        self.tracker = Tracker(settings, root, force=force, warn=_warn)
        self.stats = {}
        self.every_s = settings.every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Session:
        # what a resumed run has already, logged before the run starts: a writer's first import
        # (torch.utils.tensorboard) must not race the run's own import of torch from another thread;
        # new rows appear only once the run has imported torch
        self.tracker.sync()
        self._thread = threading.Thread(target=self._loop, name="groupfel-track", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.tracker.sync()   # what the runs finished last (or before an interruption)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tracker.sync()

    def finish(self, summary, text: str) -> None:
        self.tracker.finish(summary.to_string(index=False), text)


class _ProcessSession(Session):
    """The tracker in :mod:`groupfel.experiments.track_agent`, started here; at the end it is handed
    the study's summary and waited for while it logs it. Its warnings reach the run's as
    :class:`TrackWarning` as they happen."""

    def __init__(self, settings, root: Path, *, force: bool = False):
        self.stats = {}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, encoding="utf-8", env={**os.environ, "PYTHONWARNINGS": "ignore"})
        self._send({"settings": settings.model_dump(mode="json"), "root": str(root), "force": force})
        self._reader = threading.Thread(target=self._read, name="groupfel-track", daemon=True)
        self._reader.start()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:   # interrupted: what the runs finished last is logged, then the tracker stops
            self._end({"cmd": "stop"})

    def finish(self, summary, text: str) -> None:
        self._end({"cmd": "finish", "summary": summary.to_string(index=False), "text": text})

    def _send(self, message: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):   # the tracker has gone: its reader warns
            pass

    def _end(self, message: dict) -> None:
        if self._proc.stdin.closed:
            return
        self._send(message)
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        _unidle(self._proc.pid)
        try:
            self._proc.wait(AGENT_WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join()

    def _read(self) -> None:
        done = False
        for line in self._proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "warn" in message:
                _warn(message["warn"])
            if "done" in message:
                done, self.stats = True, message["done"]
        code = self._proc.wait()
        if not done and code != 0:
            _warn(f"track: the tracker's process ended (exit {code}); the run goes on without tracking and its "
                  f"results are complete; rerun the same command to log what is missing")


def _unidle(pid: int) -> None:
    """The tracker's process back in the normal scheduling class, every thread of it, once the run
    waits on it: left idle, the run's end would wait for cores that other work keeps busy (and on
    such a machine an idle tracker has not even opened its store yet). Allowed to root, or where
    ``ulimit -e`` is 20 or more; elsewhere it stays idle."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:   # gone, or not allowed
            pass


class Tracker:
    """Logs the rows of ``root``'s arms as they appear (:meth:`sync`, called every ``every_s`` by
    its session's thread or process), then :meth:`finish` logs the study's summary. Every call to
    the tracker goes through :meth:`_guard`: a failure is reported once (``warn``) and tracking
    stops, never the run."""

    def __init__(self, settings, root: Path, *, force: bool = False, warn: Callable[[str], None]):
        self.settings, self.root, self.warn = settings, root, warn
        self.broken = False
        try:
            self.backend = (_TensorBoard if settings.tracker == "tensorboard" else _MLflow)(settings, root)
        except Exception as exc:   # the store's own errors, past the run's checks: one line, then none
            self.broken = True
            line = str(exc) if isinstance(exc, InputError) else \
                f"track: cannot use {settings.tracker} ({type(exc).__name__}: {_first(exc)})"
            warn(f"{line}; the run goes on without tracking and its results are complete"
                 if not settings.optional else f"{line}; running without tracking (track.optional)")
            return
        state = {} if force else _read_state(root)
        self.key = f"{settings.tracker} {self.backend.where}"
        logs = state.get("logs") if isinstance(state.get("logs"), dict) else {}
        self.state = {"last": settings.model_dump(), "logs": logs}
        self.log = logs.setdefault(self.key, {})
        self.log.setdefault("runs", {})
        self.backend.state = self.log
        self._seen: dict[str, int] = {}      # results.csv -> the modification stamp last read
        self._dirty = False

    def sync(self) -> None:
        """Log every row not logged yet of every arm under ``root``; close the runs of finished arms."""
        if self.broken:
            return
        self._guard(self._sync)
        if self._dirty:
            self._save()

    def _sync(self) -> None:
        from groupfel.emulator.runfiles import complete_manifest

        runs = self.log["runs"]
        for results in _results_files(self.root):
            arm_dir = results.parent
            name = arm_dir.relative_to(self.root).as_posix()
            run = runs.get(name)
            if run is not None and run.get("done"):
                continue
            try:
                stamp = results.stat().st_mtime_ns
            except OSError:
                continue
            done = complete_manifest(arm_dir) is not None   # before the rows: a complete arm's rows are final
            if self._seen.get(name) == stamp and not done:
                continue
            self._seen[name] = stamp
            rows = _read_rows(results)
            if not rows:
                continue
            if run is None:
                run = runs[name] = {"round": -1, "cost": -1}
                self.backend.open_run(name, run, _arm_params(arm_dir), _arm_tags(name))
                self._dirty = True
            elif not run.get("checked"):
                self.backend.resume_run(name, run)   # what the tracker holds beyond the record
            run["checked"] = True
            new = [r for r in rows if r["round"] > run["round"]]
            by_cost = [r for r in rows if _cost_step(r) > run["cost"]]
            if new or by_cost:
                self.backend.log_rows(name, run, new, by_cost)
                if new:
                    run["round"] = int(new[-1]["round"])
                if by_cost:
                    run["cost"] = max(_cost_step(r) for r in by_cost)
                self._dirty = True
            if done:
                self.backend.end_run(name, run, rows[-1])
                run["done"] = True
                self._dirty = True
        self.backend.flush()

    def finish(self, summary: str, text: str, report: Callable[[Path], Any] | None = None) -> None:
        """Log the study's summary table (``summary``, as text) and verdicts (``text``) and, with
        MLflow, its plots and report.html (``report`` writes it to the path it is given), once per
        change of its tables: a finished run rerun logs nothing."""
        if self.broken:
            return
        digest = _tables_digest(self.root)
        if self.log.get("summary") == digest:
            self._guard(self.backend.close)
            return

        def log():
            self.backend.log_study(summary, text, _study_files(self.root), _final_rows(self.root), report)
            self.log["summary"] = digest
            self._dirty = True

        self._guard(log)
        if self._dirty:
            self._save()
        self._guard(self.backend.close)

    def log_finals(self) -> None:
        """Log each run's headline row as soon as the runner has written it (per_seed.csv, before
        the study's statistics and plots), so that :meth:`finish` does not wait for it. A row
        logged already is not logged again; TensorBoard logs them in :meth:`finish`."""
        if self.broken or not hasattr(self.backend, "log_finals"):
            return
        finals = _final_rows(self.root)
        if finals:
            self._guard(lambda: self.backend.log_finals(finals))
            if self.backend.logged_finals:
                self._dirty = True
                self._save()

    def _guard(self, call: Callable[[], None]) -> None:
        if self.broken:
            return
        try:
            call()
        except Exception as exc:   # a tracker's failure must never cost the run: report once, stop tracking
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if self.broken:
            return
        self.broken = True
        self.warn(f"track: {self.settings.tracker} at {self.backend.where} failed ({type(exc).__name__}: "
                  f"{_first(exc)}); the run goes on without tracking and its results are complete; rerun the "
                  f"same command to log what is missing")

    def _save(self) -> None:
        """The record of what the tracker holds, written after it holds it."""
        from groupfel.emulator.io import write_json

        runs = {k: {f: v for f, v in r.items() if f != "checked"} for k, r in self.log["runs"].items()}
        out = {"last": self.state["last"], "logs": {**self.state["logs"], self.key: {**self.log, "runs": runs}}}
        try:   # also after a failure: what the tracker got before it stays recorded
            write_json(self.root / STATE, out)
            self._dirty = False
        except OSError as exc:
            self._failed(exc)


def _first(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


# ---- reading the run folder ----------------------------------------------------------------------

def _results_files(root: Path) -> list[Path]:
    found = []
    for depth in range(1, RESULTS_DEPTH + 1):
        found += sorted(root.glob("/".join(["*"] * depth) + "/results.csv"))
    return [p for p in found if TB_DIR not in p.relative_to(root).parts[:1]]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _read_rows(path: Path) -> list[dict]:
    """The rows of a results.csv: ``round`` an int, every other numeric column a float."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            raw = list(csv.DictReader(f))
    except (OSError, ValueError):
        return []
    rows = []
    for r in raw:
        row = {k: _number(v) for k, v in r.items() if k not in ("arm", "seed") and v not in ("", None)}
        row = {k: v for k, v in row.items() if v is not None}
        if "round" in row:
            row["round"] = int(row["round"])
            rows.append(row)
    return rows


def _cost_step(row: dict) -> int:
    cost = row.get("cost")
    return int(round(cost)) if cost is not None and math.isfinite(cost) else -1


def metrics_of(row: dict) -> dict[str, float]:
    """The values a row logs with the round as the step: every numeric column but the round."""
    return {k: v for k, v in row.items() if k not in NOT_METRICS}


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        out = {}
        for i, v in enumerate(node):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    value = json.dumps(node) if isinstance(node, (list, type(None))) else node
    return {prefix.rstrip("."): value}


def _arm_params(arm_dir: Path) -> dict[str, Any]:
    """The resolved config of an arm's run: its seed's config.json beside it, the arm's own table as
    ``arm.*`` and the others' left out."""
    try:
        raw = json.loads((arm_dir.parent / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    arms = raw.pop("arms", [])
    arm = next((a for a in arms if isinstance(a, dict) and a.get("name") == arm_dir.name), {})
    return {**_flat(raw), **_flat(arm, "arm.")}


def _arm_tags(name: str) -> dict[str, str]:
    parts = name.split("/")
    tags = {"groupfel.arm": parts[-1]}
    for p in parts[:-1]:
        if p.startswith("seed-"):
            tags["groupfel.seed"] = p.removeprefix("seed-")
        else:
            tags["groupfel.point"] = p
    return tags


def _tables_digest(root: Path) -> str:
    h = hashlib.sha256()
    for name in ("summary.csv", "per_seed.csv", "looks.json"):
        path = root / name
        if path.is_file():
            h.update(name.encode() + path.read_bytes())
    return h.hexdigest()


def _study_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_file() and (p.suffix in (".png", ".html") or p.name in (
        "summary.csv", "per_seed.csv", "points.csv", "looks.json", "curves.csv")))


def _per_seed_tables(root: Path) -> list[Path]:
    return [*root.glob("per_seed.csv"), *root.glob("*/per_seed.csv")]


def final_tables(root: Path) -> list[Path]:
    """The tables :func:`_final_rows` reads: per_seed.csv of a multi-seed run or of each sweep
    point, and a single-seed run's summary.csv."""
    return [*_per_seed_tables(root), *root.glob("summary.csv")]


def _final_rows(root: Path) -> dict[str, dict]:
    """Each (seed, arm) run's headline row: per_seed.csv of a multi-seed run (or of each sweep
    point), summary.csv of a single-seed run."""
    out: dict[str, dict] = {}
    for path in sorted(_per_seed_tables(root)):
        prefix = path.parent.relative_to(root).as_posix()
        for r in _csv_dicts(path):
            name = f"seed-{r.get('seed')}/{r.get('arm')}"
            out[name if prefix == "." else f"{prefix}/{name}"] = r
    if not out and (root / "summary.csv").is_file() and not (root / "seed-0").exists():
        out = {r.get("arm"): r for r in _csv_dicts(root / "summary.csv")}
    return out


def _csv_dicts(path: Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (OSError, ValueError):
        return []


def study_text(summary, config) -> str:
    """A run's or study's verdicts as ``groupfel run`` prints them."""
    if config.seeds is None:
        return summary.to_string(index=False)
    from .stats import conclusion, render_summary

    target = config.train.target_accuracy
    return f"{render_summary(summary, target)}\n\n{conclusion(summary, target)}"


def sweep_text(summary) -> str:
    from .axes import opening_sentence
    from .stats import compact_summary

    with_target = bool(summary["target_reached"].sum() > 0 or summary["cost_to_target_mean"].notna().any())
    return (opening_sentence(summary, summary.attrs["axes"], summary.attrs["reference"]) + "\n\n"
            + compact_summary(summary, ["point", *summary.attrs["axes"]], with_target).to_string(index=False))


# ---- TensorBoard --------------------------------------------------------------------------------

class _TensorBoard:
    """One run folder per (seed, arm) beneath the study's log folder, and one ``.../by_cost`` for
    its series against cost (TensorBoard's x axis is a run's step; a folder of its own lets its
    writer reopen with its own ``purge_step``). The study's tables go to the log folder itself."""

    @staticmethod
    def check(settings, root: Path) -> None:
        """In the run's process, before any work: the library and a writable log folder."""
        from importlib.util import find_spec

        from groupfel.emulator.io import check_writable

        if find_spec("tensorboard") is None:
            raise InputError(f"track: tensorboard is not installed; {INSTALL}")
        check_writable(_TensorBoard.logdir_of(settings, root), "dir",
                       "track.dir" if settings.dir else "track (the run folder)")

    @staticmethod
    def logdir_of(settings, root: Path) -> Path:
        return Path(settings.dir) / root.name if settings.dir else root / TB_DIR

    def __init__(self, settings, root: Path):
        self.logdir = self.logdir_of(settings, root)
        self.where = str(self.logdir.resolve())
        self.writers: dict[str, Any] = {}
        self.state: dict = {}

    def _writer(self, name: str, purge: int):
        from torch.utils.tensorboard import SummaryWriter

        if name not in self.writers:
            # purge_step: TensorBoard's readers drop what an earlier writer logged from this step on
            self.writers[name] = SummaryWriter(str(self.logdir / name), purge_step=purge, flush_secs=3600)
        return self.writers[name]

    def open_run(self, name: str, run: dict, params: dict, tags: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        w = self._writer(name, 0)
        exp, ssi, sei = hparams({k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in params.items()},
                                {"accuracy": 0, "loss": 0, "cost": 0})
        for s in (exp, ssi, sei):
            w.file_writer.add_summary(s)
        w.add_text("run", "\n".join(f"    {k}: {v}" for k, v in tags.items()), 0)

    def resume_run(self, name: str, run: dict) -> None:
        self._writer(name, run["round"] + 1)
        self._writer(f"{name}/by_cost", run["cost"] + 1)

    def log_rows(self, name: str, run: dict, rows: list[dict], by_cost: list[dict]) -> None:
        w = self._writer(name, run["round"] + 1)
        for r in rows:
            for k, v in metrics_of(r).items():
                w.add_scalar(k, v, r["round"])
        if by_cost:
            c = self._writer(f"{name}/by_cost", run["cost"] + 1)
            for r in by_cost:
                for k in BY_COST:
                    if k in r:
                        c.add_scalar(f"{k}_by_cost", r[k], _cost_step(r))

    def end_run(self, name: str, run: dict, last: dict) -> None:
        w = self._writer(name, run["round"] + 1)
        w.add_text("final", _markdown(last), last["round"])
        for key in (name, f"{name}/by_cost"):
            if key in self.writers:
                self.writers.pop(key).close()

    def flush(self) -> None:
        for w in self.writers.values():
            w.flush()

    def log_study(self, summary: str, text: str, files: list[Path], finals: dict[str, dict], report=None) -> None:
        step = self.state.get("study_step", -1) + 1
        from torch.utils.tensorboard import SummaryWriter

        w = SummaryWriter(str(self.logdir), purge_step=step, flush_secs=3600)
        w.add_text("summary", _code(summary), step)
        w.add_text("verdicts", _code(text), step)
        for name, row in finals.items():
            w.add_text(f"final/{name}", _markdown(row), step)
        w.close()
        self.state["study_step"] = step

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers.clear()


def _markdown(row: dict) -> str:
    keys = list(row)
    return "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n| " + " | ".join(
        str(row[k]) for k in keys) + " |"


def _code(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


# ---- MLflow ---------------------------------------------------------------------------------------

class _MLflow:
    """The study as a parent run, each (seed, arm) as a child (``mlflow.parentRunId``), in the
    experiment of ``track.experiment``, else MLflow's environment (``MLFLOW_EXPERIMENT_ID`` /
    ``_NAME``), else its Default; at ``track.uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's
    default. Runs are made with :class:`mlflow.MlflowClient`, never the fluent API's global run."""

    BATCH = 1000   # metrics per log_batch (MLflow's limit)
    PARAMS = 100   # params per log_batch

    FIX = ("start the tracking server (e.g. 'mlflow server --host 127.0.0.1 --port 5000') or set "
           "MLFLOW_TRACKING_URI / [track] uri to one that runs, or pass --track-optional to run without tracking")

    @staticmethod
    def check(settings, root: Path) -> None:
        """In the run's process, before any work and without importing mlflow: the library, a server
        that answers, a folder for a local store."""
        from importlib.util import find_spec

        from groupfel.emulator.io import check_writable

        if find_spec("mlflow") is None:
            raise InputError(f"track: mlflow is not installed; {INSTALL}")
        uri = settings.uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            return
        _probe(uri, _MLflow.FIX)
        parsed = urlparse(uri)
        # SQLAlchemy's sqlite:///rel.db and sqlite:////abs.db: the path after the third slash
        path = parsed.path[1:] if parsed.scheme == "sqlite" else parsed.path
        if parsed.scheme in ("sqlite", "file", "") and path not in ("", ":memory:"):
            check_writable(Path(path), "file" if parsed.scheme == "sqlite" else "dir",
                           "track.uri (or MLFLOW_TRACKING_URI)")

    def __init__(self, settings, root: Path):
        import mlflow
        from mlflow import MlflowClient

        # a server that stops answering mid-run: fail in seconds (then warn once), not retry for minutes
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        logging.getLogger("alembic").setLevel(logging.WARNING)   # a new SQLite store's migrations
        self.where = uri = settings.uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
        self.root, self.name, self.report = root, root.name, settings.report
        self.state: dict = {}
        self.logged_finals = 0   # rows the last log_finals logged
        self.resumed = False   # the study's run marked running again in this process
        self.fresh = False     # the study's run made in this process
        try:
            self.client = MlflowClient(uri)
            self.experiment_id = self._experiment(settings)
        except Exception as exc:   # the store's own errors, one line
            raise InputError(f"track: cannot use MLflow at {uri} ({type(exc).__name__}: {_first(exc)}); "
                             f"{self.FIX}") from None

    def _experiment(self, settings) -> str:
        name = settings.experiment or (None if os.environ.get("MLFLOW_EXPERIMENT_ID") else
                                       os.environ.get("MLFLOW_EXPERIMENT_NAME"))
        if name is None and os.environ.get("MLFLOW_EXPERIMENT_ID"):
            return self.client.get_experiment(os.environ["MLFLOW_EXPERIMENT_ID"]).experiment_id
        found = self.client.get_experiment_by_name(name or "Default")
        return found.experiment_id if found is not None else self.client.create_experiment(name or "Default")

    def _parent(self) -> str:
        parent = self.state.get("parent")
        if parent is None:
            run = self.client.create_run(self.experiment_id, run_name=self.name,
                                         tags={"groupfel.run_dir": str(self.root.resolve())})
            parent = self.state["parent"] = run.info.run_id
            self.fresh = True   # made here: no child of it can exist yet
            self._params(parent, _flat(_study_config(self.root)))
        elif not self.resumed:
            self.client.update_run(parent, status="RUNNING")
        self.resumed = True
        return parent

    def _params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), self.PARAMS):
            self.client.log_batch(run_id, params=items[i:i + self.PARAMS])

    def open_run(self, name: str, run: dict, params: dict, tags: dict) -> None:
        parent = self._parent()
        # made before a kill that came ahead of the record: continue it rather than start a second one
        found = [] if self.fresh else self.client.search_runs([self.experiment_id], max_results=1, filter_string=(
            f"tags.`mlflow.parentRunId` = '{parent}' and attributes.run_name = '{name}'"))
        if found:
            run["id"] = found[0].info.run_id
            self.resume_run(name, run)
        else:
            run["id"] = self.client.create_run(self.experiment_id, run_name=name,
                                               tags={"mlflow.parentRunId": parent, **tags}).info.run_id
        self._params(run["id"], params)

    def resume_run(self, name: str, run: dict) -> None:
        """A run resumed: the steps the tracker holds beyond the record (logged, then killed before
        the record was written) are not logged again."""
        self._parent()
        for series, key in (("round", "accuracy"), ("cost", "accuracy_by_cost")):
            steps = [m.step for m in self.client.get_metric_history(run["id"], key)]
            run[series] = max([run[series], *steps])
        self.client.update_run(run["id"], status="RUNNING")

    def log_rows(self, name: str, run: dict, rows: list[dict], by_cost: list[dict]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, r["round"]) for r in rows for k, v in metrics_of(r).items()]
        metrics += [Metric(f"{k}_by_cost", r[k], now, _cost_step(r)) for r in by_cost for k in BY_COST if k in r]
        # whole batches: the SQL store and the server write one batch in one transaction
        for i in range(0, len(metrics), self.BATCH):
            self.client.log_batch(run["id"], metrics=metrics[i:i + self.BATCH])

    def end_run(self, name: str, run: dict, last: dict) -> None:
        self.client.log_dict(run["id"], last, "final_row.json")
        self.client.set_terminated(run["id"], "FINISHED")

    def flush(self) -> None:
        pass

    def log_finals(self, finals: dict[str, dict]) -> None:
        """Each run's headline row as ``final/<column>`` metrics at step 0, once per row: the
        digest of the row logged is kept with the run (``final``)."""
        from mlflow.entities import Metric

        runs = self.state.get("runs", {})
        now = int(time.time() * 1000)
        self.logged_finals = 0
        for name, row in finals.items():
            run = runs.get(name)
            digest = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()[:16]
            if run is None or "id" not in run or run.get("final") == digest:
                continue
            values = {k: _number(str(v)) for k, v in row.items() if k not in ("arm", "seed")}
            metrics = [Metric(f"final/{k}", v, now, 0) for k, v in values.items() if v is not None]
            if metrics:
                self.client.log_batch(run["id"], metrics=metrics)
            run["final"] = digest
            self.logged_finals += 1

    def log_study(self, summary: str, text: str, files: list[Path], finals: dict[str, dict], report=None) -> None:
        parent = self._parent()
        self.log_finals(finals)
        self.client.log_text(parent, text, "verdicts.txt")
        for path in files:
            self.client.log_artifact(parent, str(path))
        if self.report and report is not None:
            with tempfile.TemporaryDirectory(prefix="groupfel-track-") as tmp:
                page = Path(tmp) / "report.html"
                report(page)
                if page.exists():   # else a folder the report cannot read (numerics of another machine)
                    self.client.log_artifact(parent, str(page))
        self.client.set_terminated(parent, "FINISHED")

    def close(self) -> None:
        pass


def _study_config(root: Path) -> dict:
    for name in ("config.json", "sweep.json"):
        try:
            raw = json.loads((root / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict):
            if "arms" in raw:
                raw = {**raw, "arms": json.dumps([a.get("name") for a in raw["arms"] if isinstance(a, dict)])}
            return {k: v for k, v in raw.items() if k != "points"}
    return {}


def _probe(uri: str, fix: str) -> None:
    """One line within seconds when nothing answers at an http(s) tracking URI (MLflow's client
    would retry for minutes)."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        why = f"no answer within {CONNECT_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else \
            (getattr(exc, "strerror", None) or str(exc))
        raise InputError(f"track: cannot reach MLflow at {uri} ({why}); {fix}") from None


__all__ = ["TRACKERS", "Session", "Tracker", "open_session", "resolve", "add_track_arguments", "from_args", "study_text",
           "sweep_text"]
