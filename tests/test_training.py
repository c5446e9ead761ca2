import ast
import logging
import os
import platform
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from groupfel.emulator import models
from groupfel.emulator.algorithms import algorithms
from groupfel.emulator.compute import LocalSpec, run_group_rounds
from groupfel.emulator.config import FaultsConfig
from groupfel.emulator.federation import Group, draw_faults
from groupfel.emulator.training import BatchedEngine, TorchEngine
from groupfel.topologies import Dataset, load_dataset

ROOT = Path(__file__).resolve().parents[1]


def _engine(parts):
    return TorchEngine(load_dataset("digits"), parts, "cnn", lr=0.1, batch_size=8)


def test_training_leaves_the_start_model_untouched_and_clients_independent():
    same = np.arange(40)
    engine = _engine([same, same, np.arange(40, 80)])
    start = engine.initial_weights(0)
    before = start.clone()
    out = engine.train(start, [0, 1, 2], epochs=2, seeds=[7, 7, 7])
    assert torch.equal(start, before)
    assert torch.equal(out[0], out[1])          # same data, same seed, same start -> same model
    assert not torch.equal(out[0], out[2])
    assert not torch.equal(out[0], start)


def test_training_reduces_the_clients_loss():
    engine = _engine([np.arange(200)])
    start = engine.initial_weights(1)
    trained = engine.train(start, [0], epochs=5, seeds=[0])[0]
    acc0, loss0 = engine.evaluate(start)
    acc1, loss1 = engine.evaluate(trained)
    assert loss1 < loss0 and acc1 > acc0 + 0.2


@pytest.fixture(scope="module")
def digits_parts():
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    # ragged: 1 to 4 steps per epoch at B = 8, last batches partial
    return data, [np.sort(rng.choice(len(data.y_train), size=n, replace=False)) for n in (5, 17, 30, 9)]


@pytest.mark.parametrize("model", ["mlp", "cnn", "resnet-1"])
@pytest.mark.parametrize("formulation", ["stacked", "per-client"])
@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "scaffold"])
def test_batched_engine_equals_sequential(digits_parts, model, formulation, algo):
    """Two start models (two groups), ragged clients, momentum + weight decay, and the algorithm's
    local objective: the batched engine gives the sequential engine's models and buffers."""
    data, parts = digits_parts
    kw = dict(momentum=0.9, weight_decay=1e-3, mu=0.1 if algo == "fedprox" else 0.0)
    seq = TorchEngine(data, parts, model, lr=0.05, batch_size=8, **kw)
    bat = BatchedEngine(data, parts, model, lr=0.05, batch_size=8, workers=2, formulation=formulation, **kw)
    assert bat.formulation == formulation
    start = seq.initial_weights(3)
    starts = torch.stack([start, start + 0.01])
    g = torch.Generator().manual_seed(0)
    corr = 0.01 * torch.randn(4, seq.n_params, generator=g) if algo == "scaffold" else None
    m_seq = 0.01 * torch.randn(4, seq.n_params, generator=g)
    m_bat = m_seq.clone()
    a = seq.train(starts, [0, 1, 2, 3], 2, [1, 2, 3, 4], rows=[0, 1, 1, 0], correction=corr, momentum=m_seq, lr=0.04)
    b = bat.train(starts, [0, 1, 2, 3], 2, [1, 2, 3, 4], rows=[0, 1, 1, 0], correction=corr, momentum=m_bat, lr=0.04)
    assert float((a - b).abs().max()) <= 1e-5
    assert float((m_seq - m_bat).abs().max()) <= 1e-5
    assert not torch.allclose(a[0], a[1], atol=1e-3)


