"""A study as one workload: the default demo's 12 runs (4 arms x 3 seeds) stacked against
``--stack 1``, on the same process pool, side by side in one run.

    python benchmarks/campaign.py [--stack 8] [--jobs N] [--rounds R] [--full-size-rounds R] [--steps]
    python benchmarks/campaign.py --emulator [--baseline PYTHON] [--repeats N]

1. **cpu**: ``groupfel run`` of the embedded default (digits, CNN, 4 arms x 3 seeds) with every
   run alone (``--stack 1``) and with at most ``--stack`` runs training together, each on a pool
   of ``--jobs`` workers (default: one per core): wall clock, CPU seconds of the process tree,
   the ratio, and whether both gave the same ledgers (they must: costs do not depend on stacking).
   ``--rounds R`` stops every run after R global rounds (default: the demo's own stop, its budget,
   about 30 rounds), for a machine too busy to run the whole study twice.
2. **cuda** (where torch sees a GPU): the same study on the GPU, one worker, alone vs stacked.
3. **full-size** (``--full-size-rounds R`` > 0; default 2 on a GPU, 0 on a CPU): R rounds of the
   full-size Group-FEL run (groupfel-base: 300 clients, resnet-1, batch 5) alone and as ``--stack``
   runs of it (seeds 0, 1, ...) in one stack, on the GPU if there is one; from the seconds per unit
   of Eq. 5 cost of each, the projected hours of every pending full-size reproduction that shares
   that setting (its runs stop at the same budget), for both.
4. **steps** (``--steps``, on the CPU): one local SGD step of W stacked clients, per client, in the
   three forms a CPU can train them: the per-client loop (what ``--stack 1`` runs, channels-last),
   ``vmap`` over the model (what a user's plug-in model steps through) and the written-out form
   every shipped model's stacks use (emulator.stacked.GroupedNet), channels-last as on a CPU by
   default (``grouped``) and NCHW (``grouped-nchw``, ``train.channels_last = false``), at the
   demo's shape, at larger ones and at the full-size Group-FEL step (resnet-1, 1x28x28, B = 5,
   W = 8 and 64): medians of 5, the forms interleaved, with the load average beside each row.
   Then the resnet-1 rows' ceiling for any GroupNorm kernel (:func:`norm_ceiling`), and four runs
   of other algorithms in one stacked call against one call each (:func:`mixed_call`).
5. **emulator** (``--emulator``): the emulator's own Python per run-round of full-size
   groupfel-base (300 clients, K = 5), at K = 20 and with SCAFFOLD, with training and evaluation
   stubbed (:func:`emulator_round`): SimPy, the group-round loop, pricing, sampling, aggregation,
   checkpoints and result files, everything a run does besides torch's training and evaluation.
   ``--baseline PYTHON`` also times the same rounds under another interpreter (one whose
   ``groupfel`` is another checkout, e.g. the last release's), interleaved with this one's,
   medians of ``--repeats``, and prints the ratio, of wall time and of CPU time (the process's
   own, which a loaded machine does not inflate as it does wall time).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import TreeCPU  # noqa: E402  (benchmarks/sweep.py: CPU seconds of a process tree)

from groupfel.emulator import numerics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def study(stack: int, jobs: int, device: str, out: Path, rounds: int | None) -> dict:
    from groupfel.experiments.runner import default_config, run_experiment

    config = default_config()
    train = {"stack": stack, "device": device, **({"rounds": rounds} if rounds else {})}
    config = config.model_copy(update={"train": config.train.model_copy(update=train)})
    t0 = time.perf_counter()
    with TreeCPU() as cpu:
        run_experiment(config, out, jobs=jobs, progress=False)
    ledgers = {p.relative_to(out): pd.read_parquet(p) for p in sorted(out.glob("seed-*/*/ledger.parquet"))}
    return {"wall": time.perf_counter() - t0, "cpu": cpu.seconds, "ledgers": ledgers}


def full_size(device: str, stack: int, rounds: int, tmp: Path) -> dict:
    """Seconds per unit of Eq. 5 cost of ``stack`` groupfel-base runs trained together, rounds 1
    to ``rounds`` (round 0 forms the groups and warms the engine)."""
    from groupfel.emulator.config import parse_config
    from groupfel.experiments.tasks import execute_stack

    base = tomllib.loads((ROOT / "experiments" / "reproductions" / "groupfel-base.toml").read_text())
    base["train"].update(device=device, stack=stack)
    seen: dict[int, list] = {i: [] for i in range(stack)}

    class Enough(Exception):
        pass

    def on_round(i, t, cost, acc):
        seen[i].append((time.perf_counter(), cost))
        if len(seen[i]) > rounds:
            raise Enough

    jobs = [(parse_config({**base, "seed": s}).model_dump_json(), tmp / f"full-{stack}" / str(s), 0)
            for s in range(stack)]
    with SamplePasses() as passes:
        try:
            execute_stack(jobs, stack, on_round=on_round) if stack > 1 else execute_alone(jobs[0], on_round)
        except Enough:
            pass
    start = max(s[0][0] for s in seen.values())
    end = max(s[-1][0] for s in seen.values())
    cost = sum(s[-1][1] - s[0][1] for s in seen.values())
    return {"seconds_per_cost": (end - start) / cost, "budget": base["train"]["budget"],
            "model": base["train"]["model"], "batch": base["train"]["batch_size"],
            "passes_per_cost": passes.total / sum(s[-1][1] for s in seen.values())}


class SamplePasses:
    """Counts the training sample-passes (epochs x samples of every client of every engine call)
    while it is entered: the outermost ``train`` of an engine only (a batched engine's call of the
    sequential loop, or a stack's batcher calling its engine, counts once)."""

    def __init__(self):
        import threading

        self.total, self._inside = 0, threading.local()

    def __enter__(self):
        from groupfel.emulator.training import BatchedEngine, TorchEngine

        self._saved = {cls: cls.__dict__["train"] for cls in (TorchEngine, BatchedEngine)}
        for cls, train in self._saved.items():
            setattr(cls, "train", self._counting(train))
        return self

    def _counting(self, train):
        def counted(engine, start, clients, epochs, seeds, **kw):
            outermost = not getattr(self._inside, "depth", 0)
            self._inside.depth = getattr(self._inside, "depth", 0) + 1
            try:
                return train(engine, start, clients, epochs, seeds, **kw)
            finally:
                self._inside.depth -= 1
                if outermost:
                    self.total += int(epochs) * sum(len(engine.client_samples[int(c)]) for c in clients)
        return counted

    def __exit__(self, *exc):
        for cls, train in self._saved.items():
            setattr(cls, "train", train)


def physical_limit(fit: dict, device: str) -> dict:
    """The fp32 limit of the full-size step: forward + backward FLOPs of one sample of the run's
    model (torch's FlopCounterMode over a real batch), times the measured sample-passes per unit
    of Eq. 5 cost, at the device's float32 peak (a measured float32 matmul, TF32 off; one thread
    on a CPU, as a training process runs): the milliseconds per unit of cost no engine beats."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from gpu import matmul_tflops   # benchmarks/gpu.py

    from groupfel.emulator.models import build_model

    on = torch.device(device)
    model = build_model(fit["model"], (1, 28, 28), 10).to(on)
    B = fit["batch"]
    x, y = torch.randn(B, 1, 28, 28, device=on), torch.randint(0, 10, (B,), device=on)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    flop = counter.get_total_flops() / B
    peak = matmul_tflops(on, 8192 if on.type == "cuda" else 1024)
    seconds = flop * fit["passes_per_cost"] / (peak * 1e12)
    return {"flop_per_sample": flop, "peak_tflops": peak, "seconds_per_cost": seconds}


STEP_ROWS = [("cnn", (1, 8, 8), 16, 48), ("mlp", (1, 8, 8), 16, 48), ("cnn", (1, 16, 16), 64, 48),
             ("cnn", (1, 28, 28), 32, 48), ("cnn", (1, 28, 28), 5, 64),
             # the full-size Group-FEL step: resnet-1 on 1x28x28 at B = 5, a narrow and a wide stack
             ("resnet-1", (1, 28, 28), 5, 8), ("resnet-1", (1, 28, 28), 5, 64)]


def interleaved_ms(fs, repeats: int) -> list[float]:
    """Median milliseconds of each of ``fs``, run in turn ``repeats`` times after one warm-up each
    (interleaved, so that a loaded machine's slow spells fall on every form alike)."""
    import statistics

    for f in fs:
        f()
    times: list[list[float]] = [[] for _ in fs]
    for _ in range(repeats):
        for f, t in zip(fs, times):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def _step_inputs(name: str, shape: tuple, batch: int, width: int):
    """A step's model (seed 0), its parameters stacked ``width`` times, random minibatches (x, y,
    mask) and ``vmap``'s form of the per-client loss gradient."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap

    from groupfel.emulator.models import build_model

    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().unsqueeze(0).repeat(width, *[1] * p.dim()).clone() for p in model.parameters()]
    x, y, m = torch.randn(width, batch, *shape), torch.randint(0, 10, (width, batch)), torch.ones(width, batch)

    def loss(ps, x, y, m):
        ce = F.cross_entropy(functional_call(model, dict(zip(names, ps)), (x,)), y, reduction="none")
        return (ce * m).sum() / m.sum().clamp(min=1.0)
    return model, params, (x, y, m), vmap(grad(loss))


def _held(net, model, params) -> list:
    """``params`` laid out as the written-out ``net``'s stacks hold them."""
    return [net.zeros(q.shape[0], i, p.shape, p.device).copy_(q) for i, (p, q) in enumerate(zip(model.parameters(), params))]


def steps(repeats: int = 5) -> None:
    """Per client-step milliseconds of the three CPU forms, side by side (see the docstring)."""
    import torch
    import torch.nn.functional as F

    from groupfel.emulator.models import build_model
    from groupfel.emulator.stacked import GroupedNet
    from groupfel.emulator.training import keep_freed_memory

    torch.set_num_threads(1)   # as every training process runs
    keep_freed_memory()        # as every batched engine on a CPU runs

    print(f"\n{'model':8} {'input':>8} {'B':>3} {'W':>4} {'per-client':>11} {'vmap':>8} {'grouped':>8} "
          f"{'grouped-nchw':>12} {'vmap / grouped':>15} {'per-client / grouped':>21}  (ms per client-step)")
    for name, shape, batch, width in STEP_ROWS:
        model, params, (x, y, m), vmapped = _step_inputs(name, shape, batch, width)
        # grouped: the CPU's default layout (channels-last); grouped-nchw: train.channels_last = false (not
        # bitwise independent of the width); each with the parameters as a stack holds them
        grouped, nchw = GroupedNet.of(model), GroupedNet.of(model, channels_last=False)
        held, held_nchw = _held(grouped, model, params), _held(nchw, model, params)
        alone = build_model(name, shape, 10).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(alone.parameters(), lr=0.01)
        x0 = x[0].contiguous(memory_format=torch.channels_last)

        def per_client():
            for _ in range(width):
                opt.zero_grad()
                F.cross_entropy(alone(x0), y[0]).backward()
                opt.step()
        t = [ms / width for ms in interleaved_ms([per_client, lambda: vmapped(tuple(params), x, y, m),
                                                  lambda: grouped(held, x, y, m),
                                                  lambda: nchw(held_nchw, x, y, m)],
                                                 repeats)]
        print(f"{name:8} {'x'.join(map(str, shape[1:])):>8} {batch:3d} {width:4d} {t[0]:11.2f} {t[1]:8.2f} {t[2]:8.2f} "
              f"{t[3]:12.2f} {t[1] / t[2]:14.2f}x {t[0] / t[2]:20.2f}x  load {os.getloadavg()[0]:.1f}", flush=True)

    norm_ceiling()
    mixed_call()


def norm_ceiling(repeats: int = 9) -> None:
    """The written-out resnet-1 step with every GroupNorm replaced by its bare affine map (not a
    model: no statistics, two elementwise passes), against ``vmap`` and the real step: the most
    any GroupNorm kernel, fused or not, could bring. What is left is the grouped convolutions,
    the same oneDNN kernels ``vmap``'s batching rule calls. Runs under :func:`steps`'s thread and
    allocator settings."""
    import torch.nn.functional as F

    from groupfel.emulator.stacked import GroupedNet

    def affine(h, groups, weight, bias, eps):
        return h * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
    norm = F.group_norm

    print(f"\n{'model':8} {'W':>4} {'vmap':>8} {'grouped':>8} {'norm free':>10} {'vmap / grouped':>15} "
          f"{'vmap / norm free':>17}  (ms per client-step, 1x28x28, B = 5)")
    for width in (8, 64):
        model, params, (x, y, m), vmapped = _step_inputs("resnet-1", (1, 28, 28), 5, width)
        real = GroupedNet.of(model)
        held = _held(real, model, params)

        def freed():
            # the step looks torch.nn.functional.group_norm up as it runs: swapped for these calls only
            F.group_norm = affine
            try:
                real(held, x, y, m)
            finally:
                F.group_norm = norm
        t = [ms / width for ms in interleaved_ms([lambda: vmapped(tuple(params), x, y, m),
                                                  lambda: real(held, x, y, m), freed], repeats)]
        print(f"{'resnet-1':8} {width:4d} {t[0]:8.2f} {t[1]:8.2f} {t[2]:10.2f} {t[0] / t[1]:14.2f}x {t[0] / t[2]:16.2f}x"
              f"  load {os.getloadavg()[0]:.1f}", flush=True)


def mixed_call(repeats: int = 5) -> None:
    """Four runs' group rounds of other algorithms (FedAvg, FedProx μ = 0.1, SCAFFOLD, momentum
    0.9), 12 digits clients each at B = 5, E = 1: one stacked call of all 48 clients (per-row
    terms) against four calls of 12 (one per algorithm, as before they were per-row inputs)."""
    import numpy as np
    import torch

    from groupfel.emulator.training import BatchedEngine
    from groupfel.topologies import load_dataset

    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    parts = [np.sort(rng.choice(len(data.y_train), size=int(n), replace=False)) for n in rng.integers(10, 40, 48)]
    print(f"\n{'model':8} {'one call of 48':>15} {'4 calls of 12':>14} {'ratio':>7}  (ms per group round of the 4 runs)")
    for name in ("cnn", "resnet-1"):
        eng = BatchedEngine(data, parts, name, lr=0.05, batch_size=5, formulation="stacked", workers=1)
        start = eng.initial_weights(0)
        corr = 0.01 * torch.randn(12, eng.n_params, generator=torch.Generator().manual_seed(0))
        zeros = torch.zeros(12, eng.n_params)
        algos = [dict(), dict(mu=0.1), dict(correction=corr), dict(beta=0.9, momentum=torch.zeros(12, eng.n_params))]

        def separate():
            for k, kw in enumerate(algos):
                eng.train(start, range(12 * k, 12 * k + 12), 1, range(12), **kw)

        def together():
            eng.train(start, range(48), 1, list(range(12)) * 4, mu=[0.0] * 12 + [0.1] * 12 + [0.0] * 24,
                      beta=[0.0] * 36 + [0.9] * 12, correction=torch.cat([zeros, zeros, corr, zeros]),
                      momentum=torch.zeros(48, eng.n_params))
        one, four = interleaved_ms([together, separate], repeats)
        print(f"{name:8} {one:15.1f} {four:14.1f} {four / one:6.2f}x  load {os.getloadavg()[0]:.1f}", flush=True)


def print_full_size(device: str, rounds: int, stack: int, fits: dict, rows: dict) -> None:
    """Each stack's ms per unit of Eq. 5 cost and its share of the fp32 limit, then every pending
    reproduction's projected hours beside the hours at the limit."""
    from gpu import pending_projection   # benchmarks/gpu.py

    limit = physical_limit(fits[stack], device)
    at_limit = {r["name"]: r for r in pending_projection({**fits[stack], "seconds_per_cost": limit["seconds_per_cost"]})}
    print(f"\nfull-size groupfel-base on {device}, {rounds} rounds: {fits[stack]['passes_per_cost']:.2f} sample-passes "
          f"per unit of Eq. 5 cost x {limit['flop_per_sample'] / 1e6:.2f} MFLOP forward+backward a sample "
          f"({fits[stack]['model']}, B = {fits[stack]['batch']}); fp32 peak {limit['peak_tflops']:.3g} TFLOP/s "
          f"(a float32 matmul{', one thread' if device == 'cpu' else ''}): the limit is "
          f"{limit['seconds_per_cost'] * 1e3:.5f} ms per unit of cost")
    for s, f in fits.items():
        print(f"  stack {s}: {f['seconds_per_cost'] * 1e3:.3f} ms per unit of Eq. 5 cost, "
              f"{100 * limit['seconds_per_cost'] / f['seconds_per_cost']:.2f} % of fp32 peak")
    print(f"{'pending reproduction':26} {'runs':>5} {'hours, stack 1':>14} {f'hours, stack {stack}':>15} "
          f"{'hours at the limit':>18}")
    many_of = {r["name"]: r for r in rows[stack]}
    for one in rows[1]:
        many, best = many_of[one["name"]], at_limit[one["name"]]
        hours = [f"{r['projected_hours']:.2f}" if r["projected_hours"] else "not projected" for r in (one, many, best)]
        print(f"{one['name']:26} {one['runs']:5d} {hours[0]:>14} {hours[1]:>15} {hours[2]:>18}")


# -- the emulator's own time per run-round (--emulator) ----------------------------------------------

EMULATOR_VARIANTS = {"K=5": {}, "K=20": {"group_rounds": 20}, "scaffold": {"algorithm": "scaffold"}}


class _StubEngine:
    """The run's own engine with training and evaluation stubbed: every client's trained model is
    all ones (rows of one buffer, which the rounds only read), its momentum is left as it was, and
    every evaluation reads accuracy 0.5, loss 1.
    Deterministic and almost free, so what is left of a round is the emulator's own work.
    Benchmark-only: a run never trains this way."""

    def __init__(self, engine):
        self._engine = engine
        self._trained = None

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def waiting(self):
        import contextlib

        return contextlib.nullcontext()

    def train(self, start, clients, epochs, seeds, *, lr=None, correction=None, momentum=None, rows=None,
              mu=None, beta=None):
        import torch

        if self._trained is None or len(self._trained) < len(clients):   # read, never written, by the rounds
            self._trained = torch.ones(max(len(clients), 256), self.n_params)
        return self._trained[:len(clients)]

    def evaluate(self, weights):
        return 0.5, 1.0


def emulator_round(variant: str, rounds: int | None, tmp: Path) -> tuple[float, float]:
    """Wall and CPU (this process's) seconds per run-round of full-size groupfel-base (``variant``: :data:`EMULATOR_VARIANTS`)
    with :class:`_StubEngine`, from the end of round 1 (round 0 forms the groups, round 1 warms the
    caches) to the end of the run at its budget (or of round ``rounds`` + 1), evaluations and
    checkpoints every 5 rounds as the config's: a checkpoint holds the whole ledger, so late rounds
    cost more than early ones."""
    from groupfel.emulator.driver import run_arm
    from groupfel.experiments.tasks import plan_world, task_config
    import json

    base = tomllib.loads((ROOT / "experiments" / "reproductions" / "groupfel-base.toml").read_text())
    base["train"].update(EMULATOR_VARIANTS[variant], device="cpu", **({"rounds": rounds + 1} if rounds else {}))
    import torch

    torch.set_num_threads(1)   # as every run trains (experiments.tasks.execute)
    world, (plan,) = plan_world(task_config(json.dumps(base)), only=0)
    world.engine = _StubEngine(world.engine)
    times: list[tuple[float, float]] = []
    run_arm(world, plan, tmp / variant,
            lambda t, cost, acc: times.append((time.perf_counter(), time.process_time())))
    return tuple((times[-1][i] - times[0][i]) / (len(times) - 1) for i in (0, 1))


def emulator(args) -> None:
    """Print the emulator's ms per run-round of each variant (this interpreter's ``groupfel``, and
    the ``--baseline`` interpreter's beside it where given), interleaved, medians of ``--repeats``."""
    import json
    import statistics
    import subprocess

    if args.emulator_one:   # a child: one variant, one measurement, as JSON
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(emulator_round(args.emulator_one, args.emulator_rounds, Path(tmp))))
        return
    pythons = {"this": sys.executable, **({"baseline": args.baseline} if args.baseline else {})}
    # (variant, who) -> [(wall ms, CPU ms)]: CPU time is this process's own, so it reads the same
    # on a loaded machine as on an idle one where wall time does not
    ms: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):
        for variant in EMULATOR_VARIANTS:
            for who, python in pythons.items():
                rounds = ["--emulator-rounds", str(args.emulator_rounds)] if args.emulator_rounds else []
                out = subprocess.run([python, __file__, "--emulator", "--emulator-one", variant, *rounds],
                                     check=True, capture_output=True, text=True).stdout
                wall, cpu = json.loads(out.splitlines()[-1])
                ms.setdefault((variant, who), []).append((wall * 1e3, cpu * 1e3))
                print(f"  {variant} {who}: {wall * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms CPU "
                      f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    span = f"rounds 2-{args.emulator_rounds + 1}" if args.emulator_rounds else "whole runs"
    print(f"emulator's time per run-round of full-size groupfel-base, training and evaluation stubbed "
          f"({span}, median of {args.repeats}, load average {os.getloadavg()[0]:.1f})")
    print(f"{'variant':9} {'clock':5} " + " ".join(f"{who + ' ms':>12}" for who in pythons)
          + (f" {'baseline / this':>16}" if args.baseline else ""))
    for variant in EMULATOR_VARIANTS:
        for i, clock in enumerate(("wall", "CPU")):
            med = {who: statistics.median(m[i] for m in ms[variant, who]) for who in pythons}
            print(f"{variant:9} {clock:5} " + " ".join(f"{med[who]:12.1f}" for who in pythons)
                  + (f" {med['baseline'] / med['this']:15.2f}x" if args.baseline else ""), flush=True)


def execute_alone(job, on_round) -> None:
    from groupfel.experiments.tasks import execute

    execute(*job, on_round=lambda t, cost, acc: on_round(0, t, cost, acc))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", type=int, default=8, help="runs that train together (default 8)")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="pool workers (default: cores)")
    ap.add_argument("--rounds", type=int, help="stop each run after this many rounds (default: the demo's budget)")
    ap.add_argument("--full-size-rounds", type=int, help="default 2 with a GPU, else 0 (skipped)")
    ap.add_argument("--steps", action="store_true", help="only the per-step table of the CPU's three forms")
    ap.add_argument("--emulator", action="store_true",
                    help="only the emulator's time per run-round, training and evaluation stubbed")
    ap.add_argument("--baseline", help="--emulator: also time under this Python (another checkout's groupfel)")
    ap.add_argument("--repeats", type=int, default=3, help="--emulator: measurements per variant (default 3)")
    ap.add_argument("--emulator-rounds", type=int,
                    help="--emulator: time this many rounds of each run (default: the whole run, to its budget)")
    ap.add_argument("--emulator-one", choices=list(EMULATOR_VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    numerics.apply("portable")   # the demo's numerics, before torch loads
    import torch

    if args.steps:
        steps()
        return
    if args.emulator:
        emulator(args)
        return

    cuda = torch.cuda.is_available()
    print(f"{'device':6} {'runs':>4} {'jobs':>4} {'stack':>5} {'wall s':>8} {'CPU s':>8} {'speed-up (wall)':>15} "
          f"{'same ledgers':>12}  load average")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for device, jobs in [("cpu", args.jobs)] + ([("cuda", 1)] if cuda else []):
            alone = study(1, jobs, device, tmp / f"{device}-alone", args.rounds)
            stacked = study(args.stack, jobs, device, tmp / f"{device}-stacked", args.rounds)
            same = alone["ledgers"].keys() == stacked["ledgers"].keys() and all(
                alone["ledgers"][k].equals(stacked["ledgers"][k]) for k in alone["ledgers"])
            for stack, r in ((1, alone), (args.stack, stacked)):
                print(f"{device:6} {len(r['ledgers']):4d} {jobs:4d} {stack:5d} {r['wall']:8.1f} {r['cpu']:8.1f} "
                      f"{alone['wall'] / r['wall']:14.2f}x {str(same):>12}  {os.getloadavg()[0]:.1f}", flush=True)
        rounds = args.full_size_rounds if args.full_size_rounds is not None else (2 if cuda else 0)
        if not rounds:
            print("\nfull-size projection: skipped (pass --full-size-rounds R to measure groupfel-base)")
            return
        from gpu import pending_projection   # benchmarks/gpu.py: which reproductions are pending, their runs

        device = "cuda" if cuda else "cpu"
        fits = {stack: full_size(device, stack, rounds, tmp) for stack in (1, args.stack)}
        rows = {stack: pending_projection(fit) for stack, fit in fits.items()}
        print_full_size(device, rounds, args.stack, fits, rows)


if __name__ == "__main__":
    main()
