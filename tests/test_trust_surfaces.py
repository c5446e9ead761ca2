"""Hostile inputs on the surfaces a resume, a lock, a meter, a what-if and settings that interact
meet: each gets a correct finite result, or one line (exit 2) before any work, never a hang."""
import copy
import json
import os
import resource
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import TINY, one_error_line, write_toml
from groupfel.cost_models.energy_meter import MAX_INTERVAL_S, PowerLog, open_meter
from groupfel.emulator import io
from groupfel.emulator.config import parse_config
from groupfel.errors import InputError
from groupfel.experiments import runner
from groupfel.experiments.cli import main


def _exit(args) -> int:
    """The CLI's exit code (returned, or raised as SystemExit)."""
    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


# -- whatif: an edge never holds more clients than the run has ----------------------------------------

@pytest.mark.parametrize("flags", [
    ["--clients", "20", "--access-mbps", "10"],                       # default 60 edge clients: 20 there are
    ["--clients", "20", "--energy"],
    ["--clients", "1", "--group-sizes", "1", "--edge-cores", "1"],
    ["--clients", "5", "--group-sizes", "5", "--edge-clients", "5"],
    ["--clients", "3", "--group-sizes", "2", "--access-mbps", "8,50"],
])
def test_whatif_edge_of_at_most_the_clients_gives_finite_makespans(tmp_path, capsys, flags):
    args = ["whatif", "--rounds", "3", "--out", str(tmp_path / "w"), *flags]
    if "--group-sizes" not in flags:
        args += ["--group-sizes", "2,5"]
    assert main(args) == 0
    df = pd.read_csv(tmp_path / "w" / "whatif.csv")
    assert len(df) and np.isfinite(df["makespan_s"]).all() and (df["makespan_s"] > 0).all()
    clients = int(flags[flags.index("--clients") + 1])
    assert f"one edge of {min(clients, 60)} clients" in capsys.readouterr().out


@pytest.mark.parametrize("edge, clients", [("30", "20"), ("2", "1"), ("61", "60")])
def test_whatif_edge_clients_above_clients_is_one_line_before_any_file(tmp_path, capsys, edge, clients):
    assert _exit(["whatif", "--group-sizes", "1", "--clients", clients, "--edge-clients", edge, "--out",
                  str(tmp_path / "w")]) == 2
    err = one_error_line(capsys)
    assert f"--edge-clients {edge}: more than the {clients} clients" in err
    assert not (tmp_path / "w").exists()


# -- measure --power-log: units before any call repeats, a live meter awaited ---------------------------

def _log(path: Path, times, watts=5.0) -> Path:
    path.write_text("timestamp,watts\n" + "".join(f"{t!r},{watts}\n" for t in times))
    return path


@pytest.mark.parametrize("scale, unit", [(1e3, "milliseconds"), (1e6, "microseconds")])
def test_power_log_in_finer_units_is_refused_at_once(tmp_path, scale, unit):
    """Milliseconds read as seconds: an interval of 1,000 "s" would repeat each call 10,000 s."""
    now = time.time()
    log = _log(tmp_path / "p.csv", [(now - 5 + 0.005 * i) * scale for i in range(100)])
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"ahead of this machine's clock; give timestamps in Unix seconds"):
        open_meter(str(log))
    assert time.monotonic() - t0 < 5


def test_power_log_sampled_too_slowly_is_refused_before_any_call(tmp_path):
    now = time.time()
    log = _log(tmp_path / "p.csv", [now - 600 + 60 * i for i in range(10)])
    with pytest.raises(InputError, match=rf"samples every 60 s, so each measured call would repeat for 600 s.*"
                                         rf"every {MAX_INTERVAL_S:g} s"):
        open_meter(str(log))


def test_power_log_slightly_ahead_within_the_slack_is_accepted(tmp_path):
    now = time.time()
    meter, line = open_meter(str(_log(tmp_path / "p.csv", [now - 2 + 0.01 * i for i in range(250)])))
    assert isinstance(meter, PowerLog) and meter.min_span_s == pytest.approx(0.1) and "power-meter log" in line