def test_worker_block_grows_between_calls(digits_parts):
    """Models travel to and from the workers through a shared block; a call with more clients than
    it holds restarts them with a bigger one, and the results stay the sequential engine's."""
    data, parts = digits_parts
    seq = TorchEngine(data, parts, "mlp", lr=0.05, batch_size=8, momentum=0.9)
    bat = BatchedEngine(data, parts, "mlp", lr=0.05, batch_size=8, momentum=0.9, workers=2,
                        formulation="per-client")
    start = seq.initial_weights(0)
    for clients in ([0, 1], [3, 2, 1, 0], [2, 3]):
        seeds = [7 + c for c in clients]
        m_seq, m_bat = torch.ones(len(clients), seq.n_params), torch.ones(len(clients), seq.n_params)
        a = seq.train(start, clients, 1, seeds, momentum=m_seq)
        b = bat.train(start, clients, 1, seeds, momentum=m_bat)
        assert float((a - b).abs().max()) <= 1e-6 and float((m_seq - m_bat).abs().max()) <= 1e-6
    assert len(bat._block["block"]) >= 4 + 4 + 1     # out + momentum + table rows of the largest call


_WATCH_FORKS: list[int] = []   # pids that forked while a test watched (os.register_at_fork is for good)
_WATCHING = [False]
os.register_at_fork(before=lambda: _WATCHING[0] and _WATCH_FORKS.append(os.getpid()))


def test_the_engine_never_forks_a_process_that_ran_backward(digits_parts):
    """A CUDA build of torch with a GPU present starts autograd's device threads at a process's
    first backward pass, and a child forked after that refuses to run backward ("Unable to handle
    autograd's threading in combination with fork-based multiprocessing"). A CPU-only torch never
    starts those threads, so the crash itself cannot happen here (tests/test_gpu.py shows it on a
    GPU machine); this tests the design that prevents it: after a backward pass in this process,
    the per-client workers train without this process forking (they fork from a server that never
    ran a torch op, :mod:`groupfel.emulator.procs`), and give the sequential engine's models."""
    data, parts = digits_parts
    seq = TorchEngine(data, parts, "cnn", lr=0.05, batch_size=8)
    start = seq.initial_weights(0)
    a = seq.train(start, [0, 1, 2], 1, [1, 2, 3])                     # backward in this process
    _WATCHING[0] = True
    try:
        bat = BatchedEngine(data, parts, "cnn", lr=0.05, batch_size=8, workers=2, formulation="per-client")
        b = bat.train(start, [0, 1, 2], 1, [1, 2, 3])
    finally:
        _WATCHING[0] = False
    assert os.getpid() not in _WATCH_FORKS
    assert float((a - b).abs().max()) <= 1e-5
    assert bat._pool is not None                                      # the workers did the training


