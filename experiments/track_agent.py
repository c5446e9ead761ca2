"""The tracker's process: ``python -m groupfel.experiments.track_agent``, started by a tracked run
(:class:`groupfel.experiments.track.Session`), never by a user.

It reads one JSON line on stdin (the ``[track]`` settings, the run folder, ``force``), opens the
tracker, then logs what the run writes every ``every_s`` seconds until a second line arrives:
``stop`` (log what the runs finished last) or ``finish`` (that, then the study's summary, verdicts
and, with MLflow, its plots and report.html). The end of stdin without one (the run killed) ends it
at once. It writes JSON lines on stdout: ``warn`` (a failure, once) and ``done`` (its CPU seconds
and the seconds the run waited for it at the end).

It logs an arm as soon as it completes and, with report.html on, draws the report's slow sections
while the run goes (the cost profiles as soon as the first arm completes, from the cost model its
manifest records, so that this process never imports torch; the Eq. 5 breakdown and the grouping
once every planned arm is complete, while the runner writes the study's tables), and logs each
run's headline row as soon as the runner writes per_seed.csv (while it computes the study's
statistics and draws its plots), so the run's end waits only for the rest.
It sits above both :mod:`.track` and :mod:`.report`, as the commands do.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from pathlib import Path

from .track import Tracker, final_tables

POLL_S = 0.25   # how often it looks for completed arms and the tables of headline rows


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class _Plan:
    """The arm runs the study will hold (:func:`groupfel.experiments.report.planned_arms`), watched
    for completion: an arm that completes is logged at once rather than at the next ``every_s``,
    and with the report on, its slow sections are drawn ahead
    (:func:`groupfel.experiments.report.prepare_sections`)."""

    def __init__(self, root: Path, report: bool):
        self.root, self.report = root, report
        self.plan: tuple | None = None
        self.prepared: dict | None = None
        self.complete: set[str] = set()
        self.finished = False

    def poll(self) -> bool:
        """Whether an arm has completed since the last poll."""
        if self.finished:
            return False
        from groupfel.emulator.runfiles import complete_manifest

        from . import report

        if self.plan is None:
            self.plan = report.planned_arms(self.root)
            if self.plan is None:
                return False
        config, arms = self.plan
        before = len(self.complete)
        self.complete |= {str(a.path) for a in arms
                          if str(a.path) not in self.complete and complete_manifest(a.path) is not None}
        if len(self.complete) == len(arms):
            self.finished = True
        if self.report and self.prepared is None and arms and str(arms[0].path) in self.complete:
            # its imports too, while the run goes
            self.prepared = report.prepare_sections(self.root, *self.plan, parts=("profiles",))
        return len(self.complete) > before

    def prepare(self) -> None:
        from . import report

        if self.finished and self.report and "grouping" not in (self.prepared or {}):
            parts = [p for p in report.SECTIONS if p not in (self.prepared or {})]
            self.prepared = {**(self.prepared or {}), **report.prepare_sections(self.root, *self.plan, parts=parts)}

    def build(self, out: Path) -> None:
        from groupfel.errors import InputError

        from .report import build_report

        try:
            build_report(self.root, out, prepared=self.prepared)
        except InputError:   # a folder the report cannot read (numerics of another machine): no page
            pass


class _Finals:
    """The tables that hold each run's headline row (per_seed.csv, a single-seed run's
    summary.csv), watched once every planned arm is complete: the runner writes them before the
    study's statistics and plots, so the rows are logged while it draws those."""

    def __init__(self, root: Path):
        self.root = root
        self.seen: dict[Path, int] = {}

    def changed(self) -> bool:
        stamps = {}
        for path in final_tables(self.root):
            try:
                stamps[path] = path.stat().st_mtime_ns
            except OSError:
                pass
        fresh = any(self.seen.get(p) != t for p, t in stamps.items())
        self.seen = stamps
        return fresh


class _Lines:
    """Whole lines from a file descriptor, read only when :func:`select.select` says so."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def ready(self) -> bool:
        return b"\n" in self.buf or self.eof

    def read(self) -> None:
        chunk = os.read(self.fd, 65536)
        self.buf += chunk
        self.eof = not chunk

    def line(self) -> str | None:
        """The next line; None at the end of the input."""
        while not self.ready():
            self.read()
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8")


def serve(lines: _Lines) -> dict:
    from groupfel.emulator.config import TrackConfig

    first = json.loads(lines.line() or "null")
    settings = TrackConfig.model_validate(first["settings"])
    root = Path(first["root"])
    tracker = Tracker(settings, root, force=bool(first.get("force")), warn=lambda text: _say({"warn": text}))
    report = settings.tracker == "mlflow" and settings.report
    plan = _Plan(root, report)
    finals = _Finals(root)
    tracker.sync()   # what a resumed run has already
    next_sync = time.monotonic() + settings.every_s
    while True:
        if not lines.ready():
            wait = max(0.0, next_sync - time.monotonic())
            if select.select([lines.fd], [], [], wait if tracker.broken else min(wait, POLL_S))[0]:
                lines.read()
        if lines.ready():
            line = lines.line()
            if line is None:     # the run is gone (killed): its resume logs what is missing
                return {}
            command, t0 = json.loads(line), time.perf_counter()
            tracker.sync()
            if command.get("cmd") == "finish":
                tracker.finish(command["summary"], command["text"], report=plan.build if report else None)
            return {"end_s": time.perf_counter() - t0}
        if tracker.broken:
            continue
        try:
            completed = plan.poll()
        except Exception:   # unplanned: logged every every_s, the report drawn whole at the end
            completed, plan.finished = False, True
        if completed or time.monotonic() >= next_sync:
            tracker.sync()
            next_sync = time.monotonic() + settings.every_s
        if completed:
            try:
                plan.prepare()
            except Exception:   # drawn again at the end, where a failure is the report's own
                plan.prepared = None
        if plan.finished and finals.changed():
            tracker.log_finals()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the run, which tells this process to stop
    # Linux's idle class: it runs on the cores the run leaves idle and never preempts the run (nice
    # 19 still does, on every wake-up: 1.06x the demo's wall against 1.03x); where no core is idle
    # it gets about 0.3 % of one, so its logging lags until the run leaves a gap
    if hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass
    try:
        timing = serve(_Lines(sys.stdin.fileno()))
    except (ValueError, KeyError, TypeError):   # not started by a run
        return 2
    _say({"done": {"cpu_s": time.process_time(), **timing}})
    return 0


if __name__ == "__main__":
    code = main()
    # everything is logged and closed: skip the second of tearing down torch, matplotlib and MLflow
    # that the run would otherwise wait for
    os._exit(code)
