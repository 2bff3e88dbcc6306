"""The flat settings of earlier releases (``WatermarkConfig``), kept for one more release.

``WatermarkConfig(max_candidates=12, mark="region", gamma=0.3)`` still builds, with a
``DeprecationWarning``, and the builders take it: ``to_settings`` gives the same settings in
their groups (``WatermarkSettings``). Its fields, their types and their defaults are made from
the groups (``settings_files.FLAT_KEYS``), so there is no second copy of a default. Fields of
the mark that its ``mark`` does not have are left out, as they never applied. New code uses
``WatermarkSettings``; this module also re-exports the builders and the settings, as before.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Literal, get_type_hints

from .builders import (
    apply_threads,
    build_detector,
    build_scheme,
    build_watermarker,
    load_centroids,
    load_scheme_encoder,
)
from .settings import (
    DEFAULT_CENTROIDS,
    GROUPS,
    MARK_KINDS,
    PACKAGE_DATA,
    PAPER_CENTROIDS,
    REPO_ROOT,
    WatermarkSettings,
)
from .settings_files import FLAT_KEYS, load_settings_file, unflatten

__all__ = [
    "DEFAULT_CENTROIDS",
    "PACKAGE_DATA",
    "PAPER_CENTROIDS",
    "REPO_ROOT",
    "WatermarkConfig",
    "WatermarkSettings",
    "apply_threads",
    "build_detector",
    "build_scheme",
    "build_watermarker",
    "load_centroids",
    "load_scheme_encoder",
    "load_settings_file",
]

_OWN = ("key", "allow_weak_key", "chat")


def _flat_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """``(name, type, field)`` of every flat setting, typed and defaulted as in its group."""
    out = []
    for flat, place in FLAT_KEYS.items():
        group, name = place.split(".")
        if group == "mark" and name == "kind":
            out.append((flat, Literal[tuple(MARK_KINDS)], dataclasses.field(default="direction")))
            continue
        classes = list(MARK_KINDS.values()) if group == "mark" else [GROUPS[group]]
        cls = next(c for c in classes if name in {f.name for f in dataclasses.fields(c)})
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        out.append((flat, get_type_hints(cls)[name], dataclasses.field(default=f.default)))
    hints = get_type_hints(WatermarkSettings)
    for name in _OWN:
        default = WatermarkSettings.__dataclass_fields__[name].default
        out.append((name, hints[name], dataclasses.field(default=default, repr=False)))
    return out


def _post_init(self) -> None:
    warnings.warn(
        "WatermarkConfig is the flat spelling of the settings, kept for one more release: use "
        "WatermarkSettings (for example WatermarkSettings(search=SearchSettings(max_candidates="
        "12))), or WatermarkConfig(...).to_settings()",
        DeprecationWarning,
        stacklevel=3,
    )
    self.to_settings()  # every check of the groups, now


def _to_settings(self) -> WatermarkSettings:
    """The same settings in their groups (the key included)."""
    flat = dataclasses.asdict(self)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        nested = unflatten({k: v for k, v in flat.items() if k not in _OWN})
    return WatermarkSettings.from_dict({**nested, **{k: flat[k] for k in _OWN}})


def _to_dict(self) -> dict[str, Any]:
    """All settings except the key, flat."""
    out = dataclasses.asdict(self)
    out.pop("key")
    return out


def _from_dict(cls, data: dict[str, Any]):
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown settings {unknown}; known: {sorted(FLAT_KEYS)}")
    return cls(**data)


def _from_yaml(cls, path: str | Path, **overrides: Any):
    return cls.from_dict({**load_settings_file(path), **overrides})


WatermarkConfig = dataclasses.make_dataclass(
    "WatermarkConfig",
    _flat_fields(),
    namespace={
        "__doc__": "The flat settings of earlier releases (deprecated): see the module.",
        "__module__": __name__,
        "__post_init__": _post_init,
        "to_settings": _to_settings,
        "to_dict": _to_dict,
        "from_dict": classmethod(_from_dict),
        "from_yaml": classmethod(_from_yaml),
        "centroid_path": lambda self: self.to_settings().centroid_path(),
        "__repr__": lambda self: f"WatermarkConfig({self.to_dict()})",
    },
)
