"""A user's run config read and checked: TOML in, one line naming the field out on any error."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from groupfel import userfile
from groupfel.errors import InputError
from groupfel.userfile import short

from .run import RunConfig


_FIX = {
    "extra_forbidden": "unknown key; remove it or check its spelling",
    "missing": "required; add it",
}
# a number out of its range: (the bound's name in pydantic's context, how to say it)
_BOUND = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "above"),
          "less_than_equal": ("le", "at most"), "less_than": ("lt", "below")}


def _union_tag(part: Any) -> bool:
    """A loc part pydantic adds for a branch of a union (``constrained-int``, ``list[...]``)."""
    return isinstance(part, str) and (part in ("int", "float", "str") or part.startswith(
        ("constrained-", "list[", "dict[", "function-")))


def _first_error(exc: ValidationError) -> dict:
    """The first error; of a union's branches, the one that got furthest into the input (a list
    of counts: the list's error, not the single count's)."""
    errors = exc.errors()
    err = errors[0]
    tag = next((i for i, p in enumerate(err["loc"]) if _union_tag(p)), None)
    if tag is not None:
        same = [e for e in errors if e["loc"][:tag] == err["loc"][:tag]]
        err = max(same, key=lambda e: len(e["loc"]))
    return {**err, "loc": tuple(p for p in err["loc"] if not _union_tag(p))}


def _one_line(exc: ValidationError) -> str:
    err = _first_error(exc)
    loc = ".".join(str(p) for p in err["loc"])
    msg = _FIX.get(err["type"]) or err["msg"].removeprefix("Value error, ")
    if err["type"] in _BOUND:
        key, word = _BOUND[err["type"]]
        bound = err["ctx"][key]
        msg = (f"{short(err['input'])} is out of range; give a number {word} "
               f"{f'{bound:,}' if isinstance(bound, int) else f'{bound:g}'} (see the config guide's Limits)")
    elif err["type"] == "finite_number":
        msg = f"{short(err['input'])} is not a finite number; give one"
    if err["type"] == "string_pattern_mismatch" and err["loc"] and err["loc"][-1] in ("dataset", "model", "policy", "aggregation", "algorithm"):
        msg = f"{short(err['input'])} is neither a name nor an import path \"module:attr\""
    typed = re.match(r"(\w+): (.* (?:not a number|not true or false|not a whole number);.*)", msg)
    if typed and loc:   # a type check of a table's key names the key by its whole path
        loc, msg = f"{loc}.{typed.group(1)}", typed.group(2)
    return f"config: {loc}: {msg}" if loc else f"config: {msg}"


def parse_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(_one_line(exc)) from None


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """A user's TOML file as a dict, through the gate of users' files (:mod:`groupfel.userfile`):
    a FIFO, a device, an oversized, binary, deeply nested or invalid file is one line."""
    return userfile.read_toml(path, f"{what} {path}")


def load_config(path: str | Path) -> RunConfig:
    """A user's run config. Config files the tool writes (config.json, holding both ``seed`` and
    ``seeds``) are read with :func:`parse_config`, which does not apply the checks below."""
    data = read_toml(path, "config file")
    check_user_config(data, f"config file {path}", f"groupfel sweep {path}")
    return check_modes(data, parse_config(data))


# Keys that only mean something in one mode: (the mode, whether a config is in it). A user's config
# that sets one in another mode is refused, since the key would be silently ignored. The tool's own
# files (config.json, a multi-seed run's per-seed configs) carry every key, so only what a user
# wrote is checked (:func:`check_modes`). tests/test_limits.py tries each key in the other mode.
# data.alpha and data.dirichlet_counts stay allowed beside another partition: a config switched from
# the default dirichlet to a shift scenario keeps them (DIRICHLET_CARRIED).
ONLY_IN: dict[str, tuple[str, Callable[[RunConfig], bool]]] = {
    "seed_batch": ('seeds = "auto"', lambda c: c.seeds == "auto"),
    "max_seeds": ('seeds = "auto"', lambda c: c.seeds == "auto"),
    "margins": ('seeds = [...] or seeds = "auto" (a single seed has no comparison to decide)',
                lambda c: c.seeds is not None),
    "withhold_skew": ('seeds = [...] or seeds = "auto" (a single seed has no comparison to decide)',
                      lambda c: c.seeds is not None),
    "data.n_shards": ('data.partition = "shards"', lambda c: c.data.partition == "shards"),
    "data.shards_deal": ('data.partition = "shards"', lambda c: c.data.partition == "shards"),
    "data.shard_samples": ('data.shards_deal = "authors"', lambda c: c.data.partition == "shards"
                           and c.data.shards_deal == "authors"),
    "data.label_shift_deal": ('data.partition = "label-shift" and mode = "per-group"',
                              lambda c: c.data.partition == "label-shift" and c.mode == "per-group"),
    "track.dir": ('track.tracker = "tensorboard"', lambda c: c.track is not None and c.track.tracker == "tensorboard"),
    **{f"track.{key}": ('track.tracker = "mlflow"', lambda c: c.track is not None and c.track.tracker == "mlflow")
       for key in ("uri", "experiment", "report")},
    "data.cluster_k": ('data.label_shift_deal = "authors"', lambda c: _authors_deal(c)),
    "data.subsample_decay": ('data.label_shift_deal = "authors"', lambda c: _authors_deal(c)),
    # the authors' deal sets every client's counts and cuts its test split by label
    **{f"data.{key}": ('data.label_shift_deal = "types" (the authors\' deal sets the sample counts itself)',
                       lambda c: not _authors_deal(c)) for key in ("min_samples", "max_samples", "test_samples",
                                                                  "mean_samples", "types")},
    "data.local_test": ('mode = "per-group"', lambda c: c.mode == "per-group"),
    "data.std_samples": ('data.sizes = "normal"', lambda c: c.data.sizes == "normal"),
    "data.types[].label_weights": ('data.partition = "label-shift"', lambda c: c.data.partition == "label-shift"),
    "data.types[].rotation": ('data.partition = "feature-shift"', lambda c: c.data.partition == "feature-shift"),
    "data.types[].permutation": ('data.partition = "concept-shift"', lambda c: c.data.partition == "concept-shift"),
    "faults.straggler.sigma": ('faults.straggler.distribution = "lognormal"',
                               lambda c: c.faults.straggler is not None and c.faults.straggler.distribution == "lognormal"),
    "faults.straggler.shape": ('faults.straggler.distribution = "pareto"',
                               lambda c: c.faults.straggler is not None and c.faults.straggler.distribution == "pareto"),
    "train.report_best": ('mode = "per-group"', lambda c: c.mode == "per-group"),
    "train.local_reference": ('mode = "per-group"', lambda c: c.mode == "per-group"),
    "topology.heterogeneity.reference_ms_per_sample": (
        "topology.heterogeneity.fedscale_file",
        lambda c: c.topology.heterogeneity is not None and c.topology.heterogeneity.fedscale_file is not None),
    "topology.heterogeneity.fedscale_pairing": (
        "topology.heterogeneity.fedscale_file",
        lambda c: c.topology.heterogeneity is not None and c.topology.heterogeneity.fedscale_file is not None),
    "topology.availability.fedscale_pairing": (
        "topology.availability.fedscale_file",
        lambda c: c.topology.availability is not None and c.topology.availability.fedscale_file is not None),
}


def _authors_deal(c: RunConfig) -> bool:
    return c.data.partition == "label-shift" and c.data.label_shift_deal == "authors"


DIRICHLET_CARRIED = ("data.alpha", "data.dirichlet_counts")


def _values(data: Any, path: str) -> list:
    """What the user's ``data`` writes at ``path`` (``[]``: each element of a list)."""
    key, _, rest = path.partition(".")
    name = key.removesuffix("[]")
    if not isinstance(data, dict) or name not in data:
        return []
    if key.endswith("[]"):
        items = data[name] if isinstance(data[name], list) else []
        return [v for item in items for v in _values(item, rest)]
    return _values(data[name], rest) if rest else [data[name]]


