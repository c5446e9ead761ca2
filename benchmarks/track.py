"""What tracking costs: the default demo (4 arms x 3 seeds on the process pool) with tracking off,
to TensorBoard and to MLflow (a SQLite store), side by side in one run.

    python benchmarks/track.py [--repeat N] [--mlflow-uri URI] [--screenshots DIR] [--kill-resume]
    python benchmarks/track.py --direct

Each repeat runs the three in turn (off, tensorboard, mlflow; every other repeat in the reverse
order), each as ``groupfel run`` in a process of its own (a tracker's imports count, as for a user;
MLflow's SQLite store made beforehand, as a user's exists), into fresh temporary folders, and
prints each one's wall clock and the CPU seconds of its whole process tree (the pool's workers
included), then each tracker's ratio to tracking off: the ratio of the medians over repeats, and
the median of each repeat's own ratio (a repeat's three runs are minutes apart, the repeats
further). On a busy machine the wall clock carries the other jobs' noise; the CPU seconds carry
less of it.

``--screenshots DIR``: after the last repeat, TensorBoard's UI (on 127.0.0.1) showing the demo's
accuracy against Eq. 5 cost, screenshotted in headless Chromium into DIR/track-tensorboard.png.

``--direct``: what the tracker itself spends, free of the other jobs' noise that a loaded machine
puts on two whole runs: the demo in this process with each tracker, timing the run's wait to open
the tracker, the CPU seconds of the tracker's own process (its imports, every round logged, the
study's summary and report.html) and the run's wait for it at the end.

``--kill-resume``: the demo again per tracker from the command line, killed (kill -9, its whole
process group) once the tracker has 5 rounds of some run, then ``groupfel run --resume``; every
series read back from the tracker (TensorBoard's EventMultiplexer, MLflow's client) is compared
with the uninterrupted run's, step by step.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sweep import TreeCPU

MODES = ("off", "tensorboard", "mlflow")


def env_of(mode: str, folder: Path, mlflow_uri: str | None = None) -> dict:
    return {**os.environ, **({"MLFLOW_TRACKING_URI": mlflow_uri or f"sqlite:///{folder / 'mlflow.db'}",
                              "MLFLOW_EXPERIMENT_NAME": "demo"} if mode == "mlflow" else {})}


def one(mode: str, folder: Path, mlflow_uri: str | None) -> tuple[float, float]:
    """``groupfel run`` as a user runs it, a process of its own: a tracker's imports count. An
    MLflow store exists already, as a user's does (a new SQLite store's tables take seconds once)."""
    track = [] if mode == "off" else ["--track", mode]
    if mode == "mlflow" and mlflow_uri is None:
        subprocess.run([sys.executable, "-c", "import sys; from mlflow import MlflowClient; "
                        "MlflowClient(sys.argv[1]).search_experiments()", f"sqlite:///{folder / 'mlflow.db'}"],
                       check=True, capture_output=True)
    t0 = time.perf_counter()
    with TreeCPU() as cpu:
        subprocess.run([sys.executable, "-m", "groupfel", "run", "--output", str(folder / "default"), "--quiet", *track],
                       cwd=folder, env=env_of(mode, folder, mlflow_uri), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, cpu.seconds


def screenshot(logdir: Path, out: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                           "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/data/runs", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        out.parent.mkdir(parents=True, exist_ok=True)
        # the by_cost runs only, unsmoothed: each seed's accuracy against its Eq. 5 cost
        page = f"{url}/?darkMode=false#scalars&tagFilter=accuracy_by_cost&regexInput=by_cost&_smoothingWeight=0"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1400,900", "--virtual-time-budget=20000", f"--screenshot={out}", page],
                       capture_output=True, timeout=180, check=True)
        print(f"screenshot: {out}")
    finally:
        tb.terminate()
        tb.wait()


def killed(mode: str, folder: Path) -> None:
    """The demo from the command line, killed -9 mid-run, then resumed."""
    out = folder / "default"
    env = env_of(mode, folder)
    proc = subprocess.Popen([sys.executable, "-m", "groupfel", "run", "--output", str(out), "--track", mode, "--quiet"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    while proc.poll() is None:
        try:
            logs = json.loads((out / "track.json").read_text())["logs"].values()
        except (OSError, ValueError, KeyError):
            logs = []
        if any(r["round"] >= 5 for log in logs for r in log["runs"].values()):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait()
    subprocess.run([sys.executable, "-m", "groupfel", "run", "--resume", str(out), "--quiet"], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def series(mode: str, folder: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Every series the tracker holds: (run, tag) -> [(step, value)] in the order read back."""
    out = {}
    if mode == "tensorboard":
        from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

        mux = EventMultiplexer().AddRunsFromDirectory(str(folder / "default" / "tensorboard"))
        mux.Reload()
        for run, tags in mux.Runs().items():
            for tag in tags["scalars"]:
                out[run, tag] = [(e.step, e.value) for e in mux.Scalars(run, tag)]
        return out
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("demo")
    for run in client.search_runs([exp.experiment_id], max_results=1000):
        for key in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, key)
            out[run.info.run_name, key] = sorted((m.step, m.value) for m in history)
    return out


