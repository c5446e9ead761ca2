"""A stack of clients' models and optimiser state in fixed tensors, and one local SGD (or Adam)
step of its first rows.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..optimizers import ADAM_BETAS, ADAM_EPS
from ..precision import autocast
from .grouped import GroupedNet


def bucket(live: int, width: int) -> int:
    """The rows a GPU step computes for ``live`` clients of a stack of ``width``: ``live``
    rounded up to a multiple of 8, or above 64 of an eighth of its power of two (at most 12.5 %
    padded rows, about 8 captured graphs per doubling of the width)."""
    quantum = max(8, 1 << max(live.bit_length() - 4, 0))
    return min(width, -(-live // quantum) * quantum)


@dataclass(frozen=True)
class Terms:
    """A call's optimiser inputs, one per client (row): the learning rate, FedProx's μ (the
    gradient gains μ·(w − w_start)), the momentum β (buf = β·buf + g) and SCAFFOLD's correction
    (C, P) added to every gradient (None: no client has one; a row of zeros: this one has none).
    Runs of different algorithms and sweep points thus train in one call: a row whose μ, β or
    correction is zero computes exactly as without the term (x + 0·y = x for finite y)."""
    lr: Sequence[float]
    mu: Sequence[float]
    beta: Sequence[float]
    correction: torch.Tensor | None = None

    def ordered(self, perm: Sequence[int]) -> Terms:
        """The terms of the clients in the order ``perm``."""
        pick = lambda v: [v[i] for i in perm]   # noqa: E731
        corr = self.correction
        if corr is not None:
            corr = corr[torch.as_tensor(perm, device=corr.device)]
        return Terms(pick(self.lr), pick(self.mu), pick(self.beta), corr)


class Uses(NamedTuple):
    """Which of the optional terms a call's step computes (a captured graph each)."""
    prox: bool
    corrected: bool
    heavy: bool
    adam: bool = False


