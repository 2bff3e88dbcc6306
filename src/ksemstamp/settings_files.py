"""Settings files: reading them, layering them, and the flat spelling of earlier releases.

A settings file holds the groups of ``WatermarkSettings`` as mappings (``configs/ksemstamp.yaml``)
and, for a command, that command's own options and groups beside them. Several files layer
(``--config a.yaml --config b.yaml``, an evaluation's ``watermark_configs``): a later file wins
field by field, and a ``mark`` of another ``kind`` replaces the mark whole, so that the fields
of the other kind are gone (``merge``).

Releases before the groups wrote every setting at the top level (``max_candidates: 32``,
``mark: region``, ``gamma: 0.25``). Such a file still loads, for one more release: its keys are
moved to their group (``FLAT_KEYS``) and a warning names each new spelling. Fields of the mark
that the file's kind does not have are left out (they never applied to it).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .settings import GROUPS, MARK_KINDS, WatermarkSettings, merge

RENAMED = {
    "partition": "partition.kind",
    "mark": "mark.kind",
    "sampler_strategy": "search.strategy",
}
"""Flat keys whose field has another name in its group."""


GROUPED_ONLY = frozenset({"mark.units", "mark.clause_words"})
"""Fields added after the flat files: they have no flat key to carry forward."""


def _flat_keys() -> dict[str, str]:
    keys = dict(RENAMED)
    groups = [(name, cls) for name, cls in GROUPS.items() if name != "mark"]
    groups += [("mark", cls) for cls in MARK_KINDS.values()]
    for name, cls in groups:
        for f in dataclasses.fields(cls):
            place = f"{name}.{f.name}"
            if f.init and place not in RENAMED.values() and place not in GROUPED_ONLY:
                keys.setdefault(f.name, place)
    return keys


FLAT_KEYS: dict[str, str] = _flat_keys()
"""Flat key of the earlier releases -> its place in the groups (``max_candidates`` ->
``search.max_candidates``)."""
DEPRECATION = "flat settings keys load until the next release"


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


def is_flat(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is written in the flat spelling: a key that is a flat setting and not a
    group, or a group name holding a plain value (``mark: region``)."""
    return any(
        (key in FLAT_KEYS and key not in GROUPS) or (key in GROUPS and not isinstance(v, dict))
        for key, v in data.items()
        if key not in ("key", "allow_weak_key", "chat")
    )


def unflatten(data: Mapping[str, Any], source: str = "settings") -> dict[str, Any]:
    """``data`` with its flat watermark keys moved into their groups (others kept as they are),
    and a ``FutureWarning`` naming each new spelling. Mark fields that ``data``'s kind of mark
    does not have are dropped."""
    if not is_flat(data):
        return dict(data)
    out: dict[str, Any] = {}
    moved = []
    kind = data.get("mark") if isinstance(data.get("mark"), str) else None
    fields_of_kind = (
        {f.name for f in dataclasses.fields(MARK_KINDS[kind])} if kind in MARK_KINDS else None
    )
    for key, value in data.items():
        target = FLAT_KEYS.get(key)
        if (
            target is None
            or key in ("key", "allow_weak_key", "chat")
            or (key in GROUPS and isinstance(value, dict))
        ):
            out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
            continue
        group, name = target.split(".")
        if group == "mark" and fields_of_kind is not None and name not in fields_of_kind:
            continue  # a field of the other kind of mark: it never applied to this one
        out.setdefault(group, {})[name] = value
        moved.append(f"{key} -> {target}")
    if moved:
        warnings.warn(
            f"{source}: {DEPRECATION}; write them in their groups: " + ", ".join(moved),
            FutureWarning,
            stacklevel=3,
        )
    return out


def resolve_path(name: str | Path) -> Path:
    """A settings file named relative to the working directory, else to the checkout."""
    from .settings import REPO_ROOT

    path = Path(name)
    return path if path.exists() or path.is_absolute() else REPO_ROOT / path


def load_watermark_settings(
    paths: Iterable[str | Path], overrides: Mapping[str, Any] | None = None
) -> WatermarkSettings:
    """``WatermarkSettings`` from settings files, later ones winning, and ``overrides`` (the
    file's form) on top; flat files load with a warning (``unflatten``)."""
    data: dict[str, Any] = {}
    for path in paths:
        data = merge(data, unflatten(load_settings_file(resolve_path(path)), str(path)))
    if overrides:
        data = merge(data, unflatten(dict(overrides), "overrides"))
    return WatermarkSettings.from_dict(data)


def command_line_layers(
    tokens: list[str], takes_watermark: bool
) -> tuple[list[dict], str, list[str]]:
    """The ``--config`` files of a command line's ``tokens`` (read, in order) and its
    ``--mark.kind`` as layers for the parser, the mark's final kind, and the other tokens;
    ``takes_watermark``: the command takes the watermark settings (flat files are read).

    A change of kind replaces the mark whole (``settings_files.merge``): the ``mark`` of a layer
    before the last change is dropped, and the parser takes the fields of the final kind only.
    """
    layers: list[dict] = []
    flat: set[int] = set()  # layers read from flat files
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        name, eq, inline = tokens[i].partition("=")
        if name in ("--config", "--mark.kind") and (eq or i + 1 < len(tokens)):
            value = inline if eq else tokens[i + 1]
            i += 1 if eq else 2
            if name == "--config":
                data = load_settings_file(value)
                if takes_watermark and is_flat(data):
                    flat.add(len(layers))
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
        # A flat file held the fields of both kinds of mark; those the final kind lacks never
        # applied to it (a flat ``gamma`` under the direction mark), so they are dropped.
        own = {f.name for f in dataclasses.fields(MARK_KINDS[kind])}
        for n in flat:
            if isinstance(layers[n].get("mark"), dict):
                layers[n]["mark"] = {k: v for k, v in layers[n]["mark"].items() if k in own}
    return layers, kind, rest
