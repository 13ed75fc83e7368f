"""Command-line options drawn from a pydantic settings model: one `--option` per field, its
help the field's docstring (first sentence), its type the field's (a `Literal` becomes a
choice), and no default of its own: an option not given leaves the model's value (or the
profile's) as it is, so no option needs a "0 means default" value.

A field that defaults to True becomes a `--no-FIELD` flag, one that defaults to False a
`--FIELD` flag. `--set FIELD=VALUE` reaches every other field of the model.
`config_command` adds `--show-config` (and `--quick` where the model has a `quick()`
profile) and turns a value the model refuses into exit status 2 with the reason. A field
named in `arguments` is a positional argument instead (required where the field is); a
required field that is an option is a required option.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, TypeAdapter, ValidationError

SCALARS = (str, int, float, Path, datetime)


def first_sentence(text: str | None) -> str:
    """The help line of a field: its docstring up to the first sentence's end."""
    text = " ".join((text or "").split())
    end = re.search(r"\.\s+(?=[A-Z(`])", text)  # not at "e.g. a"
    return text if end is None else text[: end.start() + 1]


def _option(
    model: type[BaseModel], name: str, decls: Sequence[str] = (), defaults: bool = False
) -> tuple[inspect.Parameter, str]:
    """The typer parameter of field `name` (its flags `decls`, else `--field-name`), and the
    parameter's name in the function. `defaults`: its help shows the field's default (where
    it is a value: not None, not an empty list, not a flag's)."""
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
            default=typer.Option(False, *(decls or [flag]), help=help_, show_default=False),
            annotation=bool,
        ), param
    kind = _cli_type(ann)
    if kind is None:
        raise TypeError(f"{model.__name__}.{name}: no command-line type for {ann!r}")
    base, literal, many = kind
    value = None if info.is_required() else info.get_default(call_default_factory=True)
    if defaults and value not in (None, []):  # as typer writes one (escaped: not markup)
        help_ += f" \\[default: {value}]"
    option = typer.Option(
        ... if info.is_required() else None,
        *(decls or [flag]),
        help=help_ + (" Repeatable." if many else ""),
        show_default=False,
        metavar="<choice>" if literal else None,
    )
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=option,
        annotation=typing.Optional[base],  # noqa: UP045 - a runtime type
    ), name


def _cli_type(ann: Any) -> tuple[Any, bool, bool] | None:
    """The option's type of a field typed `ann` (Optional unwrapped), whether it is a choice
    (a `Literal`) and whether it repeats (a list of scalars); None: no command-line type."""
    union = typing.get_origin(ann) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(ann) if a is not type(None)] if union else []
    base = args[0] if len(args) == 1 else ann
    literal = typing.get_origin(base) is typing.Literal  # typer makes it a choice
    many = typing.get_origin(base) in (list, tuple) and typing.get_args(base)[0] in SCALARS
    if many:  # a repeatable option
        return list[typing.get_args(base)[0]], False, True  # type: ignore[misc]
    if not literal and base not in SCALARS:
        return None
    return base, literal, False


def _drawable(model: type[BaseModel], name: str) -> bool:
    """Whether field `name` has a command-line type (a flag, a scalar, a choice, a list of
    scalars)."""
    ann = model.model_fields[name].annotation
    return ann is bool or _cli_type(ann) is not None


def option_parameters(
    model: type[BaseModel],
    fields: Sequence[str],
    flags: Mapping[str, Sequence[str]] | None = None,
    defaults: bool = False,
) -> list[inspect.Parameter]:
    """One typer parameter per field of `fields` (`flags` names a field's own flags; with
    `defaults` its help shows the field's default); the values they receive become the
    model's fields through `overrides(model, values)`."""
    return [_option(model, name, (flags or {}).get(name, ()), defaults)[0] for name in fields]


def argument_parameters(model: type[BaseModel], fields: Sequence[str]) -> list[inspect.Parameter]:
    """One positional typer argument per field of `fields`, in that order: its help the
    docstring's first sentence, required where the field is. Its value reaches the model
    through `overrides` like an option's."""
    out = []
    for name in fields:
        param, _ = _option(model, name)
        info = model.model_fields[name]
        out.append(
            param.replace(
                default=typer.Argument(
                    ... if info.is_required() else None,
                    help=first_sentence(info.description),
                    show_default=False,
                )
            )
        )
    return out


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
        elif value is not None and not (isinstance(value, list | tuple) and not value):
            out[key] = value
    for pair in given.get("set_") or ():
        name, sep, raw = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not _settable(model, name):
            raise typer.BadParameter(
                f"{pair!r}: use FIELD=VALUE with one of {', '.join(model.model_fields)}"
                " (SECTION.KEY=VALUE in a section)",
                param_hint="--set",
            )
        out[name] = _parse(raw)
    return out


