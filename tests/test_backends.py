"""Backends: a killed pool worker's task runs again; GPU requests; what a task ships back."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import children

from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.experiments.backends import RayOptions, land, run_task, run_tasks, task_device
from groupfel.experiments.cli import main
from groupfel.experiments.runner import prepare, run_experiment

ROOT = Path(__file__).resolve().parents[1]


def test_a_pool_worker_killed_by_the_os_is_replaced_and_the_run_completes(tmp_path, tiny_dict):
    """A pool worker training a stack of two runs is killed (as the out-of-memory killer does): its
    runs go again from their checkpoints, and the tables are bitwise those of an uninterrupted
    stacked run (which itself is one stack of four, in this process)."""
    raw = {**tiny_dict, "seed": None, "seeds": [0, 1, 2, 3], "arms": tiny_dict["arms"][:1],
           "train": {**tiny_dict["train"], "rounds": 20, "stack": 4}}
    raw.pop("seed")
    config = parse_config(raw)
    run_experiment(config, tmp_path / "whole", jobs=1, progress=False)
    import tomli_w

    (tmp_path / "run.toml").write_text(tomli_w.dumps(raw))
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "groupfel.experiments.cli", "run", str(tmp_path / "run.toml"),
                             "--output", str(out), "--jobs", "2", "--quiet"],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    killed, deadline = [], time.time() + 300
    while not killed and proc.poll() is None and time.time() < deadline:
        if list(out.glob("seed-*/*/checkpoint.pt")):        # mid-run: a worker holds an arm
            workers = [w for fs in children(proc.pid) for w in children(fs)]   # forkserver -> workers
            if workers:
                os.kill(workers[0], signal.SIGKILL)          # as the out-of-memory killer does
                killed.append(workers[0])
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=600)
    assert killed and proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "a worker process died" in stderr
    for name in ("runs.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "whole" / name), pd.read_csv(out / name),
                                      check_exact=True)
    for path in out.glob("seed-*/*/manifest.json"):
        assert json.loads(path.read_text())["stack"] == {"width": 4, "runs": 2, "formulation": "stacked"}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_run_takes_its_pool_workers_down_and_resumes_to_the_same_tables(tmp_path, tiny_dict):
    """SIGTERM to the run (a scheduler's stop): no worker goes on writing an arm's checkpoints
    behind it, and the same command then finishes with the uninterrupted run's tables."""
    raw = {**tiny_dict, "seeds": [0, 1], "arms": tiny_dict["arms"][:1], "train": {**tiny_dict["train"], "rounds": 20}}
    raw.pop("seed")
    run_experiment(parse_config(raw), tmp_path / "whole", jobs=1, progress=False)
    import tomli_w

    (tmp_path / "run.toml").write_text(tomli_w.dumps(raw))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "groupfel.experiments.cli", "run", str(tmp_path / "run.toml"), "--output", str(out),
               "--jobs", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers, deadline = [], time.time() + 300
    while not workers and proc.poll() is None and time.time() < deadline:
        if list(out.glob("seed-*/*/checkpoint.pt")):        # mid-run: the workers hold arms
            workers = [w for fs in children(proc.pid) for w in children(fs)]   # forkserver -> workers
        time.sleep(0.01)
    assert workers, "the run finished before it could be killed"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    deadline = time.time() + 30
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "a pool worker outlived the killed run"
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for name in ("runs.csv", "summary.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "whole" / name), pd.read_csv(out / name),
                                      check_exact=True)


def test_task_device_asks_for_cuda_only_with_gpus():
    assert task_device("cpu", 0.0, [], False, "n1") is None        # no --gpus-per-task: the config's
    assert task_device("cpu", 0.5, [0], True, "n1") == "cuda"      # Ray's GPU is the first visible one
    assert task_device("cuda:3", 1.0, [3], True, "n1") == "cuda"
    with pytest.raises(InputError, match=r"node n1 asked for GPUs but torch there has no CUDA"):
        task_device("cpu", 1.0, [0], False, "n1")
    with pytest.raises(InputError, match=r"node n1 asked for GPUs but Ray assigned it no GPU"):
        task_device("cpu", 1.0, [], True, "n1")


def test_gpu_shares_ray_accepts():
    assert RayOptions(gpus_per_task=0.25).gpus_per_task == 0.25 and RayOptions(gpus_per_task=2).gpus_per_task == 2
    for bad in (-1, 1.5):
        with pytest.raises(InputError, match=r"--gpus-per-task"):
            RayOptions(gpus_per_task=bad)
    with pytest.raises(InputError, match=r"need --backend ray"):
        run_tasks([object()], backend="local", ray=RayOptions(gpus_per_task=1))


def test_ray_flags_without_ray_backend_fail_in_one_line(tmp_path, tiny_dict, capsys):
    import tomli_w

    raw = {**tiny_dict, "seeds": [0, 1]}
    raw.pop("seed")
    (tmp_path / "run.toml").write_text(tomli_w.dumps(raw))
    assert main(["run", str(tmp_path / "run.toml"), "--output", str(tmp_path / "out"), "--gpus-per-task", "1",
                 "--quiet"]) == 2
    assert "need --backend ray" in capsys.readouterr().err


def test_the_manifest_records_the_device(tmp_path, tiny_config):
    raw = json.loads(tiny_config.model_dump_json())
    arm_dir = Path(run_task(json.dumps(raw), str(tmp_path), 0))
    manifest = json.loads((arm_dir / "manifest.json").read_text())
    assert manifest["device"].startswith("cpu (")


def test_landed_files_mark_the_arm_complete_last_and_drop_its_checkpoint(tmp_path, tiny_dict):
    raw = {**tiny_dict, "seeds": [0]}
    raw.pop("seed")
    task = prepare(parse_config(raw), tmp_path)[0]
    arm = Path(task.run_dir) / "covg-esrcov"
    land(Path(task.run_dir), {"covg-esrcov/checkpoint.pt": b"ck"}, final=False)
    assert (arm / "checkpoint.pt").read_bytes() == b"ck" and not task.done
    import io

    def parquet() -> bytes:
        buf = io.BytesIO()
        pd.DataFrame({"r": [1]}).to_parquet(buf)
        return buf.getvalue()
    # an arm is done when its manifest says so and its tables parse (groupfel.emulator.runfiles.intact_arm)
    land(Path(task.run_dir), {"covg-esrcov/manifest.json": b'{"complete": true}', "covg-esrcov/results.csv": b"r\n1\n",
                              "covg-esrcov/results.parquet": parquet(), "covg-esrcov/ledger.parquet": parquet(),
                              "local-reference-seed0.pt": b"x"}, final=True)
    assert task.done and not (arm / "checkpoint.pt").exists() and (arm / "results.csv").read_text() == "r\n1\n"
    with pytest.raises(ValueError, match="outside its run directory"):
        land(Path(task.run_dir), {"../evil": b""}, final=False)


def _files_of(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("mode", ["global", "per-group"])
def test_a_task_streams_checkpoints_and_resumes_from_one_with_equal_files(tmp_path, tiny_dict, mode):
    """What a Ray task sends (run here as the plain generator it is): a checkpoint after each
    evaluation, then every file. Restarted from a streamed checkpoint, it ends with the same
    results and ledger as an undisturbed task and as the local pool's worker."""
    from groupfel.experiments.backends import ray_task

    if mode == "per-group":
        tiny_dict.update(mode="per-group", topology={"edges": 1, "clients_per_edge": 6})
        tiny_dict["arms"] = [{"name": "ifca", "grouping": {"policy": "ifca", "n_clusters": 2}}]
    config_json = json.dumps(json.loads(parse_config(tiny_dict).model_dump_json()))
    run_task(config_json, str(tmp_path / "local"), 0)
    arm = tiny_dict["arms"][0]["name"]

    messages = [(k, f) for k, i, f in ray_task([(config_json, 0, {}, None)], 1, 0.0)]
    kinds = [k for k, _ in messages]
    assert kinds == ["checkpoint"] * (len(kinds) - 1) + ["done"] and len(kinds) >= tiny_dict["train"]["rounds"]
    assert f"{arm}/checkpoint.pt" in messages[1][1]
    whole = tmp_path / "whole"
    for kind, files in messages:
        land(whole, files, final=kind == "done")
    # a retry: the driver's copy after the second checkpoint, as _driver_files ships it
    partial = tmp_path / "partial"
    for kind, files in messages[:2]:
        land(partial, files, final=False)
    resumed_msgs = list(ray_task([(config_json, 0, _files_of(partial), None)], 1, 0.0))
    assert len(resumed_msgs) < len(messages)            # it resumed: fewer rounds left to stream
    land(partial, resumed_msgs[-1][2], final=True)
    for d in (whole, partial):
        for name in ("results.csv", "ledger.parquet"):
            assert (d / arm / name).read_bytes() == (tmp_path / "local" / arm / name).read_bytes(), (d, name)
        assert not (d / arm / "checkpoint.pt").exists()


def test_a_worker_that_fails_at_start_up_reports_its_own_error_in_one_line(tmp_path, tiny_dict, monkeypatch,
                                                                            capsys):
    """Not "lost its worker process (killed ...)" four times over: the worker's own error, once."""
    import tomli_w

    from groupfel.experiments import backends

    monkeypatch.setattr(backends, "WORKER_SETUP", os.setsid)   # setsid(parent) -> TypeError in the worker
    raw = {**tiny_dict, "seeds": [0, 1], "arms": tiny_dict["arms"][:1], "train": {**tiny_dict["train"], "rounds": 1}}
    raw.pop("seed")
    (tmp_path / "run.toml").write_text(tomli_w.dumps(raw))
    assert main(["run", str(tmp_path / "run.toml"), "--output", str(tmp_path / "out"), "--jobs", "2",
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "groupfel: error: a worker process failed at start-up: TypeError: posix.setsid() takes no arguments "
        "(1 given)"], err
