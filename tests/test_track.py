"""--track tensorboard|mlflow against the real tools: TensorBoard's own event reader, MLflow's client
on a local file store, a SQLite store and a real `mlflow server` on loopback, TensorBoard's UI in
headless Chromium; a kill -9 and --resume; a tracker that is unreachable or dies mid-run."""
from __future__ import annotations

import copy
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import TINY, children, write_toml

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

from mlflow import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from groupfel.experiments import api  # noqa: E402
from groupfel.experiments.cli import main  # noqa: E402

SERIES = ["cost", "training_cost", "overhead_cost", "sim_time_s", "round_time_s", "accuracy", "loss",
          "groups_sampled", "clients_sampled", "avg_sampled_cov"]


def _tiny(rounds: int = 4, seeds=None, arms: int = 2, every_s: float | None = None) -> dict:
    d = copy.deepcopy(TINY)
    d["train"]["rounds"] = rounds
    d["arms"] = d["arms"][-arms:]
    if seeds is not None:
        d.pop("seed")
        d["seeds"] = seeds
    if every_s is not None:
        d["track"] = {"tracker": "tensorboard", "every_s": every_s}
    return d


def _arm_dirs(root: Path) -> dict[str, Path]:
    return {p.parent.relative_to(root).as_posix(): p.parent
            for p in sorted(root.rglob("results.csv")) if "tensorboard" not in p.parts}


def _tb(logdir: Path, run: str) -> EventAccumulator:
    acc = EventAccumulator(str(logdir / run))   # purges orphaned events, as TensorBoard's UI does
    acc.Reload()
    return acc


def _f32(values) -> list[float]:
    return [float(np.float32(v)) for v in values]


def _check_tensorboard(root: Path, logdir: Path | None = None) -> None:
    """Every arm's every results column read back from its event files, step by step, and its
    accuracy against cost (the cost axis), each step once."""
    logdir = logdir or root / "tensorboard"
    arms = _arm_dirs(root)
    assert arms
    for name, arm_dir in arms.items():
        df = pd.read_csv(arm_dir / "results.csv")
        acc = _tb(logdir, name)
        for col in SERIES:
            events, rows = acc.Scalars(col), df[df[col].notna()]   # round 0 sampled nothing: no value
            assert [e.step for e in events] == rows["round"].tolist(), (name, col)
            assert [e.value for e in events] == _f32(rows[col]), (name, col)
        by_cost = _tb(logdir, f"{name}/by_cost").Scalars("accuracy_by_cost")
        assert [e.step for e in by_cost] == [int(round(c)) for c in df["cost"]]
        assert [e.value for e in by_cost] == _f32(df["accuracy"])


def _mlflow_runs(client: MlflowClient, experiment: str) -> tuple[object, dict]:
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    return parents[0], children


def _check_mlflow(client: MlflowClient, experiment: str, root: Path) -> tuple[object, dict]:
    parent, children = _mlflow_runs(client, experiment)
    arms = _arm_dirs(root)
    assert set(children) == set(arms)
    for name, arm_dir in arms.items():
        df = pd.read_csv(arm_dir / "results.csv")
        run = children[name]
        assert run.info.status == "FINISHED"
        assert run.data.params["arm.name"] == arm_dir.name
        for col in ("accuracy", "loss", "cost", "overhead_cost", "clients_sampled"):
            history = sorted(client.get_metric_history(run.info.run_id, col), key=lambda m: m.step)
            assert [(m.step, m.value) for m in history] == list(zip(df["round"], df[col].astype(float))), (name, col)
        history = sorted(client.get_metric_history(run.info.run_id, "accuracy_by_cost"), key=lambda m: m.step)
        assert [m.step for m in history] == [int(round(c)) for c in df["cost"]]
    return parent, children


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 400) -> None:
    import urllib.request

    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, f"{url}: the server exited ({proc.returncode})"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url}: no answer within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---- TensorBoard --------------------------------------------------------------------------------