def test_live_power_log_written_while_measuring_is_accepted(tmp_path):
    """A meter writing at 200 Hz, clocks in sync: the log is always a sample behind the call's
    end when the call ends; the reading waits for the sample that covers it."""
    path = tmp_path / "live.csv"
    stop = threading.Event()
    path.write_text("timestamp,watts\n")

    def meter():
        with open(path, "a") as f:
            while not stop.is_set():
                f.write(f"{time.time()!r},7.0\n")
                f.flush()
                time.sleep(0.005)

    writer = threading.Thread(target=meter, daemon=True)
    writer.start()
    try:
        time.sleep(0.3)
        log = PowerLog(path)
        a = log.start()
        time.sleep(0.3)
        span, _ = log.stop(a)
        (joules,) = log.joules([span])
    finally:
        stop.set()
        writer.join()
    assert joules == pytest.approx(7.0 * (span[1] - span[0]), rel=1e-6)


def test_power_log_that_ended_before_the_call_is_refused_within_its_bound(tmp_path):
    now = time.time()
    log = PowerLog(_log(tmp_path / "p.csv", [now - 3 + 0.01 * i for i in range(200)]))
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"covers .* but a measured call ran"):
        log.joules([(now - 1.0, now + 0.5, 1)])
    assert time.monotonic() - t0 < 3 * 0.01 + 1.0 + 2   # three intervals and the clock's slack, not a minute


def test_power_log_of_one_row_is_checked_once_the_calls_ran(tmp_path):
    now = time.time()
    log = PowerLog(_log(tmp_path / "p.csv", [now]))
    assert log.min_span_s == 0.0
    with pytest.raises(InputError, match="at least two rows"):
        log.joules([(now, now + 0.1, 1)])


# -- settings that change nothing ---------------------------------------------------------------------

@pytest.mark.parametrize("accounting", ["full-fleet", "marginal"])
def test_energy_accounting_without_energy_is_refused(accounting):
    d = copy.deepcopy(TINY)
    d["cost"]["energy_accounting"] = accounting
    with pytest.raises(InputError, match=rf"cost.energy_accounting = \"{accounting}\" .* cost.energy is off"):
        parse_config(d)


def test_energy_accounting_default_without_energy_is_accepted():
    d = copy.deepcopy(TINY)
    d["cost"]["energy_accounting"] = "group-rounds"
    assert parse_config(d).cost.energy is False


def _power_file(tmp_path, device, value=4.0):
    path = tmp_path / "power.toml"
    path.write_text(f'[[power]]\ndevice = "{device}"\nstate = "training"\nvalue = {value}\n')
    return path


def _energy_config(tmp_path, profiles):
    d = copy.deepcopy(TINY)
    d["cost"].update(energy=True, profiles_file=str(profiles))
    return parse_config(d)


def test_power_table_of_a_misspelt_device_is_refused(tmp_path):
    from groupfel.emulator.world import check_power_devices

    with pytest.raises(InputError, match=r"power\[0\].*device 'raspbery-pi-4' is not a device of this run; did you "
                                         r"mean 'raspberry-pi-4'\?"):
        check_power_devices(_energy_config(tmp_path, _power_file(tmp_path, "raspbery-pi-4")))


def test_power_table_of_another_device_is_noted_not_refused(tmp_path):
    from groupfel.emulator.world import check_power_devices

    (note,) = check_power_devices(_energy_config(tmp_path, _power_file(tmp_path, "jetson-nano")))
    assert "device 'jetson-nano' is not a device of this run" in note and "prices nothing" in note


def test_power_table_of_the_runs_device_is_silent(tmp_path):
    from groupfel.emulator.world import check_power_devices

    assert check_power_devices(_energy_config(tmp_path, _power_file(tmp_path, "raspberry-pi-4"))) == []


def test_power_tables_without_energy_are_not_read(tmp_path):
    from groupfel.emulator.world import check_power_devices

    d = copy.deepcopy(TINY)
    d["cost"]["profiles_file"] = str(_power_file(tmp_path, "raspbery-pi-4"))
    assert check_power_devices(parse_config(d)) == []


@pytest.mark.parametrize("value, says", [("1000000.5", "power 1000000.5 W"), ("2e9", "power 2000000000 W"),
                                         ("-0.25", "power -0.25 W")])
