"""What the page shows, as plain JSON: detection views, the null-law chart, batch records.

Nothing here touches the models or the key: the functions take results and settings and return
dicts, so they are tested without a server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..detector import DetectionResult
from ..records import ERROR_FIELDS as RECORD_ERROR_FIELDS
from ..text.normalize import normalize_text, tampered

# The detector's verdicts, as the page names them ("valid": a unit that carries the mark,
# whatever the mark's rule; "blocked" one that does not).
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


def detection_view(
    result: DetectionResult, text: str, mark: Any, *, alpha: float, unit: str = "sentence"
) -> dict[str, Any]:
    """Everything the page needs to show one detection: the fields every mark gives, and what
    ``mark`` adds (``Mark.view``: the explanation, the chart of the null law, the expected
    count, whether a unit's verdict depends on the one before it)."""
    own = mark.view(result, alpha, unit)
    depends = own.pop("previous", True)
    previous = result.seed_region if depends else None
    sentences = []
    scores = result.scores or [None] * len(result.sentences)
    for i, (sentence, region, verdict, score) in enumerate(
        zip(result.sentences, result.regions, result.verdicts, scores, strict=True)
    ):
        sentences.append(
            {
                "text": sentence,
                "region": region,
                "previous_region": previous if depends else None,
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
        "statistic": result.statistic,
        "alpha": alpha,
        "sentences": sentences,
        "segments": _segments(normalize_text(text).text, result.sentences),
        "normalization": normalization_note(result.normalized),
        **own,
    }


# ---------------------------------------------------------------------- batch


ERROR_FIELDS = RECORD_ERROR_FIELDS["detect"]
