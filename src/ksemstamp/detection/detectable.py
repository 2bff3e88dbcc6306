"""Whether a generated text holds enough scored units for detection to call it watermarked.

A text's evidence is its scored units (sentences, or clauses by default): too few, and the
detector cannot reach ``detection.alpha`` however well each unit carries the mark. Two bounds,
from the settings alone (``units_needed``):

* the fewest units that can reach alpha when every one carries the mark. The region mark's
  exact test gives a text of ``n`` scored units, each after another region and each valid,
  ``p = gamma ** n``; the paper's z-test ``z = sqrt(n (1 - gamma) / gamma)``. The direction
  mark's scores are not bounded: one unit can in principle reach any p, so its bound is 1.
* the units a text typically needs: the direction mark's z grows as about ``TYPICAL_UNIT_Z``
  times the square root of the units, and with ``mark.scan`` the p-value combines four tests
  (at most 4 times the smallest p); the region mark's generated units are valid but for rare
  fallbacks, so it needs what the first bound says.

``length_note`` turns that into what ``generate`` says about a result: the record's
``scored_units`` and ``units_needed`` and a ``warning``, when a text holds fewer.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from ..results import GenerationResult
from ..settings.watermark import WatermarkSettings

TYPICAL_UNIT_Z = 1.5
"""The direction mark's typical z over the square root of a clean text's scored units: median z
6.40 over a median of 18.5 clause units, 4.86 over 10.5 sentence units (README, `make
results-clauses`): 1.49 and 1.50. A paraphrase keeps about half of it."""
SCAN_TESTS = 4
"""Tests ``mark.scan`` combines into one p-value (whole text, span, mixture, weighted); the
combined p is at most this many times the smallest."""


def units_needed(settings: WatermarkSettings) -> tuple[int, int]:
    """``(least, typical)``: the fewest scored units that can reach ``detection.alpha`` when
    every one carries the mark, and the units a clean watermarked text typically needs."""
    alpha = settings.detection.alpha
    mark = settings.mark
    if mark.kind == "region":
        if settings.detection.statistic == "paper":
            z = NormalDist().inv_cdf(1 - alpha)
            least = math.ceil(z * z * mark.gamma / (1 - mark.gamma) - 1e-9)
        else:
            least = math.ceil(math.log(alpha) / math.log(mark.gamma) - 1e-9)
        return max(1, least), max(1, least)
    tests = SCAN_TESTS if mark.scan else 1
    z = NormalDist().inv_cdf(1 - alpha / tests)
    return 1, max(1, math.ceil((z / TYPICAL_UNIT_Z) ** 2 - 1e-9))


def scored_units(result: GenerationResult, settings: WatermarkSettings) -> int:
    """The units of ``result`` detection scores: all of them, but the first of a text that
    continues no sentence (a chat answer, an empty prompt) when each unit is scored after the
    one before it (the region mark, ``mark.context: previous``)."""
    own = settings.mark.kind == "direction" and settings.mark.context == "own"
    unseeded = result.chat or not result.prompt.strip()
    return max(0, result.num_sentences - (unseeded and not own))


def length_note(result: GenerationResult, settings: WatermarkSettings) -> dict | None:
    """``scored_units``, ``units_needed`` and a ``warning`` for a result with fewer scored units
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
    return {"scored_units": have, "units_needed": typical, "warning": warning}
