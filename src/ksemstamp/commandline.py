"""Commands from functions: one way to configure and call every command, the jsonargparse
language that ``train.py`` speaks through LightningCLI.

A command is a function; its signature and docstring are its options, as in litgpt:

* a parameter ``settings: WatermarkSettings`` puts the settings groups at the top of the
  command line and of a settings file: ``--search.max_candidates 8`` and
  ``search: {max_candidates: 8}``, ``--mark.kind region --mark.gamma 0.3``, ``--key``; a
  ``settings`` of another settings class (``EvalSettings``) puts its fields at the top;
* a parameter typed with a settings dataclass is a group of its own:
  ``calibration: CalibrationSettings`` gives ``--calibration.num_keys 50`` and
  ``calibration: {num_keys: 50}``;
* any other parameter is an option, ``--prompt TEXT``, helped by its line of the docstring.

Every command takes ``--config FILE`` (YAML, repeatable: later files win, and flags win over
every file wherever they stand) and ``--print_config``: the merged settings and options as a
complete file that ``--config`` reads back, never the key. A boolean option alone means
``true`` (``--quiet``); a list takes ``a,b``, the flag again or a YAML list. The mark's fields
are those of its kind: ``--mark.kind region`` (or a file's ``mark: {kind: region}``) replaces
the mark whole, and ``--help`` after it lists the region mark's fields.

What can go wrong is one line on stderr and exit status 2 (``CommandLineError``), and no value
that may be the key is repeated in it (``errors``). The spelling of earlier releases
(``--max-new-tokens 40``, ``--no-adaptive-batch``, flat keys in files) is read for one more
release, with a warning naming the new spelling (``legacy``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import docstring_parser
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from .settings import GROUPS, MARK_KINDS, SettingsError, WatermarkSettings
from .settings_files import load_settings_file, unflatten


class CommandLineError(ValueError):
    """A command line or settings that cannot be used; the message is one line."""


class _OptionalText:
    """A ``str | None`` value: the command line's string as typed, a string or null in files.

    jsonargparse would read ``--key '#x'`` or ``--key null`` as YAML, that is as ``None``, and
    silently fall back to another key. The message of a wrong value does not repeat it: the
    value may be the key.
    """

    def __call__(self, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        raise TypeError(f"expected a string or null, got a {type(value).__name__}")

    def __repr__(self) -> str:  # the type shown in the help
        return "str | null"


optional_text = _OptionalText()


# ---------------------------------------------------------------------- what a command takes


@dataclass(frozen=True)
class Option:
    """One flag: its place (``search.max_candidates``), type, default and help."""

    dest: str
    hint: Any
    default: Any
    help: str | None = None

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
    """Parameter and attribute docs of a function or a dataclass, by name."""
    parsed = docstring_parser.parse_from_object(obj)
    return {p.arg_name: " ".join((p.description or "").split()) for p in parsed.params}


def is_settings_class(hint: Any) -> bool:
    return inspect.isclass(hint) and dataclasses.is_dataclass(hint)


def group_options(cls: type, prefix: str, instance: Any = None) -> list[Option]:
    """The options of a settings dataclass under ``prefix`` (``""``: at the top); a field that
    is itself a settings dataclass is a group of its own (one level)."""
    hints = typing.get_type_hints(cls)
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
            out.append(Option(dest, hints[f.name], default, docs.get(f.name)))
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def watermark_options(kind: str) -> list[Option]:
    """The options of ``WatermarkSettings`` with a mark of ``kind``: one per field of each group
    (``--model.lm``), ``--mark.kind`` and the kind's own fields, ``--key``, ``--allow_weak_key``,
    ``--chat``."""
    out = []
    for name, group in GROUPS.items():
        if name == "mark":
            out.append(Option("mark.kind", typing.Literal[tuple(MARK_KINDS)], kind, _KIND_HELP))
            group = MARK_KINDS[kind]
        out += group_options(group, f"{name}.")
    docs = _docs(WatermarkSettings)
    hints = typing.get_type_hints(WatermarkSettings)
    for name in ("key", "allow_weak_key", "chat"):
        default = WatermarkSettings.__dataclass_fields__[name].default
        out.append(Option(name, hints[name], default, docs.get(name)))
    return out


_KIND_HELP = (
    "the mark: direction (the default) or region (k-SemStamp, SemStamp); another kind replaces "
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


def parameters(fn: Callable) -> list[Parameter]:
    """The parameters of a command function, in order."""
    hints = typing.get_type_hints(fn)
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
        out.append(Parameter(p.name, hint, default, docs.get(p.name), role))
    return out


def _optional_class(hint: Any) -> type | None:
    """The settings class of ``hint`` (``Settings`` or ``Settings | None``), else ``None``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = inner[0] if len(inner) == 1 else None
    return hint if is_settings_class(hint) else None


