"""The watermark marks: one module per key rule, behind the ``Mark`` interface of ``base``.
May import: ksemstamp core modules and generation, detection, text; never cli, config, builders, watermarker or detector.

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
    from ..scheme import WatermarkScheme

__all__ = ["MARKS", "DirectionMark", "Mark", "RegionMark", "Round", "SentenceState", "make_mark"]

MARKS: dict[str, type[Mark]] = {RegionMark.name: RegionMark, DirectionMark.name: DirectionMark}


def make_mark(
    scheme: WatermarkScheme,
    *,
    threshold: float | None = None,
    prune: PruneRule | None = None,
    selection: str = "text",
    novelty_patience: int = 0,
    margin_patience: int | None = None,
) -> Mark:
    """The mark of ``scheme.mark`` with the generation settings that apply to it (the others
    are ignored, as ``WatermarkConfig`` documents)."""
    RegionMark.check(novelty_patience, margin_patience)
    if scheme.mark == DirectionMark.name:
        return DirectionMark(scheme, threshold=threshold, prune=prune, selection=selection)
    return RegionMark(scheme, novelty_patience=novelty_patience, margin_patience=margin_patience)
