"""Watermark detection, batched over many texts.

Every text is split into sentences; all sentences of all texts go through the encoder in one
pass; each text's region sequence is then scored (see ``stats``).

Scoring rules (``ScoringPlan``; none of them depends on the key):

* With a prompt that ends a sentence, the region of the prompt's last sentence seeds the text's
  first sentence, which is then scored (as in generation). Without a prompt (or with an empty
  one), the text's first sentence only seeds.
* With a prompt that ends mid-sentence, the text begins by completing that sentence (as the
  generator does): prompt and text are split as one text (``prompt.rstrip() + text``), the
  sentence holding the prompt's end (the *straddling* sentence) seeds, and the sentences that
  start after the prompt's end are the text's sentences. ``continuation_sentences`` is the rule;
  generation checks its completions with it, so both cut the same sentences.
* A sentence that repeats an earlier sentence of the same text (case and whitespace ignored) is
  not scored: it still sets the previous region, but copying one valid sentence many times
  cannot raise the count.
* A text with no scored sentence has no statistic: status ``too_short``.
* Code points no model can read (lone surrogates, noncharacters) are removed first
  (``textcheck.readable``). Input that is not text (mostly control or undecodable characters)
  or longer than ``max_chars`` is refused (status ``error``); text in a script the splitter and encoder do not
  read, or with no letters, gets status ``unsupported`` (see ``textcheck``).
* The margin is not applied at detection.
* Text and prompt are read in their normalised form (``normalize``): invisible characters
  removed, compatibility forms and look-alike letters read as plain Latin ones, single line
  breaks inside a paragraph read as spaces. What that took is reported (``normalized``); look-
  alike letters or invisible characters are a sign that the text was altered on purpose.

The key enters only afterwards. Under the ``region`` mark the valid table turns each scored
transition into a verdict; under the ``direction`` mark the key's direction for the previous
sentence's region gives each scored sentence a score (``scores``), positive scores counting as
``valid``. Calibration consumes the same plans (``Detector.plan_batch``) under many keys.

``z_score``: under the ``region`` mark always the paper's z (comparable with published numbers);
under the ``direction`` mark the exact z of ``stats.direction_z``. ``p_value`` comes from the
configured statistic (``exact`` by default) and alone decides ``watermarked``. With ``scan``
(the direction mark's windowed detection, ``ksemstamp.scan``) the best span of consecutive
scored sentences is reported too (``span``), and ``p_value`` combines the whole text's
(``text_p_value``) and the span's by Bonferroni.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .normalize import normalize_text
from .results import DetectionResult, too_short
from .scan import combine, scan_seed, score_covariance
from .scan import scan as scan_spans
from .scheme import WatermarkScheme
from .splitter import PunktSplitter
from .stats import (
    STATISTICS,
    direction_z,
    exact_p_value,
    normal_sf,
    paper_z,
    transition_matrix,
)
from .textcheck import not_text, unsupported_script

_SPACE = re.compile(r"\s+")

SEED, SCORED, REPEAT = "seed", "scored", "repeat"
PROGRESS_SENTENCES = 512
"""Encoder passes over more sentences than this show a progress bar when asked for one (a few
seconds and more on a CPU; a 200,000-character text has about 1,400 sentences, ~40 s)."""


def continuation_sentences(
    splitter: PunktSplitter, prompt: str | None, text: str
) -> tuple[str | None, list[str], str | None]:
    """How a ``text`` that continues ``prompt`` is cut: ``(seed, sentences, completion)``.

    * no prompt, or a blank one: no seed; ``sentences`` are the text's own.
    * a prompt that ends a sentence: its last sentence seeds; the text is split on its own.
    * a prompt that ends mid-sentence: ``prompt.rstrip() + text`` is split as one text; the
      sentence holding the prompt's end seeds, the sentences starting after it are the
      text's, and ``completion`` is the part of the text inside the seed (``""`` when the
      text adds nothing to it).

    ``completion`` is ``None`` unless the prompt ends mid-sentence. Both are read in their
    normalised form (``normalize``), and ``completion`` is part of the normalised text.
    """
    text = normalize_text(text).text
    prompt = normalize_text(prompt).text if prompt else prompt
    prompt_sentences = splitter.split(prompt) if prompt else []
    if not prompt_sentences:
        return None, splitter.split(text), None
    if splitter.ends_sentence(prompt_sentences[-1]):
        return prompt_sentences[-1], splitter.split(text), None
    head = prompt.rstrip()
    spans = splitter.spans(head + text)
    start, seed = [(at, s) for at, s in spans if at < len(head)][-1]
    completion = text[: max(0, start + len(seed) - len(head))]
    return seed, [s for at, s in spans if at >= len(head)], completion


@dataclass
class ScoringPlan:
    """What the detector scores in one text, before any key is applied.

    Attributes:
        sentences: the text's own sentences (the prompt's seeding sentence is not one of them).
        regions: their regions.
        seed_region: region of the prompt's last sentence when a prompt seeds the text.
        roles: per sentence ``seed`` (only sets the previous region), ``scored`` or ``repeat``.
        vectors: ``(N, D)`` what the ``direction`` mark scores (``WatermarkScheme.vectors``) of
            each sentence; ``None`` under the ``region`` mark.
        weights: ``(N + 1, K)`` ``direction`` mark: the context weights
            (``WatermarkScheme.context_weights``) of the seed (row 0; zeros without a seed)
            and of each sentence; ``None`` under the ``region`` mark.
        own: ``direction`` mark with ``context: own``: each sentence is scored on its own
            context weights, not those of the sentence (or seed) before it.
        error: why the text could not be planned (then everything else is empty).
        status: ``ok``, or for a text that could not be planned ``error`` (bad input) or
            ``unsupported`` (a script the splitter and encoder do not read).
        seed: the sentence whose region is ``seed_region``.
        completion: the part of the text that completed a prompt ending mid-sentence.
        normalized: what normalising text and prompt took, per kind.
    """

    sentences: list[str] = field(default_factory=list)
    regions: list[int] = field(default_factory=list)
    seed_region: int | None = None
    roles: list[str] = field(default_factory=list)
    vectors: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    error: str | None = None
    status: str = "ok"
    seed: str | None = None
    completion: str | None = None
    normalized: dict[str, int] = field(default_factory=dict)
    own: bool = False

    @classmethod
    def refused(cls, error: str, status: str = "error") -> ScoringPlan:
        """The plan of a text that cannot be scored, and why."""
        return cls(error=error, status=status)

    @property
    def previous(self) -> list[int | None]:
        """The region before each sentence (``None`` before an unseeded first sentence)."""
        return [self.seed_region, *self.regions][: len(self.regions)]

    @property
    def num_scored(self) -> int:
        return self.roles.count(SCORED)

    @property
    def scored(self) -> list[bool]:
        """The scored mask over ``sentences``."""
        return [role == SCORED for role in self.roles]

    def scored_contexts(self) -> tuple[list[int], list[int]]:
        """Indices of the scored sentences and the region of each one's context (its own
        under ``own``, else the region before it)."""
        rows = [t for t, role in enumerate(self.roles) if role == SCORED]
        regions = self.regions if self.own else self.previous
        return rows, [int(regions[t]) for t in rows]

    def context_weights(self, rows: Sequence[int]) -> torch.Tensor:
        """``(len(rows), K)`` the contexts sentences ``rows`` are scored on: their own weights
        (``own``), else those of the sentence, or seed, before each."""
        return self.weights[[r + self.own for r in rows]]

    def transition_counts(self, num_regions: int):
        """``(K, K)`` counts of the scored transitions ``(previous region, region)``."""
        if self.seed_region is None:
            return transition_matrix(self.regions, self.scored, num_regions)
        return transition_matrix(
            [self.seed_region, *self.regions], [False, *self.scored], num_regions
        )


def _norm(sentence: str) -> str:
    return _SPACE.sub(" ", sentence).strip().lower()


def _roles(sentences: Sequence[str], seeded: bool) -> list[str]:
    """Seed, scored or repeat for each sentence of a text (see the module's rules)."""
    roles: list[str] = []
    seen: set[str] = set()
    for t, sentence in enumerate(sentences):
        key = _norm(sentence)
        if t == 0 and not seeded:
            roles.append(SEED)
        elif key in seen:
            roles.append(REPEAT)
        else:
            roles.append(SCORED)
        seen.add(key)
    return roles


class Detector:
    """Scores texts for the watermark of a ``WatermarkScheme``.

    Args:
        scheme: the same scheme (encoder, partition, key) that generated the text.
        statistic: ``exact`` (key-randomisation p-value, calibrated) or ``paper`` (normal tail
            of the paper's z; ``region`` mark only).
        alpha: texts with ``p_value <= alpha`` are called watermarked.
        max_chars: longest text (with its prompt) to score, in characters; a longer one gets
            status ``error`` without being split or embedded. ``None``: no limit.
        scan: ``direction`` mark: also scan spans of consecutive sentences for the one that
            carries the mark (``scan``); ``p_value`` is then the Bonferroni combination of the
            whole text's and the best span's.
    """

    def __init__(
        self,
        scheme: WatermarkScheme,
        statistic: str = "exact",
        alpha: float = 0.01,
        max_chars: int | None = None,
        scan: bool = False,
    ):
        if statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, not {statistic!r}")
        if statistic == "paper" and scheme.mark == "direction":
            raise ValueError("the paper statistic is defined for the region mark only")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars must be >= 1 or None, got {max_chars}")
        self.scheme = scheme
        self.statistic = statistic
        self.alpha = alpha
        self.max_chars = max_chars
        self.scan = scan and scheme.mark == "direction"

    def detect(
        self, text: str, prompt: str | None = None, progress: bool = False
    ) -> DetectionResult:
        """Score one text (see ``detect_batch``)."""
        return self.detect_batch([text], [prompt], progress=progress)[0]

    def detect_batch(
        self,
        texts: Sequence[str],
        prompts: Sequence[str | None] | None = None,
        progress: bool = False,
    ) -> list[DetectionResult]:
        """Score many texts with one encoder pass over all their sentences.

        A text that is not a string, not text, or over ``max_chars`` gets status ``error``, one
        the splitter and encoder cannot read ``unsupported``; the others are still scored.
        ``progress`` shows a bar while many sentences are embedded.
        """
        return [self.score(plan) for plan in self.plan_batch(texts, prompts, progress)]

    def check(self, text: object, prompt: object = None) -> ScoringPlan | None:
        """The refusal of one input (see ``detect_batch``), or ``None`` when it can be planned.
        Cheap: nothing is split or embedded."""
        if not isinstance(text, str):
            return ScoringPlan.refused(f"text must be a string, got {type(text).__name__}")
        if prompt is not None and not isinstance(prompt, str):
            return ScoringPlan.refused(f"prompt must be a string, got {type(prompt).__name__}")
        size = len(text) + len(prompt or "")
        if self.max_chars is not None and size > self.max_chars:
            what = "text and prompt have" if prompt else "text has"
            return ScoringPlan.refused(
                f"the {what} {size:,} characters; the limit is {self.max_chars:,} (max_text_chars)"
            )
        for name, value in (("text", text), ("prompt", prompt)):
            problem = not_text(value, name) if value else None
            if problem:
                return ScoringPlan.refused(problem)
        problem = unsupported_script(text)
        if problem:
            return ScoringPlan.refused(problem, status="unsupported")
        return None

    def plan_batch(
        self,
        texts: Sequence[str],
        prompts: Sequence[str | None] | None = None,
        progress: bool = False,
    ) -> list[ScoringPlan]:
        """The key-free ``ScoringPlan`` of each text, with one encoder pass over all sentences
        (each text's, and each prompt's seeding sentence)."""
        prompts = list(prompts) if prompts is not None else [None] * len(texts)
        if len(prompts) != len(texts):
            raise ValueError("need one prompt (or None) per text")
        splitter = self.scheme.splitter
        plans: list[ScoringPlan] = []
        seeded: list[ScoringPlan] = []
        flat: list[str] = []
        for text, prompt in zip(texts, prompts, strict=True):
            refusal = self.check(text, prompt)
            if refusal is not None:
                plans.append(refusal)
                continue
            text, prompt, normalized = _normalized(text, prompt)
            seed, sentences, completion = continuation_sentences(splitter, prompt, text)
            plans.append(
                ScoringPlan(
                    sentences=sentences, seed=seed, completion=completion, normalized=normalized
                )
            )
            seeded.append(plans[-1])
            flat += ([seed] if seed is not None else []) + sentences
        show = progress and len(flat) > PROGRESS_SENTENCES
        emb = self.scheme.embed(flat, progress=show)
        located = self.scheme.locate(emb)[0]
        regions = iter(located.tolist())
        direction = self.scheme.mark == "direction"
        vectors = self.scheme.vectors(emb) if direction else None
        weights = self.scheme.context_weights(emb, located) if direction else None
        row = 0
        for plan in seeded:
            has_seed = plan.seed is not None
            plan.seed_region = next(regions) if has_seed else None
            plan.regions = [next(regions) for _ in plan.sentences]
            plan.own = direction and self.scheme.context == "own"
            # Under own contexts every sentence is scored: the first needs nothing before it.
            plan.roles = _roles(plan.sentences, has_seed or plan.own)
            if vectors is not None:
                first = weights[row : row + 1] if has_seed else torch.zeros_like(weights[:1])
                own = weights[row + has_seed : row + has_seed + len(plan.sentences)]
                plan.weights = torch.cat([first, own])
            row += has_seed
            if vectors is not None:
                plan.vectors = vectors[row : row + len(plan.sentences)]
            row += len(plan.sentences)
        return plans

    def score(self, plan: ScoringPlan) -> DetectionResult:
        """Apply the scheme's valid table and the statistic to one plan."""
        if plan.error is not None:
            return DetectionResult(status=plan.status, error=plan.error, statistic=self.statistic)
        if self.scheme.mark == "direction":
            return self._score_direction(plan)
        table = self.scheme.table
        verdicts = []
        for prev, region, role in zip(plan.previous, plan.regions, plan.roles, strict=True):
            if role == SCORED:
                role = "valid" if bool(table[prev, region]) else "invalid"
            verdicts.append(role)
        num_valid = verdicts.count("valid")
        num_scored = plan.num_scored
        result = DetectionResult(
            status="ok",
            num_scored=num_scored,
            num_valid=num_valid,
            statistic=self.statistic,
            sentences=plan.sentences,
            regions=plan.regions,
            verdicts=verdicts,
            seed_region=plan.seed_region,
            seed=plan.seed,
            completion=plan.completion,
            normalized=plan.normalized,
        )
        if num_scored == 0:
            return too_short(result)
        z = paper_z(num_valid, num_scored, self.scheme.gamma)
        if self.statistic == "paper":
            p = normal_sf(z)
        else:
            counts = plan.transition_counts(self.scheme.num_regions)
            p = exact_p_value(counts, table.numpy())
        result.z_score = float(z)
        result.p_value = float(p)
        result.watermarked = p <= self.alpha
        return result

    def _score_direction(self, plan: ScoringPlan) -> DetectionResult:
        """The ``direction`` mark: each scored sentence's projection on its context's keyed
        direction, summed into the exact z of ``stats.direction_z``."""
        rows, _ = plan.scored_contexts()
        contexts = plan.context_weights(rows)
        scores: list[float | None] = [None] * len(plan.sentences)
        verdicts = list(plan.roles)
        if rows:
            values = self.scheme.scores(plan.vectors[rows], contexts).tolist()
            for t, value in zip(rows, values, strict=True):
                scores[t] = float(value)
                verdicts[t] = "valid" if value > 0 else "invalid"
        result = DetectionResult(
            status="ok",
            num_scored=len(rows),
            num_valid=verdicts.count("valid"),
            statistic=self.statistic,
            sentences=plan.sentences,
            regions=plan.regions,
            verdicts=verdicts,
            seed_region=plan.seed_region,
            seed=plan.seed,
            completion=plan.completion,
            scores=scores,
            normalized=plan.normalized,
        )
        if not rows:
            return too_short(result)
        z = direction_z(
            plan.vectors[rows].double().numpy(),
            contexts.numpy(),
            self.scheme.directions.double().numpy(),
        )
        result.z_score = float(z)
        result.text_p_value = float(normal_sf(z))
        result.p_value = result.text_p_value
        if self.scan:
            cov = score_covariance(contexts.double().numpy(), plan.vectors[rows].double().numpy())
            seed = scan_seed([plan.sentences[t] for t in rows])
            best = scan_spans(np.array([scores[t] for t in rows]), cov, seed)
            if best is not None:
                result.span = [rows[best.start], rows[best.stop - 1] + 1]
                result.span_z, result.span_p_value = best.z, best.p_value
                result.p_value = combine(result.text_p_value, best.p_value)
        result.watermarked = result.p_value <= self.alpha
        return result


def _normalized(text: str, prompt: str | None) -> tuple[str, str | None, dict[str, int]]:
    """Text and prompt in their normalised form, and what that took (counts added up)."""
    out = normalize_text(text)
    counts = dict(out.counts)
    if prompt:
        norm_prompt = normalize_text(prompt)
        prompt = norm_prompt.text
        for kind, n in norm_prompt.counts.items():
            counts[kind] = counts.get(kind, 0) + n
    return out.text, prompt, counts
