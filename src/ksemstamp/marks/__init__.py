"""The watermark marks: one module per key rule, behind the ``Mark`` interface of ``base``.
May import: ksemstamp core modules and generation, detection, scheme, settings, text; never cli, builders, watermarker or detector.

``region`` is k-SemStamp's (and SemStamp's) valid-region rule, ``direction`` the keyed-direction
score. A mark's settings class (``settings.groups.MARK_KINDS``, the one registry of kinds) names
its ``Mark`` class; ``build_mark`` makes the mark a scheme's settings ask for. The sentence loop
(``watermarker``), the ``Detector``, calibration, the CLI and the web page ask the mark and never
its kind.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import Drawn, Mark, SentenceState

if TYPE_CHECKING:
    from ..scheme.core import WatermarkScheme

__all__ = ["Mark", "Drawn", "SentenceState", "build_mark", "mark_class"]


def mark_class(settings: Any) -> type[Mark]:
    """The ``Mark`` class a mark's settings name (``MarkSettings.mark``: the class, or its
    ``"module:Class"`` path)."""
    target = type(settings).mark
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    if not (isinstance(target, type) and issubclass(target, Mark)):
        raise TypeError(f"{type(settings).__name__}.mark does not name a Mark class")
    return target


def build_mark(
    scheme: WatermarkScheme,
    search: Any = None,
    steering: Any = None,
    key: str | None = None,
) -> Mark:
    """The mark of ``scheme``'s settings (``scheme.settings``) under its key (``key``: another
    key), with the generation effort ``search`` (the kind's ``search`` class) and ``steering`` for a
    mark that generates."""
    cls = mark_class(scheme.settings)
    return cls(scheme, scheme.settings, scheme.key if key is None else key, search, steering)
