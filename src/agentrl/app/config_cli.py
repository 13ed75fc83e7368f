"""Command-line options drawn from a pydantic settings model: one `--option` per field, its
help the field's docstring (first sentence), its type the field's (a `Literal` becomes a
choice), and no default of its own: an option not given leaves the model's value (or the
profile's) as it is, so no option needs a "0 means default" value.

A field that defaults to True becomes a `--no-FIELD` flag, one that defaults to False a
`--FIELD` flag. `--set FIELD=VALUE` reaches every other field of the model.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, TypeAdapter


def first_sentence(text: str | None) -> str:
    """The help line of a field: its docstring up to the first sentence's end."""
    text = " ".join((text or "").split())
    end = re.search(r"\.\s+(?=[A-Z(`])", text)  # not at "e.g. a"
    return text if end is None else text[: end.start() + 1]


def _option(model: type[BaseModel], name: str) -> tuple[inspect.Parameter, str]:
    """The typer parameter of field `name`, and the parameter's name in the function."""
    info = model.model_fields[name]
    ann = info.annotation
    help_ = first_sentence(info.description)
    flag = "--" + name.replace("_", "-")
    if ann is bool:
        param = f"no_{name}" if info.default else name
        if info.default:
            flag = "--no-" + name.replace("_", "-")
            help_ = f"Off: {help_[:1].lower()}{help_[1:]}"
        return inspect.Parameter(
            param,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(False, flag, help=help_, show_default=False),
            annotation=bool,
        ), param
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    base = args[0] if len(args) == 1 else ann
    literal = typing.get_origin(base) is typing.Literal  # typer makes it a choice
    if not literal and base not in (str, int, float, Path):
        raise TypeError(f"{model.__name__}.{name}: no command-line type for {ann!r}")
    option = typer.Option(
        None, flag, help=help_, show_default=False, metavar="<choice>" if literal else None
    )
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=option,
        annotation=typing.Optional[base],  # noqa: UP045 - a runtime type
    ), name


def _set_option() -> inspect.Parameter:
    return inspect.Parameter(
        "set_",
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(
            None,
            "--set",
            metavar="FIELD=VALUE",
            help="Any other setting; see --show-config.",
            show_default=False,
        ),
        annotation=list[str] | None,
    )


def overrides(model: type[BaseModel], given: dict[str, Any]) -> dict[str, Any]:
    """The fields the options set: those given (not None; flags that were passed) and the
    `--set FIELD=VALUE` pairs (each value parsed as JSON where it is JSON, else a string)."""
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key == "set_":
            continue
        if key.startswith("no_") and key[3:] in model.model_fields:
            if value:
                out[key[3:]] = False
        elif model.model_fields[key].annotation is bool:
            if value:
                out[key] = True
        elif value is not None:
            out[key] = value
    for pair in given.get("set_") or ():
        name, sep, raw = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in model.model_fields:
            raise typer.BadParameter(
                f"{pair!r}: use FIELD=VALUE with one of {', '.join(model.model_fields)}",
                param_hint="--set",
            )
        out[name] = _parse(raw)
    return out


def _parse(raw: str) -> Any:
    try:
        return TypeAdapter(Any).validate_json(raw)
    except ValueError:
        return raw


def model_command(
    model: type[BaseModel],
    fields: Sequence[str],
    body: Callable[..., None],
    extra: Sequence[inspect.Parameter] = (),
) -> Callable[..., None]:
    """A function typer can register: `extra` parameters (the command's own), then one
    option per field of `fields`, then `--set`. It calls `body(overrides, **extra_values)`."""
    built = [_option(model, name) for name in fields]
    params = [*extra, *(p for p, _ in built), _set_option()]
    own = {p.name for p in extra}

    def command(**kwargs: Any) -> None:
        mine = {k: v for k, v in kwargs.items() if k in own}
        given = {k: v for k, v in kwargs.items() if k not in own}
        body(overrides(model, given), **mine)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = body.__doc__
    return command
