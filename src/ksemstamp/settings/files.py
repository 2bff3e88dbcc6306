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

from .groups import MARK_KINDS
from .watermark import WatermarkSettings, merge


def load_settings_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML settings file into a dict, as it is written.

    A YAML syntax error is re-raised as a ``ValueError`` naming only the file and position:
    PyYAML's own message quotes the offending line, which may hold the secret key.
    """
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ValueError(f"{path}: YAML error{where}: {problem}") from None
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
        raise ValueError(f"mark.kind must be one of {list(MARK_KINDS)}, not {kind!r}")
    if takes_watermark:
        layers = [
            {k: v for k, v in layer.items() if k != "mark"} if n < start else layer
            for n, layer in enumerate(layers)
        ]
    return layers, kind, rest
