"""Models by name (``train.model``): the networks the papers train, for (C, H, W) inputs.

Normalisation: the ResNets use GroupNorm, not BatchNorm. BatchNorm's running statistics are not
parameters, so federated averaging either leaves them out (each client then evaluates with stats
of data it never saw) or averages statistics of different distributions; under the label skew the
papers study this costs accuracy (Hsieh et al., ICML 2020, "The Non-IID Data Quagmire", recover it
with GroupNorm). GroupNorm normalises each sample on its own, so it works with the tiny local
batches of the papers (B = 10), keeps the whole model state in the flat parameter vector that is
sent and aggregated, and can be stacked over clients by the batched engine.

``digit-bn-cnn`` and ``audio-m5`` are the exceptions, for the reproductions: FedBN's Digit model,
which the HCCT authors train, and the Group-FEL authors' Speech Commands model, each with its
BatchNorm. Their running statistics and batch counters are registered as
parameters that take no gradient (:func:`state_as_parameters`), so they travel in the flat vector
as the authors' state dict does: a group's model averages them (FedAvg of the state dict), and a
client's update (start − trained) holds their change, the authors' "gradient". The engines step
only the parameters that take a gradient; ``trainable_mask`` says which entries those are.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from groupfel.errors import InputError
from groupfel.policies.grouping import Layer

ModelBuilder = Callable[[tuple[int, ...], int], nn.Module]


def _mlp(shape, classes):
    c, h, w = shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(), nn.Linear(64, classes))


def _mlp3(shape, classes):
    """FedCollab's 3-layer MLP (hidden sizes 200-200, McMahan et al.'s 2NN)."""
    c, h, w = shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                         nn.Linear(200, classes))


def _linear(shape, classes):
    """Softmax regression: a convex problem with a unique optimum (toy checks of the algorithms)."""
    c, h, w = shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, classes))


def _cnn(shape, classes):
    c, h, w = shape
    # max-pool before ReLU: the same function and the same gradients, bit for bit (ReLU is
    # monotone, so it commutes with max; where a window's max is <= 0 both orders pass no gradient),
    # with a quarter of the ReLU work: 12 % faster a step on the CPU (issue 9)
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * (h // 4) * (w // 4), 64), nn.ReLU(), nn.Linear(64, classes))


def _audio_cnn(shape, classes):
    """5 layers for log-mel spectrograms (FSDD, Speech Commands): 4 conv blocks + a linear head."""
    c = shape[0]
    layers: list[nn.Module] = []
    for cin, cout in ((c, 16), (16, 32), (32, 64), (64, 64)):   # pool before ReLU: see _cnn
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.MaxPool2d(2, ceil_mode=True), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


def state_as_parameters(model: nn.Module) -> nn.Module:
    """Every BatchNorm's running statistics and batch counter as parameters without a gradient
    (float, so they fit the float32 flat vector: a counter is exact below 2^24 batches). BatchNorm
    updates them in place in training mode as it does its buffers; ``state_dict`` keeps their names."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                value = getattr(m, name).detach().float().clone()
                delattr(m, name)
                m.register_parameter(name, nn.Parameter(value, requires_grad=False))
    return model


