"""Whether a generated text holds enough scored units for detection to call it watermarked.

A text's evidence is its scored units (sentences, or clauses by default): too few, and the
detector cannot reach ``detection.alpha`` however well each unit carries the mark. Each mark
gives two bounds from the settings alone (``MarkSettings.units_needed``): the fewest units that
can reach alpha when every one carries the mark, and the units a text typically needs.

``length_note`` turns that into what ``generate`` says about a result: the record's
``scored_units`` and ``units_needed`` and a ``warning``, when a text holds fewer.
"""

from __future__ import annotations

from ..results import GenerationResult
from ..settings.watermark import WatermarkSettings


def units_needed(settings: WatermarkSettings) -> tuple[int, int]:
    """``(least, typical)``: the fewest scored units that can reach ``detection.alpha`` when
    every one carries the mark, and the units a clean watermarked text typically needs (the
    mark's own bounds, ``MarkSettings.units_needed``)."""
    return settings.mark.units_needed(settings.detection)


def scored_units(result: GenerationResult, settings: WatermarkSettings) -> int:
    """The units of ``result`` detection scores: all of them, but the first of a text that
    continues no sentence (a chat answer, an empty prompt) when each unit is scored after the
    one before it (``MarkSettings.scores_first`` false)."""
    unseeded = result.chat or not result.prompt.strip()
    return max(0, result.num_sentences - (unseeded and not settings.mark.scores_first))


def length_note(result: GenerationResult, settings: WatermarkSettings) -> dict | None:
    """``scored_units``, ``units_needed``, a ``warning`` and its reason (``why``) for a result with fewer scored units
    than a text typically needs to be detected at ``detection.alpha``; ``None`` otherwise (and
    for a result with an error)."""
    if result.status != "ok":
        return None
    least, typical = units_needed(settings)
    have = scored_units(result, settings)
    if have >= typical:
        return None
    unit = settings.unit
    alpha = settings.detection.alpha
    if have < least:
        why = f"cannot reach alpha {alpha:g} even if every one carries the mark (needs {least})"
    else:
        why = f"a text typically needs {typical} to be detected at alpha {alpha:g}"
    warning = (
        f"only {have} scored {unit}{'' if have == 1 else 's'}: {why}; detection will likely "
        f"call it not watermarked. A longer text (--sampling.max_new_tokens) gives more"
    )
    return {"scored_units": have, "units_needed": typical, "warning": warning, "why": why}
