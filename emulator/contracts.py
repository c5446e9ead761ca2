"""Contracts at the plug-in seam: everything a part returns is checked where it enters the run.

A broken rule is an :class:`~groupfel.errors.InputError` of one line naming the config field, the
part's import path, the rule and the offending value (exit 2). An exception raised inside the
part's own code is the user's bug to find: :func:`calling` keeps its traceback and puts one line
naming the part under it (:class:`~groupfel.errors.PluginError`).

The checks are cheap (a pass over a few index arrays or weight vectors) and never change a value,
so the shipped parts run through them too and the reference numbers stay bitwise equal.
"""
from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from groupfel.errors import InputError, PluginError


def spec_of(obj: Any) -> str:
    """A part's import path ``module:qualname`` (of its class where ``obj`` is an instance)."""
    import inspect

    cls = obj if isinstance(obj, type) or inspect.isfunction(obj) else type(obj)
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', type(cls).__name__)}"


def _show(value: Any, limit: int = 8) -> str:
    arr = np.asarray(value).ravel() if not isinstance(value, (str, type(None))) else None
    if arr is None or arr.size <= limit:
        return repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return f"[{', '.join(map(str, arr[:limit].tolist()))}, ...] ({arr.size} values)"


@contextmanager
def calling(where: str, spec: str, hook: str) -> Iterator[None]:
    """Run a part's own code: its exception keeps its traceback, under one line naming the part.
    Our own one-line errors (InputError) pass through unchanged."""
    try:
        yield
    except (InputError, KeyboardInterrupt):
        raise
    except Exception as exc:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        raise PluginError(f"{where}: {spec!r} raised {type(exc).__name__} in its {hook} (its traceback is "
                          f"above; the bug is in that code)", trace) from None


def broken(where: str, spec: str, part: str, rule: str, got: str) -> InputError:
    return InputError(f"{where}: {spec!r} breaks the {part} contract: {rule}; got {got}")


# -- grouping --------------------------------------------------------------------------------------