class Stack:
    """``width`` clients' models, optimiser state and minibatch in fixed tensors on the engine's
    device, and one local SGD step of the first rows. The step's gradients come from the model's
    written-out form (:class:`GroupedNet`) where it has one, else from ``vmap`` over the model
    (``loss_fn``: a user's plug-in model). ``buckets``: a step computes its bucket of rows (a GPU's);
    ``graphs``: each bucket's step is a captured CUDA graph, replayed; otherwise steps run eagerly."""

    def __init__(self, engine, width: int, loss_fn: Callable[[], Callable], *,
                 buckets: bool, graphs: bool, channels_last: bool):
        dev = engine.device
        self.engine, self.width, self.buckets, self.graphs = engine, width, buckets, graphs
        self.grouped = GroupedNet.of(engine.model, channels_last=channels_last)
        self.params = [self.grouped.zeros(width, i, p.shape, dev) if self.grouped is not None
                       else torch.zeros(width, *p.shape, device=dev) for i, p in enumerate(engine.model.parameters())]
        # the optional terms' tensors, made when a call first needs them
        self.anchor: list[torch.Tensor] | None = None
        self.corr: list[torch.Tensor] | None = None
        self.bufs: list[torch.Tensor] | None = None
        self.moments: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None   # Adam's, per row
        self.count = torch.zeros(width, device=dev)    # each row's Adam steps taken
        self.adam = engine.optimizer == "adam"
        self.batch = torch.zeros(width, engine.batch_size, dtype=torch.long, device=dev)
        self.mask = torch.zeros(width, engine.batch_size, device=dev)
        self.lr = torch.zeros(width, device=dev)    # each row's learning rate, μ and momentum
        self.mu = torch.zeros(width, device=dev)
        self.beta = torch.zeros(width, device=dev)
        self.uses = Uses(False, False, False)
        self._per_row = [(-1, *[1] * (p.dim() - 1)) for p in self.params]   # a (rows,) vector against each
        if self.grouped is not None:
            self._grad = self.grouped
        else:
            from torch.func import grad, vmap
            self._grad = vmap(grad(loss_fn()))
        self._graphs: dict[tuple[int, Uses], torch.cuda.CUDAGraph] = {}
        self._pool = None

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """(C, P) flat rows as the stack's per-parameter (C, ...) views."""
        sizes = [p[0].numel() for p in self.params]
        return [v.reshape(len(flat), *p.shape[1:]) for v, p in zip(flat.split(sizes, dim=1), self.params)]

    @staticmethod
    def flat(tensors: list[torch.Tensor], rows: int) -> torch.Tensor:
        """The first ``rows`` rows of per-parameter stacks as (rows, P) flat vectors."""
        return torch.cat([t[:rows].reshape(rows, -1) for t in tensors], dim=1)

    def load(self, starts: torch.Tensor, terms: Terms, momentum: torch.Tensor | None) -> None:
        """A call's clients into the first rows: their start models (C, P), terms (in the rows'
        order) and momentum buffers (C, P; None: zeros). A row without momentum (β = 0) starts
        from a zero buffer, so β·buf adds exactly nothing; the rows past the call are zeroed."""
        C, dev = len(starts), self.lr.device
        for p, s in zip(self.params, self._split(starts)):
            p[:C].copy_(s)
        for row, values in ((self.lr, terms.lr), (self.mu, terms.mu), (self.beta, terms.beta)):
            row.zero_()
            row[:C].copy_(torch.as_tensor(values, dtype=row.dtype, device=dev))
        self.uses = Uses(any(terms.mu), terms.correction is not None, any(terms.beta) and not self.adam, self.adam)
        zeros = lambda: [torch.zeros_like(p) for p in self.params]   # noqa: E731
        if self.uses.prox:
            self.anchor = self.anchor or zeros()
            for a, p in zip(self.anchor, self.params):
                a.copy_(p)
        if self.uses.corrected:
            self.corr = self.corr or zeros()
            for c, s in zip(self.corr, self._split(terms.correction.to(dev))):
                c.zero_()
                c[:C].copy_(s)
        if self.uses.adam:   # a row's state: its two moments and its step count (zeros: a fresh Adam)
            self.moments = self.moments or (zeros(), zeros())
            for t in (*self.moments[0], *self.moments[1], self.count):
                t.zero_()
            if momentum is not None:
                P = momentum.shape[1] // 2
                momentum = momentum.to(dev)
                for dst, src in ((self.moments[0], momentum[:, :P]), (self.moments[1], momentum[:, P:2 * P])):
                    for t, v in zip(dst, self._split(src)):
                        t[:C].copy_(v)
                self.count[:C].copy_(momentum[:, 2 * P])
        if self.uses.heavy:
            self.bufs = self.bufs or zeros()
            for b in self.bufs:
                b.zero_()
            if momentum is not None:
                heavy = (self.beta[:C] != 0).unsqueeze(1)
                for b, s in zip(self.bufs, self._split(torch.where(heavy, momentum.to(dev), 0.0))):
                    b[:C].copy_(s)

    def _step(self, rows: int, uses: Uses) -> None:
        """One step of the stack's first ``rows`` clients; the rest wait unchanged."""
        e, n = self.engine, rows
        params, batch, m = [p[:n] for p in self.params], self.batch[:n], self.mask[:n]
        with autocast(e.device, e.precision):
            grads = self._grad(params, e.x[batch], e.y[batch], m)
        active = m.sum(1) > 0                                # clients with a real step here
        shapes = self._per_row
        # torch's multi-tensor (_foreach) ops: one call per term for all parameters, the same
        # elementwise arithmetic as a loop over them (bitwise), 5-16 % less time a call on the CPU
        with torch.no_grad():
            g = list(grads)
            if e.weight_decay:
                g = torch._foreach_add(g, params, alpha=e.weight_decay)
            if uses.prox:
                d = torch._foreach_sub(params, [a[:n] for a in self.anchor])
                torch._foreach_mul_(d, [self.mu[:n].view(s) for s in shapes])
                g = torch._foreach_add(g, d)
            if uses.corrected:
                g = torch._foreach_add(g, [c[:n] for c in self.corr])
            if uses.adam:
                self._adam(params, g, active, n)
                return
            if uses.heavy:
                bufs = [b[:n] for b in self.bufs]
                new = torch._foreach_mul(bufs, [self.beta[:n].view(s) for s in shapes])
                torch._foreach_add_(new, g)
                for buf, fresh, s in zip(bufs, new, shapes):   # a row without a batch keeps its buffer
                    buf.copy_(torch.where(active.view(s), fresh, buf))
                g = bufs
            # a row without a batch moves by g·0 = 0 (its gradient is 0, its buffer finite)
            rate = torch.where(active, self.lr[:n], 0.0)
            torch._foreach_sub_(params, torch._foreach_mul(g, [rate.view(s) for s in shapes]))

    def _adam(self, params, g, active: torch.Tensor, n: int) -> None:
        """Adam's update of the first ``n`` rows, each with its own step count (torch.optim.Adam's
        arithmetic, its bias corrections per row); a row without a batch keeps its model and state."""
        (b1, b2), shapes = ADAM_BETAS, self._per_row
        count = self.count[:n] + active.to(self.count.dtype)
        self.count[:n].copy_(count)
        steps = count.double()   # bias corrections in double, as torch's Python floats
        step_size = (self.lr[:n].double() / (1 - b1 ** steps)).to(count.dtype)
        root2 = torch.sqrt(1 - b2 ** steps).to(count.dtype)
        firsts, seconds = [m[:n] for m in self.moments[0]], [v[:n] for v in self.moments[1]]
        new1 = torch._foreach_lerp(firsts, g, 1 - b1)
        new2 = torch._foreach_mul(seconds, b2)
        torch._foreach_addcmul_(new2, g, g, value=1 - b2)
        denom = torch._foreach_sqrt(new2)
        torch._foreach_div_(denom, [root2.view(s) for s in shapes])
        torch._foreach_add_(denom, ADAM_EPS)
        moved = torch._foreach_div(torch._foreach_mul(new1, [step_size.view(s) for s in shapes]), denom)
        for p, m1, m2, f1, f2, d, s in zip(params, firsts, seconds, new1, new2, moved, shapes):
            on = active.view(s)   # a row past its last step: 1 − β^0 = 0 divides; where() keeps it as it was
            m1.copy_(torch.where(on, f1, m1))
            m2.copy_(torch.where(on, f2, m2))
            p.copy_(torch.where(on, p - d, p))

    def adam_state(self, rows: int) -> torch.Tensor:
        """The first ``rows`` rows' Adam state as (rows, 2P + 1): both moments and the step count."""
        return torch.cat([self.flat(self.moments[0], rows), self.flat(self.moments[1], rows),
                          self.count[:rows].unsqueeze(1)], dim=1)

    def rows(self, live: int) -> int:
        """How many of the stack's first rows a step computes to serve ``live`` clients."""
        if self.buckets:
            return bucket(live, self.width)
        return self.grouped.rows(live) if self.grouped is not None else max(live, 2)

    def step(self, rows: int) -> None:
        """One step of the first ``rows`` rows (the caller orders the clients with steps left first)."""
        if not self.graphs:
            self._step(rows, self.uses)
            return
        key = (rows, self.uses)
        if key not in self._graphs:
            self._graphs[key] = self._capture(rows, self.uses)
        self._graphs[key].replay()

    def _capture(self, rows: int, uses: Uses):
        """The step of ``rows`` rows as a CUDA graph. Warm-up steps run first (as CUDA graphs
        require) and are undone, so every step of every call is the graph's: a resumed run
        computes as the uninterrupted one did. The buckets' graphs share one memory pool: they
        replay one after another on one stream, and every tensor a step leaves behind lives in
        the stack's own tensors, outside the pool."""
        kept = self.params + (self.bufs or []) + ([*self.moments[0], *self.moments[1], self.count] if self.moments else [])
        state = [t.clone() for t in kept]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(rows, uses)
        torch.cuda.current_stream().wait_stream(side)
        for t, saved in zip(kept, state):
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
                self._step(rows, uses)
            self._pool = self._pool or graph.pool()
        finally:
            if collecting:
                gc.enable()
        return graph
