"""Commands from functions: one way to configure and call every command, the jsonargparse
language that ``train.py`` speaks through LightningCLI.

A command is a function; its signature and docstring are its options (``options``): the
settings groups at the top (``--search.max_candidates 8``), a group per settings dataclass
(``--calibration.num_keys 50``) and an option per other parameter (``--prompt TEXT``). Here
they become a parser (``build_parser``), and a command line the function's arguments
(``parse``, ``build``).

Every command takes ``--config FILE`` (YAML, repeatable: later files win, and flags win over
every file wherever they stand) and ``--print_config``: the merged settings and options as a
complete file that ``--config`` reads back, never the key. A boolean option alone means
``true`` (``--quiet``); a list takes ``a,b``, the flag again or a YAML list. The mark's fields
are those of its kind: ``--mark.kind region`` (or a file's ``mark: {kind: region}``) replaces
the mark whole, and ``--help`` after it lists the region mark's fields.

A command line that cannot be used raises ``CommandLineError`` with a one-line message; how
that message reaches a terminal without the key is ``console``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import docstring_parser
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

from ..settings.files import check_aliases, command_line_layers, load_yaml
from ..settings.groups import MARK_KINDS
from ..settings.watermark import GROUPS, SettingsError, WatermarkSettings
from .options import Option, entry_help, is_settings_class, options_of, parameters


class CommandLineError(ValueError):
    """A command line or settings that cannot be used (``console.one_line`` puts the message
    on one line)."""


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

NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.I)
"""What a command line value that starts with ``-`` must look like to be read as a number."""


# ---------------------------------------------------------------------- the parser


GENERATION_GROUPS = ("search", "sampling", "engine")
"""The settings only generation reads: a command that does not generate takes them (a shared
settings file holds them) but its ``--help`` leaves them to ``--help_all``."""


def reads_no_generation(fn: Callable) -> Callable:
    """Mark command ``fn`` as one that never generates (see ``GENERATION_GROUPS``)."""
    fn.hidden_groups = GENERATION_GROUPS  # type: ignore[attr-defined]
    return fn


def build_parser(
    fn: Callable, prog: str, kind: str | None = None, full: bool = False
) -> ArgumentParser:
    """The jsonargparse parser of command ``fn`` (with a mark of ``kind``; ``None``: the
    default kind); ``full``: its help lists every option, those the command does not read
    too."""
    doc = docstring_parser.parse_from_object(fn)
    description = "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)
    hidden = () if full else getattr(fn, "hidden_groups", ())
    if hidden:
        description += (
            f"\n\nThe {', '.join(hidden)} settings, read only where text is generated, are "
            "taken but not listed here: --help_all lists every option."
        )
    parser = ArgumentParser(
        prog=prog,
        description=description or None,
        exit_on_error=False,
        print_config=None,
        env_prefix=False,
        default_env=False,
    )
    # argparse reads only -1 and -.5 as numbers; -inf, -1e-3 and -nan would be taken for
    # options ("expected one argument") instead of reaching the setting's bounds check.
    parser._negative_number_matcher = NEGATIVE_NUMBER
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
        if head in hidden:
            given = {"required": True} if option.required else {"default": option.default}
            hint = optional_text if option.hint == (str | None) else option.hint
            parser.add_argument(option.flag, type=hint, help=argparse.SUPPRESS, **given)
            continue
        if head and head not in groups:
            groups[head] = parser.add_argument_group(group_heading(head, _group_title(fn, head)))
        target = groups.get(head, parser)
        hint = optional_text if option.hint == (str | None) else option.hint
        given = {"required": True} if option.required else {"default": option.default}
        shown = option.help
        if option.bounds is not None:
            shown = f"{shown or ''} ({option.bounds.low:,} to {option.bounds.high:,})".strip()
        target.add_argument(option.flag, type=hint, help=shown, **given)
    for p in parameters(fn):
        for name, entry in getattr(p.hint, "entries", {}).items() if p.role == "settings" else ():
            parser.add_argument_group(
                f"an entry of --{name} ({name}: in a file)", entry_help(entry)
            )
    return parser


def group_heading(head: str, title: str) -> str:
    """A group's heading in the help: ``model (the generator, ...)``, to which argparse adds
    its colon (a title's own full stop would read ``...run.:``); the title's first sentence,
    without what it puts in brackets."""
    title = title.split(". ")[0].split(" (")[0].rstrip(". ")
    if title[:1].isupper() and not title[1:2].isupper():
        title = title[0].lower() + title[1:]
    return f"{head} ({title})" if title else head


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
        return yaml.safe_dump(plain_values(data), sort_keys=False)


def plain_values(value: Any) -> Any:
    """A value YAML can write: tuples as lists, throughout."""
    if isinstance(value, list | tuple):
        return [plain_values(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_values(v) for k, v in value.items()}
    return value


def parse(fn: Callable, argv: Sequence[str], prog: str) -> Invocation:
    """Parse ``argv`` (the command's part) into ``fn``'s arguments; raises ``CommandLineError``
    (``--help`` prints the help and exits with 0)."""
    argv = list(argv)
    options = {o.dest: o for kind in MARK_KINDS for o in options_of(fn, kind)}
    takes_watermark = any(p.hint is WatermarkSettings for p in parameters(fn))
    try:
        files, kind, rest = command_line_layers(argv, takes_watermark)
        for n, token in enumerate(rest):
            flag, eq, value = token.partition("=")
            if flag.startswith("--") and eq:
                check_aliases(value, f"the value of {flag}")
            elif not token.startswith("--") and n:
                check_aliases(token, f"the value of {rest[n - 1]}")
        rest = _normalise(rest, {o.flag: o for o in options.values()})
        if "--help_all" in rest:
            build_parser(fn, prog, kind, full=True).print_help()
            raise SystemExit(0)
        parser = build_parser(fn, prog, kind)
        config = [a for layer in files for a in ("--config", yaml.safe_dump(layer))]
        namespace = parser.parse_args(config + rest)
    except (ValueError, TypeError, OSError) as err:
        raise CommandLineError(str(err)) from None
    except Exception as err:  # jsonargparse's ArgumentError
        if type(err).__name__ != "ArgumentError":
            raise
        raise CommandLineError(str(err)) from None
    values = namespace.as_dict()
    print_config = bool(values.pop("print_config", False))
    values.pop("config", None)
    try:
        kwargs = build(fn, values)
    except (SettingsError, ValueError, TypeError) as err:
        raise CommandLineError(str(err)) from None
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
                problems += p.bounds.problems(p.name, values[p.name], p.optional)
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
        loaded = load_yaml(value, "a list option's value")
        if isinstance(loaded, list):
            return loaded
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return parts if item is str else [load_yaml(p, "a list option's item") for p in parts]
