"""The clients' local optimisers: their names, Adam's constants and the size of a client's state."""
from __future__ import annotations

OPTIMIZERS = ("sgd", "adam")
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8   # torch.optim.Adam's defaults (the Group-FEL authors keep them)


def state_width(optimizer: str, momentum: float, n_params: int) -> int:
    """Numbers in one client's optimiser state: Adam's two moments and its step count (2P + 1),
    SGD's momentum buffer (P), or none (plain SGD)."""
    if optimizer == "adam":
        return 2 * n_params + 1
    return n_params if momentum else 0
