"""The engine's stacked forms (emulator.stacked): every shipped model written out as one step.

* every shipped model has a written-out form, and a user's plug-in model of other modules has
  none (it steps through ``vmap``);
* the written-out gradients are within 1e-5 (relative, per client) of a float64 per-client
  reference, for every shipped model, ragged masks included;
* a GPU step computes its bucket of rows (:func:`bucket`); the bucketed step, run eagerly on the
  CPU, gives every client bitwise the numbers of the exact-rows step, and every tensor the step
  makes lives on the engine's device (tests/test_devices.py's discipline).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from groupfel.emulator import models
from groupfel.emulator.stacked import GroupedNet, Stack, bucket
from groupfel.emulator.training import BatchedEngine, TorchEngine
from groupfel.topologies import load_dataset

from test_devices import DeviceDiscipline

SHAPES = {"audio-cnn": (1, 12, 9), "resnet-3": (3, 8, 8)}   # others: (1, 12, 12)


def _stack(name: str, width: int, seed: int = 0):
    shape = SHAPES.get(name, (1, 12, 12))
    torch.manual_seed(seed)
    net = models.build_model(name, shape, 10)
    params = [p.detach().unsqueeze(0) + 0.05 * torch.randn(width, *p.shape) for p in net.parameters()]
    x, y, m = torch.randn(width, 5, *shape), torch.randint(0, 10, (width, 5)), torch.ones(width, 5)
    m[1, 2:] = 0   # a partial last batch
    return net, params, x, y, m


# digit-bn-cnn and audio-m5 carry BatchNorm state that travels with the model, so they train client by client
@pytest.mark.parametrize("name", sorted(set(models.MODELS) - {"digit-bn-cnn", "audio-m5"}))
def test_every_shipped_model_is_written_out_and_its_gradients_match_a_float64_reference(name):
    """Each client's gradient of its masked mean loss, against the module itself in float64, one
    client at a time: within 1e-5 of the reference's norm, every parameter of every client."""
    net, params, x, y, m = _stack(name, 3)
    grouped = GroupedNet.of(net)
    assert grouped is not None
    got = grouped(params, x, y, m)
    ref_net = models.build_model(name, tuple(x.shape[2:]), 10).double()
    for k in range(3):
        for p, own in zip(ref_net.parameters(), params):
            p.data.copy_(own[k].double())
        ref_net.zero_grad(set_to_none=True)
        keep = m[k] > 0
        F.cross_entropy(ref_net(x[k][keep].double()), y[k][keep]).backward()
        for g, p in zip(got, ref_net.parameters()):
            ref = p.grad
            assert float((g[k].double() - ref).norm() / ref.norm().clamp(min=1e-12)) <= 1e-5, (name, k, p.shape)


def test_a_plug_in_model_of_other_modules_has_no_written_out_form():
    class Doubling(nn.Module):
        def forward(self, x):
            return 2 * x

    assert GroupedNet.of(nn.Sequential(nn.Flatten(), nn.Linear(4, 2), Doubling())) is None
    assert GroupedNet.of(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 2))) is None
    shared = nn.Linear(4, 4)
    assert GroupedNet.of(nn.Sequential(nn.Flatten(), shared, shared)) is None
    assert GroupedNet.of(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU())) is None   # no per-sample logits
    assert GroupedNet.of(nn.Sequential(nn.Flatten(), nn.Linear(4, 2))) is not None


def test_buckets_round_up_by_at_most_an_eighth_and_never_past_the_stack():
    for width in (8, 56, 416, 1000):
        sizes = [bucket(live, width) for live in range(1, width + 1)]
        assert all(live <= b <= width for live, b in zip(range(1, width + 1), sizes))
        assert all(b - live < max(8, live / 8 + 1) for live, b in zip(range(1, width + 1), sizes))
        assert sizes == sorted(sizes)          # fewer live rows never take a wider bucket
    assert len({bucket(live, 416) for live in range(1, 417)}) <= 32   # a graph each: few of them
    assert bucket(3, 416) == 8 and bucket(65, 416) == 72 and bucket(129, 416) == 144 and bucket(400, 416) == 416