def options_of(fn: Callable, kind: str = "direction") -> list[Option]:
    """Every option of a command (its settings', its groups', its own)."""
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
            out.append(Option(p.name, p.hint, p.default, p.help))
    return out


# ---------------------------------------------------------------------- the parser


def build_parser(fn: Callable, prog: str, kind: str = "direction") -> ArgumentParser:
    """The jsonargparse parser of command ``fn`` (with a mark of ``kind``)."""
    doc = docstring_parser.parse_from_object(fn)
    description = "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)
    parser = ArgumentParser(
        prog=prog,
        description=description or None,
        exit_on_error=False,
        print_config=None,
        env_prefix=False,
        default_env=False,
    )
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="YAML settings file (repeatable: later files win, flags win over every file)",
    )
    parser.add_argument(
        "--print_config",
        action="store_true",
        help="print the settings and options as a file --config reads back (never the key)",
    )
    groups: dict[str, Any] = {}
    for option in options_of(fn, kind):
        head = option.dest.split(".")[0] if "." in option.dest else ""
        if head and head not in groups:
            groups[head] = parser.add_argument_group(f"{head}: {_group_title(fn, head)}")
        target = groups.get(head, parser)
        hint = optional_text if option.hint == (str | None) else option.hint
        target.add_argument(option.flag, type=hint, default=option.default, help=option.help)
    return parser


def _group_title(fn: Callable, head: str) -> str:
    """The first line of a group's docstring."""
    cls = None
    for p in parameters(fn):
        if p.role == "group" and p.name == head:
            cls = p.hint
        elif p.role == "settings" and p.hint is WatermarkSettings and head in GROUPS:
            cls = GROUPS[head]
        elif p.role == "settings" and is_settings_class(p.hint):
            hint = typing.get_type_hints(p.hint).get(head)
            cls = hint if is_settings_class(hint) else cls
    doc = (cls.__doc__ or "").strip().split("\n\n")[0] if cls is not None else ""
    return " ".join(doc.split()) if head != "mark" else "what the key asks of a sentence"


# ---------------------------------------------------------------------- the command line


@dataclass
class Invocation:
    """A parsed command line: the function's arguments, built and checked."""

    fn: Callable
    kwargs: dict[str, Any]
    values: dict[str, Any]
    """Every option as parsed, in the file's form (for ``--print_config``)."""
    print_config: bool
    argv: list[str]

    def printed_config(self) -> str:
        """The settings and options as YAML, in the form ``--config`` reads; never the key."""
        data = dict(self.values)
        data.pop("key", None)
        settings = self.kwargs.get("settings")
        if isinstance(settings, WatermarkSettings):
            data.update(settings.to_dict())
        return yaml.safe_dump(_plain(data), sort_keys=False)