@pytest.mark.skipif(not platform.libc_ver()[0] == "glibc", reason="mallopt's settings are glibc's")
def test_keeping_freed_memory_starts_no_helper_process():
    """Every per-client worker sets glibc's malloc at its start. Finding libc by name would run
    ``ldconfig`` in a child process, which a Ctrl-C to the process group can catch between its
    fork and its exec: the settings come from the process's own symbols instead."""
    import subprocess
    import sys

    code = ("import sys; events = []\n"
            "sys.addaudithook(lambda e, a: e.startswith(('subprocess.', 'os.posix_spawn', 'os.fork', 'os.exec'))"
            " and events.append(e))\n"
            "from groupfel.emulator.training import keep_freed_memory\n"
            "print(keep_freed_memory(), events)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []", out


def test_padded_steps_change_nothing(digits_parts):
    """A 5-sample client trained beside a 30-sample one (one real step per epoch against four)
    ends exactly where it ends alone, momentum and weight decay included."""
    data, parts = digits_parts
    eng = BatchedEngine(data, parts, "mlp", lr=0.05, batch_size=8, momentum=0.9, weight_decay=1e-2,
                        formulation="stacked")
    start = eng.initial_weights(0)
    alone = eng.train(start, [0], 3, [11])
    together = eng.train(start, [0, 2], 3, [11, 12])
    assert torch.allclose(alone[0], together[0], atol=1e-6)
    assert eng.steps(0, 3) == 3 and eng.steps(2, 3) == 12


def test_fedprox_with_mu_zero_is_fedavg(digits_parts):
    data, parts = digits_parts
    avg = TorchEngine(data, parts, "cnn", lr=0.05, batch_size=8)
    prox0 = TorchEngine(data, parts, "cnn", lr=0.05, batch_size=8, mu=0.0)
    prox = TorchEngine(data, parts, "cnn", lr=0.05, batch_size=8, mu=1.0)
    start = avg.initial_weights(0)
    a, b, c = (e.train(start, [1, 2], 2, [5, 6]) for e in (avg, prox0, prox))
    assert torch.equal(a, b)
    # the proximal term pulls towards the start model
    assert float((c - start).norm()) < float((a - start).norm())


def _toy(n=40, d=5, seed=0):
    """Two clients whose data pull a softmax regression different ways (label and feature skew)."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([rng.choice(3, n, p=[0.8, 0.1, 0.1]), rng.choice(3, n, p=[0.1, 0.1, 0.8])])
    x = rng.normal(size=(2 * n, d)) + np.eye(3, d)[y] * 1.5
    x[n:] += 1.0
    x = x.astype(np.float32).reshape(2 * n, 1, 1, d)
    return Dataset("toy", x, y.astype(np.int64), x, y.astype(np.int64), 3), [np.arange(n), np.arange(n, 2 * n)]


def _optimum(engine, steps=500):
    """The global objective's minimiser (mean loss over both clients + weight decay), full batch."""
    w = engine.initial_weights(0).clone().requires_grad_()
    params = list(engine.model.parameters())
    opt = torch.optim.LBFGS([w], max_iter=steps, tolerance_grad=1e-10, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        out, o = engine.x, 0
        pieces = []
        for p in params:
            pieces.append(w[o:o + p.numel()].view(p.shape))
            o += p.numel()
        from torch.func import functional_call
        names = [n for n, _ in engine.model.named_parameters()]
        loss = nn.functional.cross_entropy(functional_call(engine.model, dict(zip(names, pieces)), (out,)), engine.y)
        loss = loss + engine.weight_decay / 2 * (w * w).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return w.detach()


def test_scaffold_reaches_the_global_optimum_where_fedavg_drifts():
    data, parts = _toy()
    engine = TorchEngine(data, parts, "linear", lr=0.1, batch_size=40, weight_decay=0.05)
    opt = _optimum(engine)
    group = Group(0, np.array([0, 1]), np.array([40, 40]), 0.0)
    final = {}
    for algo in ("fedavg", "scaffold"):
        x = engine.initial_weights(0)
        alg = algorithms[algo]()
        state = alg.init_state(2, x)
        spec = LocalSpec(0, 1, 20, 0.1)     # 20 local full-batch steps per round
        for t in range(60):
            scratch = alg.begin_round(state, [0], group.clients)
            models = run_group_rounds(engine, {0: x}, {0: group}, t, spec, alg, state, scratch)
            x = alg.aggregate_cloud(state, scratch, np.array([1.0]), [models[0]], group.clients, group.n_samples)
        final[algo] = float((x - opt).norm() / opt.norm())
    assert final["scaffold"] < 3e-3                          # measured 7e-4
    assert final["fedavg"] > 0.05                            # measured 0.12: client drift


def test_unbatchable_model_falls_back_and_says_so(digits_parts, caplog, monkeypatch):
    def bn_cnn(shape, classes):   # BatchNorm updates running statistics in place: vmap refuses
        return nn.Sequential(nn.Conv2d(shape[0], 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * shape[1] * shape[2], classes))
    monkeypatch.setitem(models.MODELS, "bn-cnn", bn_cnn)
    data, parts = digits_parts
    with caplog.at_level(logging.WARNING, logger="groupfel.emulator.training"):
        eng = BatchedEngine(data, parts, "bn-cnn", lr=0.05, batch_size=8, formulation="stacked", workers=1)
    assert eng.formulation == "per-client"
    lines = [r.getMessage() for r in caplog.records if "cannot stack" in r.getMessage()]
    assert len(lines) == 1 and "bn-cnn" in lines[0]
    seq = TorchEngine(data, parts, "bn-cnn", lr=0.05, batch_size=8)
    start = seq.initial_weights(0)
    assert torch.allclose(seq.train(start, [0, 1], 1, [1, 2]), eng.train(start, [0, 1], 1, [1, 2]), atol=1e-5)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_every_model_builds_and_steps(name):
    shape = {"audio-cnn": (1, 32, 32), "audio-m5": (1, 1, 8000)}.get(name, (1, 28, 28))
    net = models.build_model(name, shape, 10)
    out = net(torch.zeros(2, *shape))
    assert out.shape == (2, 10)
    # no state outside the flat parameter vector: BatchNorm (digit-bn-cnn) holds its statistics as parameters
    assert not any(net.buffers())


@pytest.mark.parametrize("name,shape", [("cnn", (1, 28, 28)), ("audio-cnn", (1, 31, 23))])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_pooling_before_relu_is_the_textbook_network_bit_for_bit(name, shape, layout):
    """The conv nets pool before their ReLU (faster); the output and every gradient must equal
    the usual conv-ReLU-pool order exactly, odd sizes (ceil-mode edge windows) included."""
    fast = models.build_model(name, shape, 10)
    textbook = nn.Sequential(*_relu_before_pool(fast))
    torch.manual_seed(3)
    x = torch.randn(16, *shape).contiguous(memory_format=layout)
    y = torch.randint(0, 10, (16,))
    grads = []
    for net in (fast, textbook):
        net.to(memory_format=layout).zero_grad(set_to_none=True)
        out = net(x)
        nn.functional.cross_entropy(out, y).backward()
        grads.append([out.detach()] + [p.grad.clone() for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def _relu_before_pool(net: nn.Sequential) -> list[nn.Module]:
    """The same modules (shared parameters) with every MaxPool-ReLU pair put back as ReLU-MaxPool."""
    layers = list(net)
    for i in range(len(layers) - 1):
        if isinstance(layers[i], nn.MaxPool2d) and isinstance(layers[i + 1], nn.ReLU):
            layers[i], layers[i + 1] = layers[i + 1], layers[i]
    assert any(isinstance(a, nn.ReLU) and isinstance(b, nn.MaxPool2d) for a, b in zip(layers, layers[1:]))
    return layers


def test_no_simpy_module_imports_torch():
    """Simulated time and compute stay apart: a module that imports simpy does not import torch."""
    offenders, seen = [], []
    for path in ROOT.glob("*/**/*.py"):
        if any(part in {"tests", ".git", "benchmarks"} or part.startswith(".") for part in path.parts[len(ROOT.parts):]):
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
        if "simpy" in imported:
            seen.append(path.name)
            if "torch" in imported:
                offenders.append(str(path.relative_to(ROOT)))
    assert "federation.py" in seen and offenders == []


def test_scaffold_group_variate_moves_by_its_survivors_changes_over_all_members(digits_parts):
    """A group's c_g moves by Σ_{i alive} (n_i/n_g) Δc_i, n_g over every member: a dropped member
    counts as a zero change (here client 1 of 4 drops in the only group round)."""
    data, parts = digits_parts
    engine = TorchEngine(data, parts, "mlp", lr=0.05, batch_size=8)
    faults = FaultsConfig(dropout=0.4)
    members = np.arange(4)
    seed = next(s for s in range(100) if draw_faults(faults, s, 0, 0, members)[0].tolist() == [False, True, False, False])
    n = np.array([len(p) for p in parts])
    group = Group(0, members, n, 0.0)
    alg = algorithms["scaffold"]()
    state = alg.init_state(4, engine.initial_weights(0))
    state.clients["variates"] += 0.01 * torch.randn(4, engine.n_params, generator=torch.Generator().manual_seed(1))
    c = 0.02 * torch.randn(engine.n_params, generator=torch.Generator().manual_seed(2))
    state.server["control"] = c
    before = state.clients["variates"].clone()
    scratch = alg.begin_round(state, [0], members)
    x = run_group_rounds(engine, {0: engine.initial_weights(0)}, {0: group}, 0, LocalSpec(seed, 1, 1, 0.05, faults),
                         alg, state, scratch)
    alg.aggregate_cloud(state, scratch, np.ones(1), [x[0]], members, n)   # the round's c_i reach the run's table
    change = state.clients["variates"] - before
    control = scratch.control
    assert change[1].abs().max() == 0                                    # client 1 dropped
    assert (change[[0, 2, 3]].abs().sum(1) > 0).all()
    expected = c.double() + torch.as_tensor(n / n.sum()) @ change.double()
    torch.testing.assert_close(control[0].double(), expected, atol=1e-7, rtol=0)


class _RowsEngine:
    """Trains nothing: each call's trained models are the next rows of a fixed random table."""

    def __init__(self, n_params, steps):
        self.table = torch.randn(64, n_params, generator=torch.Generator().manual_seed(3))
        self.calls, self.n_steps = 0, steps

    def train(self, start, clients, epochs, seeds, *, lr, correction, momentum, rows):
        self.calls += 1
        return self.table.roll(self.calls, 0)[:len(clients)].clone()

    def steps(self, client, epochs):
        return int(self.n_steps[client]) * epochs


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_scaffold_round_is_its_formulas_bit_for_bit(dropout):
    """A SCAFFOLD round (three groups, K = 3, with and without dropouts) gives exactly the floats
    of its formulas written out row by row: c_i⁺ = (x_g − y_i)/(τ_i·lr) − (c_g − c_i), c_g moved by
    float32(shares · float64(c_i⁺ − c_i)) after each group round, c by the round's changes at its end.
    However the round's tables are kept, reused or copied, these numbers may not move."""
    n_params, n_clients, lr, seed = 3000, 20, 0.05, 7
    gen = torch.Generator().manual_seed(0)
    n = np.arange(20, 20 + 7 * n_clients, 7)
    groups = {4: Group(0, np.array([3, 1, 8]), n[[3, 1, 8]], 0.0), 9: Group(0, np.array([0, 5, 6, 12]), n[[0, 5, 6, 12]], 0.0),
              2: Group(0, np.array([7, 19]), n[[7, 19]], 0.0)}
    members = np.concatenate([g.clients for g in groups.values()])
    faults = FaultsConfig(dropout=dropout) if dropout else None
    spec = LocalSpec(seed, 3, 2, lr, faults)
    alg = algorithms["scaffold"]()
    x = torch.randn(n_params, generator=gen)
    state = alg.init_state(n_clients, x)
    state.clients["variates"].normal_(generator=gen)
    state.server["control"] = torch.randn(n_params, generator=gen)
    variates, control = state.clients["variates"].clone(), state.server["control"].clone()
    steps = n // 5 + 1
    engine = _RowsEngine(n_params, steps)
    for _ in range(2):   # the second round reuses the first one's tables
        scratch = alg.begin_round(state, list(groups), members)
        models = run_group_rounds(engine, {g: x for g in groups}, groups, 0, spec, alg, state, scratch)
        weights = np.array([0.5, 0.3, 0.2])
        x = alg.aggregate_cloud(state, scratch, weights, list(models.values()), members, n)

    # the same round, row by row
    replay = _RowsEngine(n_params, steps)
    xr = torch.randn(n_params, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        start = variates.clone()
        c_g = {g: control.clone() for g in groups}
        model = {g: xr for g in groups}
        for k in range(3):
            batch = [(g, i) for g in groups for i in range(groups[g].size)
                     if not draw_faults(faults, seed, 0, k, groups[g].clients)[0][i]]
            if not batch:
                continue
            replay.calls += 1
            trained = replay.table.roll(replay.calls, 0)
            old = variates.clone()
            for g in groups:
                rows = [r for r, (h, _) in enumerate(batch) if h == g]
                if not rows:
                    continue
                clients = [int(groups[g].clients[i]) for h, i in batch if h == g]
                for r, c in zip(rows, clients):
                    d = torch.tensor([float(steps[c] * 2)])[0] * lr
                    variates[c] = (model[g] - trained[r]) / d - (c_g[g] - old[c])
                ng = torch.as_tensor(groups[g].n_samples, dtype=torch.float64)
                alive = [i for h, i in batch if h == g]
                share = (ng / ng.sum())[alive]
                c_g[g] = c_g[g] + (share @ (variates[clients] - old[clients]).double()).to(torch.float32)
                w = torch.as_tensor(n[clients] / n[clients].sum(), dtype=torch.float32)
                model[g] = w @ trained[rows]
        share = torch.as_tensor(n[members] / n.sum(), dtype=torch.float64)
        control = control + (share @ (variates[members] - start[members]).double()).to(torch.float32)
        xr = sum(float(w) * model[g] for w, g in zip(weights, groups))
    assert torch.equal(state.clients["variates"], variates)
    assert torch.equal(state.server["control"], control)
    assert torch.equal(x, xr)
