"""Runs that train together: several runs in one process, their clients in the same stacked steps.

A study's width is across runs (arms, seeds, sweep points), not inside one: a run's group round
trains a few dozen small models, too few to fill a GPU or to amortise Python's per-step cost on a
CPU. So the runs of a shard (``train.stack``, ``--stack N``: at most N) run in one process, each
run's loop (its SimPy clock, sampling, grouping, ledger, checkpoints) in a thread of its own, and
every engine call of every run goes to one :class:`Batcher`:

* A call waits until every live run of the batcher has made one (or finished), then all of them
  train in one stacked call of one engine (:class:`~groupfel.emulator.training.BatchedEngine`'s
  stacked formulation), and each run gets its own rows back. Runs that finish leave; the others
  go on without them.
* The gathered calls are ordered by run. Local epochs, learning rates, FedProx's μ, momentum
  and SCAFFOLD's corrections are per-row inputs of the stacked formulation
  (:class:`~groupfel.emulator.stacked.Terms`): calls that differ in them (Table 2's E = 2/5/10,
  a decayed learning rate, FedAvg beside FedProx and SCAFFOLD) share one engine call, each
  client computed as in a call of its own. On the per-client loop calls that differ in any of
  them go to separate engine calls. So the k-th stacked call holds the k-th call of every run
  that makes one: a stacked campaign gives the same numbers every time, whichever thread asks
  first.
* A run's own engine (:class:`StackMember`) keeps its own model for everything but training
  (evaluation, scoring, the personal algorithms' steps): only ``train`` goes to the batcher.
* Runs whose engine settings differ (model, batch size, weight decay, optimizer, device,
  precision, kernel settings, engine) get different batchers (:class:`Stacks`).

A client's result does not depend on its partners where the kernels compute each stacked client
alone. On this project's CPU (x86-64, portable numerics) a client's models are bitwise the same in
a stack of 2 or of 300 (tests/test_stacking.py); the widths whose kernels differ (one client; 3
input channels in all, where oneDNN has a kernel of its own) are never computed: a step pads to
the next width that is safe. On a GPU, cuBLAS and cuDNN may pick other kernels for
other stack widths: there a run's numbers match its unstacked ones within the stacked-vs-sequential
tolerance (1e-5 on a model after a call), not bitwise.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np
import torch

from groupfel.topologies import Dataset

from .stacked import Kernels
from .training import BatchedEngine, TorchEngine


@dataclass
class _Request:
    table: torch.Tensor          # (R, P) start models
    rows: list[int]              # client i starts from table[rows[i]]
    clients: list[int]           # the batcher's client indices
    seeds: list[int]
    epochs: int
    lr: float
    mu: float
    beta: float                       # the run's momentum
    correction: torch.Tensor | None
    momentum: torch.Tensor | None     # updated in place


class Batcher:
    """One engine, fed by the calls of several runs (see the module docstring)."""

    def __init__(self, engine: TorchEngine):
        self.engine = engine
        self.live: set[int] = set()
        self.pending: dict[int, _Request] = {}
        self.results: dict[int, torch.Tensor | BaseException] = {}
        self.cond = threading.Condition()
        self._data: dict[int, int] = {}      # id(x_train) -> its first row in the engine's data
        self._arrays: list[np.ndarray] = []  # keeps those ids alive

    def join(self, run: int, dataset: Dataset, client_samples) -> int:
        """Register run ``run``'s clients; returns the offset of its client indices here."""
        e = self.engine
        key = id(dataset.x_train)
        if key not in self._data:
            if self._data:
                self._data[key] = len(e.x)
                e.x = torch.cat([e.x, torch.from_numpy(dataset.x_train).to(e.device)])
                e.y = torch.cat([e.y, torch.from_numpy(dataset.y_train).to(e.device)])
            else:
                self._data[key] = 0   # the engine was built on this dataset
            self._arrays.append(dataset.x_train)
        offset, rows = len(e.client_samples), self._data[key]
        samples = [torch.as_tensor(s, dtype=torch.long) + rows for s in client_samples]
        e.client_samples += [s.to(e.device) for s in samples]
        if hasattr(e, "_cpu_samples"):
            e._cpu_samples += samples
        self.live.add(run)
        return offset

    def leave(self, run: int) -> None:
        with self.cond:
            self.live.discard(run)
            self._flush_if_ready()

    @contextlib.contextmanager
    def away(self, run: int):
        """Run ``run`` makes no call meanwhile (it waits for a partner): the others train without it."""
        self.leave(run)
        try:
            yield
        finally:
            with self.cond:
                self.live.add(run)

    def train(self, run: int, request: _Request) -> torch.Tensor:
        with self.cond:
            self.pending[run] = request
            self._flush_if_ready()
            while run not in self.results:
                self.cond.wait()
            out = self.results.pop(run)
        if isinstance(out, BaseException):
            raise RuntimeError("the stacked training call of this run and its partners failed") from out
        return out

    def _flush_if_ready(self) -> None:
        """With every live run's call in: train them (in this thread, the others wait) and wake all."""
        if not self.pending or len(self.pending) < len(self.live):
            return
        batch, self.pending = dict(sorted(self.pending.items())), {}
        try:
            self.results.update(self._train(batch))
        except BaseException as exc:   # every partner's call failed with it
            self.results.update({run: exc for run in batch})
        self.cond.notify_all()

    def _train(self, batch: dict[int, _Request]) -> dict[int, torch.Tensor]:
        # the stacked formulation takes every optimiser input per row: all runs share one call;
        # the per-client loop takes one of each, so runs that differ in any go to separate calls
        per_row = getattr(self.engine, "formulation", None) == "stacked"
        calls: dict[tuple, list[int]] = {}
        for run, r in batch.items():
            key = () if per_row else (r.correction is not None, r.momentum is not None, r.epochs, r.lr, r.mu, r.beta)
            calls.setdefault(key, []).append(run)
        out = {}
        for runs in calls.values():
            reqs = [batch[run] for run in runs]
            starts = np.cumsum([0] + [len(r.table) for r in reqs])
            rows = [start + row for r, start in zip(reqs, starts) for row in r.rows]
            per = lambda name: ([getattr(r, name) for r in reqs for _ in r.clients] if per_row  # noqa: E731
                                else getattr(reqs[0], name))
            momentum = self._rows(reqs, "momentum")
            trained = self.engine.train(torch.cat([r.table.to(self.engine.device) for r in reqs]),
                                        [c for r in reqs for c in r.clients], per("epochs"),
                                        [s for r in reqs for s in r.seeds], lr=per("lr"), rows=rows,
                                        correction=self._rows(reqs, "correction"), momentum=momentum,
                                        mu=per("mu"), beta=per("beta"))
            pos = 0
            for run, r in zip(runs, reqs):
                n = len(r.clients)
                out[run] = trained[pos:pos + n]
                if r.momentum is not None:
                    r.momentum.copy_(momentum[pos:pos + n])
                pos += n
        return out

    def _rows(self, reqs: list[_Request], name: str) -> torch.Tensor | None:
        """The calls' rows of an optional input (correction, momentum), zeros for a call without
        one (a zero correction or momentum adds exactly nothing); None where no call has one."""
        given = [getattr(r, name) for r in reqs]
        if all(t is None for t in given):
            return None
        like = next(t for t in given if t is not None)
        return torch.cat([t if t is not None else like.new_zeros(len(r.clients), like.shape[1])
                          for t, r in zip(given, reqs)])


