"""Settings dataclasses as dashed jsonargparse flags, the way the research and benchmark commands
spell them (``python -m research.study sweep --contexts-per-doc 14``).

The package's own commands speak the grouped language of ``commandline`` instead
(``--search.max_candidates 8``); this module serves the repository's research and benchmark
scripts, which are not part of the package's interface.

``SettingsGroup`` gives every field of a settings dataclass a flag, so that a new field needs no
edit anywhere else: dashes for underscores (``max_new_tokens`` is ``--max-new-tokens``), a
boolean as a pair (``--adaptive-batch`` / ``--no-adaptive-batch``), a ``str | None`` as typed,
and a list of plain values as ``a,b``, the flag again (``--x a --x b``) or a YAML list. Settings
files use the field names (``max_new_tokens: 200``); ``SettingsFile`` reads them.

jsonargparse parses and checks every value by its type hint and reads the files. Its
``add_class_arguments`` is not used because it spells flags ``--max_new_tokens`` and booleans
``--adaptive_batch true``, while the documented command line is ``--max-new-tokens`` and
``--no-adaptive-batch``; ``SettingsGroup.add_to`` is the few lines that differ, and
``normalise_argv`` turns the documented list and ``--config`` conventions into jsonargparse's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docstring_parser
import yaml
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, Namespace

from .commandline import optional_text, plain_values  # YAML-ready values; a str | None as typed
from .settings_files import load_settings_file

SECRET_FIELDS = frozenset({"key"})
"""Settings never printed and never echoed in an error message."""


def _list_item_type(hint: Any) -> type | None:
    """``str`` for ``list[str]`` or ``tuple[str, ...]`` (likewise int, float); else ``None``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    sequence = (origin is list and len(args) == 1) or (
        origin is tuple and len(args) == 2 and args[1] is Ellipsis
    )
    return args[0] if sequence and args[0] in (str, int, float) else None


def _is_optional_text(hint: Any) -> bool:
    return set(typing.get_args(hint)) == {str, type(None)}


@dataclass(frozen=True)
class SettingsGroup:
    """The flags of one settings dataclass in a subcommand, and the way back to an instance.

    ``rename`` gives a field another flag and file key where two dataclasses of one command
    share a field name (``CalibrationSettings.seed`` is ``--calibration-seed`` beside the
    sampling ``--seed``) or where the documented flag says it better.
    """

    cls: type
    title: str
    rename: Mapping[str, str] = field(default_factory=dict)

    def dests(self) -> dict[str, str]:
        """Field name -> flag name as in files (``max_new_tokens``)."""
        return {f.name: self.rename.get(f.name, f.name) for f in dataclasses.fields(self.cls)}

    def list_flags(self) -> dict[str, type]:
        """Option strings of the list settings of plain values, with their item type."""
        hints = typing.get_type_hints(self.cls)
        out = {}
        for name, dest in self.dests().items():
            item = _list_item_type(hints[name])
            if item is not None:
                out[flag(dest)] = item
        return out

    def add_to(self, parser: ArgumentParser) -> None:
        """One flag per field, typed by its hint, helped by its docstring."""
        hints = typing.get_type_hints(self.cls)
        docs = {
            p.arg_name: p.description for p in docstring_parser.parse_from_object(self.cls).params
        }
        group = parser.add_argument_group(self.title)
        for f in dataclasses.fields(self.cls):
            dest = self.rename.get(f.name, f.name)
            hint = hints[f.name]
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            kwargs: dict[str, Any] = {"dest": dest, "default": default, "help": docs.get(f.name)}
            if hint is bool:
                kwargs["action"] = ActionYesNo(no_prefix="no-")
            elif _is_optional_text(hint):
                kwargs["type"] = optional_text
                kwargs["metavar"] = "TEXT"
            else:
                kwargs["type"] = hint
            group.add_argument(flag(dest), **kwargs)

    def build(self, args: Namespace) -> Any:
        """The dataclass from the parsed values.

        The dataclass checks itself and raises ``ValueError`` with one problem a line, each
        starting with the field's name; the flag is named beside it (``num_keys (--num-keys)
        must be >= 2``), as in jsonargparse's messages.
        """
        dests = self.dests()
        values = {}
        for name, dest in dests.items():
            value = args[dest]
            values[name] = value.as_dict() if isinstance(value, Namespace) else value
        try:
            return self.cls(**values)
        except ValueError as err:
            named = re.sub(
                r"^(\s*)(\w+)\b",
                lambda m: m[0] + f" ({flag(dests[m[2]])})" if m[2] in dests else m[0],
                str(err),
                flags=re.MULTILINE,
            )
            raise ValueError(named) from None

    def dump(self, settings: Any) -> dict[str, Any]:
        """The settings under their file keys, secrets left out, tuples as lists."""
        return {
            dest: plain_values(getattr(settings, name))
            for name, dest in self.dests().items()
            if name not in SECRET_FIELDS
        }


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class SettingsFile(ActionConfigFile):
    """``--config FILE``: jsonargparse's config file, with YAML errors told by file and line.

    PyYAML's own messages may quote the offending line, and that line may hold the key;
    ``load_settings_file`` names only the file and the position.
    """

    def __call__(self, parser, cfg, values, option_string=None):
        if Path(values).is_file():
            load_settings_file(values)
        super().__call__(parser, cfg, values, option_string)


def normalise_argv(
    argv: Sequence[str], list_flags: Mapping[str, type], command: str | None = None
) -> list[str]:
    """The documented command line in the form jsonargparse parses.

    ``--config`` files move to the front (after ``command``, the subcommand), in their order,
    so that flags win over every file wherever they stand. A list flag's occurrences (``--x a,b --x c``) become one JSON list
    (``--x=["a", "b", "c"]``) at the first one's place; a YAML list (``--x '[a, b]'``) is
    taken as it is.
    """
    configs: list[str] = []
    rest: list[str] = []
    lists: dict[str, list] = {}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, inline = token.partition("=")
        takes_value = name == "--config" or name in list_flags
        if takes_value and not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value, i = tokens[i + 1], i + 2
        elif takes_value and eq:
            value, i = inline, i + 1
        else:
            rest.append(token)
            i += 1
            continue
        if name == "--config":
            configs += ["--config", value]
        else:
            if name not in lists:
                lists[name] = []
                rest.append(name)  # its place; the value is filled in below
            lists[name] += _list_items(value, list_flags[name])
    out = []
    for token in rest:
        if token in lists:
            out.append(f"{token}={json.dumps(lists.pop(token))}")
        else:
            out.append(token)
    head = out.index(command) + 1 if command in out else 0
    return out[:head] + configs + out[head:]


def _list_items(value: str, item: type) -> list:
    if value.lstrip().startswith("["):
        loaded = yaml.safe_load(value)
        if isinstance(loaded, list):
            return loaded
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return parts if item is str else [yaml.safe_load(p) for p in parts]


def one_line(err: BaseException) -> str:
    """``err``'s message on one line, each setting named by its file key and its flag.

    jsonargparse's messages span lines, name a setting ``Parser key "max_new_tokens"`` and a
    type ``<class 'float'>``; the dataclasses list one problem a line.
    """
    message = ""
    for line in (" ".join(line.split()) for line in str(err).splitlines()):
        if line:
            message += ("" if not message else " " if message.endswith(":") else "; ") + line
    message = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    return re.sub(r'Parser key "(\w+)":', lambda m: f"{m[1]} ({flag(m[1])}):", message)