@pytest.mark.parametrize("name", ["cnn", "resnet-1"])
def test_a_bucketed_call_gives_every_client_the_exact_rows_numbers_and_stays_on_the_device(name):
    """The GPU's bucketing, eager on the CPU: ragged clients ordered by step count, each step
    computing its bucket's rows; every client's model and momentum bitwise those of the CPU's
    exact rows, each step's rows its bucket of the live clients, and no tensor factory of the
    engine without its device."""
    data = load_dataset("digits")
    rng = np.random.default_rng(1)
    parts = [np.sort(rng.choice(len(data.y_train), size=int(n), replace=False)) for n in rng.integers(3, 40, 19)]
    eng = BatchedEngine(data, parts, name, lr=0.05, batch_size=8, formulation="stacked", workers=1, momentum=0.9)
    start = eng.initial_weights(0)
    clients, seeds = list(range(19)), list(range(100, 119))
    exact_m = torch.zeros(19, eng.n_params)
    exact = eng.train(start, clients, 2, seeds, momentum=exact_m)
    eng.buckets = True
    steps: list[tuple[int, int]] = []
    real_step = type(eng._stack(bucket(19, 1 << 30))).step

    def record(stack, rows):
        steps.append((int((stack.mask.sum(1) > 0).sum()), rows))
        real_step(stack, rows)
    bucketed_m = torch.zeros(19, eng.n_params)
    with pytest.MonkeyPatch.context() as mp, DeviceDiscipline() as discipline:
        mp.setattr(type(eng._stack(bucket(19, 1 << 30))), "step", record)
        bucketed = eng.train(start, clients, 2, seeds, momentum=bucketed_m)
    assert not discipline.found, sorted(discipline.found)
    assert torch.equal(exact, bucketed) and torch.equal(exact_m, bucketed_m)
    assert steps and all(rows == bucket(live, 24) for live, rows in steps)
    assert len({rows for _, rows in steps}) > 1   # ragged: the buckets shrink as clients finish


