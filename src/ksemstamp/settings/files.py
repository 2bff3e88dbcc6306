"""Settings files: reading them and layering them.

A settings file holds the groups of ``WatermarkSettings`` as mappings (``configs/ksemstamp.yaml``)
and, for a command, that command's own options and groups beside them. Several files layer
(``--config a.yaml --config b.yaml``, an evaluation's ``watermark_configs``): a later file wins
field by field, and a ``mark`` of another ``kind`` replaces the mark whole, so that the fields
of the other kind are gone (``merge``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .checks import SettingsError
from .groups import MARK_KINDS
from .marks import load_mark_plugins, search_owners
from .search import own_values
from .watermark import WatermarkSettings, merge

MAX_FILE_BYTES = 1 << 20
"""Largest settings file read (1 MiB; the shipped ones are under 10 KiB)."""
MAX_YAML_NODES = 100_000
"""Most values a settings file (or a YAML value on the command line) may hold once its
aliases are expanded: an alias repeats what its anchor names, so nine lines of aliases can
stand for billions of values (an "alias bomb"), expanded by whatever walks them next."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting what each alias stands for (``MAX_YAML_NODES``)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.expanded = 0
        self.sizes: dict[int, int] = {}

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        alias = self.check_event(yaml.AliasEvent)
        node = super().compose_node(parent, index)
        # A node of its own is counted once here (its children as they are composed); an
        # alias counts all it stands for.
        self.expanded += self._size(node) if alias else 1
        if self.expanded > MAX_YAML_NODES:
            raise _TooLarge
        return node

    def _size(self, node: yaml.Node) -> int:
        """Values ``node`` holds once expanded (aliases within it counted whole)."""
        known = self.sizes.get(id(node))
        if known is None:
            children = node.value if isinstance(node.value, list) else []
            flat = [n for c in children for n in (c if isinstance(c, tuple) else (c,))]
            known = 1 + sum(self._size(n) for n in flat)
            self.sizes[id(node)] = known
        return known

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        """A mapping, refusing a key given twice (YAML would keep the last one silently)."""
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    continue  # a complex key: PyYAML's own rules
                if key in seen:
                    raise _Duplicate(str(key), key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _TooLarge(Exception):
    pass


class _Duplicate(Exception):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(key, line)
        self.key, self.line = key, line


def load_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing aliases that expand past ``MAX_YAML_NODES`` values;
    a ``ValueError`` names ``source`` (never quoting the text: it may hold the key)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _TooLarge:
        raise ValueError(
            f"{source}: its YAML aliases expand to more than {MAX_YAML_NODES:,} values "
            "(settings are small: write them out)"
        ) from None
    except _Duplicate as twice:
        raise ValueError(
            f"{source}: {twice.key!r} is given twice in one mapping (again at line "
            f"{twice.line}); YAML would keep the last silently: give it once"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ValueError(f"{source}: YAML error{where}: {problem}") from None
    finally:
        loader.dispose()


def check_aliases(text: str, source: str) -> None:
    """Raise ``load_yaml``'s ``ValueError`` when ``text``, read as YAML, holds aliases that
    expand past ``MAX_YAML_NODES`` values; text that is not YAML passes (a command line's
    values are read as YAML by the parser when their type is not text)."""
    if "*" not in text:  # no alias
        return
    try:
        load_yaml(text, source)
    except ValueError as err:
        if "aliases expand" in str(err):  # not YAML errors: the value may be plain text
            raise


def load_settings_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML settings file into a dict, as it is written.

    Refused with a ``ValueError`` naming the file: a file over ``MAX_FILE_BYTES``, one that is
    not UTF-8, aliases that expand past ``MAX_YAML_NODES`` values (``load_yaml``), and a YAML
    syntax error, told by position only (PyYAML's own message quotes the offending line, which
    may hold the secret key).
    """
    path = Path(path)
    with path.open("rb") as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_FILE_BYTES:,} bytes; a settings file is small")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {err.start}); save the settings file as UTF-8"
        ) from None
    data = load_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    return data


def resolve_path(name: str | Path) -> Path:
    """A settings file named relative to the working directory, else to the checkout."""
    from .groups import REPO_ROOT

    path = Path(name)
    return path if path.exists() or path.is_absolute() else REPO_ROOT / path


def load_watermark_settings(
    paths: Iterable[str | Path], overrides: Mapping[str, Any] | None = None
) -> WatermarkSettings:
    """``WatermarkSettings`` from settings files, later ones winning, and ``overrides`` (the
    file's form) on top."""
    data: dict[str, Any] = {}
    for path in paths:
        data = merge(data, load_settings_file(resolve_path(path)))
    if overrides:
        data = merge(data, dict(overrides))
    return WatermarkSettings.from_dict(data)


def command_line_layers(
    tokens: list[str], takes_watermark: bool
) -> tuple[list[dict], str, list[str]]:
    """The ``--config`` files of a command line's ``tokens`` (read, in order) and its
    ``--mark.kind`` as layers for the parser, the mark's final kind, and the other tokens;
    ``takes_watermark``: the command takes the watermark settings.

    A change of kind replaces the mark whole (``merge``): the ``mark`` of a layer
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
                layers.append(load_settings_file(value))
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
        load_mark_plugins()
    if kind not in MARK_KINDS:
        raise ValueError(f"mark.kind must be one of {list(MARK_KINDS)}, not {kind!r}")
    if takes_watermark:
        layers = [
            {k: v for k, v in layer.items() if k != "mark"} if n < start else layer
            for n, layer in enumerate(layers)
        ]
        layers = [_own_search(layer, kind) for layer in layers]
    return layers, kind, rest


def _own_search(layer: dict, kind: str) -> dict:
    """``layer`` with only the ``search`` fields a ``kind`` mark has: another kind's at their
    default are dropped (``configs/ksemstamp.yaml`` under ``--mark.kind region``), one given
    another value is a ``SettingsError`` naming the mark that reads it."""
    search = layer.get("search")
    if not isinstance(search, dict):
        return layer
    kept, problems = own_values(MARK_KINDS[kind].search, search, kind, search_owners())
    if problems:
        raise SettingsError("invalid settings", problems)
    return {**layer, "search": kept}
