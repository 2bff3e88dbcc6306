"""A command's options from its signature: what ``parser`` turns into flags and a file's keys.

A command is a function; its signature and docstring are its options, as in litgpt:

* a parameter ``settings: WatermarkSettings`` puts the settings groups at the top of the
  command line and of a settings file: ``--search.max_candidates 8`` and
  ``search: {max_candidates: 8}``, ``--mark.kind region --mark.gamma 0.3``, ``--key``; a
  ``settings`` of another settings class (``EvalSettings``) puts its fields at the top;
* a parameter typed with a settings dataclass is a group of its own:
  ``calibration: CalibrationSettings`` gives ``--calibration.num_keys 50`` and
  ``calibration: {num_keys: 50}``;
* any other parameter is an option, ``--prompt TEXT``, helped by its line of the docstring.

The mark's fields are those of its kind (``watermark_options``): ``--mark.kind region`` lists
the region mark's.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docstring_parser

from ..settings.checks import SEED_BOUNDS, Range, range_of
from ..settings.groups import MARK_KINDS
from ..settings.marks import default_kind
from ..settings.watermark import GROUPS, WatermarkSettings

DEFAULT_BOUNDS = Range(*SEED_BOUNDS)
"""The bounds of an integer option that declares none: what a 64-bit integer holds."""


@dataclass(frozen=True)
class Option:
    """One flag: its place (``search.max_candidates``), type, default and help."""

    dest: str
    hint: Any
    default: Any
    help: str | None = None
    required: bool = False
    """The command has no default for it: the command line or a file must give it."""
    bounds: Range | None = None
    """An integer option's declared bounds, shown in the help."""

    @property
    def flag(self) -> str:
        return "--" + self.dest

    @property
    def is_bool(self) -> bool:
        return self.hint is bool

    @property
    def item(self) -> type | None:
        """The item type of a list or tuple of plain values (``str`` for ``tuple[str, ...]``),
        optional or not; ``None`` for any other type."""
        hint = self.hint
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(inner) != 1:
                return None
            hint = inner[0]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        sequence = (origin is list and len(args) == 1) or (
            origin is tuple and len(args) == 2 and args[1] is Ellipsis
        )
        return args[0] if sequence and args[0] in (str, int, float) else None


def _docs(obj: Any) -> dict[str, str]:
    """Parameter and attribute docs of a function or a dataclass, by name (a class's own
    first, then what it inherits: ``DirectionSearch``'s shared fields are ``SearchSettings``')."""
    out: dict[str, str] = {}
    for source in reversed(obj.__mro__[:-1]) if inspect.isclass(obj) else [obj]:
        parsed = docstring_parser.parse_from_object(source)
        out |= {p.arg_name: " ".join((p.description or "").split()) for p in parsed.params}
    return out


def entry_help(cls: type) -> str:
    """The fields of an entry of a list setting (``EvalSettings.entries``: an attack) as one
    paragraph of the help: each field, its default, and the first sentence of its doc."""
    docs = _docs(cls)
    parts = []
    for f in dataclasses.fields(cls):
        doc = docs.get(f.name, "").replace("``", "").split(". ")[0].rstrip(".")
        default = "" if f.default is dataclasses.MISSING else f" = {f.default!r}"
        parts.append(f"{f.name}{default}: {doc}")
    return "; ".join(parts) + "."


def is_settings_class(hint: Any) -> bool:
    return inspect.isclass(hint) and dataclasses.is_dataclass(hint)


