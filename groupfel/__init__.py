"""groupfel: an emulator of group-based hierarchical federated learning over a client-edge-cloud
architecture, with cost accounting (Group-FEL).

The public surface, each loaded on first use (``import groupfel`` imports neither torch nor pandas):

- the Python API (:mod:`groupfel.experiments.api`): :func:`run`, :func:`load`, :func:`sweep`,
  :func:`whatif`, :func:`calibrate`, :func:`group` and :class:`Study`;
- the plug-in bases: :class:`GroupingPolicy`, :class:`EdgeGrouping`, :class:`EdgeView`,
  :class:`SamplingPolicy`, :class:`AggregationRule` (:mod:`groupfel.policies`),
  :class:`Algorithm` (:mod:`groupfel.emulator.algorithms`), :class:`Dataset`
  (:mod:`groupfel.topologies`);
- :class:`InputError`, the one-line error every bad input raises.

The repository's folders are its subpackages: ``groupfel.emulator``, ``groupfel.topologies``,
``groupfel.cost_models``, ``groupfel.policies`` and ``groupfel.experiments``.
"""
from importlib import import_module

from .errors import InputError

_LAZY = {
    **{name: "groupfel.experiments.api" for name in ("run", "load", "sweep", "whatif", "calibrate", "group", "Study")},
    **{name: "groupfel.policies" for name in ("GroupingPolicy", "EdgeGrouping", "EdgeView", "SamplingPolicy",
                                              "AggregationRule")},
    "Algorithm": "groupfel.emulator.algorithms",
    "Dataset": "groupfel.topologies",
}

__all__ = ["InputError", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value   # later lookups skip this hook
        return value
    raise AttributeError(f"module 'groupfel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
