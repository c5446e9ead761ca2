"""groupfel on a GPU. The CUDA tests run where torch sees a GPU and are skipped elsewhere (the
CPU-side guarantees are tests/test_devices.py and tests/test_training.py); the benchmark's quick
mode runs everywhere, so it cannot rot."""
from __future__ import annotations

import copy
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY
from test_devices import CASES, RESUMED, run_twice
from test_stacking import compare_stacks

from groupfel.emulator.config import parse_config
from groupfel.emulator.driver import plan_arm, run_arm
from groupfel.emulator.training import BatchedEngine, TorchEngine
from groupfel.emulator.world import build_world
from groupfel.experiments import reproduce
from groupfel.topologies import load_dataset

ROOT = Path(__file__).resolve().parents[1]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@functools.cache
def _gpu_benchmark():
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.path[:] = path   # it puts benchmarks/ first, where pfl.py would shadow the pfl package
    return module


@pytest.mark.parametrize("name,runs", [
    ("figs10-12", 3 * 3 * 5),      # 3 zipped points (algorithm with mu) x 3 seeds x the base's 5 arms, not 27 points
    ("fig13", (5 + 1 + 1) * 3),    # 3 zipped points, each with its own arms (5, 1, 1) x 3 seeds
    ("table2", 9 * 3 * 2),         # a product of 3 x 3 values x 3 seeds x 2 arms
])
def test_the_projection_counts_runs_as_the_sweep_expands_them(name, runs):
    sweep, base, _ = reproduce.resolve(reproduce.load(name), False)
    assert _gpu_benchmark().sweep_runs(sweep, base) == runs


