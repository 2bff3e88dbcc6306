"""Watermark detection, batched over many texts.

Every text is split into sentences; all sentences of all texts go through the encoder in one
pass; each text's region sequence is then scored (see ``stats``).

Scoring rules:

* With a prompt, the region of the prompt's last sentence seeds the text's first sentence, which
  is then scored (as in generation). Without one, the text's first sentence only seeds.
* A sentence that repeats an earlier sentence of the same text (case and whitespace ignored) is
  not scored: it still sets the previous region, but copying one valid sentence many times
  cannot raise the count.
* A text with no scored sentence has no statistic: status ``too_short``.
* The margin is not applied at detection.

``z_score`` is always the paper's z (comparable with published numbers); ``p_value`` comes from
the configured statistic (``exact`` by default) and alone decides ``watermarked``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .scheme import WatermarkScheme
from .stats import STATISTICS, exact_p_value, normal_sf, paper_z, transition_matrix

_SPACE = re.compile(r"\s+")


@dataclass
class DetectionResult:
    """The verdict on one text."""

    status: str  # "ok", "too_short" or "error"
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
        if self.error:
            out["error"] = self.error
        return out


def _norm(sentence: str) -> str:
    return _SPACE.sub(" ", sentence).strip().lower()


class Detector:
    """Scores texts for the watermark of a ``WatermarkScheme``.

    Args:
        scheme: the same scheme (encoder, partition, key) that generated the text.
        statistic: ``exact`` (key-randomisation p-value, calibrated) or ``paper`` (normal tail
            of the paper's z).
        alpha: texts with ``p_value <= alpha`` are called watermarked.
    """

    def __init__(self, scheme: WatermarkScheme, statistic: str = "exact", alpha: float = 0.01):
        if statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, not {statistic!r}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.scheme = scheme
        self.statistic = statistic
        self.alpha = alpha

    def detect(self, text: str, prompt: str | None = None) -> DetectionResult:
        """Score one text (see ``detect_batch``)."""
        return self.detect_batch([text], [prompt])[0]

    def detect_batch(
        self, texts: Sequence[str], prompts: Sequence[str | None] | None = None
    ) -> list[DetectionResult]:
        """Score many texts with one encoder pass over all their sentences.

        A text that is not a string gets status ``error``; the others are still scored.
        """
        prompts = list(prompts) if prompts is not None else [None] * len(texts)
        if len(prompts) != len(texts):
            raise ValueError("need one prompt (or None) per text")
        splitter = self.scheme.splitter
        plans: list[tuple[list[str], bool] | str] = []
        flat: list[str] = []
        for text, prompt in zip(texts, prompts, strict=True):
            if not isinstance(text, str):
                plans.append(f"text must be a string, got {type(text).__name__}")
                continue
            if prompt is not None and not isinstance(prompt, str):
                plans.append(f"prompt must be a string, got {type(prompt).__name__}")
                continue
            sentences = splitter.split(text)
            seeded = False
            if prompt:
                prompt_sentences = splitter.split(prompt)
                if prompt_sentences:
                    sentences = [prompt_sentences[-1], *sentences]
                    seeded = True
            plans.append((sentences, seeded))
            flat.extend(sentences)
        regions = self.scheme.regions(flat)[0].tolist()

        out: list[DetectionResult] = []
        cursor = 0
        for plan in plans:
            if isinstance(plan, str):
                out.append(DetectionResult(status="error", error=plan, statistic=self.statistic))
                continue
            sentences, seeded = plan
            seq = regions[cursor : cursor + len(sentences)]
            cursor += len(sentences)
            out.append(self._score(sentences, seq, seeded))
        return out

    def _score(self, sentences: list[str], regions: list[int], seeded: bool) -> DetectionResult:
        verdicts: list[str] = []
        scored: list[bool] = []
        seen: set[str] = set()
        num_valid = 0
        for t, sentence in enumerate(sentences):
            key = _norm(sentence)
            if t == 0:
                verdicts.append("seed")
                scored.append(False)
                if not seeded:
                    seen.add(key)
                continue
            if key in seen:
                verdicts.append("repeat")
                scored.append(False)
                continue
            seen.add(key)
            valid = bool(self.scheme.table[regions[t - 1], regions[t]])
            num_valid += valid
            verdicts.append("valid" if valid else "invalid")
            scored.append(True)
        num_scored = sum(scored)
        # Report the text's own sentences; the prompt's seeding sentence is not part of it.
        shown = slice(1, None) if seeded else slice(None)
        result = DetectionResult(
            status="ok",
            num_scored=num_scored,
            num_valid=num_valid,
            statistic=self.statistic,
            sentences=sentences[shown],
            regions=regions[shown],
            verdicts=verdicts[shown],
            seed_region=regions[0] if seeded else None,
        )
        if num_scored == 0:
            result.status = "too_short"
            result.error = (
                "no sentence to score: a text needs two sentences, or one sentence and a prompt"
            )
            return result
        z = paper_z(num_valid, num_scored, self.scheme.gamma)
        if self.statistic == "paper":
            p = normal_sf(z)
        else:
            counts = transition_matrix(regions, scored, self.scheme.num_regions)
            p = exact_p_value(counts, self.scheme.table.numpy())
        result.z_score = float(z)
        result.p_value = float(p)
        result.watermarked = p <= self.alpha
        return result
