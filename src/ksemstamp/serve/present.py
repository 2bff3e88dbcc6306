"""What the page shows, as plain JSON: detection views, the null-law chart, batch records.

Nothing here touches the models or the key: the functions take results and settings and return
dicts, so they are tested without a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..detection.stats import P_FLOOR, log_normal_sf, null_count_pmf, transition_matrix
from ..detector import DetectionResult
from ..records import ERROR_FIELDS as RECORD_ERROR_FIELDS
from ..records import key_problem, text_problem
from ..results import shown_p
from ..text.normalize import normalize_text, tampered

# The detector's verdicts, as the page names them (under the direction mark, "valid" is a
# sentence whose score is positive, "blocked" one whose score is not).
LABELS = {
    "valid": "valid",
    "invalid": "blocked",
    "seed": "seed only, not scored",
    "repeat": "repeated, not scored",
}
HEADLINES = {
    "watermarked": "Watermarked",
    "not_watermarked": "No evidence of the watermark",
    "too_short": "Too short to score",
    "unsupported": "Not a language this detector reads",
    "error": "Could not score this text",
}


@dataclass(frozen=True)
class Limits:
    """Input limits of the server; requests beyond them get a 4xx and a message."""

    max_chars: int = 200_000
    """Longest text or prompt, in characters (``create_app`` takes ``max_text_chars``)."""
    max_upload_bytes: int = 20_000_000
    """Largest batch upload."""
    max_records: int = 5_000
    """Most lines in one batch upload."""
    max_waiting: int = 8
    """Most generations waiting behind the running one."""
    max_streams: int = 1_000
    """Most progress streams open at once (each costs the server a little memory, no thread);
    a watcher beyond them can still poll ``/api/jobs/{id}``."""

    def __post_init__(self) -> None:
        for name in ("max_chars", "max_upload_bytes", "max_records", "max_streams"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")


def decision(result: DetectionResult) -> str:
    """``watermarked``, ``not_watermarked``, ``too_short``, ``unsupported`` or ``error``."""
    if result.status != "ok":
        return result.status
    return "watermarked" if result.watermarked else "not_watermarked"


NORMALIZED_KINDS = {
    "look_alike": "look-alike letters of other scripts read as Latin",
    "invisible": "invisible characters removed",
    "invalid": "invalid characters removed",
    "compatibility": "compatibility forms read as plain letters",
    "line_breaks": "line breaks inside paragraphs read as spaces",
}


def normalization_note(counts: dict[str, int]) -> str | None:
    """One line on what reading the text in its normalised form took, or ``None``; it warns
    when the text looks the same as another but reads differently (a sign of tampering)."""
    if not counts:
        return None
    parts = [
        f"{counts[k]} {what if counts[k] != 1 else _singular(what)}"
        for k, what in NORMALIZED_KINDS.items()
        if counts.get(k)
    ]
    note = "Read in normalised form: " + "; ".join(parts) + "."
    if tampered(counts):
        note += " Characters like these make a text look unchanged while it reads differently: "
        note += "a sign that it was altered on purpose."
    return note


def _singular(what: str) -> str:
    """``what`` with its counted noun (its first word ending in "s") in the singular."""
    words = what.split(" ")
    at = next(i for i, word in enumerate(words) if word.endswith("s"))
    words[at] = words[at][:-1]
    return " ".join(words)


def _segments(text: str, sentences: list[str]) -> list[dict[str, Any]]:
    """The text cut into sentences and the gaps between them, so it can be shown in place."""
    out: list[dict[str, Any]] = []
    cursor = 0
    for index, sentence in enumerate(sentences):
        at = text.find(sentence, cursor)
        if at < 0:  # the splitter changed the sentence: show it after a plain space
            out.append({"gap": " " if out else ""})
        else:
            out.append({"gap": text[cursor:at]})
            cursor = at + len(sentence)
        out[-1]["sentence"] = index
    out.append({"gap": text[cursor:] if sentences else text})
    return out


def _scored_transitions(result: DetectionResult) -> set[tuple[int, int]]:
    previous, out = result.seed_region, set()
    for region, verdict in zip(result.regions, result.verdicts, strict=True):
        if verdict in ("valid", "invalid") and previous is not None:
            out.add((previous, region))
        previous = region
    return out


def explanation(
    result: DetectionResult,
    gamma: float | None,
    alpha: float,
    mark: str = "region",
    soft_contexts: bool = False,
    context: str = "previous",
    unit: str = "sentence",
) -> str:
    """One plain paragraph on what this text's p-value promises and what it does not
    (direction mark: ``context`` says whose region gives a sentence its direction, the
    sentence's ``own`` or the ``previous`` one's, ``soft_contexts`` that the directions of
    the regions near it are blended, and ``unit`` what it scores one at a time: ``sentence``
    or ``clause``)."""
    if result.status != "ok":
        return result.error or ""
    caveat = (
        f" It does not cover text that quotes or paraphrases watermarked text or was written by "
        f"someone holding the key. The text is called watermarked when p <= {alpha:g}."
    )
    if mark == "direction":
        whose = f"the {unit} itself" if context == "own" else f"the previous {unit}"
        direction = (
            f"a blend of the directions the key draws for the regions nearest {whose}"
            if soft_contexts
            else f"the direction the key draws for the region of {whose}"
        )
        span = ""
        if result.span is not None and result.span_p_value is not None:
            first, last = result.span[0] + 1, result.span[1]
            span = (
                f" The most strongly marked run of {unit}s, {first} to {last}, has z = "
                f"{result.span_z:.2f}; the largest of all runs' z would be that high with "
                f"probability {result.span_p_value:.3g} without our key. A third test asks "
                f"whether some {unit}s, wherever they stand, lean the key's way (p = "
                f"{result.mixture_p_value:.3g}), and a fourth totals the scores again with "
                f"{unit}s that say much the same thing counted about once (p = "
                f"{result.weighted_p_value:.3g}). The p-value above combines the four: how "
                f"often the smallest of their p-values would be this small without our key."
            )
        text_p = result.p_value if result.text_p_value is None else result.text_p_value
        return (
            f"Each scored {unit}'s score is how far its meaning points along {direction}. "
            f"If this text had been written "
            f"without our key, a total score this high (z = {result.z_score:.2f}) would turn up "
            f"with probability {shown_p(text_p, _text_log10(result))} (the shaded area of the "
            f"chart), whatever its "
            f"topic or style: over random keys the total is exactly normal, with a spread the "
            f"text's own {unit}s fix ({result.num_valid} of {result.num_scored} scored "
            f"{unit}s lean the key's way; half would by chance).{span}{caveat}"
        )
    one_step = ""
    transitions = _scored_transitions(result)
    if len(transitions) == 1 and result.num_scored > 1:
        ((a, b),) = transitions
        one_step = (
            f" All {result.num_scored} scored sentences make the same step, region {a} to "
            f"region {b}: under a random key that step is valid for all of them or for none, so "
            f"this text cannot reach a p-value below {gamma:g}, watermarked or not."
        )
    p, scored, valid = result.p_value, result.num_scored, result.num_valid
    if result.statistic == "exact":
        promise = (
            f"If this text had been written without our key, a valid count of {valid} or more "
            f"out of {scored} scored sentences would turn up with probability {p:.3g} (the shaded "
            f"area of the chart), whatever its topic or style."
        )
    else:
        promise = (
            f"p = {p:.3g} is the normal tail of the paper's z; it assumes every sentence is valid "
            f"with chance {gamma:g} on its own, which human text that keeps its topic does not "
            f"meet, so it flags human text more often than its nominal rate."
        )
    return (
        f"{promise}{one_step} It does not cover text that quotes or paraphrases watermarked text or was "
        f"written by someone holding the key, and a text that stays in one region carries little "
        f"evidence either way. The text is called watermarked when p <= {alpha:g}."
    )


def null_chart(
    result: DetectionResult, valid_per_row: int, num_regions: int, mark: str = "region"
) -> dict | None:
    """The exact test's null law for this text, and where the text falls: the law of the valid
    count (``region`` mark, ``kind: count``) or the standard normal of the z (``direction``
    mark, ``kind: normal``)."""
    if result.status != "ok":
        return None
    if mark == "direction":
        tail = result.p_value if result.text_p_value is None else result.text_p_value
        return {"kind": "normal", "z": result.z_score, "tail": tail}
    regions = list(result.regions)
    scored = [v in ("valid", "invalid") for v in result.verdicts]
    if result.seed_region is not None:
        regions, scored = [result.seed_region, *regions], [False, *scored]
    pmf = null_count_pmf(transition_matrix(regions, scored, num_regions), valid_per_row)
    observed = result.num_valid
    return {
        "kind": "count",
        "pmf": [float(x) for x in pmf],
        "observed": observed,
        "tail": float(min(1.0, pmf[observed:].sum())),
        "expected": float(sum(i * x for i, x in enumerate(pmf))),
    }


def detection_view(
    result: DetectionResult,
    text: str,
    *,
    gamma: float | None,
    alpha: float,
    valid_per_row: int,
    num_regions: int,
    mark: str = "region",
    soft_contexts: bool = False,
    context: str = "previous",
    unit: str = "sentence",
) -> dict[str, Any]:
    """Everything the page needs to show one detection (``context``, ``unit``: see
    ``explanation``; under ``own`` no sentence's direction comes from the one before it)."""
    own = mark == "direction" and context == "own"
    previous = None if own else result.seed_region
    sentences = []
    scores = result.scores or [None] * len(result.sentences)
    for i, (sentence, region, verdict, score) in enumerate(
        zip(result.sentences, result.regions, result.verdicts, scores, strict=True)
    ):
        sentences.append(
            {
                "text": sentence,
                "region": region,
                "previous_region": None if own else previous,
                "verdict": verdict,
                "label": LABELS.get(verdict, verdict),
                "scored": verdict in ("valid", "invalid"),
                "score": score,
                "index": i,
            }
        )
        previous = region
    kind = decision(result)
    return {
        "status": result.status,
        "decision": kind,
        "headline": HEADLINES[kind],
        "message": result.error,
        "p_value": result.p_value,
        "log10_p_value": result.log10_p_value,
        "z_score": result.z_score,
        "num_scored": result.num_scored,
        "num_valid": result.num_valid,
        "expected_valid": (0.5 if mark == "direction" else gamma) * result.num_scored,
        "statistic": result.statistic,
        "mark": mark,
        "alpha": alpha,
        "gamma": gamma,
        "sentences": sentences,
        "segments": _segments(normalize_text(text).text, result.sentences),
        "normalization": normalization_note(result.normalized),
        "null": null_chart(result, valid_per_row, num_regions, mark),
        "span": result.span,
        "span_p_value": result.span_p_value,
        "mixture_p_value": result.mixture_p_value,
        "weighted_p_value": result.weighted_p_value,
        "explanation": explanation(result, gamma, alpha, mark, soft_contexts, context, unit),
    }


def _text_log10(result: DetectionResult) -> float | None:
    """``log10`` of the whole text's p-value when it is below the reported floor."""
    text_p = result.p_value if result.text_p_value is None else result.text_p_value
    if text_p is None or text_p > P_FLOOR or result.z_score is None:
        return None
    return log_normal_sf(result.z_score) / math.log(10.0)


# ---------------------------------------------------------------------- batch


def check_record(data: dict[str, Any], fingerprint: str, max_chars: int) -> str | None:
    """Why a detection record cannot be scored (the CLI's rules plus the size limit), or None."""
    problem = text_problem(data)
    if problem:
        return problem
    if len(data["text"]) + len(data.get("prompt") or "") > max_chars:
        return f"text and prompt are longer than the limit of {max_chars:,} characters"
    return key_problem(data, fingerprint)


ERROR_FIELDS = RECORD_ERROR_FIELDS["detect"]