@pytest.mark.parametrize("device", ["cuda", "cuda:99", "gpu"])
def test_the_gpu_benchmark_without_that_gpu_says_so_in_one_line(device, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--device", device, "--json", str(tmp_path / "out.json")])
    assert _gpu_benchmark().main() == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--device" in err, err
    assert not (tmp_path / "out.json").exists()


def test_the_gpu_benchmark_runs_quick_on_the_cpu(tmp_path):
    """Every section of the benchmark's code on tiny sizes; one timed repeat (the default 3 only
    steady the medians, which nothing here reads)."""
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
                           "--repeats", "1", "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["tiny"]["ok"] and result["tiny"]["bitwise_repeatable"]
    engines = {(r["where"], r["engine"]) for r in result["round"]}
    assert {("cpu", "sequential"), ("cpu", "batched per-client"), ("cpu", "batched stacked")} <= engines
    assert all(r["seconds"] > 0 for r in result["round"])
    assert result["full_size"]["rounds"] == 1 and result["full_size"]["eq5_cost_per_round"] > 0


@cuda
def test_the_gpu_benchmark_records_the_settings_the_engines_trained_with(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cuda", "--quick",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    detail = json.loads(out.read_text())["device_details"]
    assert detail["tf32"] is False and detail["deterministic_algorithms"] is True
    assert detail["cudnn_deterministic"] is True and detail["cudnn_benchmark"] is False


@cuda
@pytest.mark.parametrize("name,d", CASES, ids=[c[0] for c in CASES])
def test_every_algorithm_and_mode_runs_on_cuda_and_resumes(name, d, tmp_path):
    full, resumed = run_twice(d, tmp_path, "cuda", resume=name in RESUMED)
    assert np.isfinite(full["loss"]).all()
    np.testing.assert_array_equal(full["accuracy"], resumed["accuracy"])   # deterministic, graphs included


@cuda
@pytest.mark.parametrize("first,then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device(first, then, tmp_path):
    d = copy.deepcopy(TINY)
    d["arms"] = [d["arms"][0]]
    d["train"].update(rounds=4, momentum=0.5, client_state="persistent")

    class Killed(Exception):
        pass

    def kill(t, cost, acc):
        if t == 2:
            raise Killed
    d["train"]["device"] = first
    world = build_world(parse_config(d))
    with pytest.raises(Killed):
        run_arm(world, plan_arm(world, 0), tmp_path / "run", kill)
    d["train"]["device"] = then
    world = build_world(parse_config(d))
    rows = run_arm(world, plan_arm(world, 0), tmp_path / "run")
    assert list(rows["round"])[-1] == 4 and np.isfinite(rows["loss"]).all()


@cuda
def test_the_cpu_engine_trains_after_a_backward_pass_on_the_gpu():
    """The crash this guards against: a CUDA build with a GPU starts autograd's device threads at
    the first backward pass, after which a forked child refuses to run backward."""
    x = torch.ones(3, device="cuda", requires_grad=True)
    (x * 2).sum().backward()
    data = load_dataset("digits")
    parts = [np.arange(i * 20, i * 20 + 20) for i in range(4)]
    seq = TorchEngine(data, parts, "mlp", 0.05, 8)
    bat = BatchedEngine(data, parts, "mlp", 0.05, 8, workers=2, formulation="per-client")
    start = seq.initial_weights(0)
    a = seq.train(start, [0, 1, 2, 3], 1, [1, 2, 3, 4])
    b = bat.train(start, [0, 1, 2, 3], 1, [1, 2, 3, 4])
    assert float((a - b).abs().max()) <= 1e-5


@cuda
@pytest.mark.parametrize("model", ["mlp", "cnn", "resnet-1"])
def test_the_stacked_engine_on_cuda_is_the_sequential_one(model):
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    parts = [rng.choice(len(data.y_train), n, replace=False) for n in (9, 20, 33, 5, 17)]
    seq = TorchEngine(data, parts, model, 0.05, 8, "cuda", momentum=0.9, weight_decay=1e-3, mu=0.01)
    bat = BatchedEngine(data, parts, model, 0.05, 8, "cuda", momentum=0.9, weight_decay=1e-3, mu=0.01,
                        formulation="stacked")
    start = seq.initial_weights(0)
    for _ in range(2):   # the second call replays the captured graph
        a = seq.train(start, [0, 1, 2, 3, 4], 2, [5, 6, 7, 8, 9])
        b = bat.train(start, [0, 1, 2, 3, 4], 2, [5, 6, 7, 8, 9])
        assert float((a - b).abs().max()) <= 1e-4
    again = BatchedEngine(data, parts, model, 0.05, 8, "cuda", momentum=0.9, weight_decay=1e-3, mu=0.01,
                          formulation="stacked").train(start, [0, 1, 2, 3, 4], 2, [5, 6, 7, 8, 9])
    assert torch.equal(b, again)   # a fresh engine (a resumed run) computes bitwise as the first


@cuda
def test_runs_stacked_on_cuda_keep_each_runs_ledger_and_numbers(tiny_dict, tmp_path):
    compare_stacks(tiny_dict, tmp_path, "cuda")


@cuda
def test_the_collector_never_runs_while_a_step_is_captured():
    """A finished run's engine holds its captured graphs in a reference cycle; freed by the
    collector during another engine's capture, it voids that capture (the demo on CUDA failed so:
    cudaErrorStreamCaptureInvalidated). With the collector set to run at nearly every allocation,
    no collection may start while a graph is being captured."""
    import gc

    data = load_dataset("digits")
    parts = [np.arange(i * 20, i * 20 + 20) for i in range(4)]
    during_capture = []

    def watch(phase, info):
        if phase == "start" and torch.cuda.is_current_stream_capturing():
            during_capture.append(info["generation"])
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(watch)
    try:
        for _ in range(2):
            engine = BatchedEngine(data, parts, "cnn", 0.05, 8, "cuda", momentum=0.9, formulation="stacked")
            out = engine.train(engine.initial_weights(0), [0, 1, 2, 3], 1, [1, 2, 3, 4])
            assert torch.isfinite(out).all()
            del engine   # cyclic garbage, graphs and all
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*threshold)
    assert not during_capture