class StackMember(TorchEngine):
    """A run's engine in a stack: its own model for evaluation and scoring; ``train`` goes to the
    stack's :class:`Batcher`."""

    batcher: Batcher
    run: int
    offset: int

    def train(self, start, clients, epochs, seeds, *, lr=None, correction=None, momentum=None, rows=None,
              mu=None, beta=None):
        table, rows = self._inputs(start, len(clients), rows)
        request = _Request(table, rows, [self.offset + int(c) for c in clients], [int(s) for s in seeds], int(epochs),
                           self.lr if lr is None else float(lr), self.mu if mu is None else float(mu),
                           self.momentum if beta is None else float(beta), correction, momentum)
        return self.batcher.train(self.run, request)

    def waiting(self):
        return self.batcher.away(self.run)


class Stacks:
    """The batchers of one process's shard, one per set of engine settings."""

    def __init__(self):
        self.batchers: dict[tuple, Batcher] = {}
        self.runs = 0

    def member(self, engine_kind: str, dataset: Dataset, client_samples, model: str, lr: float, batch_size: int,
               device: str, *, momentum: float, weight_decay: float, mu: float, precision: str,
               optimizer: str = "sgd", kernels: Kernels | None = None) -> StackMember:
        """The engine of the next run of the shard, joined to the batcher of its settings (μ and
        momentum are each call's own: runs of any algorithm share a batcher)."""
        kw = dict(weight_decay=weight_decay, precision=precision, optimizer=optimizer)
        kernels = kernels or Kernels()
        key = (engine_kind, model, tuple(dataset.input_shape), dataset.num_classes, batch_size, device,
               *kw.values(), kernels)
        if key not in self.batchers:
            engine = (BatchedEngine(dataset, [], model, lr, batch_size, device, workers=1, formulation="stacked",
                                    kernels=kernels, **kw)
                      if engine_kind == "batched" else TorchEngine(dataset, [], model, lr, batch_size, device, **kw))
            self.batchers[key] = Batcher(engine)
        batcher = self.batchers[key]
        member = StackMember(dataset, client_samples, model, lr, batch_size, device, momentum=momentum, mu=mu, **kw)
        member.batcher, member.run = batcher, self.runs
        member.offset = batcher.join(self.runs, dataset, client_samples)
        self.runs += 1
        return member
