"""Real torch training behind a small engine interface.

The SimPy processes model *time*; an engine does the *compute*: it takes start models (flat
parameter vectors) and a set of clients and returns each client's model after E local epochs of
minibatch SGD (Alg. 1, Lines 10-13), with the local objective of the configured algorithm:

* FedAvg: the client's mean cross-entropy;
* FedProx (Li et al. 2020): plus (μ/2)·‖w − w_start‖², gradient μ·(w − w_start);
* SCAFFOLD (Karimireddy et al. 2020, Alg. 1 line 10): the gradient corrected by c − c_i, passed in
  per client as ``correction`` (the variates themselves live in :mod:`groupfel.emulator.compute`).

Every step is torch's SGD: g = ∇f + wd·w (+ the terms above); with momentum m, buf = m·buf + g;
w ← w − lr·buf. With ``optimizer = "adam"`` it is torch's Adam (L2 weight decay in g, β = (0.9,
0.999), ε = 1e-8, the same elementwise arithmetic as ``torch.optim.Adam``). A client's optimiser
state (:func:`state_width` numbers a row: SGD's buffer, or Adam's two moments and its step count)
may be passed in (persistent client state) and is updated in place; otherwise each client starts
from zero state, which is what a fresh torch optimiser does.

Engines: :class:`TorchEngine` (``sequential``) trains one client after another, the readable
reference. :class:`BatchedEngine` (``batched``) trains a whole group round per call, either with
the clients stacked into one step (the model written out over all of them,
:mod:`groupfel.emulator.stacked`: the fast way on a GPU, and for runs that train together) or client by client with oneDNN's channels-last
convolutions split over worker processes (the fast way for CNNs on a CPU).
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import signal
import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from groupfel.topologies import Dataset

from . import devices, procs
from .io import exit_with_parent
from .models import build_model
from .optimizers import ADAM_BETAS, ADAM_EPS, OPTIMIZERS, state_width
from .precision import PRECISIONS, autocast, set_precision
from .stacked import GroupedNet, Kernels, Stack, Terms, bucket

log = logging.getLogger(__name__)
# torch's global generator seeds the initial weights: runs sharing a process (emulator.stacking) take turns
_GLOBAL_RNG = threading.Lock()

__all__ = ["TrainingEngine", "TorchEngine", "BatchedEngine", "ENGINES", "OPTIMIZERS", "PRECISIONS", "autocast",
           "build_model", "flatten", "load_flat", "set_precision", "state_width"]


@torch.no_grad()
def load_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a flat vector into parameters (``vector_to_parameters`` would alias it, and SGD's
    in-place steps would then overwrite the caller's start model)."""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()


