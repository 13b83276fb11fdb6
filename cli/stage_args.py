"""A stage's command-line flags, built from its parameter model: one declaration per parameter.

Every field of the stage's Params model (tasks/<stage>/stage.py) becomes a flag named after it (`max_items` ->
`--max-items`, or the descriptor's `cli_flags` name), with the field's description as its help:

    str / int / float (optional or not)   --name VALUE   (a field without a default is a required flag)
    bool, default False                   --name         (sets it)
    bool, default True                    --no-name      (clears it)
    Literal[...]                          --name {a,b}
    list[Literal[...]]                    --name a,b     (comma-separated)

The output folder (the descriptor's `out_field`) is a required flag unless its default is None.
`overrides` (nested config overrides, a Python / Prefect parameter) and the descriptor's `cli_hidden` fields
are not flags. A flag left out is not passed, so the model's own default applies, as in the Prefect UI.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

NOT_FLAGS = ("overrides",)


def _strip_optional(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _comma_list(allowed: tuple[str, ...] | None):
    def parse(value: str) -> list[str]:
        items = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in items if allowed is not None and v not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(value)} not one of {', '.join(allowed or ())}")
        return items
    return parse


def flag_of(stage, name: str) -> str:
    return stage.cli_flags.get(name, "--" + name.replace("_", "-"))


def add_param_flags(parser: argparse.ArgumentParser, stage) -> None:
    """Add one flag per parameter of `stage.params` (see the module docstring)."""
    for name, info in stage.params.model_fields.items():
        if name in NOT_FLAGS or name in stage.cli_hidden:
            continue
        flag, help_text = flag_of(stage, name), info.description or ""
        kind = _strip_optional(info.annotation)
        # the output folder is a required flag when the model gives it a default folder (the UI form's default)
        required = info.is_required() or (name == stage.out_field and info.default is not None)
        if kind is bool:
            if info.default is True:
                neg = stage.cli_flags.get(name, "--no-" + name.replace("_", "-"))
                parser.add_argument(neg, dest=name, action="store_false", default=None, help=f"(off) {help_text}")
            else:
                parser.add_argument(flag, dest=name, action="store_true", default=None, help=help_text)
            continue
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        kw: dict[str, Any] = dict(dest=name, default=None, help=help_text)
        if required:
            kw["required"] = True
        if origin is Literal:
            kw["choices"] = list(args)
        elif origin is list:
            inner = args[0] if args else str
            allowed = typing.get_args(inner) if typing.get_origin(inner) is Literal else None
            kw["type"] = _comma_list(allowed)
            kw["metavar"] = ",".join(allowed) if allowed else "A,B"
        elif kind in (int, float):
            kw["type"] = kind
        elif kind is not str:
            continue  # a structured parameter: Python / Prefect only
        parser.add_argument(flag, **kw)


class ParamsError(ValueError):
    """Flags that do not make valid parameters (a value out of range): one line, exit status 2."""


def params_from_args(stage, args: argparse.Namespace) -> BaseModel:
    """The stage's parameter model from the parsed flags (flags left out take the model's defaults)."""
    values = {name: getattr(args, name) for name in stage.params.model_fields
              if getattr(args, name, None) is not None}
    for name, value in getattr(stage, "cli_defaults", {}).items():  # the command's own default (not the model's)
        values.setdefault(name, value)
    if stage.out_field and isinstance(values.get(stage.out_field), str) and not values[stage.out_field].strip():
        raise ParamsError(f"{flag_of(stage, stage.out_field)} is empty: name the output folder (an empty one would "
                          "be the current folder)")
    try:
        return stage.params(**values)
    except ValidationError as e:
        problems = "; ".join(
            (f"{flag_of(stage, str(err['loc'][0]))} {err.get('input')}: " if err["loc"] else "")
            + err["msg"][:1].lower() + err["msg"][1:] for err in e.errors())
        raise ParamsError(f"invalid arguments: {problems}") from None