def check_grouping(groups: Any, dropped: Any, n_clients: int, where: str, spec: str, leaves_out: bool,
                   edge: int | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """The groups of one edge of ``n_clients`` clients (row indices): integers in range, no client
    in two groups, no empty group. Clients in no group are allowed only where the policy declares
    that it leaves clients out (``leaves_out``) or lists them in ``dropped``; returns the groups as
    integer arrays and every client left out (the manifest counts them)."""
    at = "" if edge is None else f" of edge {edge}"
    part = "grouping"
    if isinstance(groups, np.ndarray) and groups.ndim == 1 and groups.dtype != object:
        raise broken(where, spec, part, "groups must be a list of index arrays, one per group",
                     f"one flat array {_show(groups)}{at}")
    try:
        groups = list(groups)
    except TypeError:
        raise broken(where, spec, part, "groups must be a list of index arrays", type(groups).__name__) from None
    out, owner = [], np.full(n_clients, -1)
    for k, g in enumerate(groups):
        arr = np.asarray(g)
        if arr.ndim != 1:
            raise broken(where, spec, part, "each group must be a 1-D array of client indices",
                         f"group {k}{at} of shape {arr.shape}")
        if arr.size == 0:
            raise broken(where, spec, part, "no group may be empty", f"group {k}{at} empty")
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                arr = arr.astype(np.int64)
            else:
                raise broken(where, spec, part, "client indices must be integers",
                             f"{_show(arr)} ({arr.dtype}) in group {k}{at}")
        arr = arr.astype(np.int64)
        bad = arr[(arr < 0) | (arr >= n_clients)]
        if bad.size:
            raise broken(where, spec, part, f"client indices must lie in 0..{n_clients - 1} (the edge's "
                         f"{n_clients} clients)", f"{int(bad[0])} in group {k}{at}")
        dup = np.flatnonzero(np.bincount(arr, minlength=n_clients) > 1)
        if dup.size:
            raise broken(where, spec, part, "no client may be in a group twice",
                         f"client {int(dup[0])} twice in group {k}{at}")
        seen = owner[arr]
        if (seen >= 0).any():
            i = int(np.flatnonzero(seen >= 0)[0])
            raise broken(where, spec, part, "no client may be in two groups",
                         f"client {int(arr[i])}{at} in groups {int(seen[i])} and {k}")
        owner[arr] = k
        out.append(arr)
    missing = np.flatnonzero(owner < 0)
    listed = np.asarray(dropped if dropped is not None else [], dtype=np.int64).ravel()
    if missing.size and not leaves_out:
        undeclared = np.setdiff1d(missing, listed)
        if undeclared.size:
            raise broken(where, spec, part, "every client must be in a group unless the policy declares "
                         "leaves_clients_out = True (or lists them in EdgeGrouping.dropped)",
                         f"client(s) {_show(undeclared)}{at} in no group")
    return out, missing


# -- sampling and aggregation ------------------------------------------------------------------------

def check_weights(values: Any, n_groups: int, where: str, spec: str, part: str, what: str,
                  allow_inf: np.ndarray | None = None) -> np.ndarray:
    """One finite weight per group (``allow_inf``: groups where +inf is the base class's own
    meaning, a CoV of 0)."""
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise broken(where, spec, part, f"{what} must be one number per group",
                     type(values).__name__) from None
    if arr.shape != (n_groups,):
        raise broken(where, spec, part, f"{what} must be one number per group ({n_groups} groups)",
                     f"shape {arr.shape}")
    bad = np.isnan(arr) | (np.isinf(arr) & (arr > 0) & (True if allow_inf is None else ~allow_inf))
    if part == "aggregation":
        bad |= ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise broken(where, spec, part, f"{what} must be finite", f"{arr[i]} for group {i} of {n_groups}")
    return arr


# -- dataset and model --------------------------------------------------------------------------------

def check_dataset(ds: Any, where: str, spec: str) -> None:
    """Equal lengths, labels in 0..num_classes-1, finite features, at least one test sample."""
    part = "dataset"
    m = ds.num_classes
    if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 1:
        raise broken(where, spec, part, "num_classes must be an integer >= 1", repr(m))
    for split in ("train", "test"):
        x, y = np.asarray(getattr(ds, f"x_{split}")), np.asarray(getattr(ds, f"y_{split}"))
        if y.ndim != 1 or len(x) != len(y):
            raise broken(where, spec, part, f"x_{split} and y_{split} must have equal lengths (y 1-D)",
                         f"{len(x)} features and labels of shape {y.shape}")
        if split == "test" and len(y) == 0:
            raise broken(where, spec, part, "at least one test sample", "0")
        if len(y) and (y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= m):
            bad = y[(y < 0) | (y >= m)] if y.dtype.kind in "iuf" else y[:1]
            value = bad[0] if bad.size else y[y != np.round(y)][0] if y.dtype.kind == "f" else y[0]
            raise broken(where, spec, part, f"labels must be integers in 0..{m - 1} (num_classes = {m})",
                         f"{getattr(value, 'item', lambda: value)()!r} in y_{split}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            i = int(np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))[0])
            raise broken(where, spec, part, "features must be finite", f"a NaN or infinity in x_{split}[{i}]")


def check_model(model: Any, x_one: np.ndarray, num_classes: int, where: str, spec: str) -> None:
    """One forward pass of one sample; the output must be (1, num_classes)."""
    import torch

    with calling(where, spec, "forward pass"), torch.no_grad():
        out = model(torch.as_tensor(np.asarray(x_one, dtype=np.float32)))
    shape = tuple(getattr(out, "shape", ()))
    if shape != (1, num_classes):
        raise broken(where, spec, "model", f"one sample's output must have shape (1, num_classes) = "
                     f"(1, {num_classes})", f"{shape}")


# -- training algorithm ---------------------------------------------------------------------------------

def _tensor_shape(where: str, spec: str, hook: str, value: Any, shape: tuple[int, ...], optional: bool) -> None:
    import torch

    if value is None and optional:
        return
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise broken(where, spec, "algorithm", f"{hook} must return a tensor of shape {shape}"
                     + (" or None" if optional else ""), got)


def check_algorithm(algorithm: Any, where: str = "train.algorithm") -> Any:
    """Wrap a plug-in algorithm's hooks (on the instance) so their returns are checked and their
    exceptions name it; a shipped algorithm is returned as it is."""
    spec = spec_of(algorithm)
    cls = type(algorithm)

    def wrap(name: str, check):
        method = getattr(algorithm, name)

        def hook(*args, **kwargs):
            with calling(where, spec, f"{name}()"):
                value = method(*args, **kwargs)
            check(value, *args, **kwargs)
            return value
        object.__setattr__(algorithm, name, hook)

    def client_state(value):
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
            raise broken(where, spec, "algorithm", "client_state() must return a tuple of names (str)", repr(value))

    def server_state(value, weights):
        import torch

        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                  for k, v in value.items()):
            raise broken(where, spec, "algorithm", "server_state() must return a dict of name -> tensor",
                         type(value).__name__)

    def rows(name, optional):
        def check(value, state, scratch, clients, *rest, **kw):
            starts = rest[0] if name == "local_start" else None
            p = starts.shape[-1] if starts is not None else _width(state, algorithm)
            if p is not None:
                _tensor_shape(where, spec, name + "()", value, (len(clients), p), optional)
        return check

    def local_update(value, engine, state, scratch, table, clients, *rest, **kw):
        _tensor_shape(where, spec, "local_update()", value, (len(clients), table.shape[-1]), False)

    def aggregate_group(value, state, scratch, update):
        _tensor_shape(where, spec, "aggregate_group()", value, (update.models.shape[-1],), False)

    def aggregate_cloud(value, state, scratch, weights, models, *rest):
        _tensor_shape(where, spec, "aggregate_cloud()", value, (models[0].numel(),), False)

    for name, check in (("client_state", client_state), ("server_state", server_state),
                        ("local_start", rows("local_start", True)), ("correction", rows("correction", True)),
                        ("local_update", local_update), ("aggregate_group", aggregate_group),
                        ("aggregate_cloud", aggregate_cloud)):
        if getattr(cls, name) is not None:
            wrap(name, check)
    return algorithm


def _width(state: Any, algorithm: Any) -> int | None:
    """P, the model's parameters, from the algorithm's state or its bound engine."""
    engine = getattr(getattr(algorithm, "ctx", None), "engine", None)
    return getattr(engine, "n_params", None)
