"""The record every dataset loader returns (a shipped one or a plug-in's)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    # multi-domain datasets: each sample's domain (an index into ``domains``), for client types
    # that draw from one domain only (``[data] types``' ``domain``)
    domain_train: np.ndarray | None = None
    domain_test: np.ndarray | None = None
    domains: tuple[str, ...] = ()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])
