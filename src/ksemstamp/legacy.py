"""The command-line spelling of earlier releases, read for one more release.

Before the settings groups, ``watermark.py`` spelled every setting with dashes at the top
(``--max-new-tokens 40``, ``--no-adaptive-batch``, ``--num-keys 50``, ``--no-watermark``).
``modernise`` rewrites such a command line into today's (``--sampling.max_new_tokens 40``,
``--search.adaptive_batch false``, ``--calibration.num_keys 50``, ``--watermark false``) and
warns once, naming each new spelling. Files in the flat spelling are ``settings_files``'s.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from .settings_files import FLAT_KEYS

RENAMED_OPTIONS: dict[str, tuple[str, str | None]] = {
    "no_watermark": ("watermark", "false"),
    "no_generate": ("generation", "false"),
    "calibration_seed": ("calibration.seed", None),
    "embedding_cache": ("calibration.reuse_embeddings", None),
    "no_embedding_cache": ("calibration.reuse_embeddings", "false"),
}
"""Options of earlier releases whose new name is not their own: ``(new place, value)``."""


def places(options: Mapping[str, Any], takes_watermark: bool) -> dict[str, str]:
    """Old name -> new place of every option of a command that has one (``max_new_tokens`` ->
    ``sampling.max_new_tokens``): the flat settings keys, and a group's field by its own name
    where no other group has a field of that name."""
    place = dict(FLAT_KEYS) if takes_watermark else {}
    counts = Counter(dest.rsplit(".", 1)[-1] for dest in options)
    for dest in options:
        last = dest.rsplit(".", 1)[-1]
        if "." in dest and counts[last] == 1:
            place.setdefault(last, dest)
    return {old: new for old, new in place.items() if new in options}


def modernise(
    argv: Sequence[str], options: Mapping[str, Any], takes_watermark: bool = True
) -> list[str]:
    """``argv`` in today's spelling (see the module docstring); warns once when anything was
    rewritten. ``options``: the command's options by place; ``takes_watermark``: whether the
    command takes the watermark settings (their flat names then count)."""
    place = places(options, takes_watermark)
    out: list[str] = []
    renamed: list[str] = []
    for token in argv:
        name, eq, value = token.partition("=")
        old = name[2:].replace("-", "_")
        if not name.startswith("--") or "." in name or old in ("help", "config"):
            out.append(token)
            continue
        new, fixed = _place(old, options, place)
        if new is None:
            out.append(token)
            continue
        flag = f"--{new}"
        if flag != name:
            renamed.append(f"{name} -> {flag}" + (f" {fixed}" if fixed else ""))
        out.append(flag + (eq + value if eq else ""))
        if fixed is not None:
            out.append(fixed)
    if renamed:
        warnings.warn(
            "the flags of earlier releases are read until the next release; write: "
            + ", ".join(renamed),
            FutureWarning,
            stacklevel=2,
        )
    return out


def _place(
    old: str, options: Mapping[str, Any], place: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The new place of flag ``old`` (underscored) and the value it stands for, if fixed."""
    if old in options or old == "print_config":
        return old, None
    if old in RENAMED_OPTIONS:
        new, value = RENAMED_OPTIONS[old]
        return (new, value) if new in options else (None, None)
    if old in place:
        return place[old], None
    if old.startswith("no_") and old[3:] in place:
        option = options[place[old[3:]]]
        if getattr(option, "hint", None) is bool:
            return place[old[3:]], "false"
    return None, None