def _plain(value: Any) -> Any:
    """A value YAML can write: tuples as lists, throughout."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def parse(fn: Callable, argv: Sequence[str], prog: str) -> Invocation:
    """Parse ``argv`` (the command's part) into ``fn``'s arguments; raises ``CommandLineError``
    (``--help`` prints the help and exits with 0)."""
    from .legacy import modernise

    argv = list(argv)
    options = {o.dest: o for kind in MARK_KINDS for o in options_of(fn, kind)}
    takes_watermark = any(p.hint is WatermarkSettings for p in parameters(fn))
    try:
        tokens = modernise(argv, options, takes_watermark)
        files, kind, rest = _layers(tokens, takes_watermark)
        rest = _normalise(rest, {o.flag: o for o in options.values()})
        parser = build_parser(fn, prog, kind)
        config = [a for layer in files for a in ("--config", yaml.safe_dump(layer))]
        namespace = parser.parse_args(config + rest)
    except (ValueError, TypeError, OSError) as err:
        raise CommandLineError(one_line(err)) from None
    except Exception as err:  # jsonargparse's ArgumentError
        if type(err).__name__ != "ArgumentError":
            raise
        raise CommandLineError(one_line(err)) from None
    values = namespace.as_dict()
    print_config = bool(values.pop("print_config", False))
    values.pop("config", None)
    try:
        kwargs = build(fn, values)
    except (SettingsError, ValueError, TypeError) as err:
        raise CommandLineError(one_line(err)) from None
    return Invocation(fn, kwargs, values, print_config, argv)


def build(fn: Callable, values: dict[str, Any]) -> dict[str, Any]:
    """``fn``'s arguments from parsed ``values`` (the file's form): the settings and the groups
    built, each checked; every problem named by its flag."""
    kwargs: dict[str, Any] = {}
    problems: list[str] = []
    taken: set[str] = set()
    for p in parameters(fn):
        try:
            if p.role == "settings" and p.hint is WatermarkSettings:
                own = {*GROUPS, "key", "allow_weak_key", "chat"}
                kwargs[p.name] = WatermarkSettings.from_dict({k: values[k] for k in own})
                taken |= own
            elif p.role == "settings":
                names = [f.name for f in dataclasses.fields(p.hint) if f.init]
                kwargs[p.name] = _build_class(p.hint, {k: values[k] for k in names}, "")
                taken |= set(names)
            elif p.role == "group":
                kwargs[p.name] = _build_class(p.hint, values[p.name], f"{p.name}.")
                taken.add(p.name)
            else:
                kwargs[p.name] = values[p.name]
        except SettingsError as err:
            problems += err.problems
    if problems:
        raise SettingsError("invalid settings", [_named(p) for p in problems])
    return kwargs


def _build_class(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """``cls`` from ``data``; its ``ValueError`` becomes a ``SettingsError`` whose problems
    start with their place (``calibration.num_keys must be >= 2``)."""
    hints = typing.get_type_hints(cls)
    data = {
        k: _build_class(hints[k], v, f"{prefix}{k}.") if is_settings_class(hints[k]) else v
        for k, v in data.items()
    }
    try:
        return cls(**data)
    except SettingsError as err:
        raise SettingsError("invalid settings", [f"{prefix}{p}" for p in err.problems]) from None
    except ValueError as err:
        lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        lines = lines or [str(err)]
        raise SettingsError("invalid settings", [f"{prefix}{line}" for line in lines]) from None


def _named(problem: str) -> str:
    """A problem that starts with a setting's place, with its flag beside it."""
    head, _, tail = problem.partition(" ")
    if head and all(part.isidentifier() for part in head.split(".")):
        return f"{head} (--{head}) {tail}"
    return problem