class _BatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that normalises a training batch of one sample with its running statistics
    (and leaves them), where torch's raises: a client's last minibatch can hold one sample."""

    def forward(self, x):
        if self.training and x.shape[0] == 1:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                            False, 0.0, self.eps)
        return super().forward(x)


def _digit_bn_cnn(shape, classes):
    """FedBN's Digit model (Li et al. 2021, the HCCT authors' Digit model): conv 64-64-128 (5×5,
    padding 2), each + BatchNorm and ReLU, 2×2 max-pools after the first two; linear 2048-512,
    each + BatchNorm and ReLU; a linear head. On 28×28 inputs the first linear layer takes 6,272
    features, as theirs; on other sides 128·(side/4)²."""
    c, h, w = shape
    return state_as_parameters(nn.Sequential(
        nn.Conv2d(c, 64, 5, padding=2), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5, padding=2), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 5, padding=2), nn.BatchNorm2d(128), nn.ReLU(), nn.Flatten(),
        nn.Linear(128 * (h // 4) * (w // 4), 2048), _BatchNorm1d(2048), nn.ReLU(),
        nn.Linear(2048, 512), _BatchNorm1d(512), nn.ReLU(), nn.Linear(512, classes)))


def _audio_m5(shape, classes):
    """The Group-FEL authors' Speech Commands model (Jiyao17/fl-grouping utils/model.py,
    ``SpeechCommand``: torchaudio's M5, Dai et al. 2017, at 32 channels) on a raw waveform of 1×1×L
    (``data.audio = "waveform"``, L = 8,000 at 8 kHz): Conv1d(1, 32, 80, stride 16), then Conv1d of
    kernel 3 to 32, 64 and 64 channels, each followed by BatchNorm, ReLU and a max-pool of 4; a
    global average pool and a linear head (their log-softmax and NLL loss are cross-entropy)."""
    c, h, w = shape
    if h != 1:
        raise InputError(f"train.model: audio-m5 reads raw waveforms (1×1×L inputs), not {c}×{h}×{w}; "
                         f"set data.audio = \"waveform\"")
    layers: list[nn.Module] = [nn.Flatten(1, 2)]
    for cin, cout, kernel, stride in ((c, 32, 80, 16), (32, 32, 3, 1), (32, 64, 3, 1), (64, 64, 3, 1)):
        layers += [nn.Conv1d(cin, cout, kernel, stride), nn.BatchNorm1d(cout), nn.ReLU(), nn.MaxPool1d(4)]
    return state_as_parameters(nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, classes)))


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(2, channels)   # 2 groups, as Hsieh et al. 2020 (see the module docstring)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = _norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = _norm(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else \
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cout))

    def forward(self, x):
        out = nn.functional.relu(self.n1(self.conv1(x)))
        return nn.functional.relu(self.n2(self.conv2(out)) + self.short(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet (He et al. 2016, Sec. 4.2): a 3×3 stem, three stages of ``blocks`` basic
    blocks with ``widths`` channels (stride 2 between stages), global average pooling, one linear."""

    def __init__(self, in_channels: int, classes: int, blocks: int, widths: tuple[int, int, int]):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), _norm(widths[0]), nn.ReLU())
        stages, cin = [], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                stages.append(BasicBlock(cin, w, 2 if i > 0 and b == 0 else 1))
                cin = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


MODELS: dict[str, ModelBuilder] = {
    "mlp": _mlp,
    "mlp3": _mlp3,
    "linear": _linear,
    "cnn": _cnn,
    "audio-cnn": _audio_cnn,
    "digit-bn-cnn": _digit_bn_cnn,
    "audio-m5": _audio_m5,
    # the Group-FEL authors' light and heavy tasks: 1 block per stage at 8/16/32 channels, 3 at 16/32/64
    "resnet-1": lambda shape, classes: ResNet(shape[0], classes, 1, (8, 16, 32)),
    "resnet-3": lambda shape, classes: ResNet(shape[0], classes, 3, (16, 32, 64)),
}


def model_builder(name: str, where: str = "train.model") -> ModelBuilder:
    """The builder ``name`` stands for: a shipped model, an installed ``groupfel.models`` entry
    point, or ``module:attr``, a callable ``(input_shape, num_classes) -> torch.nn.Module``."""
    if name in MODELS:
        return MODELS[name]
    from groupfel.policies import plugins

    builder = plugins.load("model", name, where, plugins.check_callable(("input_shape", "num_classes")))
    if builder is None:
        raise InputError(f"{where}: unknown model {name!r}; choose one of {sorted(MODELS) + plugins.installed('model')} "
                         f"or give an import path \"module:function\"")
    return builder


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    model = model_builder(name)(tuple(input_shape), num_classes)
    if not isinstance(model, nn.Module):
        raise InputError(f"train.model: {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


def model_layers(engine) -> tuple[Layer, ...] | None:
    """Each module that holds parameters, in the flat weight vector's order: its name (module path
    and class), each parameter's range, and whether it normalises; None without a model."""
    model = getattr(engine, "model", None)
    if model is None:
        return None
    parts: dict[str, list[slice]] = {}
    offset = 0
    for name, p in model.named_parameters():
        parts.setdefault(name.rsplit(".", 1)[0], []).append(slice(offset, offset + p.numel()))
        offset += p.numel()
    out = []
    for path, spans in parts.items():
        module = model.get_submodule(path)
        out.append(Layer(f"{path} ({type(module).__name__})", tuple(spans), isinstance(module, _NORMS)))
    return tuple(out)


def layer_slices(engine) -> tuple[slice, ...] | None:
    """Parameter ranges of each layer (weight and bias of one module) in the flat weight vector."""
    layers = model_layers(engine)
    return None if layers is None else tuple(layer.columns for layer in layers)


def trainable_mask(engine) -> np.ndarray | None:
    """Which entries of the flat weight vector take a gradient (False: BatchNorm statistics held
    as parameters, :func:`state_as_parameters`); None where all do, or without a model."""
    model = getattr(engine, "model", None)
    if model is None or all(p.requires_grad for p in model.parameters()):
        return None
    return np.concatenate([np.full(p.numel(), p.requires_grad) for p in model.parameters()])