def test_power_value_out_of_range_is_quoted_as_written(tmp_path, value, says):
    from groupfel.cost_models.power import read_power

    with pytest.raises(InputError, match=rf"{says}; give watts from 0 to 1,000,000"):
        read_power(_power_file(tmp_path, "d", value))


# -- reading a run's files: a buffer the file's size; side files through the gate ---------------------

def _in_fork(fn) -> int:
    """``fn()``'s return (a small int) from a forked child; 97 where it raised."""
    pid = os.fork()
    if pid == 0:
        code = 97
        try:
            code = fn()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_run_file_reads_under_a_memory_limit(tmp_path):
    """ulimit -v 2 GiB (a batch cluster's limit) and the 8 GiB limit of a run's files: a small
    file is read with a buffer of its own size."""
    from groupfel.userfile import read_json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"arms": []}))

    def read():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY))
        return 0 if read_json(path, str(path), kind="run") == {"arms": []} else 1

    assert _in_fork(read) == 0


def test_file_that_grew_past_its_size_is_read_whole(tmp_path):
    from groupfel.userfile import read_bytes

    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 10)
    real_fstat = os.fstat

    def stale(fd):   # the file as it was at the check, before it grew
        st = real_fstat(fd)
        return os.stat_result((*st[:6], 5, *st[7:]))

    os.fstat, saved = stale, os.fstat
    try:
        assert read_bytes(path, "f", "a file", "run") == b"x" * 10
    finally:
        os.fstat = saved


def _checkpoint(tmp_path) -> Path:
    import torch

    path = tmp_path / io.CHECKPOINT
    io.write_checkpoint(path, {"weights": torch.arange(100_000, dtype=torch.float32), "t": 3})
    return path


def _side(path: Path) -> Path:
    import torch

    return path.with_name(torch.load(path, weights_only=True)["__tables__"]["file"])


def test_checkpoint_round_trips_through_its_side_file(tmp_path):
    import torch

    blob = io.read_checkpoint(_checkpoint(tmp_path))
    assert blob["t"] == 3 and torch.equal(blob["weights"], torch.arange(100_000, dtype=torch.float32))


def test_checkpoint_side_file_swapped_for_a_fifo_is_one_line_not_a_hang(tmp_path):
    from groupfel.emulator.driver import load_checkpoint

    path = _checkpoint(tmp_path)
    side = _side(path)
    side.unlink()
    os.mkfifo(side)
    with pytest.raises(InputError, match=r"tables0: is a FIFO \(named pipe\), not a regular file"):
        load_checkpoint(path)


def test_checkpoint_side_file_over_the_limit_is_one_line(tmp_path, monkeypatch):
    from groupfel.emulator.driver import load_checkpoint

    path = _checkpoint(tmp_path)
    monkeypatch.setenv("GROUPFEL_MAX_FILE_MB", "0.2")
    with pytest.raises(InputError, match=r"tables0: 390\.7 KB, more than the 204\.8 KB groupfel reads"):
        load_checkpoint(path)


def test_checkpoint_side_file_a_directory_is_one_line(tmp_path):
    from groupfel.emulator.driver import load_checkpoint

    path = _checkpoint(tmp_path)
    side = _side(path)
    side.unlink()
    side.mkdir()
    with pytest.raises(InputError, match=r"tables0: is a directory"):
        load_checkpoint(path)


def test_checkpoint_side_file_missing_restarts_the_arm(tmp_path):
    from groupfel.emulator.driver import load_checkpoint

    path = _checkpoint(tmp_path)
    _side(path).unlink()
    with pytest.raises(InputError, match=r"is not a readable checkpoint \(ValueError\); delete it"):
        load_checkpoint(path)


def test_checkpoint_side_file_truncated_restarts_the_arm(tmp_path):
    from groupfel.emulator.driver import load_checkpoint

    path = _checkpoint(tmp_path)
    side = _side(path)
    side.write_bytes(side.read_bytes()[:1000])
    with pytest.raises(InputError, match=r"is not a readable checkpoint \(ValueError\)"):
        load_checkpoint(path)


# -- GROUPFEL_MAX_FILE_MB: checked before any work ----------------------------------------------------

