"""The engine's stacked forms: many clients' copies of one model trained as one step.

* :mod:`.grouped`: every shipped model written out over the channel-stacked layout (grouped
  convolutions, GroupNorm over the stacked channels, residual adds, batched-matmul heads), the
  step of every stack on a CPU and a GPU; ``torch.func.vmap`` only for user plug-in models.
* :mod:`.step`: a stack's fixed tensors (models, optimiser state, minibatch) and one local SGD
  step of its first rows; on a GPU one captured graph per bucket of rows (no padded work).
* :mod:`.kernels`: the step's kernel settings (cuDNN autotuning, channels-last).
"""
from .grouped import GroupedNet
from .kernels import Kernels
from .step import Stack, Terms, bucket

__all__ = ["GroupedNet", "Kernels", "Stack", "Terms", "bucket"]