def _settable(model: type[BaseModel], name: str) -> bool:
    """A field of `model`, or `section.key` where the field `section` is itself a model (the
    model's own validation then says whether `key` is one of the section's)."""
    head, dot, _ = name.partition(".")
    info = model.model_fields.get(head)
    if info is None:
        return False
    return not dot or (inspect.isclass(info.annotation) and issubclass(info.annotation, BaseModel))


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
    flags: Mapping[str, Sequence[str]] | None = None,
    arguments: Sequence[str] = (),
    defaults: bool = False,
) -> Callable[..., None]:
    """A function typer can register: the `arguments` fields as positional arguments, then
    `extra` parameters (the command's own), then one option per field of `fields` (`flags`
    names a field's own flags; `defaults`: the help shows the model's defaults, right where
    no profile changes them), then `--set`. It calls `body(overrides, **extra_values)`."""
    params = [
        *argument_parameters(model, arguments),
        *extra,
        *option_parameters(model, fields, flags, defaults),
        _set_option(),
    ]
    own = {p.name for p in extra}

    def command(**kwargs: Any) -> None:
        mine = {k: v for k, v in kwargs.items() if k in own}
        given = {k: v for k, v in kwargs.items() if k not in own}
        body(overrides(model, given), **mine)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = body.__doc__
    return command


def flag(name: str, help_: str, *decls: str) -> inspect.Parameter:
    """A command's own on/off flag (not a field of its model), e.g. `--show-config`."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(False, *(decls or ["--" + name.replace("_", "-")]), help=help_),
        annotation=bool,
    )


def argument(name: str, help_: str, annotation: Any, default: Any = ...) -> inspect.Parameter:
    """A command's positional argument (`...`: required)."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Argument(default, help=help_, show_default=False),
        annotation=annotation,
    )


def build(factory: Callable[..., BaseModel], overrides: dict[str, Any]) -> Any:
    """`factory(**overrides)`, or exit status 2 with the model's reason."""
    try:
        return factory(**overrides)
    except ValidationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def shown(cfg: BaseModel) -> str:
    """The settings as JSON, secrets (a field named like a password or token) masked."""
    data = cfg.model_dump(mode="json")
    for name in data:
        if data[name] and re.search(r"(^|_)(password|token|secret|api_key)$", name):
            data[name] = "***"
    return json.dumps(data, indent=2)


def config_command(
    model: type[BaseModel],
    fields: Sequence[str] | None,
    run: Callable[..., None],
    extra: Sequence[inspect.Parameter] = (),
    flags: Mapping[str, Sequence[str]] | None = None,
    arguments: Sequence[str] = (),
) -> Callable[..., None]:
    """`model_command` for a command that runs on one validated config: `run(cfg, **extra)`.
    `fields` None: every field not in `arguments` with a command-line type is an option
    (a section, a field that is itself a model, stays `--set`'s).

    It adds `--show-config` (print the settings as JSON, run nothing) and, where `model`
    has a `quick(**overrides)` classmethod, `--quick` (that profile, its docstring the help);
    without one, each option's help shows the model's default.
    """
    if fields is None:
        fields = [n for n in model.model_fields if n not in arguments and _drawable(model, n)]
    own = [*extra, flag("show_config", "Print the settings as JSON and exit.")]
    quick = getattr(model, "quick", None)
    if quick is not None:
        own.insert(0, flag("quick", first_sentence(quick.__doc__)))

    def body(overrides: dict[str, Any], *, show_config: bool, **mine: Any) -> None:
        factory = quick if quick is not None and mine.pop("quick", False) else model
        cfg = build(factory, overrides)
        if show_config:
            typer.echo(shown(cfg))
            return
        run(cfg, **mine)

    body.__doc__ = run.__doc__
    # a `--quick` profile changes the defaults: the help shows them only without one
    return model_command(model, fields, body, own, flags, arguments, defaults=quick is None)
