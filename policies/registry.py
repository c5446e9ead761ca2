"""Name -> class registries, so ``policy = "covg"`` in a config finds the class."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from emulator.errors import InputError

T = TypeVar("T")


class Registry(dict):
    """Maps a policy name to a dataclass; ``make`` validates the parameters from a config."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str):
        def deco(cls: type[T]) -> type[T]:
            cls.name = name
            self[name] = cls
            return cls
        return deco

    def make(self, name: str, params: dict[str, Any] | None = None, where: str = "") -> Any:
        where = where or self.kind
        if name not in self:
            raise InputError(f"{where}.policy: unknown {self.kind} policy {name!r}; choose one of {sorted(self)}")
        cls = self[name]
        params = dict(params or {})
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        for key in params:
            if key not in fields:
                raise InputError(f"{where}.{key}: not a parameter of {self.kind} policy {name!r}; "
                                 f"its parameters are {sorted(fields) or 'none'}")
        try:
            return cls(**params)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from None
