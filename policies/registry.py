"""Name -> class registries, so ``policy = "covg"`` in a config finds the class, and
``policy = "mypkg.mod:MyPolicy"`` (or an installed entry point's short name) finds a plug-in."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from groupfel.errors import InputError

from . import plugins

T = TypeVar("T")


class Registry(dict):
    """Maps a policy name to a dataclass; ``make`` validates the parameters from a config.

    Names not registered here resolve as plug-ins (:mod:`groupfel.policies.plugins`): an entry point of
    the kind's group, or ``module:attr``, checked against the kind's contract (``contract``:
    base class, method name, its parameters after self)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.noun = f"{kind} policy"   # what an error calls one of these
        self.contract: tuple[type, str, tuple[str, ...]] | None = None

    def register(self, name: str):
        def deco(cls: type[T]) -> type[T]:
            cls.name = name
            self[name] = cls
            return cls
        return deco

    def names(self) -> list[str]:
        """Shipped names, then installed plug-ins' short names (read from metadata, not imported)."""
        return sorted(self) + [n for n in plugins.installed(self.kind) if n not in self]

    def resolve(self, name: str, where: str = "") -> type:
        """The class ``name`` stands for; ``where`` is the config field that named it."""
        where = where or self.kind
        if name in self:
            return self[name]
        cls = None
        if isinstance(name, str) and self.contract is not None:
            cls = plugins.load(self.kind, name, where, plugins.check_class(*self.contract))
        if cls is None:
            raise InputError(f"{where}: unknown {self.noun} {name!r}; choose one of {self.names()} "
                             f"or give an import path \"module:Class\"")
        if cls.__dict__.get("name") is None:   # a plug-in is known by the name the config gave it
            cls.name = name
        if "description" in getattr(self.contract[0], "__annotations__", {}) and not hasattr(cls, "description"):
            cls.description = name   # what the manifest says of an aggregation rule, unless it says more
        return cls

    def make(self, name: str, params: dict[str, Any] | None = None, where: str = "") -> Any:
        where = where or self.kind
        return self.build(self.resolve(name, f"{where}.policy"), name, params, where)

    def build(self, cls: type, name: str, params: dict[str, Any] | None, where: str) -> Any:
        """``cls(**params)``, each key checked against its fields; errors name ``where.key``."""
        params = dict(params or {})
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        for key in params:
            if key not in fields:
                raise InputError(f"{where}.{key}: not a parameter of {self.noun} {name!r}; "
                                 f"its parameters are {sorted(fields) or 'none'}")
        _check_numbers(cls, params, where)
        try:
            return cls(**params)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from None


# A parameter's bound, whatever the policy or algorithm: a step count, cluster count or weight
# beyond it stops meaning anything (a run of 10^12 fine-tuning steps never ends, a weight of 1e308
# overflows the model) long before it stops being a number. A policy checks its own narrower bounds.
MAX_PARAM = 10**6


def _check_numbers(cls: type, params: dict[str, Any], where: str) -> None:
    """Each numeric parameter (a field typed int or float) given as a finite number within
    ±:data:`MAX_PARAM`: not text ('10'), not a boolean, not inf/NaN, with one line naming it."""
    import math

    types = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.init}
    for key, value in params.items():
        kind = types.get(key, "")
        numeric = ("int" in kind or "float" in kind) and not any(w in kind for w in ("str", "Any", "Literal"))
        if not numeric or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{where}.{key}: {value!r} is not a number; write the number without quotes")
        if not math.isfinite(value) or abs(value) > MAX_PARAM:
            raise InputError(f"{where}.{key}: {value!r} is out of range; give a finite number within ±{MAX_PARAM:,} "
                             f"(see the config guide's Limits)")
