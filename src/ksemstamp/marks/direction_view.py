"""How the direction mark's results read: its description for reports, its lines in the CLI's
report and its web view (the standard normal its z follows, and what the p-value promises)."""

from __future__ import annotations

import math
from typing import Any

from ..detection.stats import P_FLOOR, log_normal_sf
from ..results import DetectionResult, shown_p


def describe_direction(mark: Any, scan: bool = False) -> dict[str, Any]:
    """What ``Mark.describe`` says of the direction mark."""
    whose = "its own embedding" if mark.context == "own" else "the previous sentence"
    contexts = (
        f"soft contexts, temperature {mark.temperature:g}"
        if mark.temperature
        else "hard contexts (the context's region)"
    )
    components = 0 if mark.basis is None else len(mark.basis)
    removed = f", {components} principal components projected out" if components else ""
    windowed = "; p-values include the windowed scan" if scan else ""
    statistic = (
        "direction statistic: z of the summed projections on the key's directions, exactly "
        "standard normal over random keys; p is its normal tail"
    )
    if scan:
        statistic += (
            ", combined with the span scan, the mixture statistic and the correlation-weighted"
            " sum (one exact p-value)"
        )
    short = "direction mark, " + (
        "own contexts" if mark.context == "own" else "previous unit's context"
    )
    return {
        "kind": "direction",
        "short": short + (", span scan" if scan else ""),
        "keys": "keys (keyed directions)",
        "drawn": "keyed directions",
        "counted": "positive",
        "z": "exact",
        "summary": (
            f"Mark: direction (the key draws a direction per region; each sentence on the "
            f"context of {whose}, {contexts}{removed}{windowed}), K = "
            f"{mark.scheme.num_regions} regions"
        ),
        "statistic": {"exact": statistic},
        "first": (
            "prompt; every sentence is scored on its own context."
            if mark.context == "own"
            else "prompt: each text's first sentence only seeds."
        ),
        "uniformity": [
            "gets over random keys, which is what a p-value promises. The direction mark's",
            "exact p-value is continuous (the normal tail of an exactly normal z), so its",
            "pooled distribution is uniform when the null law holds; its `exact_randomised`",
            "row is the same numbers.",
        ],
        "fallbacks": "{n} sentences kept as the best of their draws (none reached the threshold)",
        "settings": {
            "context": mark.context,
            "context_temperature": mark.temperature,
            "remove_components": components,
            "scan": scan,
        },
    }


def direction_lines(result: DetectionResult, unit: str) -> list[str]:
    """The windowed tests of a result, one entry each (none without them)."""
    d = result.details
    if d.get("span") is None or d.get("span_p_value") is None:
        return []
    tests = [
        f"whole text p = {d['text_p_value']:.3g}",
        f"most marked span ({unit}s {d['span'][0] + 1}-{d['span'][1]}, "
        f"z = {d['span_z']:.2f}) p = {d['span_p_value']:.3g}",
        f"marked {unit}s scattered among others p = {d['mixture_p_value']:.3g}",
    ]
    if d.get("weighted_p_value") is not None:
        tests.append(f"{unit}s that move together counted once p = {d['weighted_p_value']:.3g}")
    return tests


def _text_p(result: DetectionResult) -> float | None:
    return result.details.get("text_p_value", result.p_value)


def _text_log10(result: DetectionResult) -> float | None:
    """``log10`` of the whole text's p-value when it is below the reported floor."""
    text_p = _text_p(result)
    if text_p is None or text_p > P_FLOOR or result.z_score is None:
        return None
    return log_normal_sf(result.z_score) / math.log(10.0)


def direction_view(mark: Any, result: DetectionResult, alpha: float, unit: str) -> dict[str, Any]:
    """What ``Mark.view`` gives the page for the direction mark."""
    d = result.details
    null = None
    if result.status == "ok":
        null = {"kind": "normal", "z": result.z_score, "tail": _text_p(result)}
    return {
        "expected": 0.5 * result.num_scored,
        "expected_label": "half",
        "counted": "positive / scored",
        "z_label": "exact",
        "previous": mark.context != "own",
        "null": null,
        "span": d.get("span"),
        "span_p_value": d.get("span_p_value"),
        "mixture_p_value": d.get("mixture_p_value"),
        "weighted_p_value": d.get("weighted_p_value"),
        "explanation": _explanation(mark, result, alpha, unit),
    }


def _explanation(mark: Any, result: DetectionResult, alpha: float, unit: str) -> str:
    """What the p-value promises, in words."""
    if result.status != "ok":
        return result.error or ""
    caveat = (
        f" It does not cover text that quotes or paraphrases watermarked text or was written by "
        f"someone holding the key. The text is called watermarked when p <= {alpha:g}."
    )
    whose = f"the {unit} itself" if mark.context == "own" else f"the previous {unit}"
    direction = (
        f"a blend of the directions the key draws for the regions nearest {whose}"
        if mark.temperature > 0
        else f"the direction the key draws for the region of {whose}"
    )
    d = result.details
    span = ""
    if d.get("span") is not None and d.get("span_p_value") is not None:
        first, last = d["span"][0] + 1, d["span"][1]
        span = (
            f" The most strongly marked run of {unit}s, {first} to {last}, has z = "
            f"{d['span_z']:.2f}; the largest of all runs' z would be that high with "
            f"probability {d['span_p_value']:.3g} without our key. A third test asks "
            f"whether some {unit}s, wherever they stand, lean the key's way (p = "
            f"{d['mixture_p_value']:.3g}), and a fourth totals the scores again with "
            f"{unit}s that say much the same thing counted about once (p = "
            f"{d['weighted_p_value']:.3g}). The p-value above combines the four: how "
            f"often the smallest of their p-values would be this small without our key."
        )
    return (
        f"Each scored {unit}'s score is how far its meaning points along {direction}. "
        f"If this text had been written "
        f"without our key, a total score this high (z = {result.z_score:.2f}) would turn up "
        f"with probability {shown_p(_text_p(result), _text_log10(result))} (the shaded area of "
        f"the chart), whatever its topic or style: over random keys the total is exactly normal, "
        f"with a spread the text's own {unit}s fix ({result.num_valid} of {result.num_scored} "
        f"scored {unit}s lean the key's way; half would by chance).{span}{caveat}"
    )
