"""The `[faults]` section: client dropouts and stragglers."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import _Strict


class StragglerConfig(_Strict):
    """Compute slowdown factor (≥ 1) of a client in one group round: ``lognormal`` draws
    max(1, exp(N(0, sigma²))) (half the clients at nominal speed, the rest slower); ``pareto``
    draws 1 + Lomax(shape) (a heavy tail: a few clients very slow)."""

    distribution: Literal["lognormal", "pareto"] = Field("lognormal", description="The slowdown's "
                                                         "distribution.")
    sigma: float = Field(0.5, gt=0, le=3, description="lognormal: σ of the underlying normal.")
    shape: float = Field(3.0, ge=0.1, le=1e6, description="pareto: the Lomax shape (smaller: heavier tail).")


class FaultsConfig(_Strict):
    dropout: float = Field(0.0, ge=0, le=1, description="Probability that a client drops in a group round: "
                           "it pays its training, not the group operations, and its update is excluded.")
    straggler: StragglerConfig | None = Field(None, description="Compute slowdowns (simulated time only); "
                                              "unset: none.")
    recovery_multiple: float = Field(1.0, ge=0, le=1e3, description="Recovery cost per dropped member when a profile "
                                     "has no `<op>-recovery` curve: recovery_multiple × O_op(|g|) / "
                                     "|g| per survivor (groupfel.cost_models.model.CostModel.recovery).")