def test_a_cpu_run_refuses_autotune_in_one_line_before_any_work(tmp_path, tiny_dict, capsys):
    from groupfel.experiments.cli import main

    from conftest import write_toml

    tiny_dict["train"]["autotune"] = True
    cfg = write_toml(tmp_path, tiny_dict, "c.toml")
    assert main(["run", str(cfg), "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("groupfel: error: train.autotune:") and "\n" not in err and "false" in err
    assert not (tmp_path / "out").exists()


def test_the_layout_setting_reaches_the_step_and_changes_no_client_beyond_rounding():
    """``channels_last`` unset is channels-last on a CPU; NCHW computes the same models within the
    engines' 1e-5, and runs with other kernel settings never share a batcher."""
    from groupfel.emulator.stacked import Kernels
    from groupfel.emulator.stacking import Stacks

    data = load_dataset("digits")
    parts = [np.arange(i * 20, i * 20 + 9 + 3 * i) for i in range(4)]
    out = {}
    for layout in (None, False):
        eng = BatchedEngine(data, parts, "resnet-1", lr=0.05, batch_size=8, formulation="stacked", workers=1,
                            kernels=Kernels(channels_last=layout))
        out[layout] = eng.train(eng.initial_weights(0), [0, 1, 2, 3], 1, [1, 2, 3, 4])
        stack = next(iter(eng._stacks.values()))
        assert stack.grouped.memory_format == (torch.channels_last if layout is None else torch.contiguous_format)
    assert float((out[None] - out[False]).abs().max()) <= 1e-5
    stacks = Stacks()
    kw = dict(momentum=0.0, weight_decay=0.0, mu=0.0, precision="fp32")
    a = stacks.member("batched", data, parts, "mlp", 0.05, 8, "cpu", **kw)
    b = stacks.member("batched", data, parts, "mlp", 0.05, 8, "cpu", kernels=Kernels(channels_last=False), **kw)
    assert a.batcher is not b.batcher
    with pytest.raises(ValueError, match="autotune"):
        Kernels(autotune=True).apply(torch.device("cpu"))


def test_the_gpu_step_profile_runs_on_a_cpu_in_quick_mode(tmp_path, monkeypatch):
    """benchmarks/step_profile.py, the first script a lent GPU runs: its tiny CPU mode, so it cannot rot."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("step_profile", root / "benchmarks" / "step_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.path[:] = path   # it puts benchmarks/ first, where pfl.py would shadow the pfl package
    monkeypatch.setattr(sys, "argv", ["step_profile.py", "--device", "cpu", "--quick", "--json", str(tmp_path / "p.json")])
    assert module.main() == 0
    got = json.loads((tmp_path / "p.json").read_text())
    assert {r["setting"] for r in got["step"]} == {"fp32", "channels-last"}
    assert all(r["rows_computed"] <= r["rows_padded"] for r in got["engine"])
    monkeypatch.setattr(sys, "argv", ["step_profile.py", "--device", "cuda:99"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert module.main() == 2


@pytest.mark.parametrize("corrected", [False, True])
def test_clients_of_other_epochs_and_learning_rates_share_a_call_with_their_own_numbers(corrected):
    """Local epochs and learning rate are per-row inputs of one stacked call: each client's model
    and momentum bitwise those of a call of its own epochs and rate alone (on the CPU)."""
    data = load_dataset("digits")
    rng = np.random.default_rng(2)
    parts = [np.sort(rng.choice(len(data.y_train), size=int(n), replace=False)) for n in rng.integers(3, 30, 6)]
    eng = BatchedEngine(data, parts, "cnn", lr=0.05, batch_size=8, formulation="stacked", workers=1, momentum=0.9)
    start = eng.initial_weights(0)
    epochs, lrs = [2, 3, 1, 2, 4, 3], [0.05, 0.01, 0.05, 0.02, 0.05, 0.01]
    corr = 0.01 * torch.randn(6, eng.n_params, generator=torch.Generator().manual_seed(0)) if corrected else None
    mixed_m = torch.zeros(6, eng.n_params)
    mixed = eng.train(start, list(range(6)), epochs, list(range(6)), lr=lrs, momentum=mixed_m, correction=corr)
    for k in range(6):
        own_m = torch.zeros(1, eng.n_params)
        own = eng.train(start, [k], epochs[k], [k], lr=lrs[k], momentum=own_m,
                        correction=None if corr is None else corr[k:k + 1])
        assert torch.equal(own[0], mixed[k]) and torch.equal(own_m[0], mixed_m[k]), k


def test_runs_of_other_epochs_and_learning_rates_share_the_batchers_call():
    """Two runs of one stack, E = 1 at lr 0.05 and E = 3 at lr 0.01: one engine call, and each
    run's models bitwise those of its own call alone."""
    import threading

    from groupfel.emulator.stacking import Stacks

    data = load_dataset("digits")
    parts = [np.arange(i * 20, i * 20 + 5 + 4 * i) for i in range(4)]
    stacks = Stacks()
    kw = dict(momentum=0.0, weight_decay=0.0, mu=0.0, precision="fp32")
    runs = [stacks.member("batched", data, parts, "mlp", 0.05, 8, "cpu", **kw) for _ in range(2)]
    engine = runs[0].batcher.engine
    calls = []
    real = engine.train
    monkey = pytest.MonkeyPatch()
    monkey.setattr(engine, "train", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    start = runs[0].initial_weights(0)
    settings = [(1, 0.05), (3, 0.01)]
    got = {}

    def train(i):
        got[i] = runs[i].train(start, [0, 1, 2, 3], settings[i][0], [1, 2, 3, 4], lr=settings[i][1])
    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkey.undo()
    assert calls == [[1] * 4 + [3] * 4]
    for i, (epochs, lr) in enumerate(settings):
        alone = engine.train(start, [4 * i + c for c in range(4)], epochs, [1, 2, 3, 4], lr=lr)
        assert torch.equal(alone, got[i])


def test_clients_of_other_algorithms_share_a_call_each_row_bitwise_as_when_alone():
    """FedAvg, FedProx (μ), momentum and SCAFFOLD (a correction) clients in one stacked call: each
    client's model and momentum bitwise those of a call of its own algorithm alone (on the CPU),
    and a client without momentum keeps its buffer untouched."""
    data = load_dataset("digits")
    rng = np.random.default_rng(3)
    parts = [np.sort(rng.choice(len(data.y_train), size=int(n), replace=False)) for n in rng.integers(3, 30, 6)]
    eng = BatchedEngine(data, parts, "cnn", lr=0.05, batch_size=8, formulation="stacked", workers=1)
    start = eng.initial_weights(0)
    gen = torch.Generator().manual_seed(0)
    # (μ, β, corrected) a client: FedAvg, FedProx, momentum, SCAFFOLD, FedProx with momentum, FedAvg
    algos = [(0.0, 0.0, False), (0.1, 0.0, False), (0.0, 0.9, False), (0.0, 0.0, True), (0.01, 0.5, False),
             (0.0, 0.0, False)]
    own_corr = [0.01 * torch.randn(1, eng.n_params, generator=gen) if c else None for _, _, c in algos]
    corr = torch.cat([c if c is not None else torch.zeros(1, eng.n_params) for c in own_corr])
    buffers = 0.01 * torch.randn(6, eng.n_params, generator=gen)
    mixed_m = buffers.clone()
    mixed = eng.train(start, list(range(6)), [2, 1, 3, 2, 1, 2], list(range(6)), lr=0.05, momentum=mixed_m,
                      correction=corr, mu=[a[0] for a in algos], beta=[a[1] for a in algos])
    for k, (mu, beta, _) in enumerate(algos):
        own_m = buffers[k:k + 1].clone()
        own = eng.train(start, [k], [2, 1, 3, 2, 1, 2][k], [k], lr=0.05, momentum=own_m if beta else None,
                        correction=own_corr[k], mu=mu, beta=beta)
        assert torch.equal(own[0], mixed[k]), k
        assert torch.equal(own_m[0], mixed_m[k]), k
        assert beta or torch.equal(mixed_m[k], buffers[k]), k   # a client without momentum: buffer as it was


def test_a_stacked_call_matches_the_sequential_engine_for_every_algorithm():
    """Per-row μ, momentum and corrections compute what the sequential reference does with the
    engine's own (within float rounding: other kernels)."""
    data = load_dataset("digits")
    parts = [np.arange(i * 25, i * 25 + 7 + 5 * i) for i in range(3)]
    gen = torch.Generator().manual_seed(1)
    eng = BatchedEngine(data, parts, "mlp", lr=0.05, batch_size=8, formulation="stacked", workers=1)
    corr = 0.01 * torch.randn(3, eng.n_params, generator=gen)
    mixed = eng.train(eng.initial_weights(0), [0, 1, 2], 2, [5, 6, 7], mu=[0.1, 0.0, 0.0], beta=[0.0, 0.9, 0.0],
                      correction=corr * torch.tensor([[0.0], [0.0], [1.0]]))
    for k, (mu, beta, c) in enumerate([(0.1, 0.0, None), (0.0, 0.9, None), (0.0, 0.0, corr[2:3])]):
        seq = TorchEngine(data, parts, "mlp", lr=0.05, batch_size=8, mu=mu, momentum=beta)
        ref = seq.train(eng.initial_weights(0), [k], 2, [5 + k], correction=c)
        assert torch.allclose(ref[0], mixed[k], rtol=1e-5, atol=1e-6), k


class _SameDevice(TorchFunctionMode):
    """Records every op whose tensors (arguments or results) are not all on ``device``."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device, self.found = device, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        if any(t.device != self.device for t in tensors):
            self.found.add(f"{getattr(func, '__name__', func)}: {sorted({str(t.device) for t in tensors})}")
        return out


@pytest.mark.parametrize("name,optimizer", [("mlp", "sgd"), ("cnn", "sgd"), ("resnet-1", "sgd"), ("cnn", "adam")])
def test_every_op_of_a_stacked_step_stays_on_the_engines_device(name, optimizer):
    """The engine on the ``meta`` device (no data: shapes only), bucketed as on a GPU, with every
    optional term (μ, momentum or Adam's state, corrections): every op of every step (what a GPU
    captures in a graph) has all its tensors on the engine's device, and the call's results come
    back there. A tensor made on the CPU by mistake fails here (on a CPU engine it would go unseen)."""
    data = load_dataset("digits")
    parts = [np.arange(i * 20, i * 20 + 5 + 4 * i) for i in range(5)]
    eng = BatchedEngine(data, parts, name, lr=0.05, batch_size=8, formulation="stacked", workers=1,
                        optimizer=optimizer)
    start = eng.initial_weights(0)
    meta = torch.device("meta")
    eng.device, eng.buckets = meta, True
    eng.x, eng.y, eng.model = eng.x.to(meta), eng.y.to(meta), eng.model.to(meta)
    momentum = torch.zeros(5, eng.state_width if optimizer == "adam" else eng.n_params, device=meta)
    mode = _SameDevice(meta)
    real = Stack._step
    steps = []

    def checked(stack, rows, uses):
        steps.append(uses)
        with mode:
            real(stack, rows, uses)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Stack, "_step", checked)
        out = eng.train(start, list(range(5)), [2, 1, 3, 1, 2], list(range(5)), momentum=momentum,
                        mu=[0.1, 0, 0, 0, 0], beta=[0, 0.9, 0, 0, 0],
                        correction=torch.zeros(5, eng.n_params, device=meta))
    every = (True, True, False, True) if optimizer == "adam" else (True, True, True, False)
    assert steps and all(uses == every for uses in steps)   # every term computed
    assert not mode.found, sorted(mode.found)
    assert out.device == meta and out.shape == (5, eng.n_params)


def test_the_device_check_finds_a_tensor_made_off_the_device():
    """The check above can fail: a step that makes a CPU tensor is caught."""
    mode = _SameDevice(torch.device("meta"))
    with mode:
        torch.zeros(3, device="meta") + torch.ones(3, device="meta")
        torch.ones(2).sum()
    assert mode.found and all("cpu" in f for f in mode.found)


def test_each_kernel_setting_does_what_it_says_or_refuses_in_one_line():
    """The CPU-side logic of the kernel settings: autotune sets cuDNN's benchmark flag on a CUDA
    device (a plain setting: a CPU-only torch holds it too) and leaves cuDNN deterministic, and a
    CPU refuses it naming the device; the layout's default is channels-last on a CPU and NCHW on a
    GPU, an explicit setting wins on either; a plug-in model stepped through ``vmap`` has no
    layout of its own to set (a documented no-op)."""
    from groupfel.emulator.stacked import Kernels

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        torch.backends.cudnn.deterministic = True
        for autotune in (True, False):
            Kernels(autotune=autotune).apply(cuda)
            assert torch.backends.cudnn.benchmark is autotune and torch.backends.cudnn.deterministic
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved
    with pytest.raises(ValueError, match="^autotune is cuDNN's and needs a CUDA device, not cpu$"):
        Kernels(autotune=True).check(cpu)
    Kernels().apply(cpu)   # the default: nothing to set on a CPU
    assert Kernels().layout(cpu) and not Kernels().layout(cuda)
    assert not Kernels(channels_last=False).layout(cpu) and Kernels(channels_last=True).layout(cuda)
    plug_in = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
    assert GroupedNet.of(plug_in, channels_last=True) is None and GroupedNet.of(plug_in, channels_last=False) is None


def test_a_stack_holds_convolution_weights_channels_last_with_the_same_gradients():
    """The stack's convolution weights are channels-last where its images are (no copy a step),
    and their gradients are bitwise those of contiguous weights."""
    torch.manual_seed(0)
    net = models.build_model("resnet-1", (1, 8, 8), 10)
    grouped = GroupedNet.of(net)
    plain = [p.detach().unsqueeze(0) + 0.01 * torch.randn(4, *p.shape) for p in net.parameters()]
    cpu = torch.device("cpu")
    held = [grouped.zeros(4, i, p.shape, cpu).copy_(q) for i, (p, q) in enumerate(zip(net.parameters(), plain))]
    assert held[3].dim() == 5 and held[3][0].is_contiguous(memory_format=torch.channels_last)   # a 3x3 conv weight
    x, y, m = torch.randn(4, 5, 1, 8, 8), torch.randint(0, 10, (4, 5)), torch.ones(4, 5)
    assert all(torch.equal(a, b) for a, b in zip(grouped(plain, x, y, m), grouped(held, x, y, m)))
    assert GroupedNet.of(net, channels_last=False).zeros(4, 3, net.stages[0].conv1.weight.shape, cpu).is_contiguous()


@pytest.mark.parametrize("name", ["cnn", "resnet-1", "mlp"])
def test_a_cpu_step_in_chunks_of_clients_gives_every_client_the_numbers_of_one_stack(name, monkeypatch):
    """A wide stack's CPU step computes chunks of at least 4 clients one after another (here forced
    to the smallest): every client's gradients bitwise those of the whole stack in one step."""
    net, params, x, y, m = _stack(name, 13)
    grouped = GroupedNet.of(net)
    params = [grouped.zeros(13, i, p.shape[1:], p.device).copy_(p) for i, p in enumerate(params)]   # as a stack holds them
    monkeypatch.setattr(GroupedNet, "CHUNK_BYTES", 1)
    assert grouped.chunks(13, 5, x.shape[2:]) == [5, 4, 4]
    assert grouped.chunks(9, 5, x.shape[2:]) == [5, 4] and grouped.chunks(2, 5, x.shape[2:]) == [2]
    whole = grouped._grads(params, x, y, m)
    for n in (8, 9, 13):
        got = grouped([p[:n] for p in params], x[:n], y[:n], m[:n])
        assert all(torch.equal(g, w[:n]) for g, w in zip(got, whole)), n


def test_a_cpu_chunk_plan_imports_no_compiler():
    """Sizing a CPU step's chunks (a shape pass over the model) leaves torch._dynamo and sympy
    unimported: on the meta device that pass imported them, about a second of every training
    process."""
    import subprocess
    import sys
    code = ("import sys, torch\n"
            "from groupfel.emulator.models import build_model\n"
            "from groupfel.emulator.stacked import GroupedNet\n"
            "g = GroupedNet.of(build_model('resnet-1', (1, 28, 28), 10))\n"
            "assert g.chunks(64, 5, torch.Size((1, 28, 28))) == [11, 11, 11, 11, 10, 10]\n"
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