def _default(config: RunConfig, path: str) -> Any:
    """The schema's default at ``path`` (a list's element: the first element's model)."""
    *parents, leaf = path.split(".")
    obj: Any = config
    for key in parents:
        obj = getattr(obj, key.removesuffix("[]"), None)
        if key.endswith("[]"):
            obj = obj[0] if obj else None
        if obj is None:
            return _MISSING
    field = type(obj).model_fields[leaf]
    default = field.get_default(call_default_factory=True)
    return default.model_dump() if isinstance(default, BaseModel) else default


_MISSING = object()


def check_modes(data: dict, config: RunConfig) -> RunConfig:
    """``config`` (parsed from the user's ``data``), unless ``data`` sets a key of :data:`ONLY_IN`
    outside its mode to something other than its default: then one line naming the key and the mode
    it needs. A default value changes nothing in any mode, and a saved config (``model_dump``)
    carries every key at its default, so it is passed back as it is."""
    for path, (mode, applies) in ONLY_IN.items():
        default = _default(config, path)
        if any(v != default for v in _values(data, path)) and not applies(config):
            raise InputError(f"config: {path}: only used with {mode}, so it would be ignored here; remove "
                             f"{path} or set {mode.split(' (')[0]}")
    return config


def check_user_config(data: dict, where: str, sweep_hint: str = "groupfel.experiments.api.sweep") -> None:
    """What only a user's config can get wrong (a TOML file, or a dict given to the Python API)."""
    if "arms" not in data and ("axes" in data or "base" in data):
        raise InputError(f"{where}: this is a sweep file (it has {'axes' if 'axes' in data else 'base'}), "
                         f"not a run config; run it with '{sweep_hint}'")
    if "seed" in data and "seeds" in data:
        raise InputError(f"{where}: seed = {short(data['seed'])} and seeds = {short(data['seeds'])} are both set, "
                         f"which is ambiguous; keep seeds (every arm runs on each) or seed (one run)")
