"""What every section of the run config shares: the strict model (numbers are numbers, no
unknown keys), folder names and part names."""
from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from groupfel.userfile import short


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
    which pydantic would coerce, or a float where a whole number goes (2.0); None if it may."""
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
                shown = ("true" if v else "false") if isinstance(v, bool) else short(v)   # as TOML spells it
                return f"{name}: {shown} is {what}, not a number; write the number without quotes (e.g. {name} = {example})"
            if type(v) is float and int in kinds and not kinds & {float, object}:
                # pydantic would read 2.0 as 2: a count written as a float is usually a mistake
                whole = f"{v:.0f}" if abs(v) < 1e18 else "1"
                return f"{name}: {short(v)} is not a whole number; write it without a decimal point (e.g. {name} = {whole})"
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
                    raise ValueError(f"{name}: {short(value)} is not true or false; write {name} = true or "
                                     f"{name} = false, without quotes")
        return data


def _leaves_its_folder(name: str) -> str:
    """A run, arm or sweep name is a folder inside its parent: '.' and '..' are not."""
    if name in (".", ".."):
        raise ValueError(f"{short(name)} is the {'current' if name == '.' else 'parent'} folder, so the files would "
                         f"land outside their own; give a name with a letter or digit")
    return name


# the name of a run, an arm or a sweep: a folder of its own inside its parent
FolderName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$"), AfterValidator(_leaves_its_folder)]


# A part a config names: a shipped name, an installed plug-in's short name (entry point) or an
# import path "module:attr". Resolved (imported) only when a run builds its world, never on parsing,
# so a run directory's config reads back wherever its plug-ins are not installed (report, plot).
PartName = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.+-]+(:[A-Za-z_][A-Za-z0-9_.]*)?$")]


def path_of(what: str):
    """A path a config names (a file, a folder): empty or blank text is refused, since it would
    be ignored or read as the current folder."""
    def check(value: str) -> str:
        if not value.strip():
            raise ValueError(f"empty; give the {what}'s path, or remove the key")
        return value
    return Annotated[str, AfterValidator(check)]