def group_options(cls: type, prefix: str, instance: Any = None) -> list[Option]:
    """The options of a settings dataclass under ``prefix`` (``""``: at the top); a field that
    is itself a settings dataclass is a group of its own (one level)."""
    hints = typing.get_type_hints(cls)
    declared = typing.get_type_hints(cls, include_extras=True)
    docs = _docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = getattr(instance, f.name) if instance is not None else _default(f)
        dest = f"{prefix}{f.name}"
        if is_settings_class(hints[f.name]) and not prefix:
            out += group_options(hints[f.name], f"{dest}.", default)
        else:
            bounds = range_of(declared[f.name])[0]
            out.append(Option(dest, hints[f.name], default, docs.get(f.name), bounds=bounds))
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def watermark_options(kind: str | None = None) -> list[Option]:
    """The options of ``WatermarkSettings`` with a mark of ``kind`` (``None``: the default
    kind): one per field of each group
    (``--model.lm``), ``--mark.kind`` and the kind's own fields (of ``mark`` and ``search``), ``--key``, ``--allow_weak_key``,
    ``--chat``."""
    kind = kind or default_kind()
    out = []
    for name, group in GROUPS.items():
        if name == "mark":
            out.append(Option("mark.kind", typing.Literal[tuple(MARK_KINDS)], kind, _KIND_HELP))
            group = MARK_KINDS[kind]
        elif name == "search":
            group = MARK_KINDS[kind].search
        out += group_options(group, f"{name}.")
    docs = _docs(WatermarkSettings)
    hints = typing.get_type_hints(WatermarkSettings)
    for name in ("key", "allow_weak_key", "chat"):
        default = WatermarkSettings.__dataclass_fields__[name].default
        out.append(Option(name, hints[name], default, docs.get(name)))
    return out


_KIND_HELP = (
    "the mark: direction (the default) or region (k-SemStamp, SemStamp), or a kind an installed "
    "package registers; another kind replaces "
    "the mark whole, and --help after it lists that kind's fields"
)


@dataclass(frozen=True)
class Parameter:
    """One parameter of a command function and how it is given."""

    name: str
    hint: Any
    default: Any
    help: str | None
    role: str
    """``settings`` (fields at the top), ``group`` (``--name.field``) or ``option``."""
    required: bool = False
    """No default: the command line or a file must give it."""
    bounds: Range = DEFAULT_BOUNDS
    """An integer option's bounds (``Annotated[int, Range(1, 4096)]`` in the signature; else
    what a 64-bit integer holds)."""
    optional: bool = False
    """``None`` is a value of it."""


def parameters(fn: Callable) -> list[Parameter]:
    """The parameters of a command function, in order."""
    hints = typing.get_type_hints(fn)
    declared = typing.get_type_hints(fn, include_extras=True)
    docs = _docs(fn)
    out = []
    for p in inspect.signature(fn).parameters.values():
        hint = hints.get(p.name, Any)
        default = None if p.default is inspect.Parameter.empty else p.default
        group = _optional_class(hint)
        if p.name == "settings":
            role = "settings"
        elif group is not None:
            # A group given as ``name: Settings | None = None``: its defaults when not given.
            role, hint, default = "group", group, default if default is not None else group()
        else:
            role = "option"
        required = p.default is inspect.Parameter.empty and role == "option"
        bounds, optional = range_of(declared.get(p.name, Any))
        out.append(
            Parameter(
                p.name,
                hint,
                default,
                docs.get(p.name),
                role,
                required,
                bounds or DEFAULT_BOUNDS,
                optional,
            )
        )
    return out


def _optional_class(hint: Any) -> type | None:
    """The settings class of ``hint`` (``Settings`` or ``Settings | None``), else ``None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = inner[0] if len(inner) == 1 else None
    return hint if is_settings_class(hint) else None


def options_of(fn: Callable, kind: str | None = None) -> list[Option]:
    """Every option of a command (its settings', its groups', its own) with a mark of ``kind``
    (``None``: the default kind, ``settings.marks.default_kind``)."""
    out = []
    for p in parameters(fn):
        if p.role == "settings":
            out += (
                watermark_options(kind)
                if p.hint is WatermarkSettings
                else group_options(p.hint, "")
            )
        elif p.role == "group":
            out += group_options(p.hint, f"{p.name}.", p.default)
        else:
            bounds = None if p.bounds is DEFAULT_BOUNDS else p.bounds
            out.append(Option(p.name, p.hint, p.default, p.help, p.required, bounds))
    return out
