"""Plug-ins: a config names a part by its shipped name, by an installed entry point's short name,
or by an import path ``"module:attr"``.

| part          | entry-point group        | what ``module:attr`` must be                                  |
| ------------- | ------------------------ | ------------------------------------------------------------- |
| grouping      | ``groupfel.groupings``   | a dataclass subclass of :class:`groupfel.policies.GroupingPolicy`      |
| sampling      | ``groupfel.samplings``   | a dataclass subclass of :class:`groupfel.policies.SamplingPolicy`      |
| aggregation   | ``groupfel.aggregations``| a dataclass subclass of :class:`groupfel.policies.AggregationRule`     |
| model         | ``groupfel.models``      | a callable ``(input_shape, num_classes) -> torch.nn.Module``  |
| dataset       | ``groupfel.datasets``    | a callable ``(path: str | None) -> groupfel.topologies.Dataset``       |
| algorithm     | ``groupfel.algorithms``  | a dataclass subclass of :class:`groupfel.emulator.algorithms.Algorithm`|

Every failure to resolve one (module not found, attribute missing, wrong base class, wrong
signature) is an :class:`~groupfel.errors.InputError` naming the config field and the import path.
Nothing here imports a plug-in until :func:`load` is called: listing the installed plug-ins
(:func:`installed`) reads entry-point metadata only, so ``--help``, ``report``, ``plot`` and
``timeline`` never run a plug-in's code.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import marshal
import sys
from collections.abc import Callable
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from groupfel.errors import InputError

GROUPS = {"grouping": "groupfel.groupings", "sampling": "groupfel.samplings",
          "aggregation": "groupfel.aggregations", "model": "groupfel.models", "dataset": "groupfel.datasets",
          "algorithm": "groupfel.algorithms"}
IN_PROCESS = "__main__"   # a class or function defined in a notebook or script: this process only


# groupfel's top-level modules before they moved beneath ``groupfel`` (``policies.grouping`` is now
# ``groupfel.policies.grouping``); configs and run directories of that time may name them.
OLD_TOP_LEVEL = ("emulator", "policies", "topologies", "cost_models", "experiments")


def _origin(module: str) -> str | None:
    """The file ``module`` would load from, without running it (None: no such module)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def renamed(spec: str) -> str | None:
    """The current import path of a part of groupfel named by its old top-level module
    (``"policies.grouping:RandomGrouping"`` -> ``"groupfel.policies.grouping:RandomGrouping"``), or
    None if ``spec`` names something else: no such module of groupfel, or a module of that old name
    that is not groupfel's file (a user's own ``policies`` package)."""
    module = spec.partition(":")[0]
    if module.split(".")[0] not in OLD_TOP_LEVEL:
        return None
    ours, old = _origin(f"groupfel.{module}"), _origin(module)
    return f"groupfel.{spec}" if ours is not None and old in (None, ours) else None


