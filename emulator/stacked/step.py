"""A stack of clients' models and optimiser state in fixed tensors, and one local SGD step of its
first rows.

The caller orders a call's clients by step count, most first, so each step serves a prefix of
rows: the clients that still have a batch in it. On a CPU a step computes exactly the rows it
needs (:meth:`GroupedNet.rows`: never a width whose kernels differ, so a client's numbers do not
depend on its partners). On a GPU a step computes the rows of its bucket (:func:`bucket`: the
live rows rounded up by at most an eighth), each bucket one CUDA graph captured once and
replayed; the graphs share the stack's tensors (the models, the minibatch indices, the learning
rate) and one memory pool. A row with no batch left costs nothing but a bucket's rounding.
"""
from __future__ import annotations

import gc
from collections.abc import Callable

import torch

from ..precision import autocast
from .grouped import GroupedNet


def bucket(live: int, width: int) -> int:
    """The rows a GPU step computes for ``live`` clients of a stack of ``width``: ``live``
    rounded up to a multiple of 8, or above 64 of an eighth of its power of two (at most 12.5 %
    padded rows, about 8 captured graphs per doubling of the width)."""
    quantum = max(8, 1 << max(live.bit_length() - 4, 0))
    return min(width, -(-live // quantum) * quantum)


class Stack:
    """``width`` clients' models, optimiser state and minibatch in fixed tensors on the engine's
    device, and one local SGD step of the first rows. The step's gradients come from the model's
    written-out form (:class:`GroupedNet`) where it has one, else from ``vmap`` over the model
    (``loss_fn``: a user's plug-in model). ``buckets``: a step computes its bucket of rows (a GPU's);
    ``graphs``: each bucket's step is a captured CUDA graph, replayed; otherwise steps run eagerly."""

    def __init__(self, engine, width: int, corrected: bool, loss_fn: Callable[[], Callable], *,
                 buckets: bool, graphs: bool, channels_last: bool):
        dev = engine.device
        self.engine, self.width, self.buckets, self.graphs = engine, width, buckets, graphs
        self.params = [torch.zeros(width, *p.shape, device=dev) for p in engine.model.parameters()]
        self.anchor = [torch.zeros_like(p) for p in self.params] if engine.mu else None
        self.corr = [torch.zeros_like(p) for p in self.params] if corrected else None
        self.bufs = [torch.zeros_like(p) for p in self.params] if engine.momentum else None
        self.batch = torch.zeros(width, engine.batch_size, dtype=torch.long, device=dev)
        self.mask = torch.zeros(width, engine.batch_size, device=dev)
        self.lr = torch.zeros(width, device=dev)    # each row's learning rate
        self.grouped = GroupedNet.of(engine.model, channels_last=channels_last)
        if self.grouped is not None:
            self._grad = self.grouped
        else:
            from torch.func import grad, vmap
            self._grad = vmap(grad(loss_fn()))
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None

    def _step(self, rows: int) -> None:
        """One step of the stack's first ``rows`` clients; the rest wait unchanged."""
        e, n = self.engine, rows
        params, batch, m = tuple(p[:n] for p in self.params), self.batch[:n], self.mask[:n]
        with autocast(e.device, e.precision):
            grads = self._grad(params, e.x[batch], e.y[batch], m)
        active = m.sum(1) > 0                                # clients with a real step here
        with torch.no_grad():
            for j, (p, g) in enumerate(zip(params, grads)):
                if e.weight_decay:
                    g = g.add(p, alpha=e.weight_decay)
                if self.anchor is not None:
                    g = g.add(p - self.anchor[j][:n], alpha=e.mu)
                if self.corr is not None:
                    g = g + self.corr[j][:n]
                act = active.view(-1, *[1] * (p.dim() - 1))
                if self.bufs is not None:
                    buf = self.bufs[j][:n]
                    g = torch.where(act, buf * e.momentum + g, buf)
                    buf.copy_(g)
                p.sub_(torch.where(act, g, torch.zeros_like(g)) * self.lr[:n].view_as(act))

    def rows(self, live: int) -> int:
        """How many of the stack's first rows a step computes to serve ``live`` clients."""
        if self.buckets:
            return bucket(live, self.width)
        return self.grouped.rows(live) if self.grouped is not None else max(live, 2)

    def step(self, rows: int) -> None:
        """One step of the first ``rows`` rows (the caller orders the clients with steps left first)."""
        if not self.graphs:
            self._step(rows)
            return
        if rows not in self._graphs:
            self._graphs[rows] = self._capture(rows)
        self._graphs[rows].replay()

    def _capture(self, rows: int):
        """The step of ``rows`` rows as a CUDA graph. Warm-up steps run first (as CUDA graphs
        require) and are undone, so every step of every call is the graph's: a resumed run
        computes as the uninterrupted one did. The buckets' graphs share one memory pool: they
        replay one after another on one stream, and every tensor a step leaves behind lives in
        the stack's own tensors, outside the pool."""
        state = [t.clone() for t in self.params + (self.bufs or [])]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(rows)
        torch.cuda.current_stream().wait_stream(side)
        for t, saved in zip(self.params + (self.bufs or []), state):
            t.copy_(saved)
        # A finished run's engine and its graphs are cyclic garbage; a graph freed while another is
        # being captured invalidates that capture, so collect first and never during it. Runs that
        # train together evaluate in threads of their own: their CUDA calls must not void it either.
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                self._step(rows)
            self._pool = self._pool or graph.pool()
        finally:
            if collecting:
                gc.enable()
        return graph