def flatten(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Parameters as one flat vector (``reshape``: channels-last parameters are not contiguous)."""
    return torch.cat([p.detach().reshape(-1) for p in params])


class TrainingEngine(Protocol):
    n_params: int
    model_bytes: int

    def initial_weights(self, seed: int) -> torch.Tensor: ...

    def train(self, start: torch.Tensor, clients: Sequence[int], epochs: int, seeds: Sequence[int], *,
              lr: float | None = None, correction: torch.Tensor | None = None,
              momentum: torch.Tensor | None = None, rows: Sequence[int] | None = None,
              mu: float | None = None, beta: float | None = None) -> torch.Tensor:
        """Each client's flat weights after ``epochs`` local epochs: (len(clients), P).

        ``start`` is one (P,) model for every client, or one row per client, or with ``rows`` a
        (R, P) table where client i starts from ``start[rows[i]]``. ``lr`` overrides the engine's
        (learning-rate decay); ``correction`` (C, P) is added to every gradient (SCAFFOLD);
        ``momentum`` (C, :func:`state_width`) is the clients' optimiser state (SGD's momentum
        buffers, or Adam's moments and step counts), updated in place. ``mu`` and ``beta``
        override the engine's μ and momentum (runs of other algorithms trained in one call)."""

    def evaluate(self, weights: torch.Tensor) -> tuple[float, float]:
        """(accuracy, mean cross-entropy loss) on the held-out test set."""

    def waiting(self) -> contextlib.AbstractContextManager:
        """Entered while the run waits on another run of its process (so a stack trains on)."""


class TorchEngine:
    """Plain per-client minibatch SGD on the CPU (or ``device``), one client after another."""

    def __init__(self, dataset: Dataset, client_samples: Sequence[np.ndarray], model: str | nn.Module,
                 lr: float, batch_size: int, device: str = "cpu", *, momentum: float = 0.0,
                 weight_decay: float = 0.0, mu: float = 0.0, precision: str = "fp32", optimizer: str = "sgd"):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if optimizer == "adam" and momentum:
            raise ValueError("Adam keeps its own moments: give momentum = 0 with optimizer 'adam'")
        self.optimizer = optimizer
        self.device = torch.device(devices.resolve(device))
        devices.prepare(self.device)
        set_precision(self.device, precision)
        self.precision = precision
        if isinstance(model, str):
            self.model_name, model = model, build_model(model, dataset.input_shape, dataset.num_classes)
        else:   # a built model (a worker's copy of its engine's)
            self.model_name = type(model).__name__
        self.model = model.to(self.device)
        self.num_classes = dataset.num_classes
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.lr, self.batch_size = lr, batch_size
        self.momentum, self.weight_decay, self.mu = momentum, weight_decay, mu
        # the dataset lives once: clients hold index arrays into it
        self.x = torch.from_numpy(dataset.x_train).to(self.device)
        self.y = torch.from_numpy(dataset.y_train).to(self.device)
        self.x_test = torch.from_numpy(dataset.x_test).to(self.device)
        self.y_test = torch.from_numpy(dataset.y_test).to(self.device)
        self.client_samples = [torch.as_tensor(s, dtype=torch.long, device=self.device) for s in client_samples]
        self.channels_last = False

    @property
    def model_bytes(self) -> int:
        return 4 * self.n_params  # float32 parameters on the wire

    @property
    def state_width(self) -> int:
        """Numbers in one client's optimiser state row (0: it keeps none)."""
        return state_width(self.optimizer, self.momentum, self.n_params)

    def steps(self, client: int, epochs: int) -> int:
        """Local SGD steps of one client: E·⌈n_i / B⌉ (SCAFFOLD's K in its variate update)."""
        return epochs * -(-len(self.client_samples[client]) // self.batch_size)

    def waiting(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()   # alone: nothing to step out of

    def initial_weights(self, seed: int) -> torch.Tensor:
        with _GLOBAL_RNG:
            torch.manual_seed(seed)
            for layer in self.model.modules():
                if hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()
            return flatten(self.model.parameters()).clone()

    def _inputs(self, start: torch.Tensor, n_clients: int, rows) -> tuple[torch.Tensor, list[int]]:
        table = start.reshape(1, -1) if start.dim() == 1 else start
        if rows is None:
            if start.dim() == 2 and len(start) != n_clients:
                raise ValueError(f"start has {len(start)} rows for {n_clients} clients; pass rows")
            rows = [0] * n_clients if start.dim() == 1 else range(n_clients)
        return table.to(self.device), [int(r) for r in rows]

    def train(self, start, clients, epochs, seeds, *, lr=None, correction=None, momentum=None, rows=None,
              mu=None, beta=None):
        table, rows = self._inputs(start, len(clients), rows)
        lr = self.lr if lr is None else lr
        out = torch.empty(len(clients), self.n_params, device=self.device)
        for i, (client, seed) in enumerate(zip(clients, seeds)):
            out[i] = self._train_client(table[rows[i]], int(client), int(seed), epochs, lr,
                                        None if correction is None else correction[i],
                                        None if momentum is None else momentum[i], mu=mu, beta=beta)
        return out

    def _train_client(self, start: torch.Tensor, client: int, seed: int, epochs: int, lr: float,
                      correction: torch.Tensor | None, buf: torch.Tensor | None, *,
                      mu: float | None = None, beta: float | None = None) -> torch.Tensor:
        """One client's local epochs from ``start``; its optimiser state ``buf``
        (:attr:`state_width`,) is updated in place."""
        every = list(self.model.parameters())
        load_flat(every, start)
        adam = self.optimizer == "adam"
        m = 0.0 if adam else self.momentum if beta is None else beta
        wd, mu = self.weight_decay, self.mu if mu is None else mu
        if (m or adam) and buf is None:
            buf = torch.zeros(2 * self.n_params + 1 if adam else self.n_params, device=self.device)
        # per-parameter views of the flat vectors, for torch's multi-tensor (_foreach) updates; only
        # the parameters that take a gradient step (BatchNorm statistics held as parameters do not)
        step = [p.requires_grad for p in every]
        params = [p for p, s in zip(every, step) if s]
        views = lambda flat: [v.view(p.shape) for v, p, s in zip(flat.split([p.numel() for p in every]), every, step)  # noqa: E731
                              if s]
        anchor = views(start) if mu else None
        corr = views(correction) if correction is not None else None
        bufs = views(buf) if m else None
        if adam:
            P = self.n_params
            exp_avg, exp_avg_sq, count = views(buf[:P]), views(buf[P:2 * P]), buf[2 * P:]
            (b1, b2), n_steps = ADAM_BETAS, int(count.item())
        self.model.train()
        idx = self.client_samples[client]
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = idx[torch.randperm(len(idx), generator=gen, device="cpu").to(self.device)]   # a CPU generator
            for b in range(0, len(order), self.batch_size):
                batch = order[b:b + self.batch_size]
                x = self.x[batch]
                if self.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                for p in params:
                    p.grad = None
                with autocast(self.device, self.precision):
                    loss = F.cross_entropy(self.model(x), self.y[batch])
                loss.backward()
                with torch.no_grad():
                    g = [p.grad for p in params]
                    if wd:
                        g = torch._foreach_add(g, params, alpha=wd)
                    if mu:
                        g = torch._foreach_add(g, torch._foreach_sub(params, anchor), alpha=mu)
                    if corr is not None:
                        g = torch._foreach_add(g, corr)
                    if adam:   # torch.optim.Adam's arithmetic, step by step (its _single_tensor_adam)
                        n_steps += 1
                        torch._foreach_lerp_(exp_avg, g, 1 - b1)
                        torch._foreach_mul_(exp_avg_sq, b2)
                        torch._foreach_addcmul_(exp_avg_sq, g, g, value=1 - b2)
                        denom = torch._foreach_sqrt(exp_avg_sq)
                        torch._foreach_div_(denom, (1 - b2 ** n_steps) ** 0.5)
                        torch._foreach_add_(denom, ADAM_EPS)
                        torch._foreach_addcdiv_(params, exp_avg, denom, value=-lr / (1 - b1 ** n_steps))
                        continue
                    if m:
                        torch._foreach_mul_(bufs, m)
                        torch._foreach_add_(bufs, g)
                        g = bufs
                    torch._foreach_add_(params, g, alpha=-lr)
        if adam:
            count.fill_(n_steps)
        return flatten(every)

    @torch.no_grad()
    def evaluate(self, weights):
        load_flat(list(self.model.parameters()), weights)
        self.model.eval()
        correct, total_loss = 0, 0.0
        for b in range(0, len(self.y_test), 2048):
            x = self.x_test[b:b + 2048]
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            logits = self.model(x)
            y = self.y_test[b:b + 2048]
            total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
        n = len(self.y_test)
        return correct / n, total_loss / n


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Stop glibc from handing freed memory back to the OS after every step (and from mmap-ing
    each large activation anew): oneDNN's per-step tensors then reuse warm pages. Measured 1.3x
    on the CNN round on the 2-core CPU. Returns whether glibc took the settings."""
    try:
        # the process's own symbols, libc's among them: find_library("c") would run ldconfig in a
        # subprocess from every worker, a child that a Ctrl-C can catch between its fork and exec
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):   # TypeError: Windows loads no library by None
        return False
    # 32 MiB is glibc's ceiling for the mmap threshold on 64-bit (larger values are refused)
    return all(mallopt(param, value) == 1 for param, value in
               ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 256 << 20)))


_WORKER: TorchEngine | None = None     # a pool worker's own engine (per-client formulation)
_BLOCK: np.ndarray | None = None


def _worker_init(parent: int, spec: dict, data, block) -> None:
    """A per-client worker's start: its own sequential engine over the dataset and model block it
    shares with the engine in process ``parent`` (:mod:`groupfel.emulator.procs`)."""
    # Ctrl-C reaches the whole process group; the parent stops the run and says so in one line,
    # so the workers ignore it rather than print a KeyboardInterrupt traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # ignored from the start where the server was (procs)
    exit_with_parent(parent)
    torch.set_num_threads(1)   # one process per core: more threads only contend
    keep_freed_memory()
    global _WORKER, _BLOCK
    arrays = procs.attach(data)
    _BLOCK = procs.attach(block)["block"]
    empty = np.empty((0, *arrays["x"].shape[1:]), dtype=arrays["x"].dtype)
    dataset = Dataset("shared", arrays["x"], arrays["y"], empty, np.empty(0, dtype=arrays["y"].dtype),
                      spec.pop("num_classes"))
    channels_last = spec.pop("channels_last")
    _WORKER = TorchEngine(dataset, spec.pop("client_samples"), pickle.loads(spec.pop("model")), **spec)
    if channels_last:
        _WORKER.channels_last = True
        _WORKER.model = _WORKER.model.to(memory_format=torch.channels_last)


def _worker_run(job) -> None:
    """Runs in a worker: the sequential loop over some clients (positions ``chunk`` of the call),
    reading start models, corrections and momentum from the shared block and writing the trained
    models (and momentum, in place) back into it."""
    layout, chunk, rows, clients, seeds, epochs, lr = job
    block = torch.from_numpy(_BLOCK)
    for i, r, client, seed in zip(chunk, rows, clients, seeds):
        corr = block[layout["correction"] + i] if "correction" in layout else None
        buf = None
        if "momentum" in layout:   # a state row may span several block rows (Adam's: 2P + 1)
            at, span, width = layout["momentum"], layout["state_span"], layout["state_width"]
            buf = block[at + i * span:at + (i + 1) * span].view(-1)[:width]
        block[layout["out"] + i] = _WORKER._train_client(block[layout["table"] + r], client, seed, epochs, lr,
                                                         corr, buf)


def _unimportable(model: nn.Module) -> str | None:
    """Where a class of ``model`` lives that a fresh process cannot import (None: none does)."""
    for m in model.modules():
        cls = type(m)
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            return f"{cls.__module__}.{cls.__qualname__}"
    return None


def _has_conv(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


class BatchedEngine(TorchEngine):
    """Trains every client of a call (a whole group round) at once.

    Two formulations, chosen per device and model (``formulation``):

    * ``stacked``: the clients' parameters stacked into (C, ...) tensors and every shipped model
      written out as one step over all of them (grouped convolutions, GroupNorm over the stacked
      channels, residual adds, batched-matmul heads: :mod:`groupfel.emulator.stacked`); a user's
      plug-in model runs under ``torch.func.vmap``. The clients with the most steps go first and
      each step computes only the rows that still have a batch in it (on a GPU, their bucket, one
      captured CUDA graph each). Each client's step averages its loss over its own samples only,
      and a row past its client's last step is masked out of the update (weights and momentum
      unchanged), so the result is the sequential engine's up to float rounding. ``epochs``,
      ``lr``, ``mu`` and ``beta`` (momentum) may be one per client and ``correction`` a row of
      zeros for a client without one (runs of other local epochs, rates and algorithms in one
      call, each client's epochs one after another from the first step). Default on a GPU.
    * ``per-client``: the sequential loop with channels-last convolutions (oneDNN's fast kernels)
      and glibc's allocator told to keep freed memory, the clients split over ``workers``
      processes of one torch thread each, started by the server of :mod:`groupfel.emulator.procs`
      (never forked from this process: safe with a CUDA build of torch), the dataset and the
      models shared with them through anonymous memory, never copied. Default on a CPU, where it
      measured fastest for the MLP and the CNN (benchmarks/engines.py --formulation).

    A plug-in model that ``vmap`` cannot run (e.g. BatchNorm updating running statistics) falls back to
    the per-client loop, with one log line saying so.

    Runs that train together (``train.stack``, :mod:`groupfel.emulator.stacking`): the runs of a
    shard run in one process, each run's loop in its own thread, and one stacked engine of this
    class serves them all: a batcher gathers one call from every live run (a run that finished
    leaves), orders them by run and trains all their clients in one stacked call, then hands each
    run its rows. A CPU step computes at least two rows, where a client's numbers then do not
    depend on its partners, bit for bit.
    """

    def __init__(self, dataset: Dataset, client_samples: Sequence[np.ndarray], model: str,
                 lr: float, batch_size: int, device: str = "cpu", *, momentum: float = 0.0,
                 weight_decay: float = 0.0, mu: float = 0.0, workers: int | None = None,
                 formulation: str | None = None, precision: str = "fp32", kernels: Kernels | None = None,
                 optimizer: str = "sgd"):
        super().__init__(dataset, client_samples, model, lr, batch_size, device, momentum=momentum,
                         weight_decay=weight_decay, mu=mu, precision=precision, optimizer=optimizer)
        self.kernels = kernels or Kernels()
        self.kernels.apply(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        conv = _has_conv(self.model)
        cpu = self.device.type == "cpu"
        if formulation is None:   # measured on a 2-core CPU: per-client beat stacked for the MLP and the CNN
            formulation = "per-client" if cpu else "stacked"
        # a model with a written-out form (every shipped one) stacks without vmap: no trial step needed
        reason = None if formulation != "stacked" or GroupedNet.of(self.model) else self._stack_failure()
        if formulation == "stacked" and reason is not None:
            log.warning("batched engine: cannot stack model %r (%s); training its clients one by one",
                        model, reason)
            formulation = "per-client"
        if formulation not in ("stacked", "per-client"):
            raise ValueError(f"formulation must be 'stacked' or 'per-client', got {formulation!r}")
        self.formulation = formulation
        if formulation == "per-client" and conv and self.device.type == "cpu":
            self.channels_last = True
            self.model = self.model.to(memory_format=torch.channels_last)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.workers = 1 if self.device.type != "cpu" or formulation == "stacked" else (workers or cores)
        if self.workers > 1 and (where := _unimportable(self.model)):
            log.warning("batched engine: model %r is defined in %s, which worker processes cannot import; "
                        "training its clients in this process", model, where)
            self.workers = 1
        self._stacks: dict[tuple, Stack] = {}
        # on a GPU a step computes its bucket of rows as one captured graph (emulator.stacked.step)
        self.buckets = self.device.type == "cuda"
        self._cpu_samples = [s.cpu() for s in self.client_samples]
        self._pool = None
        self._data: procs.SharedArrays | None = None      # the training set, shared with the workers
        self._block: procs.SharedArrays | None = None     # models in and out of the workers

    # ---- stacked formulation -------------------------------------------------------------------
    def _loss_fn(self):
        from torch.func import functional_call
        names = [n for n, _ in self.model.named_parameters()]
        model = self.model

        def loss(params, x, y, m):
            logits = functional_call(model, dict(zip(names, params)), (x,))
            ce = F.cross_entropy(logits, y, reduction="none")
            return (ce * m).sum() / m.sum().clamp(min=1.0)   # the client's mean over its real samples
        return loss

    def _stack_failure(self) -> str | None:
        """Why ``vmap`` cannot run this model (None: it can), from a tiny real step."""
        from torch.func import grad, vmap
        if not all(p.requires_grad for p in self.model.parameters()):
            return "it holds state without a gradient (BatchNorm statistics)"
        params = tuple(p.detach().unsqueeze(0).repeat(2, *[1] * p.dim()) for p in self.model.parameters())
        x = self.x[:2].unsqueeze(0).repeat(2, *[1] * self.x.dim())
        y = self.y[:2].unsqueeze(0).repeat(2, 1)
        try:
            self.model.train()
            vmap(grad(self._loss_fn()))(params, x, y, torch.ones(2, 2, device=self.device))
        except Exception as exc:   # noqa: BLE001 - any failure means: do not stack this model
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        return None

    def _train_stacked(self, table, rows, clients, epochs, seeds, terms: Terms, momentum):
        C, dev = len(clients), self.device
        # The clients with the most steps go first, so that each step computes only the prefix of
        # rows that still have a batch in it (ragged sizes: most of a wide stack's last steps would
        # otherwise be masked work); a client's numbers do not depend on its row. On a CPU a step
        # computes exactly those rows (Stack.rows: never a width whose kernels differ), on a GPU
        # its bucket of them, one captured graph each (emulator.stacked.step).
        width = bucket(C, 1 << 30) if self.buckets else max(C, 4)
        B = self.batch_size
        n_steps = [e * -(-len(self._cpu_samples[c]) // B) for c, e in zip(clients, epochs)]
        perm = sorted(range(C), key=lambda i: -n_steps[i])
        inverse = torch.as_tensor(np.argsort(perm), device=dev)
        pick = torch.as_tensor(perm, device=dev)
        st = self._stack(width)
        starts = table[torch.as_tensor(rows, device=dev)[pick]]             # (C, P)
        terms = terms.ordered(perm)
        st.load(starts, terms, None if momentum is None else momentum[pick.to(momentum.device)])
        order, mask, live = self._schedule([clients[i] for i in perm], [seeds[i] for i in perm],
                                           [epochs[i] for i in perm], width)
        self.model.train()
        for b in range(len(order)):
            st.batch.copy_(order[b])
            st.mask.copy_(mask[b])
            st.step(st.rows(live[b]))
        if momentum is not None and st.uses.adam:
            momentum.copy_(st.adam_state(C)[inverse].to(momentum.device))
        elif momentum is not None and st.uses.heavy:   # a row without momentum keeps its buffer, untouched
            heavy = torch.as_tensor(terms.beta, device=momentum.device)[inverse.to(momentum.device)] != 0
            new = st.flat(st.bufs, C)[inverse].to(momentum.device)
            momentum.copy_(torch.where(heavy.unsqueeze(1), new, momentum))
        return st.flat(st.params, C)[inverse]

    def _schedule(self, clients, seeds, epochs, width) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Every step's sample indices and mask, (steps, width, B) each, on the device, and how
        many clients have a batch in each step: each client's ``epochs[i]`` epochs shuffled by its
        own seed as the sequential engine does, one after another from the first step (its last
        batch of an epoch partial), padded to the longest client's step count (a pad: sample 0
        with weight 0). A client's updates are the same whichever its partners' epochs."""
        B = self.batch_size
        idx = [self._cpu_samples[c] for c in clients]
        per_epoch = [-(-len(i) // B) for i in idx]
        total = [e * s for e, s in zip(epochs, per_epoch)]
        steps = max(total)
        order = torch.zeros(width, steps * B, dtype=torch.long, device="cpu")
        mask = torch.zeros(width, steps * B, device="cpu")
        for r, (i, seed, e, s) in enumerate(zip(idx, seeds, epochs, per_epoch)):
            gen = torch.Generator().manual_seed(int(seed))
            for k in range(e):
                at = k * s * B
                order[r, at:at + len(i)] = i[torch.randperm(len(i), generator=gen, device="cpu")]
                mask[r, at:at + len(i)] = 1.0
        as_steps = lambda t: t.view(width, steps, B).transpose(0, 1)  # noqa: E731
        live = [sum(t > s for t in total) for s in range(steps)]
        return as_steps(order).to(self.device), as_steps(mask).to(self.device), live

    def _stack(self, width: int) -> Stack:
        key = width
        if key not in self._stacks:
            if len(self._stacks) >= 8:   # few widths recur; an old one's memory goes back
                self._stacks.pop(next(iter(self._stacks)))
            self._stacks[key] = Stack(self, width, self._loss_fn, buckets=self.buckets,
                                      graphs=self.device.type == "cuda", channels_last=self.kernels.layout(self.device))
        return self._stacks[key]

    # ---- per-client formulation ----------------------------------------------------------------
    def _chunks(self, clients) -> list[list[int]]:
        """Positions of the clients split into ``workers`` chunks of about equal work (samples)."""
        sizes = [len(self.client_samples[c]) for c in clients]
        load = [0] * self.workers
        chunks: list[list[int]] = [[] for _ in range(self.workers)]
        for i in sorted(range(len(clients)), key=sizes.__getitem__, reverse=True):   # largest first (LPT)
            w = load.index(min(load))
            chunks[w].append(i)
            load[w] += sizes[i]
        return [sorted(c) for c in chunks if c]

    def _shared_block(self, rows: int) -> torch.Tensor:
        """A (≥ rows, P) block shared with the workers, (re)starting them when it must grow: models
        travel through it, not through pickles (pickling cost 5 % of a CNN round)."""
        if self._pool is None or len(self._block["block"]) < rows:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            if self._data is None:   # the training set, once per engine: workers map it, never copy it
                self._data = procs.SharedArrays.of({"x": self.x.numpy(), "y": self.y.numpy()})
                self.x, self.y = torch.from_numpy(self._data["x"]), torch.from_numpy(self._data["y"])
            rows = max(rows, 2 * len(self._block["block"]) if self._block is not None else 0)   # few restarts
            self._block = procs.SharedArrays({"block": ((rows, self.n_params), np.float32)})
            spec = {"client_samples": [s.numpy() for s in self.client_samples], "model": pickle.dumps(self.model),
                    "lr": self.lr, "batch_size": self.batch_size, "momentum": self.momentum,
                    "weight_decay": self.weight_decay, "mu": self.mu, "num_classes": self.num_classes,
                    "channels_last": self.channels_last, "optimizer": self.optimizer}
            # an executor, not a multiprocessing.Pool: a worker that cannot start breaks it (an
            # error here) where a Pool would start replacements forever
            self._pool = ProcessPoolExecutor(self.workers, mp_context=procs.worker_context(), initializer=_worker_init,
                                             initargs=(os.getpid(), spec, self._data.handle(), self._block.handle()))
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return torch.from_numpy(self._block["block"])

    def train(self, start, clients, epochs, seeds, *, lr=None, correction=None, momentum=None, rows=None,
              mu=None, beta=None):
        table, rows = self._inputs(start, len(clients), rows)
        lr = self.lr if lr is None else lr
        mu, beta = self.mu if mu is None else mu, self.momentum if beta is None else beta
        clients, seeds = [int(c) for c in clients], [int(s) for s in seeds]
        if self.formulation == "stacked":   # epochs, lr, μ, momentum: one for all, or one per client (emulator.stacking)
            per_row = lambda v: [float(x) for x in v] if isinstance(v, Sequence) else [float(v)] * len(clients)  # noqa: E731
            terms = Terms(per_row(lr), per_row(mu), per_row(beta), correction)
            return self._train_stacked(table, rows, clients, [int(e) for e in per_row(epochs)], seeds, terms, momentum)
        if self.workers == 1 or len(clients) == 1:
            return super().train(table, clients, epochs, seeds, lr=lr, correction=correction,
                                 momentum=momentum, rows=rows, mu=mu, beta=beta)
        if (mu, beta) != (self.mu, self.momentum):   # the workers were started with the engine's
            raise ValueError("the per-client workers train with the engine's mu and momentum; train those "
                             "of another in a call of its own engine")
        C, P = len(clients), self.n_params
        sections = {"table": table, "out": None, "correction": correction, "momentum": momentum}
        layout, end = {}, 0
        span = 1 if momentum is None else -(-momentum.shape[1] // P)   # block rows per state row
        for name, rows_of in sections.items():
            if name == "out" or rows_of is not None:
                layout[name] = end
                end += C if rows_of is None else len(rows_of) * (span if name == "momentum" else 1)
        block = self._shared_block(end)
        state = None
        if momentum is not None:
            layout.update(state_span=span, state_width=momentum.shape[1])
            state = block[layout["momentum"]:layout["momentum"] + C * span].reshape(C, span * P)[:, :momentum.shape[1]]
        for name, rows_of in sections.items():
            if name == "momentum" and rows_of is not None:
                state.copy_(rows_of.cpu())
            elif rows_of is not None:
                block[layout[name]:layout[name] + len(rows_of)] = rows_of.cpu()
        jobs = [(layout, chunk, [rows[i] for i in chunk], [clients[i] for i in chunk], [seeds[i] for i in chunk],
                 epochs, lr) for chunk in self._chunks(clients)]
        try:
            list(self._pool.map(_worker_run, jobs))
        except BrokenProcessPool:
            self._pool = None
            raise RuntimeError("the batched engine's worker processes stopped (killed, or they could not start: "
                               "see the lines above); set train.workers = 1 to train in this process") from None
        if momentum is not None:
            momentum.copy_(state)
        return block[layout["out"]:layout["out"] + C].clone().to(self.device)


ENGINES = {"sequential": TorchEngine, "batched": BatchedEngine}
