"""What every section of the run config shares: the strict model (numbers are numbers, no
unknown keys), folder names and part names."""
from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


def _kinds(tp, depth: int) -> set:
    """The leaf types a value of annotation ``tp`` may take at ``depth`` (0: the value, 1: a list's
    or dict's elements): int, float, bool, str (a Literal of words counts as str), or object."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _kinds(get_args(tp)[0], depth)
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(a, depth) for a in get_args(tp)))
    if origin is Literal:
        return {type(a) for a in get_args(tp)} if depth == 0 else set()
    if origin in (list, dict):
        return _kinds(get_args(tp)[-1], depth - 1) if depth > 0 else {list}
    if depth != 0 or tp is type(None):
        return set()
    return {tp} if tp in (int, float, bool, str) else {object}


def _not_a_number(name: str, annotation, value) -> str | None:
    """Why ``value`` cannot stand where ``annotation`` wants a number: text ('10') or a boolean,
    which pydantic would coerce; None if it may."""
    for depth, items in ((0, [value]), (1, value if isinstance(value, list) else
                                        list(value.values()) if isinstance(value, dict) else [])):
        kinds = _kinds(annotation, depth)
        for v in items:
            if isinstance(v, (str, bool)) and kinds & {int, float} and not kinds & {type(v), object}:
                what = "text" if isinstance(v, str) else "a boolean"
                try:
                    example = f"{float(v):g}" if isinstance(v, str) and v.strip() else "1"
                except ValueError:
                    example = "1"
                return f"{name}: {v!r} is {what}, not a number; write the number without quotes (e.g. {name} = {example})"
    return None


class _Strict(BaseModel):
    # no field takes inf or NaN: every number a run uses is finite by construction
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        """A number written as TOML text (max_seeds = '10') or a boolean is refused, not coerced:
        a quoted value is usually a mistake in another key, and the file should say what runs."""
        if isinstance(data, dict):
            for name, value in data.items():
                f = cls.model_fields.get(name)
                said = f is not None and _not_a_number(name, f.annotation, value)
                if said:
                    raise ValueError(said)
                if f is not None and f.annotation is bool and not isinstance(value, bool):
                    # pydantic would read 'yes', 'off' or 1 as a boolean
                    raise ValueError(f"{name}: {value!r} is not true or false; write {name} = true or "
                                     f"{name} = false, without quotes")
        return data


def _leaves_its_folder(name: str) -> str:
    """A run, arm or sweep name is a folder inside its parent: '.' and '..' are not."""
    if name in (".", ".."):
        raise ValueError(f"{name!r} is the {'current' if name == '.' else 'parent'} folder, so the files would "
                         f"land outside their own; give a name with a letter or digit")
    return name


# the name of a run, an arm or a sweep: a folder of its own inside its parent
FolderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$"), AfterValidator(_leaves_its_folder)]


# A part a config names: a shipped name, an installed plug-in's short name (entry point) or an
# import path "module:attr". Resolved (imported) only when a run builds its world, never on parsing,
# so a run directory's config reads back wherever its plug-ins are not installed (report, plot).
PartName = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.+-]+(:[A-Za-z_][A-Za-z0-9_.]*)?$")]
