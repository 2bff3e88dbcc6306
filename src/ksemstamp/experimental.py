"""Internals that the lab (``lab/``, the studies still open) uses, named in one place.

Nothing here is promised to stay as it is: the public API is ``ksemstamp``'s own. The lab
imports only that and this module, so what the lab needs of the inside is listed here and
nowhere else. Loaded on first use, like ``ksemstamp``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_encoder": "assets",
    "load_lm": "assets",
    "main": "cli",
    "KGWDetector": "evaluation.baselines",
    "KGWGenerator": "evaluation.baselines",
    "EDITS": "evaluation.edits",
    "apply_edit": "evaluation.edits",
    "needs_human": "evaluation.edits",
    "Oracle": "evaluation.metrics",
    "build_prompts": "evaluation.prompt_set",
    "build_attack": "evaluation.rewrite",
    "EvalSettings": "settings.evaluation",
    "news_articles": "text.corpora",
    "get_splitter": "text.splitter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"ksemstamp.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
