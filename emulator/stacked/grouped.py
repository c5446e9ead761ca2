"""Every shipped model written out as one stacked step (the loss gradients of W clients' copies).

The layout never changes between layers: images are batch-major and channel-stacked, (B, W × C,
H, W') with client k's channels at k·C … (k+1)·C − 1, in channels-last memory; after ``Flatten``
each client's features are (W, B, F). Over that layout

* a convolution of W clients is one grouped convolution (a group per client);
* GroupNorm(G, C) of W clients is GroupNorm(W·G, W·C): each sample's groups are W·G runs of C/G
  stacked channels, the same statistics per client;
* a residual add, ReLU and pooling are elementwise or per channel: one kernel over all clients;
* a linear layer is one batched matmul (``baddbmm``) over the clients.

``vmap`` instead moves the client axis around every layer (a copy each) and decomposes
GroupNorm's backward into elementwise passes: the written-out ResNet step measured 2-3x faster a
client-step than ``vmap`` on this project's CPU (benchmarks/campaign.py --steps).

Each client is computed alone in every kernel, so its gradients do not depend on its partners,
bit for bit on the CPU (tests/test_stacking.py), except that oneDNN takes another convolution
kernel for exactly 3 input channels: :meth:`GroupedNet.rows` never stacks to that.

On a CPU a wide stack steps in chunks of clients (:meth:`GroupedNet.chunks`) whose largest layer
output fits about 1.5 MiB: a whole stack's layers spill out of the core's caches, and resnet-1 at
W = 64 (B = 5) measured 25-30 % less time a client-step in chunks of 8-12 clients than in one.
A chunk is itself a stack of at least 4 clients, so the chunking changes no client's numbers.

A model is written out when it is built only of the modules below (``nn.Sequential`` of them,
and :mod:`groupfel.emulator.models`' ResNet and BasicBlock, whose ``forward`` is known); any
other module (a user's plug-in model) returns None from :meth:`GroupedNet.of`, and the engine
steps it through ``vmap``.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..models import BasicBlock, ResNet

# an op maps the layout ``h`` to the next one; it reads its parameters from ``p`` (the call's
# per-parameter stacks, in ``model.parameters()`` order) and the stack's width ``n`` and batch ``b``
Op = Callable[[torch.Tensor, Sequence[torch.Tensor], int, int], torch.Tensor]


class _Unsupported(Exception):
    """The model (or one of its modules) has no written-out form."""


class _Compiler:
    """Turns a model into one op over the stacked layout, checking every module on the way."""

    def __init__(self, model: nn.Module):
        self.index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        self.used: set[int] = set()
        self.seen: set[int] = set()
        self.flat = False
        self.spatial = False          # an image layer came before (the input is an image)
        self.conv_channels: set[int] = set()   # each convolution's input channels per client
        self.conv_weights: set[int] = set()    # the parameters that are convolution weights
        self.owned = False            # the layout is a tensor of the net's own (a layer's output)

    def param(self, prefix: str, name: str) -> int | None:
        i = self.index.get(f"{prefix}{name}")
        if i is not None:
            if i in self.used:   # a parameter shared by two layers: not a plain stack of them
                raise _Unsupported
            self.used.add(i)
        return i

    def compile(self, module: nn.Module, prefix: str = "") -> Op:
        if id(module) in self.seen:   # a module used twice shares its parameters
            raise _Unsupported
        self.seen.add(id(module))
        kind = type(module)
        op = self._compile(module, kind, prefix)
        if kind in (nn.ReLU, BasicBlock):   # ends in a ReLU, whose backward reads its output
            self.owned = False
        elif kind not in (nn.Sequential, nn.Identity, nn.Flatten, ResNet):   # a fresh output
            self.owned = True
        return op

    def _compile(self, module: nn.Module, kind: type, prefix: str) -> Op:
        if kind is nn.Sequential:
            # _modules, not named_children(): that skips a module's second use (shared parameters)
            ops = [self.compile(m, f"{prefix}{name}.") for name, m in module._modules.items()]
            return _chain(ops)
        if kind is ResNet:
            return _chain([self.compile(getattr(module, name), f"{prefix}{name}.") for name in ("stem", "stages", "head")])
        if kind is BasicBlock:
            return self._block(module, prefix)
        if kind is nn.Conv2d:
            return self._conv(module, prefix)
        if kind is nn.GroupNorm:
            return self._group_norm(module, prefix)
        if kind is nn.Linear:
            if not self.flat:
                raise _Unsupported
            w, bias = self.param(prefix, "weight"), self.param(prefix, "bias")
            if bias is None:
                return lambda h, p, n, b: torch.bmm(h, p[w].transpose(1, 2))
            return lambda h, p, n, b: torch.baddbmm(p[bias].unsqueeze(1), h, p[w].transpose(1, 2))
        if kind is nn.ReLU:
            # in place where the layout is a layer's own output (never the caller's input): no
            # new tensor, and ReLU's backward reads its output, which stays as saved
            if self.owned:
                return lambda h, p, n, b: h.relu_()
            return lambda h, p, n, b: h.relu()
        if kind is nn.Identity:
            return lambda h, p, n, b: h
        if kind is nn.Flatten:
            if self.flat or (module.start_dim, module.end_dim) != (1, -1):
                raise _Unsupported
            self.flat = True
            if self.spatial:   # each client's (C, H, W) flattened as nn.Flatten does
                return lambda h, p, n, b: h.reshape(b, n, -1).transpose(0, 1)
            return lambda h, p, n, b: h.reshape(n, b, -1)
        if kind is nn.MaxPool2d:
            if self.flat or module.return_indices:
                raise _Unsupported
            self.spatial = True
            m = module
            return lambda h, p, n, b: F.max_pool2d(h, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
        if kind is nn.AdaptiveAvgPool2d:
            if self.flat or module.output_size not in (1, (1, 1)):
                raise _Unsupported
            self.spatial = True
            return lambda h, p, n, b: F.adaptive_avg_pool2d(h, 1)
        raise _Unsupported

    def _conv(self, conv: nn.Conv2d, prefix: str) -> Op:
        if self.flat or conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise _Unsupported
        self.conv_channels.add(conv.in_channels)
        self.spatial = True
        w, bias = self.param(prefix, "weight"), self.param(prefix, "bias")
        self.conv_weights.add(w)
        stride, padding, dilation = conv.stride, conv.padding, conv.dilation

        def op(h, p, n, b):
            weight = p[w]
            return F.conv2d(h, weight.reshape(-1, *weight.shape[2:]), None if bias is None else p[bias].reshape(-1),
                            stride, padding, dilation, n)
        return op

    def _group_norm(self, norm: nn.GroupNorm, prefix: str) -> Op:
        if self.flat:
            raise _Unsupported
        self.spatial = True
        w, bias = self.param(prefix, "weight"), self.param(prefix, "bias")
        groups, eps = norm.num_groups, norm.eps

        def op(h, p, n, b):
            return F.group_norm(h, n * groups, None if w is None else p[w].reshape(-1),
                                None if bias is None else p[bias].reshape(-1), eps)
        return op

    def _block(self, block: BasicBlock, prefix: str) -> Op:
        conv1, n1 = self.compile(block.conv1, f"{prefix}conv1."), self.compile(block.n1, f"{prefix}n1.")
        conv2, n2 = self.compile(block.conv2, f"{prefix}conv2."), self.compile(block.n2, f"{prefix}n2.")
        short = self.compile(block.short, f"{prefix}short.")

        def op(h, p, n, b):
            # in place on the norms' fresh outputs (GroupNorm's backward reads its input, not its
            # output): the same values and gradients, bit for bit, with two tensors fewer
            out = n1(conv1(h, p, n, b), p, n, b).relu_()
            return n2(conv2(out, p, n, b), p, n, b).add_(short(h, p, n, b)).relu_()
        return op


def _chain(ops: list[Op]) -> Op:
    def op(h, p, n, b):
        for f in ops:
            h = f(h, p, n, b)
        return h
    return op


class GroupedNet:
    """The loss gradients of a stack of clients' copies of a model, written out over the
    channel-stacked layout (the module docstring); the same as ``vmap(grad(loss))``."""

    # a CPU step's chunk of clients: its largest layer output at most about this many bytes
    CHUNK_BYTES = 3 << 19

    def __init__(self, forward: Op, conv_channels: set[int], image: bool, memory_format: torch.memory_format,
                 conv_weights: set[int] = frozenset(), shapes: nn.Module | None = None):
        self.forward, self.conv_channels, self.image = forward, conv_channels, image
        self.memory_format, self.conv_weights = memory_format, conv_weights
        self._shapes = shapes              # an empty CPU copy of the model (eval mode): its layers' output sizes
        self._largest: dict[tuple[int, ...], int] = {}

    def zeros(self, width: int, index: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """A stack of ``width`` zeros for parameter ``index``. A convolution's weights (Cout, Cin,
        kh, kw) are held channels-last where the images are, so that the grouped convolution reads
        them, and its weight gradient comes back, without a copy each step (the same numbers:
        oneDNN reorders them into its own blocked format either way)."""
        if index in self.conv_weights and self.memory_format is torch.channels_last:
            cout, cin, kh, kw = shape
            return torch.zeros(width, cout, kh, kw, cin, device=device).permute(0, 1, 4, 2, 3)
        return torch.zeros(width, *shape, device=device)

    @classmethod
    def of(cls, model: nn.Module, *, channels_last: bool = True) -> GroupedNet | None:
        """The written-out form of ``model``, or None where it has a module without one.
        ``channels_last``: the images' memory layout (oneDNN's fast kernels on a CPU, and the
        only layout whose kernels measured independent of the stack's width, bit for bit)."""
        compiler = _Compiler(model)
        try:
            forward = compiler.compile(model)
        except _Unsupported:
            return None
        if len(compiler.used) != len(compiler.index) or not compiler.flat:
            return None   # a parameter no written-out layer reads, or no per-sample logits
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        # the input is an image where an image layer reads it (else the flat layout from the start)
        return cls(forward, compiler.conv_channels, compiler.spatial, fmt, frozenset(compiler.conv_weights),
                   copy.deepcopy(model).to_empty(device="cpu").eval())

    def rows(self, live: int) -> int:
        """How many of the stack's first rows a CPU step computes to serve ``live`` clients: never
        one (a stack of one takes other kernels), never 3 input channels in all (oneDNN's own)."""
        rows = max(live, 2)
        return 4 if rows == 3 and 1 in self.conv_channels else rows

    def largest(self, sample: torch.Size) -> int:
        """The most elements any layer outputs for one client's sample of shape ``sample``."""
        key = tuple(sample)
        if key not in self._largest:
            most = [0]
            def note(module, args, out):   # noqa: E306
                most[0] = max(most[0], out.numel())
            leaves = [m for m in self._shapes.modules() if not any(True for _ in m.children())]
            hooks = [m.register_forward_hook(note) for m in leaves]
            try:
                # one zero sample on the CPU (a millisecond): the meta device would import
                # torch._dynamo and sympy on the first call, about a second of every process
                with torch.no_grad():
                    self._shapes(torch.zeros(1, *key, device="cpu"))
            finally:
                for h in hooks:
                    h.remove()
            self._largest[key] = most[0]
        return self._largest[key]

    def chunks(self, n: int, b: int, sample: torch.Size, itemsize: int = 4) -> list[int]:
        """The sizes of the chunks a CPU step of ``n`` rows at batch ``b`` computes one after
        another: as even as can be, each with its largest layer output within
        :attr:`CHUNK_BYTES`, and each at least 4 clients (or the whole stack): widths whose
        kernels are those of any other stack (:meth:`rows`), so a client's numbers stay its own."""
        if self._shapes is None:
            return [n]
        fits = max(self.CHUNK_BYTES // max(self.largest(sample) * b * itemsize, 1), 4)
        k = -(-n // fits)
        if k > 1 and n // k < 4:
            k -= 1
        return [n // k + (i < n % k) for i in range(k)]

    def logits(self, params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """(W, B, classes) logits of the stack's clients on their minibatches ``x`` (W, B, ...)."""
        n, b = x.shape[:2]
        h = x.transpose(0, 1).reshape(b, n * x.shape[2], *x.shape[3:]).contiguous(
            memory_format=self.memory_format) if self.image else x
        return self.forward(h, params, n, b)

    def __call__(self, params, x, y, m):
        """Each client's gradient of its masked mean cross-entropy (as ``vmap(grad(loss))``); on a
        CPU a wide stack's in chunks of clients (:meth:`chunks`), into one gradient per parameter."""
        n, b = x.shape[:2]
        sizes = self.chunks(n, b, x.shape[2:], x.element_size()) if x.device.type == "cpu" else [n]
        if len(sizes) == 1:
            return self._grads(params, x, y, m)
        grads = [torch.empty_like(p) for p in params]
        at = 0
        for size in sizes:
            part = slice(at, at + size)
            for g, got in zip(grads, self._grads([p[part] for p in params], x[part], y[part], m[part])):
                g[part].copy_(got)
            at += size
        return grads

    def _grads(self, params, x, y, m):
        params = [p.detach().requires_grad_() for p in params]
        n, b = x.shape[:2]
        ce = F.cross_entropy(self.logits(params, x).reshape(n * b, -1), y.reshape(-1), reduction="none").view(n, b)
        loss = ((ce * m).sum(1) / m.sum(1).clamp(min=1.0)).sum()
        return torch.autograd.grad(loss, params)