def upgrade_saved(obj: Any) -> Any:
    """A config or manifest read back from a run directory written before groupfel's modules moved
    beneath ``groupfel``: every import path of a part of groupfel in its current name (a module
    of that old name that imports here, a user's own, is left alone)."""
    if isinstance(obj, dict):
        return {k: upgrade_saved(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [upgrade_saved(v) for v in obj]
    if is_import_path(obj):
        return renamed(obj) or obj
    return obj


def is_import_path(name: object) -> bool:
    return isinstance(name, str) and ":" in name


@lru_cache(maxsize=None)
def _entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def installed(kind: str) -> list[str]:
    """Short names of the packaged plug-ins of ``kind`` (entry-point metadata; nothing imported)."""
    return sorted(_entry_points(GROUPS[kind]))


def refresh() -> None:
    """Forget the cached entry points (after installing a distribution in a running process)."""
    _entry_points.cache_clear()


def spec_of(obj: Any) -> str:
    """The import path ``module:qualname`` of a class or function (a notebook's: ``__main__:Name``)."""
    return f"{obj.__module__}:{obj.__qualname__}"


def _import(spec: str, where: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if new := renamed(spec):   # groupfel's own file under its old name: a second copy, whose classes are not ours
        raise InputError(f"{where}: {spec!r} names groupfel's old top-level module {module_name.split('.')[0]!r}; "
                         f"groupfel's modules now live beneath groupfel: write {new!r}")
    if not module_name or not attr:
        raise InputError(f"{where}: {spec!r} is not an import path; write \"module:attr\" (e.g. \"mypkg.policies:MyPolicy\")")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = " (put its directory on PYTHONPATH or install its package)" if exc.name == module_name.split(".")[0] \
            or exc.name == module_name else ""
        raise InputError(f"{where}: cannot import {spec!r}: no module named {exc.name!r}{hint}") from None
    except Exception as exc:   # the plug-in's own import failed: say so in one line
        raise InputError(f"{where}: importing {spec!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if module_name == IN_PROCESS:
                raise InputError(f"{where}: {spec!r} was defined in the process that started this run (a notebook "
                                 f"or script) and is not defined here; pass the same class again through "
                                 f"groupfel.experiments.api.run to resume") from None
            raise InputError(f"{where}: {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def load(kind: str, name: str, where: str, check: Callable[[Any], str | None] | None = None) -> Any:
    """The plug-in ``name`` of ``kind`` (an entry point's short name or ``module:attr``), after
    ``check(obj)``, which returns what is wrong with it or None."""
    if is_import_path(name):
        obj = _import(name, where)
    else:
        ep = _entry_points(GROUPS[kind]).get(name)
        if ep is None:
            return None
        try:
            obj = ep.load()
        except Exception as exc:
            raise InputError(f"{where}: the installed {kind} plug-in {name!r} ({ep.value}) failed to load: "
                             f"{type(exc).__name__}: {exc}") from None
    problem = check(obj) if check else None
    if problem:
        raise InputError(f"{where}: {name!r} {problem}")
    return obj


def check_class(base: type, method: str, params: tuple[str, ...]) -> Callable[[Any], str | None]:
    """A check that a plug-in is a dataclass subclass of ``base`` whose ``method`` takes ``params``."""
    import dataclasses

    def check(obj: Any) -> str | None:
        if not (isinstance(obj, type) and issubclass(obj, base)):
            return f"is not a subclass of {base.__module__.split('.')[0]}.{base.__name__}"
        if not dataclasses.is_dataclass(obj):
            return "is not a dataclass (decorate it with @dataclass; its fields are its config keys)"
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(obj.__abstractmethods__))
            return f"does not implement {missing}"
        got = tuple(inspect.signature(getattr(obj, method)).parameters)[1:]
        if len(got) != len(params):
            return (f"has the wrong signature: {method}(self, {', '.join(got)}); "
                    f"it must be {method}(self, {', '.join(params)})")
        return None
    return check


def check_callable(params: tuple[str, ...]) -> Callable[[Any], str | None]:
    """A check that a plug-in is a callable accepting ``params`` positionally."""
    def check(obj: Any) -> str | None:
        if not callable(obj):
            return f"is not callable; it must be a function ({', '.join(params)})"
        try:
            inspect.signature(obj).bind(*params)
        except TypeError:
            return f"has the wrong signature {inspect.signature(obj)}; it must take ({', '.join(params)})"
        except ValueError:   # no signature to inspect (a builtin): accept it
            pass
        return None
    return check


def _source_sha256(obj: Any) -> str | None:
    """sha256 of an in-process object's source (of its methods' code where the source is gone)."""
    try:
        return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()
    except (OSError, TypeError):
        pass
    code = [getattr(v, "__code__", None) for v in (vars(obj).values() if isinstance(obj, type) else [obj])]
    blobs = [marshal.dumps(c) for c in code if c is not None]
    return hashlib.sha256(b"".join(blobs)).hexdigest() if blobs else None


def _distribution(module_name: str) -> dict | None:
    top = module_name.split(".")[0]
    names = metadata.packages_distributions().get(top)
    if not names:
        return None
    return {"name": names[0], "version": metadata.version(names[0])}


def record(kind: str, name: str, field: str, obj: Any) -> dict:
    """What a manifest keeps of a plug-in: its import path, the sha256 of its module file (of its
    source, for a class defined in a notebook) and its distribution's version, if any."""
    spec = spec_of(obj) if hasattr(obj, "__qualname__") else name
    module_name = getattr(obj, "__module__", None) or name.partition(":")[0]
    out: dict[str, Any] = {"field": field, "kind": kind, "name": name, "import_path": spec}
    if module_name == IN_PROCESS:
        out.update(module_file=None, sha256=_source_sha256(obj), source="defined in the running process",
                   distribution=None)
        return out
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    out["module_file"] = str(Path(path).resolve()) if path else None
    out["sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    out["distribution"] = _distribution(module_name)
    return out
