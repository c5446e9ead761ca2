"""Real torch training behind a small engine interface.

The SimPy processes model *time*; an engine does the *compute*: it takes a start model (a flat
parameter vector) and a set of clients and returns each client's model after E local epochs of
SGD (Alg. 1, Lines 10-13). One call trains a whole group, so a batched or GPU engine can replace
:class:`TorchEngine` without touching the processes.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector

from topologies import Dataset


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    c, h, w = input_shape
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(), nn.Linear(64, num_classes))
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), 64), nn.ReLU(), nn.Linear(64, num_classes))
    raise ValueError(f"unknown model {name!r}")


@torch.no_grad()
def load_flat(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a flat vector into parameters (``vector_to_parameters`` would alias it, and SGD's
    in-place steps would then overwrite the caller's start model)."""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


class TrainingEngine(Protocol):
    n_params: int

    def initial_weights(self, seed: int) -> torch.Tensor: ...

    def train(self, start: torch.Tensor, clients: Sequence[int], epochs: int,
              seeds: Sequence[int]) -> torch.Tensor:
        """Each client's flat weights after ``epochs`` local epochs from ``start``: (len(clients), P)."""

    def evaluate(self, weights: torch.Tensor) -> tuple[float, float]:
        """(accuracy, mean cross-entropy loss) on the held-out test set."""


class TorchEngine:
    """Plain per-client minibatch SGD on the CPU (or ``device``), one client after another."""

    def __init__(self, dataset: Dataset, client_samples: Sequence[np.ndarray], model: str,
                 lr: float, batch_size: int, device: str = "cpu"):
        self.device = torch.device(device)
        self.model = build_model(model, dataset.input_shape, dataset.num_classes).to(self.device)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        self.lr, self.batch_size = lr, batch_size
        self.x = torch.from_numpy(dataset.x_train).to(self.device)
        self.y = torch.from_numpy(dataset.y_train).to(self.device)
        self.x_test = torch.from_numpy(dataset.x_test).to(self.device)
        self.y_test = torch.from_numpy(dataset.y_test).to(self.device)
        self.client_samples = [torch.as_tensor(s, dtype=torch.long, device=self.device) for s in client_samples]
        self.loss = nn.CrossEntropyLoss()

    @property
    def model_bytes(self) -> int:
        return 4 * self.n_params  # float32 parameters on the wire

    def initial_weights(self, seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        for layer in self.model.modules():
            if hasattr(layer, "reset_parameters"):
                layer.reset_parameters()
        return parameters_to_vector(self.model.parameters()).detach().clone()

    def train(self, start, clients, epochs, seeds):
        out = torch.empty(len(clients), self.n_params, device=self.device)
        params = list(self.model.parameters())
        opt = torch.optim.SGD(params, lr=self.lr)
        self.model.train()
        for row, (client, seed) in enumerate(zip(clients, seeds)):
            load_flat(params, start)
            idx = self.client_samples[client]
            gen = torch.Generator().manual_seed(int(seed))
            for _ in range(epochs):
                order = idx[torch.randperm(len(idx), generator=gen).to(self.device)]
                for b in range(0, len(order), self.batch_size):
                    batch = order[b:b + self.batch_size]
                    opt.zero_grad(set_to_none=True)
                    self.loss(self.model(self.x[batch]), self.y[batch]).backward()
                    opt.step()
            out[row] = parameters_to_vector(params).detach()
        return out

    @torch.no_grad()
    def evaluate(self, weights):
        load_flat(list(self.model.parameters()), weights)
        self.model.eval()
        correct, total_loss = 0, 0.0
        for b in range(0, len(self.y_test), 2048):
            logits = self.model(self.x_test[b:b + 2048])
            y = self.y_test[b:b + 2048]
            total_loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
        n = len(self.y_test)
        return correct / n, total_loss / n


class FusedEngine(TorchEngine):
    """Trains all clients of a call at once, as C copies of the model fused into one network.

    Convolutions become one grouped convolution (``groups=C``) and linear layers one batched
    matmul, so a step costs one kernel per layer instead of C. Each client keeps its own batches
    (padded and masked where clients hold fewer samples) and its own mean loss, so the result is
    the sequential engine's up to float rounding. Supports ``nn.Sequential`` models of Conv2d,
    Linear, ReLU, MaxPool2d and Flatten (every model of :func:`build_model`). Fastest for small
    models and on a GPU; on a CPU, large convolutions run faster in :class:`TorchEngine`.
    """

    def train(self, start, clients, epochs, seeds):
        C, B = len(clients), self.batch_size
        params, offset = [], 0
        for p in self.model.parameters():
            chunk = start[offset:offset + p.numel()].view(1, *p.shape)
            params.append(chunk.repeat(C, *[1] * p.dim()).requires_grad_())
            offset += p.numel()
        idx = [self.client_samples[c] for c in clients]
        steps = max((len(i) + B - 1) // B for i in idx)
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        for _ in range(epochs):
            order = torch.zeros(C, steps * B, dtype=torch.long, device=self.device)
            mask = torch.zeros(C, steps * B, device=self.device)
            for r, (i, g) in enumerate(zip(idx, gens)):
                order[r, :len(i)] = i[torch.randperm(len(i), generator=g).to(self.device)]
                mask[r, :len(i)] = 1.0
            for b in range(steps):
                cols = slice(b * B, (b + 1) * B)
                m = mask[:, cols]
                live = m.sum(0) > 0                 # drop columns that pad every client
                batch, m = order[:, cols][:, live], m[:, live]
                logits = self._forward(params, self.x[batch])
                ce = F.cross_entropy(logits.flatten(0, 1), self.y[batch].flatten(), reduction="none").view_as(m)
                loss = ((ce * m).sum(1) / m.sum(1).clamp(min=1.0)).sum()   # Σ_c of each client's mean loss
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g in zip(params, grads):
                        p.sub_(g, alpha=self.lr)
        return torch.cat([p.detach().flatten(1) for p in params], dim=1)

    def _forward(self, params, x):
        C, n = x.shape[:2]
        h, fused, it = x, False, iter(params)    # fused: (n, C·channels, H, W); else (C, n, ...)
        for layer in self.model:
            if isinstance(layer, nn.Conv2d):
                if not fused:
                    h, fused = h.transpose(0, 1).reshape(n, C * h.shape[2], *h.shape[3:]), True
                w, bias = next(it), next(it)
                h = F.conv2d(h, w.reshape(-1, *w.shape[2:]), bias.reshape(-1), layer.stride, layer.padding,
                             layer.dilation, groups=C)
            elif isinstance(layer, nn.ReLU):
                h = F.relu(h)
            elif isinstance(layer, nn.MaxPool2d):
                h = F.max_pool2d(h, layer.kernel_size, layer.stride, layer.padding)
            elif isinstance(layer, nn.Flatten):
                h, fused = (h.reshape(n, C, -1).transpose(0, 1) if fused else h.reshape(C, n, -1)), False
            elif isinstance(layer, nn.Linear):
                w, bias = next(it), next(it)
                h = torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2))
            else:
                raise TypeError(f"FusedEngine cannot fuse {type(layer).__name__}; use engine = \"sequential\"")
        return h


ENGINES = {"sequential": TorchEngine, "fused": FusedEngine}