def _layers(tokens: list[str], takes_watermark: bool) -> tuple[list[dict], str, list[str]]:
    """The ``--config`` files of ``tokens`` (read, in order) and ``--mark.kind`` as layers for
    the parser, the mark's final kind, and the other tokens.

    A change of kind replaces the mark whole (``settings_files.merge``): the ``mark`` of a layer
    before the last change is dropped, and the parser takes the fields of the final kind only.
    """
    layers: list[dict] = []
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        name, eq, inline = tokens[i].partition("=")
        if name in ("--config", "--mark.kind") and (eq or i + 1 < len(tokens)):
            value = inline if eq else tokens[i + 1]
            i += 1 if eq else 2
            if name == "--config":
                data = load_settings_file(value)
                layers.append(unflatten(data, value) if takes_watermark else data)
            else:
                layers.append({"mark": {"kind": value}})
            continue
        rest.append(tokens[i])
        i += 1
    kind, start = next(iter(MARK_KINDS)), 0
    for n, layer in enumerate(layers if takes_watermark else []):
        mark = layer.get("mark")
        if isinstance(mark, dict) and mark.get("kind", kind) != kind:
            kind, start = mark["kind"], n
    if kind not in MARK_KINDS:
        raise ValueError(f"mark.kind must be one of {list(MARK_KINDS)}, not {kind!r}")
    if takes_watermark:
        layers = [
            {k: v for k, v in layer.items() if k != "mark"} if n < start else layer
            for n, layer in enumerate(layers)
        ]
    return layers, kind, rest


def _normalise(tokens: list[str], options: dict[str, Option]) -> list[str]:
    """A boolean flag alone becomes ``FLAG true``; a list flag's occurrences (``--x a,b --x c``)
    become one JSON list at the first one's place (a YAML list ``'[a, b]'`` is taken as it is)."""
    out: list[str] = []
    lists: dict[str, list] = {}
    i = 0
    while i < len(tokens):
        name, eq, inline = tokens[i].partition("=")
        option = options.get(name)
        has_value = bool(eq) or (i + 1 < len(tokens) and not tokens[i + 1].startswith("--"))
        if option is not None and option.is_bool and not has_value:
            out += [name, "true"]
            i += 1
            continue
        if option is not None and option.item is not None and has_value:
            value = inline if eq else tokens[i + 1]
            i += 1 if eq else 2
            if name not in lists:
                lists[name] = []
                out.append(name)  # its place; the value is filled in below
            lists[name] += _list_items(value, option.item)
            continue
        out.append(tokens[i])
        i += 1
    return [
        f"{t}={json.dumps(lists.pop(t))}" if t in lists and t.startswith("--") else t for t in out
    ]


def _list_items(value: str, item: type) -> list:
    if value.lstrip().startswith("["):
        loaded = yaml.safe_load(value)
        if isinstance(loaded, list):
            return loaded
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return parts if item is str else [yaml.safe_load(p) for p in parts]


def one_line(err: BaseException) -> str:
    """``err``'s message on one line, each setting named by its place and its flag.

    jsonargparse's messages span lines, name a setting ``Parser key "sampling.seed"`` and a type
    ``<class 'float'>``; the settings list one problem a line.
    """
    message = ""
    for line in (" ".join(line.split()) for line in str(err).splitlines()):
        if line:
            message += ("" if not message else " " if message.endswith(":") else "; ") + line
    message = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    return re.sub(r'Parser key "([\w.]+)":', lambda m: f"{m[1]} (--{m[1]}):", message)


ARGV: list[str] = []
"""The command line of the command being run (``calibrate`` records it, the key hidden)."""


