"""Measurement harness: time real group operations and training on this machine.

Produces the CSV that :mod:`groupfel.cost_models.calibrate` reads: columns operation, method, device,
group_size, n_samples, seconds (one row per repeat), after ``#`` comment lines that record the
machine. Needs only numpy, torch and ``cryptography`` (runs on a Raspberry Pi; no GPU). The
training harness times a model its caller builds (the command passes the emulator's model
factory), and the caller writes the text: this layer imports nothing of the emulator's engine.
"""
from __future__ import annotations

import csv
import io
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from groupfel.errors import InputError

from .secagg import time_secagg, time_secagg_parts

INPUT_SHAPE, NUM_CLASSES = (1, 8, 8), 10   # scikit-learn digits, the default emulation task
ModelFactory = Callable[[], nn.Module]     # a fresh model for INPUT_SHAPE inputs and NUM_CLASSES classes


@dataclass(frozen=True)
class Measurement:
    operation: str
    method: str
    device: str
    group_size: int | None
    n_samples: int | None
    seconds: float
    joules: float | None = None          # the energy meter's reading over the timed call (None: no meter)
    energy_span_s: float | None = None   # the wall-clock seconds that reading covers (its mean watts: joules / this)


def machine_info() -> dict[str, str]:
    """CPU model, cores, OS and library versions for the measurement file's header."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):   # x86 / Raspberry Pi
                cpu = value.strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": str(os.cpu_count()), "machine": platform.machine(),
            "os": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": str(torch.get_num_threads()), "numpy": np.__version__}


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def param_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def _sweep(sizes: list[int], repeats: int, work: Callable[[int], float],
           meter=None) -> Iterator[tuple[int, float, tuple]]:
    """(size, seconds, energy) for every repeat of every size. One untimed pass first, because the
    first calls pay one-off costs (allocator, oneDNN kernel selection) that would bend the fit;
    repeats go round all sizes so slow drift (other load, clock scaling) hits every size alike.
    ``energy``: (the meter's reading over the call, the call's wall seconds), or () without a meter;
    a call shorter than the meter's ``min_span_s`` is repeated until the reading spans it, and the
    reading is per call (the batch's energy and seconds over its calls)."""
    for n in sizes:
        work(n)
    for _ in range(repeats):
        for n in sizes:
            if meter is None:
                yield n, work(n), ()
                continue
            mark = meter.start()
            seconds = work(n)
            calls, t0 = 1, time.perf_counter() - seconds
            while time.perf_counter() - t0 < meter.min_span_s:   # a call shorter than the meter resolves:
                work(n)                                        # batch it until the reading spans enough
                calls += 1
            yield n, seconds, meter.stop(mark, calls)


def measure_secagg(sizes: list[int], params: int, repeats: int, device: str, server: bool = False,
                   meter=None, clock: str = "cpu") -> Iterator[Measurement]:
    """Per-client SecAgg time by group size, and the dropout-recovery time per survivor per
    dropped client (``secagg-recovery``; needs a group of 3 or more so one can drop). ``server``:
    the aggregator's part alone instead, what an edge server spends per group
    (``secagg-server``, and ``secagg-server-recovery`` per dropped client), for
    ``topology.edge_profile``. ``clock``: "cpu" (each party's CPU time) or "wall" (its elapsed
    time, for a device whose CPU is capped: a cgroup quota's waits count)."""
    if min(sizes) < 2:
        raise InputError(f"--sizes: secure aggregation needs groups of 2 or more, got {min(sizes)}")
    recovery: dict[int, list[float]] = {}
    if server:
        def work(n: int) -> float:
            _, aggregator, rec = time_secagg_parts(n, params, dropped=1 if n >= 3 else 0, clock=clock)
            recovery.setdefault(n, []).append(rec)
            return aggregator

        for n, seconds, energy in _sweep(sizes, repeats, work, meter):
            yield Measurement("secagg-server", "secagg-server", device, n, None, seconds, *energy)
            if n >= 3:
                yield Measurement("secagg-server-recovery", "secagg-server-recovery", device, n, None, recovery[n][-1])
        return

    def work(n: int) -> float:
        per_client, rec = time_secagg(n, params, dropped=1 if n >= 3 else 0, clock=clock)
        recovery.setdefault(n, []).append(rec)
        return per_client

    for n, seconds, energy in _sweep(sizes, repeats, work, meter):
        yield Measurement("secagg", "secagg", device, n, None, seconds, *energy)
        if n >= 3:
            yield Measurement("secagg-recovery", "secagg-recovery", device, n, None, recovery[n][-1])


def pairwise_distances(models: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and euclidean distance matrices of a group's flat models (backdoor screening)."""
    unit = nn.functional.normalize(models, dim=1)
    return 1.0 - unit @ unit.T, torch.cdist(models, models)


def measure_backdoor(sizes: list[int], params: int, repeats: int, device: str, meter=None) -> Iterator[Measurement]:
    """Each member screens the whole group: the full n × n distance matrices, O(n²·m)."""
    gen = torch.Generator().manual_seed(0)
    models = {n: torch.randn(n, params, generator=gen) for n in sizes}
    for n, seconds, energy in _sweep(sizes, repeats, lambda n: _timed(lambda: pairwise_distances(models[n])), meter):
        yield Measurement("backdoor-distance", "backdoor-distance", device, n, None, seconds, *energy)


def measure_training(sizes: list[int], make_model: ModelFactory, repeats: int, device: str,
                     batch_size: int = 32, lr: float = 0.05, meter=None) -> Iterator[Measurement]:
    """One local epoch of minibatch SGD over n samples (H(n), Eq. 5), on digits-shaped data, of
    the model ``make_model()`` builds."""
    gen = torch.Generator().manual_seed(0)
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    data = {n: (torch.randn(n, *INPUT_SHAPE, generator=gen), torch.randint(0, NUM_CLASSES, (n,), generator=gen))
            for n in sizes}

    def epoch(n: int) -> None:
        x, y = data[n]
        for b in range(0, n, batch_size):
            opt.zero_grad(set_to_none=True)
            loss(net(x[b:b + batch_size]), y[b:b + batch_size]).backward()
            opt.step()

    for n, seconds, energy in _sweep(sizes, repeats, lambda n: _timed(lambda: epoch(n)), meter):
        yield Measurement("training", "sgd", device, None, n, seconds, *energy)


def measurements_csv(rows: list[Measurement], header: dict[str, str]) -> str:
    """The measurement file's text: ``# key: value`` header lines, then the CSV of ``rows``."""
    buf = io.StringIO(newline="")
    for key, value in header.items():
        buf.write(f"# {key}: {value}\n")
    w = csv.writer(buf)
    names = [fl.name for fl in fields(Measurement)]
    keep = [i for i, n in enumerate(names) if n not in ("joules", "energy_span_s")
            or any(getattr(r, n) is not None for r in rows)]   # no meter: no energy columns, never zeros
    w.writerow([names[i] for i in keep])
    w.writerows(["" if v is None else (f"{v:.9g}" if isinstance(v, float) else v)
                 for i, v in enumerate(astuple(r)) if i in keep] for r in rows)
    return buf.getvalue()


def measure(kind: str, sizes: list[int], make_model: ModelFactory, *, repeats: int = 3, params: int | None = None,
            model: str = "cnn", device: str = "local", threads: int = 1,
            server: bool = False, meter=None, clock: str = "cpu") -> tuple[list[Measurement], dict[str, str]]:
    """Run one harness; returns its rows and the header describing the machine and settings.

    ``make_model()`` builds the model named ``model`` (the header records the name): the training
    harness trains it, and its parameter count is ``params`` when that is not given.

    ``threads`` caps torch's intra-op threads (default 1): a client's work is timed on one core,
    which is reproducible; on a shared machine torch's thread pool otherwise spins and timings
    scatter by 10×.

    ``clock`` (secagg): "cpu" times each party's CPU time (robust to a loaded machine), "wall" its
    elapsed time, what a device whose CPU is capped (a cgroup quota) takes. Training and backdoor
    screening are always timed on the wall clock.
    """
    if repeats < 1 or threads < 1:
        raise InputError("--repeats and --threads must be >= 1")
    if clock not in ("cpu", "wall"):
        raise InputError(f"--clock: {clock!r} is not cpu or wall")
    if clock != "cpu" and kind != "secagg":
        raise InputError("--clock: only secagg is timed on the CPU clock (training and backdoor are on the "
                         "wall clock already); remove --clock")
    if server and kind != "secagg":
        raise InputError("--server: only secagg has a server part; remove --server")
    harness = {"secagg": lambda: measure_secagg(sizes, params, repeats, device, server, meter, clock),
               "backdoor": lambda: measure_backdoor(sizes, params, repeats, device, meter),
               "training": lambda: measure_training(sizes, make_model, repeats, device, meter=meter)}
    if kind not in harness:
        raise InputError(f"measure: unknown operation {kind!r}; choose secagg, backdoor or training")
    params = params or param_count(make_model())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = list(harness[kind]())
        info = machine_info()
    finally:
        torch.set_num_threads(before)
    if meter is not None and meter.kind == "power-log":   # the log is read once the calls have run
        metered = [r for r in rows if r.joules is not None]
        joules = iter(meter.joules([r.joules for r in metered]))
        rows = [replace(r, joules=next(joules)) if r.joules is not None else r for r in rows]
    header = {"groupfel measure": kind + (" --server" if server else "") + (f" --clock {clock}" if clock != "cpu" else ""),
              **info,
              **({"energy": meter.describe()} if meter is not None else {}), "model": model,
              "params": str(params) if kind != "training" else str(param_count(make_model())),
              "repeats": str(repeats)}
    return rows, header