def compare(mode: str, reference: Path, resumed: Path) -> None:
    a, b = series(mode, reference), series(mode, resumed)
    steps = sum(len(v) for v in a.values())
    same = a == b
    dup = sum(len(v) - len({s for s, _ in v}) for v in b.values())
    print(f"kill -9 and resume, {mode}: {len({r for r, _ in b})} tracker runs, {len(b)} series, {steps} points in the "
          f"uninterrupted run, {sum(len(v) for v in b.values())} after the kill and resume; identical: {same}; "
          f"steps logged twice: {dup}", flush=True)


def direct() -> None:
    """What the tracker itself spends in an in-process demo run, per tracker: the run's wait to
    open it, its process's CPU seconds and the run's wait for it at the end."""
    from groupfel.experiments import track
    from groupfel.experiments.runner import default_config, run_experiment

    spent: dict[str, float] = {}
    open_session = track.open_session

    def opened(*a, **k):
        t0 = time.perf_counter()
        try:
            return open_session(*a, **k)
        finally:
            spent["the run's wait to open it"] = time.perf_counter() - t0

    def timed(finish):
        def finished(self, *a, **k):
            t0 = time.perf_counter()
            finish(self, *a, **k)
            spent["the run's wait at the end"] = time.perf_counter() - t0
            if "cpu_s" in self.stats:   # MLflow's process
                spent["its process's CPU"] = self.stats["cpu_s"]
        return finished

    track.open_session = opened
    for host in (track._ThreadSession, track._ProcessSession):   # TensorBoard's thread, MLflow's process
        host.finish = timed(host.finish)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for mode in MODES[1:]:
            spent.clear()
            folder = Path(tmp) / mode
            folder.mkdir()
            settings = {"tracker": mode, **({"uri": f"sqlite:///{folder / 'mlflow.db'}", "experiment": "demo"}
                                            if mode == "mlflow" else {})}
            if mode == "mlflow":   # a store that exists, as a user's does (its first use creates its tables)
                subprocess.run([sys.executable, "-c", "import sys; from mlflow import MlflowClient; "
                                "MlflowClient(sys.argv[1]).search_experiments()", settings["uri"]],
                               check=True, capture_output=True)
            t0 = time.perf_counter()
            run_experiment(default_config(), folder / "default", progress=False, track=settings)
            wall = time.perf_counter() - t0
            print(f"{mode}: the demo took {wall:.1f} s wall in all (load average {os.getloadavg()[0]:.1f}); the "
                  f"tracker: " + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--mlflow-uri", help="an MLflow server to log to (default: a SQLite store per run)")
    ap.add_argument("--screenshots", type=Path, metavar="DIR")
    ap.add_argument("--kill-resume", action="store_true")
    ap.add_argument("--direct", action="store_true")
    args = ap.parse_args()
    if args.direct:
        direct()
        return
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    if args.screenshots:
        args.screenshots = args.screenshots.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)   # MLflow's artifacts of a SQLite store land beside it
        for r in range(args.repeat):
            # every other repeat backwards: a machine that speeds up or slows down over the run
            # favours no tracker
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                folder = Path(tmp) / f"{mode}-{r}"
                folder.mkdir()
                times[mode].append(one(mode, folder, args.mlflow_uri))
                wall, cpu = times[mode][-1]
                print(f"repeat {r}: {mode:12s} {wall:7.1f} s wall {cpu:7.1f} CPU-s  (load average "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
        if args.screenshots:
            screenshot(Path(tmp) / f"tensorboard-{args.repeat - 1}" / "default" / "tensorboard",
                       args.screenshots.resolve() / "track-tensorboard.png")
        # `groupfel report` on the demo's folder, for comparison with the artifact built in the run
        t0 = time.perf_counter()
        with TreeCPU() as cpu:
            subprocess.run([sys.executable, "-m", "groupfel", "report", str(Path(tmp) / "off-0" / "default"), "--out",
                            str(Path(tmp) / "report.html")], check=True, capture_output=True)
        report = (time.perf_counter() - t0, cpu.seconds)
        if args.kill_resume:
            for mode in MODES[1:]:
                folder = Path(tmp) / f"{mode}-killed"
                folder.mkdir()
                killed(mode, folder)
                compare(mode, Path(tmp) / f"{mode}-0", folder)
    base_wall = statistics.median(w for w, _ in times["off"])
    base_cpu = statistics.median(c for _, c in times["off"])
    print(f"\ndefault demo (12 runs, {len(os.sched_getaffinity(0))} cores), median of {args.repeat}:")
    for mode in MODES:
        wall = statistics.median(w for w, _ in times[mode])
        cpu = statistics.median(c for _, c in times[mode])
        paired = statistics.median(w / o for (w, _), (o, _) in zip(times[mode], times["off"]))
        print(f"  {mode:12s} {wall:7.1f} s wall ({wall / base_wall:.3f}x off; each repeat's own ratio, median: "
              f"{paired:.3f}x)   {cpu:7.1f} CPU-s ({cpu / base_cpu:.3f}x off)")
    print(f"  'groupfel report' of the demo in a process of its own: {report[0]:.1f} s wall, {report[1]:.1f} CPU-s (MLflow's "
          f"report.html artifact is built in the tracker's process, its slow sections while the run goes)")


if __name__ == "__main__":
    main()