def call(fn: Callable, argv: Sequence[str], prog: str) -> int:
    """Parse ``argv`` for command ``fn`` and call it, or print its settings (``--print_config``).

    A bad command line is one line on stderr and ``SystemExit(2)``; settings that fail only
    once objects are built (gamma * K, centroid files, encoders) and unusable files are one line
    and status 2. The library's log and warnings show on stderr while it runs
    (``console_output``).
    """
    from .assets import AssetError

    argv = list(argv)
    if getattr(fn, "takes_argv", False):
        return fn(argv)
    with console_output():
        try:
            invocation = parse(fn, argv, prog)
        except CommandLineError as err:
            known = sorted({o.flag for o in options_of(fn)} | {"--config", "--print_config"})
            print(f"{prog}: error: {hide_secrets(str(err), argv, known)}", file=sys.stderr)
            raise SystemExit(2) from None
        if invocation.print_config:
            print(invocation.printed_config(), end="")
            return 0
        if invocation.kwargs.get("quiet"):
            quiet_model_loading()
        ARGV[:] = argv
        try:
            return fn(**invocation.kwargs)
        except (ValueError, FileNotFoundError, AssetError) as err:
            # Messages never hold the key; the key's value is blanked all the same.
            print("error: " + hide_secrets(" ".join(str(err).split()), argv), file=sys.stderr)
            return 2
        except OSError as err:
            # An output that is read-only, a folder, or on a full disk: what and where.
            where = f"{err.filename}: " if err.filename else ""
            print(f"error: {where}{err.strerror or err}", file=sys.stderr)
            return 2


def quiet_model_loading() -> None:
    """No progress bars while models load (transformers' and the Hugging Face Hub's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


class _StderrHandler(logging.Handler):
    """Log records as plain lines on the current ``sys.stderr`` (tests capture it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


@contextmanager
def console_output() -> Iterator[None]:
    """While a command runs: the library's log on stderr, one plain line each, and warnings
    as one ``warning:`` line each (a deprecated spelling, the demo key)."""
    package = logging.getLogger("ksemstamp")
    if any(isinstance(h, _StderrHandler) for h in package.handlers):
        yield  # already set up by an outer command
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = package.level, package.propagate
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"warning: {message}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
        package.removeHandler(handler)
        package.setLevel(level)
        package.propagate = propagate


# ---------------------------------------------------------------------- errors without secrets

UNRECOGNIZED = "unrecognized arguments:"


def hide_secrets(message: str, argv: Sequence[str], known: Sequence[str] = ()) -> str:
    """``message`` without any value that may be the key.

    Arguments the parser did not know are named by their flags only, each with the closest
    flag of ``known``: the value after a mistyped ``--kye`` is most likely the key. The value of
    ``--key`` and ``$KSEMSTAMP_KEY`` are blanked wherever else they appear (a key given under
    another flag by mistake is quoted in that flag's message).
    """
    import os

    from .keys import KEY_ENV

    head, found, listed = message.partition(UNRECOGNIZED)
    if found:
        message = head + UNRECOGNIZED + " " + _unrecognized(listed.strip(), argv, known)
    secrets = {os.environ.get(KEY_ENV) or ""}
    for i, token in enumerate(argv):
        if token == "--key" and i + 1 < len(argv):
            secrets.add(argv[i + 1])
        elif token.startswith("--key="):
            secrets.add(token.removeprefix("--key="))
    # A short key is refused as weak anyway; blanking a letter or two would garble messages.
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        message = message.replace(secret, "***")
    return message


def _unrecognized(listed: str, argv: Sequence[str], known: Sequence[str]) -> str:
    """The unknown arguments ``listed`` (space-separated, in command-line order): their flags
    with a suggestion each, and how many values went with them, none shown."""
    import difflib

    taken, pos = [], 0
    for token in argv:
        end = pos + len(token)
        if listed.startswith(token, pos) and (end == len(listed) or listed[end] == " "):
            taken.append(token)
            pos = end + 1
    if pos < len(listed):  # not the tokens of this command line: show none of it
        return "(not shown: one may be the key)"
    parts, values = [], 0
    for token in taken:
        name, eq, _ = token.partition("=")
        if not name.startswith("-"):
            values += 1
            continue
        values += bool(eq)
        close = difflib.get_close_matches(name, list(known), n=1)
        parts.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    if values:
        parts.append(f"{values} value{'s' if values > 1 else ''}")
    return ", ".join(parts) + "; values are not shown, as one may be the key"