def test_tensorboard_gets_every_round_and_changes_no_output(tmp_path):
    tracked = api.run(_tiny(), tmp_path / "on", progress=False, track="tensorboard")
    _check_tensorboard(tracked.run_dir)
    root_text = _tb(tmp_path / "on" / "tensorboard", ".")
    assert {"summary/text_summary", "verdicts/text_summary"} <= set(root_text.Tags()["tensors"])
    hparams = _tb(tmp_path / "on" / "tensorboard", "rg-random").PluginTagToContent("hparams")
    assert hparams   # the resolved config as the HParams dashboard reads it
    blob = b"".join(hparams.values())
    assert b"arm.grouping.policy" in blob and b"train.lr" in blob
    # tracking reads the results, never writes them: every output as without it
    api.run(_tiny(), tmp_path / "off", progress=False)
    for rel in ("summary.csv", "config.json", "rg-random/results.csv", "rg-random/ledger.parquet",
                "covg-esrcov/results.csv", "covg-esrcov/ledger.parquet"):
        assert (tmp_path / "on" / rel).read_bytes() == (tmp_path / "off" / rel).read_bytes(), rel
    assert not (tmp_path / "off" / "tensorboard").exists() and not (tmp_path / "off" / "track.json").exists()
    # a finished run rerun is a no-op: nothing logged again
    events = sorted((tmp_path / "on" / "tensorboard").rglob("events.out.tfevents*"))
    state = (tmp_path / "on" / "track.json").read_bytes()
    api.run(_tiny(), tmp_path / "on", progress=False, track="tensorboard")
    assert sorted((tmp_path / "on" / "tensorboard").rglob("events.out.tfevents*")) == events
    assert (tmp_path / "on" / "track.json").read_bytes() == state


@pytest.mark.slow
def test_a_config_track_table_and_a_sweep_on_the_cli(tmp_path, capsys):
    d = _tiny(rounds=2, arms=1)
    d["track"] = {"tracker": "tensorboard", "dir": str(tmp_path / "logs")}
    base = write_toml(tmp_path, d, "base.toml")
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'name = "sw"\nbase = "{base.name}"\nseeds = [0, 1]\n'
                     f'[axes]\n"arms.0.grouping.min_group_size" = [2, 3]\n')
    assert main(["sweep", str(sweep), "--output", str(tmp_path / "sw"), "--jobs", "2", "--quiet"]) == 0
    # [track] dir: the study's folder is named after the sweep's; a run per (point, seed, arm)
    _check_tensorboard(tmp_path / "sw", tmp_path / "logs" / "sw")
    assert "p01/seed-1/rg-random" in json.loads((tmp_path / "sw" / "track.json").read_text())["logs"][
        f"tensorboard {tmp_path / 'logs' / 'sw'}"]["runs"]
    assert not (tmp_path / "sw" / "tensorboard").exists()


# ---- MLflow -----------------------------------------------------------------------------------------

def test_mlflow_file_store_nested_runs_params_artifacts_and_a_rerun_logs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3's opt-in for its file store
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tiny-study")
    monkeypatch.chdir(tmp_path)
    api.run(_tiny(seeds=[0, 1]), tmp_path / "run", jobs=2, progress=False, track="mlflow")
    client = MlflowClient(uri)
    parent, children = _check_mlflow(client, "tiny-study", tmp_path / "run")
    assert len(children) == 4 and parent.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.html", "accuracy_vs_cost.png", "summary.csv", "verdicts.txt"} <= artifacts
    verdicts = client.download_artifacts(parent.info.run_id, "verdicts.txt", str(tmp_path))
    assert "paired difference from" in Path(verdicts).read_text()
    final = client.get_run(children["seed-1/covg-esrcov"].info.run_id).data.metrics
    per_seed = pd.read_csv(tmp_path / "run" / "per_seed.csv").set_index(["seed", "arm"])
    assert final["final/final_acc"] == per_seed.loc[(1, "covg-esrcov"), "final_acc"]
    # each headline row once, whether the tracker's process logged it ahead of the end or at it
    assert {len(client.get_metric_history(r.info.run_id, "final/final_acc")) for r in children.values()} == {1}
    # rerun: a no-op, no run made and no step logged again
    counts = {n: len(client.get_metric_history(r.info.run_id, "accuracy")) for n, r in children.items()}
    api.run(_tiny(seeds=[0, 1]), tmp_path / "run", jobs=2, progress=False, track="mlflow")
    parent2, children2 = _mlflow_runs(client, "tiny-study")
    assert parent2.info.run_id == parent.info.run_id and set(children2) == set(children)
    assert {n: len(client.get_metric_history(r.info.run_id, "accuracy")) for n, r in children2.items()} == counts
    assert {len(client.get_metric_history(r.info.run_id, "final/final_acc")) for r in children2.values()} == {1}