def test_tiny_file_limit_refuses_the_run_before_any_work(tmp_path, capsys, monkeypatch):
    """The run would train, then refuse its own manifest: it is refused before it starts."""
    d = copy.deepcopy(TINY)
    d["output_dir"] = str(tmp_path / "results")
    config = write_toml(tmp_path, d)
    monkeypatch.setenv("GROUPFEL_MAX_FILE_MB", "0.004")
    assert _exit(["run", str(config), "--quiet"]) == 2
    err = one_error_line(capsys)
    assert "GROUPFEL_MAX_FILE_MB=0.004: each arm's manifest.json of this run holds about" in err
    assert not (tmp_path / "results").exists()


def test_file_limit_names_an_existing_run_file_over_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "rg-random").mkdir(parents=True)
    (run / "rg-random" / "ledger.parquet").write_bytes(b"0" * 300_000)
    monkeypatch.setenv("GROUPFEL_MAX_FILE_MB", "0.25")
    with pytest.raises(InputError, match=r"ledger.parquet: 293\.0 KB, more than the 256\.0 KB"):
        runner.check_file_limit(parse_config(copy.deepcopy(TINY)), run)


def test_file_limit_large_enough_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUPFEL_MAX_FILE_MB", "1")
    runner.check_file_limit(parse_config(copy.deepcopy(TINY)), tmp_path / "none")


# -- resume: what a kill leaves is tidied; the round's files trail no checkpoint -----------------------

def test_tidy_removes_temporaries_and_a_finished_arms_checkpoint_only(tmp_path):
    run = tmp_path / "run"
    done, todo = run / "a", run / "b"
    for arm in (done, todo):
        arm.mkdir(parents=True)
        for p in io.checkpoint_files(arm / io.CHECKPOINT):
            p.write_bytes(b"x")
    (done / "manifest.json").write_text(json.dumps({"complete": True}))
    (run / ".summary.csv.abc_1234.tmp").write_text("half")
    (todo / ".results.csv.xyz98765.tmp").write_text("half")
    (run / ".my-notes.tmp").write_text("the user's")   # not a name groupfel writes: kept
    runner.tidy(run)
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    assert left == [".my-notes.tmp", "a/manifest.json", "b/checkpoint.pt", "b/checkpoint.pt.tables0",
                    "b/checkpoint.pt.tables1"]


def test_network_trace_is_trimmed_back_to_the_checkpoint(tmp_path):
    from groupfel.emulator.driver import NETWORK, _trim_network

    df = pd.DataFrame({"kind": ["upload"] * 4, "round": [1, 2, 3, 3], "bytes": [1, 2, 3, 4]})
    df.to_parquet(tmp_path / NETWORK, index=False)
    _trim_network(tmp_path, 2)
    assert pd.read_parquet(tmp_path / NETWORK)["round"].tolist() == [1, 2]
    _trim_network(tmp_path, 0)
    assert not (tmp_path / NETWORK).exists()


def test_full_fleet_seconds_survive_a_checkpoint():
    from groupfel.emulator.ledger import CostLedger

    led = CostLedger()
    led.client_seconds = np.array([0.1, 0.2 + 1e-17, 3.0])
    led.client_energy = np.array([1.0, 2.0, 3.0])
    led._energy_loaded = {c: np.zeros(0) for c in ("round", "edge", "group", "group_round", "client", "device",
                                                   "state", "seconds", "joules")}
    back = CostLedger.from_state(led.state())
    assert back.client_seconds.tobytes() == led.client_seconds.tobytes()
    old = led.state()
    del old["energy"]["seconds"]   # a checkpoint from before: the seconds start again
    assert len(CostLedger.from_state(old).client_seconds) == 0


def test_resume_of_a_folder_killed_before_its_config_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".config.json.x1.tmp").write_text("{")
    assert _exit(["run", "--resume", str(tmp_path / "run")]) == 2
    assert "no config.json there" in one_error_line(capsys)


# -- locks: never a run inside a run another process writes --------------------------------------------

