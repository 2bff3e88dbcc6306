"""The watermark marks: one module per key rule, behind the ``Mark`` interface of ``base``.
May import: ksemstamp core modules and generation, detection, scheme, settings, text; never cli, builders, watermarker or detector.

``region`` is k-SemStamp's (and SemStamp's) valid-region rule, ``direction`` the keyed-direction
score. The sentence loop (``watermarker``) and the ``Detector`` ask a mark; neither branches on
which one it is. ``make_mark`` builds the mark a ``WatermarkScheme`` names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Mark, Round, SentenceState
from .direction import DirectionMark
from .region import RegionMark

if TYPE_CHECKING:
    from ..generation.pruning import PruneRule
    from ..generation.steering import Steering
    from ..scheme.core import WatermarkScheme
    from ..settings.groups import MarkSettings

__all__ = ["MARKS", "DirectionMark", "Mark", "RegionMark", "Round", "SentenceState", "make_mark"]

MARKS: dict[str, type[Mark]] = {RegionMark.name: RegionMark, DirectionMark.name: DirectionMark}


def make_mark(
    scheme: WatermarkScheme,
    prune: PruneRule | None = None,
    settings: MarkSettings | None = None,
    steering: Steering | None = None,
) -> Mark:
    """The mark ``scheme`` holds the settings of (``scheme.settings``), and for the direction
    mark the rule that stops running candidates early (``prune``; the region mark has none).
    ``settings``: the same kind's settings to generate with instead of the scheme's (they give
    the region mark's patience, the direction mark's threshold and selection; the scheme's
    decide everything else). ``steering``: the direction mark's logit bias toward the key."""
    settings = settings or scheme.settings
    if settings.kind != scheme.mark:
        raise ValueError(f"the scheme's mark is {scheme.mark}, the settings' {settings.kind}")
    if settings.kind == DirectionMark.name:
        return DirectionMark(
            scheme,
            threshold=settings.threshold,
            prune=prune,
            selection=settings.selection,
            steering=steering,
        )
    return RegionMark(
        scheme,
        novelty_patience=settings.novelty_patience,
        margin_patience=settings.margin_patience,
    )
