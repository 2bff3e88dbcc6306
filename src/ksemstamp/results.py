"""What generation and detection return: per document a ``GenerationResult`` with one
``SentenceRecord`` per kept sentence, the judge's ``Judgement`` of a candidate, the
``GenerationProgress`` reported after each round, ``summarize`` for totals over documents, and
per detected text a ``DetectionResult``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .text.normalize import tampered

if TYPE_CHECKING:
    pass

NO_REGION = -1
"""The region of a sentence no mark located: a plain candidate, a prompt not yet completed."""


class Judgement(NamedTuple):
    """What the judge found about one candidate unit (its ``Candidate.info``)."""

    region: int
    valid: bool
    """It meets the mark's rule (the region mark: a valid region at the margin; the direction
    mark: a score at the threshold)."""
    novel: bool
    """It adds to what detection scores: not a repeat (of a unit, or of a transition the
    mark's patience no longer tolerates)."""
    score: float = math.nan
    """The candidate's score, for a mark that scores candidates (``nan``: it does not)."""
    rank: float = math.nan
    """What the loop ranks candidates by (``nan``: the ``score``)."""
    reason: str | None = None
    """Why the mark turns it down (one of ``Mark.rejections``), ``None`` when it accepts it."""
    data: Any = None
    """The mark's own data about the candidate, handed back to it when the unit is kept
    (``Mark.commit``)."""


def rank_of(verdict: Judgement) -> float:
    """The value a scoring mark's candidates are ranked by (``rank``, else ``score``)."""
    return verdict.score if math.isnan(verdict.rank) else verdict.rank


@dataclass
class SentenceRecord:
    """One accepted unit and what it took to get it.

    ``rejected`` counts, per reason the mark gives (``Mark.rejections``), the candidates it
    turned down; a fallback unit is among them.
    """

    text: str
    region: int
    candidates: int
    rejected: dict[str, int] = field(default_factory=dict)
    fallback: bool = False
    num_tokens: int = 0
    pruned: int = 0
    """Candidates stopped unfinished by the pruning rule (counted in ``candidates``)."""
    timed_out: bool = False
    """The search ended by ``sentence_time_budget``, before ``max_candidates`` draws (the
    region mark keeps its last candidate, a fallback; the direction mark its best so far)."""
    score: float | None = None
    """The kept unit's score, for a mark that scores units."""


@dataclass
class GenerationResult:
    """A generated continuation (without the prompt) and its statistics.

    When the prompt ended mid-sentence, ``text`` starts with ``completion`` (the words that
    finish the prompt's sentence, with the space before them as the LM wrote it), so that
    ``prompt.rstrip() + text`` is the whole document; otherwise the document is the prompt, a
    space and ``text``. ``sentences`` are the watermarked sentences after that.
    """

    prompt: str
    text: str = ""
    sentences: list[SentenceRecord] = field(default_factory=list)
    status: str = "ok"
    error: str | None = None
    ended_by_model: bool = False  # the LM kept ending the text before max_new_tokens
    ended_inside_sentence: bool = False
    """Past ``max_new_tokens`` the text went on to its sentence's end, and stopped inside the
    sentence all the same once ``max_sentence_tokens`` tokens over (a very long sentence)."""
    seconds: float = 0.0
    decoded_tokens: int = 0
    wasted_tokens: int = 0
    completion: str | None = None
    """The start of ``text`` that completed the prompt's unfinished sentence (not watermarked;
    that sentence seeds the first watermarked one), or ``None`` when nothing was completed."""
    completion_tokens: int = 0
    prompt_dropped_chars: int = 0
    """Characters cut from the left of the prompt so that the LM's view of it fits."""
    chat: bool = False
    """The prompt was an instruction (chat template); its answer is ``text``."""
    seed: int | None = None
    """The seed this text was sampled from, when none was set (``seed: null``, the default):
    the same prompt and settings with ``seed`` set to it give this text again."""

    @property
    def prompt_for_detection(self) -> str | None:
        """The prompt to give the detector with ``text``: ``None`` for a chat answer (the
        instruction seeds nothing), else the prompt."""
        return None if self.chat else self.prompt

    @property
    def num_sentences(self) -> int:
        return len(self.sentences)

    @property
    def candidates(self) -> int:
        return sum(s.candidates for s in self.sentences)

    @property
    def fallbacks(self) -> int:
        return sum(s.fallback for s in self.sentences)

    @property
    def pruned(self) -> int:
        return sum(s.pruned for s in self.sentences)

    @property
    def num_tokens(self) -> int:
        """Tokens of ``text``: the completion's and the sentences'."""
        return self.completion_tokens + sum(s.num_tokens for s in self.sentences)

    def rejected(self) -> dict[str, int]:
        """``rejected_REASON``: the candidates turned down for each reason, over the units."""
        out: dict[str, int] = {}
        for s in self.sentences:
            for reason, n in s.rejected.items():
                out[f"rejected_{reason}"] = out.get(f"rejected_{reason}", 0) + n
        return out

    def to_record(self) -> dict:
        """Fields added to a JSONL record."""
        out = {
            "text": self.text,
            "num_sentences": self.num_sentences,
            "candidates": self.candidates,
            "pruned": self.pruned,
            "fallbacks": self.fallbacks,
            "num_tokens": self.num_tokens,
            "decoded_tokens": self.decoded_tokens,
            **self.rejected(),
            "regions": [s.region for s in self.sentences],
            "seconds": round(self.seconds, 3),
            "status": self.status,
        }
        if any(s.score is not None for s in self.sentences):
            out["scores"] = [None if s.score is None else round(s.score, 6) for s in self.sentences]
        if self.error:
            out["error"] = self.error
        if self.ended_by_model:
            out["ended_by_model"] = True
        if self.ended_inside_sentence:
            out["ended_inside_sentence"] = True
        if self.completion is not None:
            out["completion"] = self.completion
        if self.prompt_dropped_chars:
            out["prompt_dropped_chars"] = self.prompt_dropped_chars
        if self.chat:
            out["chat"] = True
        if self.seed is not None:
            out["seed"] = self.seed
        return out


@dataclass
class GenerationProgress:
    """Where a ``generate`` call stands after a round, summed over its documents."""

    sentences: int  # accepted so far
    candidates: int  # drawn so far, including those for the sentences still being searched
    drawn_for_current: int  # most candidates drawn so far for one unfinished sentence
    tokens: int  # tokens of the accepted sentences
    max_tokens: int  # documents * max_new_tokens
    texts: list[str]  # each document's continuation so far


def summarize(results: Sequence[GenerationResult]) -> dict:
    """Totals over results: candidates per accepted sentence, fallbacks, rejections, waste."""
    ok = [r for r in results if r.status == "ok"]
    sentences = sum(r.num_sentences for r in ok)
    candidates = sum(r.candidates for r in ok)
    decoded = sum(r.decoded_tokens for r in ok)
    return {
        "documents": len(ok),
        "sentences": sentences,
        "tokens": sum(r.num_tokens for r in ok),
        "candidates_per_sentence": candidates / sentences if sentences else None,
        "fallbacks": sum(r.fallbacks for r in ok),
        "pruned": sum(r.pruned for r in ok),
        "ended_by_model": sum(r.ended_by_model for r in ok),
        **{
            name: sum(r.rejected().get(name, 0) for r in ok)
            for name in sorted({n for r in ok for n in r.rejected()})
        },
        "wasted_token_share": sum(r.wasted_tokens for r in ok) / decoded if decoded else None,
        "seconds": sum(r.seconds for r in ok),
    }


@dataclass
class DetectionResult:
    """The verdict on one text."""

    status: str  # "ok", "too_short", "unsupported" or "error"
    z_score: float | None = None
    p_value: float | None = None
    num_scored: int = 0
    num_valid: int = 0
    watermarked: bool | None = None
    statistic: str = "exact"
    sentences: list[str] = field(default_factory=list)
    regions: list[int] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)  # seed / valid / invalid / repeat
    error: str | None = None
    seed_region: int | None = None  # region of the prompt sentence that seeded the first one
    seed_sentence: str | None = (
        None  # that sentence (the straddling one when the prompt ended mid-way)
    )
    completion: str | None = None  # the start of the text that completed the prompt's sentence
    scores: list[float | None] | None = None
    """Each unit's score, for a mark that scores units (``None`` where a unit is not scored)."""
    normalized: dict[str, int] = field(default_factory=dict)
    """What normalising text and prompt took, per kind (see ``normalize.NormalizedText``)."""
    log10_p_value: float | None = None
    """``log10`` of ``p_value``, computed in log space, when the p-value is below
    ``stats.P_FLOOR`` (then ``p_value`` holds that bound): an exact p-value is never 0."""
    details: dict[str, Any] = field(default_factory=dict)
    """The mark's own results beside the p-value (the direction mark's windowed tests:
    ``text_p_value``, ``span``, ``span_z``, ``span_p_value``, ``mixture_p_value``,
    ``weighted_p_value``), written into the record as they are."""

    @property
    def tampered(self) -> bool:
        """Whether the input held invisible characters or look-alike letters (``normalize``)."""
        return tampered(self.normalized)

    def to_record(self) -> dict:
        """Fields added to a JSONL record."""
        out = {
            "z_score": self.z_score,
            "p_value": self.p_value,
            "num_scored": self.num_scored,
            "num_valid": self.num_valid,
            "watermarked": self.watermarked,
            "statistic": self.statistic,
            "regions": self.regions,
            "verdicts": self.verdicts,
            "status": self.status,
        }
        if self.scores is not None:
            out["scores"] = [None if x is None else round(x, 6) for x in self.scores]
        if self.error:
            out["error"] = self.error
        if self.completion is not None:
            out["completion"] = self.completion
        out |= self.details
        if self.log10_p_value is not None:
            out["log10_p_value"] = self.log10_p_value
        if self.normalized:
            out["normalized"] = dict(self.normalized)
            out["tampered"] = self.tampered
        return out


def shown_p(p: float, log10: float | None = None) -> str:
    """A p-value as people read it: ``1.2e-05``, or below the reported floor ``< 1e-300
    (log10 p = -349.2)`` (``DetectionResult.log10_p_value``)."""
    if log10 is not None:
        return f"< {p:.0e} (log10 p = {log10:.1f})"
    return f"{p:.3g}"


def too_short(result: DetectionResult) -> DetectionResult:
    """``result`` marked as having nothing to score."""
    result.status = "too_short"
    result.error = "no sentence to score: a text needs two sentences, or one sentence and a prompt"
    return result