def test_headline_rows_logged_ahead_are_not_logged_again_at_the_end(tmp_path, monkeypatch):
    """The tracker's process logs each run's headline row as soon as per_seed.csv is written;
    the study's end then logs only what changed since: every row once."""
    from groupfel.emulator.config import TrackConfig
    from groupfel.experiments.track import Tracker

    monkeypatch.chdir(tmp_path)
    api.run(_tiny(rounds=2, seeds=[0, 1]), tmp_path / "run", jobs=2, progress=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = TrackConfig(tracker="mlflow", uri=uri, experiment="ahead", report=False)
    warnings: list[str] = []
    tracker = Tracker(settings, tmp_path / "run", force=True, warn=warnings.append)
    tracker.sync()
    tracker.log_finals()
    assert tracker.backend.logged_finals == 4
    tracker.log_finals()    # nothing changed: nothing logged
    assert tracker.backend.logged_finals == 0
    tracker.finish("summary", "verdicts")
    assert not warnings
    client = MlflowClient(uri)
    parent, children = _mlflow_runs(client, "ahead")
    per_seed = pd.read_csv(tmp_path / "run" / "per_seed.csv").set_index(["seed", "arm"])
    for name, run in children.items():
        history = client.get_metric_history(run.info.run_id, "final/final_acc")
        seed, arm = name.split("/")
        assert [m.value for m in history] == [per_seed.loc[(int(seed.removeprefix("seed-")), arm), "final_acc"]]


@pytest.mark.slow
def test_seeds_auto_study_on_a_sqlite_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = _tiny(rounds=2, seeds="auto")
    d["max_seeds"] = 3
    d["track"] = {"tracker": "mlflow", "uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "auto",
                  "report": False}
    api.run(d, tmp_path / "auto", jobs=2, progress=False)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent, children = _check_mlflow(client, "auto", tmp_path / "auto")
    assert len(children) == 6
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "verdicts.txt" in artifacts and "report.html" not in artifacts


def test_an_unreachable_tracker_is_refused_before_any_work_or_skipped_when_optional(tmp_path, capsys, monkeypatch):
    from conftest import one_error_line

    port = _free_port()   # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    config = write_toml(tmp_path, _tiny(rounds=1, arms=1))
    out = tmp_path / "run"
    assert main(["run", str(config), "--output", str(out), "--track", "mlflow", "--quiet"]) == 2
    err = one_error_line(capsys)
    assert f"http://127.0.0.1:{port}" in err and "--track-optional" in err and "MLFLOW_TRACKING_URI" in err
    assert not out.exists()
    assert main(["run", str(config), "--output", str(out), "--track", "mlflow", "--track-optional", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("groupfel: warning: track: cannot reach MLflow") == 1, err
    assert (out / "rg-random" / "results.csv").exists() and not (out / "track.json").exists()
    # a bad [track] value: the field and the fix, exit 2
    d = _tiny(rounds=1, arms=1)
    d["track"] = {"tracker": "wandb"}
    assert main(["run", str(write_toml(tmp_path, d, "bad.toml")), "--output", str(tmp_path / "bad")]) == 2
    assert "track.tracker" in one_error_line(capsys)


# ---- kill -9, resume; a server that dies; every backend -------------------------------------------------

def _start_run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """The CLI in ``cwd`` (where a SQLite store's artifacts land, as MLflow places them)."""
    return subprocess.Popen([sys.executable, "-m", "groupfel", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


def _wait_logged(state: Path, proc: subprocess.Popen, rounds: int, timeout: float = 300) -> dict:
    """track.json once some run has ``rounds`` rounds logged."""
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            logs = json.loads(state.read_text())["logs"]
        except (OSError, ValueError, KeyError):
            logs = {}
        runs = [r for log in logs.values() for r in log.get("runs", {}).values()]
        if any(r["round"] >= rounds for r in runs):
            return json.loads(state.read_text())
        time.sleep(0.1)
    raise AssertionError("nothing logged in time")


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow"])
def test_kill_9_and_resume_continue_the_same_tracker_runs(tmp_path, tracker):
    d = _tiny(rounds=14, seeds=[0, 1], arms=1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    d["track"] = {"tracker": tracker, "every_s": 0.2, **({"uri": uri, "experiment": "kill"} if tracker == "mlflow" else {})}
    config, out = write_toml(tmp_path, d), tmp_path / "run"
    proc = _start_run(["run", str(config), "--output", str(out), "--jobs", "2", "--quiet"], tmp_path)
    state = _wait_logged(out / "track.json", proc, 3)
    os.killpg(proc.pid, signal.SIGKILL)   # the driver and its workers, mid-round
    proc.wait()
    # the window a kill can hit: rows the tracker holds, the record not yet written
    for log in state["logs"].values():
        for run in log["runs"].values():
            run.update(round=max(run["round"] - 2, 0), cost=0)
    (out / "track.json").write_text(json.dumps(state))
    done = subprocess.run([sys.executable, "-m", "groupfel", "run", "--resume", str(out), "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    # every step once, each the results' value: as a run never killed (resumed results are those)
    if tracker == "tensorboard":
        _check_tensorboard(out)
    else:
        _check_mlflow(MlflowClient(uri), "kill", out)


@pytest.mark.slow
def test_a_real_mlflow_server_and_one_that_dies_mid_run(tmp_path):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination", str(tmp_path / "art"),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{uri}/health", server)
        d = _tiny(rounds=10, seeds=[0, 1], arms=1)
        d["track"] = {"tracker": "mlflow", "experiment": "server", "every_s": 0.2}
        config = write_toml(tmp_path, d)
        env = {"MLFLOW_TRACKING_URI": uri}
        ok = _start_run(["run", str(config), "--output", str(tmp_path / "ok"), "--jobs", "2", "--quiet"], tmp_path, env)
        assert ok.wait(600) == 0, ok.communicate()[1][-2000:]
        client = MlflowClient(uri)
        parent, _ = _check_mlflow(client, "server", tmp_path / "ok")
        assert "report.html" in {a.path for a in client.list_artifacts(parent.info.run_id)}
        # the server dies mid-run: one warning, the run finishes, its results as the first run's
        lost = _start_run(["run", str(config), "--output", str(tmp_path / "lost"), "--jobs", "2", "--quiet"], tmp_path, env)
        _wait_logged(tmp_path / "lost" / "track.json", lost, 2)
        _stop(server)
        _, err = lost.communicate(timeout=600)
        assert lost.returncode == 0, err[-2000:]
        assert err.count("groupfel: warning: track: mlflow at") == 1, err
        for rel in ["summary.csv", "runs.csv", "per_seed.csv", *(f"seed-{s}/rg-random/{f}" for s in (0, 1)
                                                                  for f in ("results.csv", "ledger.parquet"))]:
            assert (tmp_path / "lost" / rel).read_bytes() == (tmp_path / "ok" / rel).read_bytes(), rel
    finally:
        _stop(server)


@pytest.mark.slow
@pytest.mark.parametrize("backend,stack", [("ray", 1), ("local", 2)])
def test_every_backend_logs_the_same_series(tmp_path, backend, stack):
    api.run(_tiny(rounds=3, seeds=[0, 1]), tmp_path / "run", jobs=2, backend=backend, stack=stack, progress=False,
            track="tensorboard")
    _check_tensorboard(tmp_path / "run")


@pytest.mark.slow
def test_tensorboard_ui_shows_accuracy_against_cost_in_chromium(tmp_path, browser):
    import matplotlib.image as mpimg
    import urllib.request

    api.run(_tiny(rounds=3, seeds=[0, 1]), tmp_path / "run", jobs=2, progress=False, track="tensorboard")
    port = _free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path / "run" / "tensorboard"),
                           "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/data/runs", tb)
        with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags") as r:
            tags = json.load(r)
        assert all("accuracy_by_cost" in tags[f"seed-{s}/{a}/by_cost"] for s in (0, 1) for a in ("covg-esrcov", "rg-random"))
        shot = tmp_path / "tb.png"
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,800", "--virtual-time-budget=15000", f"--screenshot={shot}",
                        f"{url}/?darkMode=false#scalars&tagFilter=accuracy_by_cost"], capture_output=True, timeout=120)
        px = mpimg.imread(shot)
        assert px.shape[:2] == (800, 1200)
        assert px[..., :3].std() > 0.05   # a drawn page, not a blank one
    finally:
        _stop(tb)


@pytest.mark.parametrize("track", [[], ["--track", "mlflow"]])
def test_the_runs_own_process_imports_neither_tracker(tmp_path, track):
    """Untracked, or tracked to MLflow: its client lives in a process of its own."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = ("import sys, json\nfrom groupfel.experiments.cli import main\n"
            f"assert main(['run', {str(write_toml(tmp_path, _tiny(rounds=1, arms=1)))!r}, '--output', "
            f"{str(tmp_path / 'run')!r}, '--quiet', *{track!r}]) == 0\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'tensorboard'})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "own"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    if track:
        _check_mlflow(MlflowClient(uri), "own", tmp_path / "run")


def test_a_store_that_will_not_open_is_warned_about_once_and_the_run_completes(tmp_path, capsys):
    """Past the checks before any work (the file exists and can be written) but not an MLflow store:
    the tracker's process reports it once; the run's results are those of an untracked run."""
    store = tmp_path / "not-a-store.db"
    store.write_bytes(b"this is not a SQLite database\n" * 64)
    d = _tiny(rounds=2, arms=1)
    config = write_toml(tmp_path, d)
    assert main(["run", str(config), "--output", str(tmp_path / "plain"), "--quiet"]) == 0
    capsys.readouterr()
    d["track"] = {"tracker": "mlflow", "uri": f"sqlite:///{store}"}
    assert main(["run", str(write_toml(tmp_path, d, "tracked.toml")), "--output", str(tmp_path / "run"),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("groupfel: warning: track: cannot use MLflow at sqlite:///") == 1, err
    assert "results are complete" in err
    for rel in ("summary.csv", "rg-random/results.csv", "rg-random/ledger.parquet"):
        assert (tmp_path / "run" / rel).read_bytes() == (tmp_path / "plain" / rel).read_bytes(), rel


def _agents(pid: int) -> list[int]:
    """The run's tracker processes."""
    out = []
    for c in children(pid):
        try:
            if b"track_agent" in Path(f"/proc/{c}/cmdline").read_bytes():
                out.append(c)
        except OSError:
            pass
    return out


def _gone(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] == "Z"


def test_the_tracker_leaves_the_idle_class_when_the_run_waits_on_it():
    """Every thread of the tracker's process back in the normal class (root here); where that is not
    allowed it stays idle without an error."""
    from groupfel.experiments.track import _unidle

    code = ("import os, sys, threading, time\n"
            "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        threads = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(threads) == 2 and all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in threads)
        _unidle(proc.pid)
        allowed = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20
        want = os.SCHED_OTHER if allowed else os.SCHED_IDLE
        assert [os.sched_getscheduler(t) for t in threads] == [want, want]
    finally:
        proc.kill()
        proc.wait()
    _unidle(proc.pid)   # gone: nothing to do, no error


@pytest.mark.slow
def test_the_tracker_stops_when_the_run_is_killed_alone(tmp_path):
    """kill -9 of the run's process only (not its group): MLflow's tracker process sees its input
    end and exits rather than outlive the run."""
    d = _tiny(rounds=30, arms=1)
    d["track"] = {"tracker": "mlflow", "uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "every_s": 0.2}
    proc = _start_run(["run", str(write_toml(tmp_path, d)), "--output", str(tmp_path / "run"), "--quiet"], tmp_path)
    # in the idle class while the run goes: it takes only the cores the run leaves idle (looked at
    # before the run's end, where the run takes it back to the normal class)
    end, idle = time.time() + 60, False
    while not idle and time.time() < end and proc.poll() is None:
        agents = _agents(proc.pid)
        try:
            idle = len(agents) == 1 and os.sched_getscheduler(agents[0]) == os.SCHED_IDLE
        except OSError:
            pass
        time.sleep(0.01)
    assert idle
    _wait_logged(tmp_path / "run" / "track.json", proc, 1)
    assert _agents(proc.pid) == agents
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.time() + 30
    while not _gone(agents[0]) and time.time() < end:
        time.sleep(0.1)
    assert _gone(agents[0])


def test_the_report_drawn_ahead_is_the_report_drawn_at_the_end(tmp_path):
    """The sections the tracker draws while the run goes (report.prepare_sections) make the same
    page as drawing it whole; sections of other arm runs are not used."""
    import re

    from groupfel.experiments.report import build_report, planned_arms, prepare_sections

    root = tmp_path / "run"
    api.run(_tiny(rounds=2, seeds=[0, 1]), root, jobs=1, progress=False)
    config, arms = planned_arms(root)
    assert [(a.label, a.seed) for a in arms] == [(a, s) for s in (0, 1) for a in ("covg-esrcov", "rg-random")]

    def page(path: Path) -> str:
        text = path.read_text()
        text = re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC", "", text)
        return re.sub(r"Report built in [\d.]+ s", "", text)

    whole = page(build_report(root, tmp_path / "whole.html"))
    ahead = prepare_sections(root, config, arms, parts=("profiles",))
    ahead.update(prepare_sections(root, config, arms, parts=("breakdown", "grouping")))
    assert page(build_report(root, tmp_path / "ahead.html", prepared=ahead)) == whole
    other = {**ahead, "arms": ahead["arms"][:1], "grouping": "<p>not this study's</p>"}
    assert page(build_report(root, tmp_path / "other.html", prepared=other)) == whole