def _hold_lock(folder: Path):
    """A forked process holding ``folder``'s run lock until the returned pipe is written."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with io.run_lock(folder):
                os.write(ready_w, b"1")
                os.read(r, 1)
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    return pid, w


def _release(pid, w):
    os.write(w, b"1")
    os.waitpid(pid, 0)


def test_run_inside_a_folder_another_process_writes_is_refused(tmp_path):
    outer = tmp_path / "outer"
    pid, w = _hold_lock(outer)
    try:
        with pytest.raises(InputError, match=rf"--output: {outer / 'sub'} lies inside {outer}, which another "
                                             rf"groupfel process \(PID {pid}\) is writing"):
            runner.check_alone(outer / "sub", "--output")
    finally:
        _release(pid, w)


def test_run_around_a_folder_another_process_writes_waits_then_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "NEST_WAIT_S", 0.3)
    inner = tmp_path / "outer" / "a" / "b"
    pid, w = _hold_lock(inner)
    try:
        t0 = time.monotonic()
        with pytest.raises(InputError, match=rf"another groupfel process \(PID {pid}\) is writing {inner}"):
            runner.check_alone(tmp_path / "outer", "output_dir/name")
        assert 0.3 <= time.monotonic() - t0 < 5
    finally:
        _release(pid, w)


def test_run_around_a_folder_whose_writer_gives_way_goes_on(tmp_path):
    inner = tmp_path / "outer" / "sub"
    pid, w = _hold_lock(inner)
    threading.Timer(0.2, _release, (pid, w)).start()
    runner.check_alone(tmp_path / "outer", "--output")   # waits for the lock to go, then passes


def test_a_lock_file_nobody_holds_is_no_run(tmp_path):
    (tmp_path / "outer" / "sub").mkdir(parents=True)
    (tmp_path / "outer" / "sub" / io.LOCK_NAME).write_text("12345\n")
    assert io.held_elsewhere(tmp_path / "outer" / "sub") is None
    runner.check_alone(tmp_path / "outer" / "x", "--output")
    runner.check_alone(tmp_path / "outer", "--output")


def test_this_processs_own_lock_is_not_another_writer(tmp_path):
    with io.run_lock(tmp_path / "outer"):
        assert io.held_elsewhere(tmp_path / "outer") is None
        runner.check_alone(tmp_path / "outer" / "sub", "--output")


def test_a_refused_new_run_leaves_no_folder_it_created(tmp_path):
    made = tmp_path / "results" / "deep" / "run"
    made.mkdir(parents=True)
    (made / "config.json").write_text("{}")
    (tmp_path / "results" / "other").mkdir()
    runner._drop_if_empty(made, tmp_path / "results" / "deep")
    assert not (tmp_path / "results" / "deep").exists() and (tmp_path / "results" / "other").is_dir()


# -- availability: what the first round's refusal says ---------------------------------------------------

def _availability_run(tmp_path, start, end) -> Path:
    d = copy.deepcopy(TINY)
    d["arms"] = d["arms"][1:]
    n = d["topology"]["edges"] * d["topology"]["clients_per_edge"]
    (tmp_path / "av.csv").write_text("client,start_s,end_s\n" + "".join(f"{c},{start},{end}\n" for c in range(n)))
    d["topology"].update(availability={"file": str(tmp_path / "av.csv")}, edge_access_mbps=30.0)
    d["output_dir"] = str(tmp_path / "results")
    return write_toml(tmp_path, d)


def test_first_round_whose_clients_leave_at_once_is_one_line_and_leaves_nothing(tmp_path, capsys):
    """Online only in [0, 0.001): not "offline at 0 s, start at 0", which the file already does."""
    assert _exit(["run", str(_availability_run(tmp_path, "0", "0.001")), "--quiet"]) == 2
    err = one_error_line(capsys)
    assert "are online at its start (0 s simulated) but go offline before their first group round ends" in err
    assert "start_s = 0" not in err
    assert not (tmp_path / "results").exists()


def test_clients_online_only_late_train_then_stop_with_a_reason(tmp_path, capsys):
    """Every client online in [1000000.5, 1000001) only: the clock waits for them, the round runs,
    then the run stops early saying why (exit 0, a finite result)."""
    assert _exit(["run", str(_availability_run(tmp_path, "1000000.5", "1000001")), "--quiet"]) == 0
    summary = pd.read_csv(tmp_path / "results" / "tiny" / "summary.csv")
    assert summary["stop"].tolist() == ["availability"] and np.isfinite(summary["sim_time_s"]).all()
    assert summary["sim_time_s"].iloc[0] >= 1000000.5
    assert "stopped early: rg-random: availability: no client is online" in capsys.readouterr().out
