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

The key enters only afterwards, through the scheme's mark (``marks``): the region mark turns
each scored transition into a verdict under its valid table, the direction mark gives each
scored unit a score along its keyed direction; each reports its own ``z_score``, ``p_value``
under the configured statistic (``exact`` by default), which alone decides ``watermarked``,
and its own further results (``DetectionResult.details``: the direction mark's windowed
tests under ``scan``). Calibration consumes the same plans (``Detector.plan_batch``) and the
same mark under many keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .detection.plans import REPEAT, SCORED, SEED, ScoringPlan
from .detection.stats import P_FLOOR
from .marks import Mark, build_mark
from .results import DetectionResult
from .scheme.core import WatermarkScheme
from .settings.groups import DetectionSettings, LimitSettings
from .text.normalize import normalize_text, sentence_key
from .text.splitter import continuation_sentences
from .text.textcheck import not_text, unsupported_script

PROGRESS_SENTENCES = 512
"""Encoder passes over more sentences than this show a progress bar when asked for one (a few
seconds and more on a CPU; a 200,000-character text has about 1,400 sentences, ~40 s)."""


def _roles(sentences: Sequence[str], seeded: bool) -> list[str]:
    """Seed, scored or repeat for each sentence of a text (see the module's rules)."""
    roles: list[str] = []
    seen: set[str] = set()
    for t, sentence in enumerate(sentences):
        key = sentence_key(sentence)
        if t == 0 and not seeded:
            roles.append(SEED)
        elif key in seen:
            roles.append(REPEAT)
        else:
            roles.append(SCORED)
        seen.add(key)
    return roles


class Detector:
    """Scores texts for the watermark of a ``WatermarkScheme``. Each argument's default is the
    setting it stands for (``DetectionSettings``, ``LimitSettings``).

    Args:
        scheme: the same scheme (encoder, partition, key, mark settings) that generated the
            text; its mark (``marks.build_mark``) applies the key.
        statistic: one of the mark's statistics (``Mark.statistics``): ``exact``
            (key-randomisation p-value, calibrated), or the region mark's ``paper``.
        alpha: texts with ``p_value <= alpha`` are called watermarked.
        max_chars: longest text (with its prompt) to score, in characters; a longer one gets
            status ``error`` without being split or embedded. ``None``: no limit.
        scan: the mark's windowed tests too, for a mark that has them (the direction mark:
            spans of consecutive units, marked units scattered, units that move together
            counted once; ``p_value`` then combines them).
        mark: the mark to detect with instead of the one the scheme's settings make.
    """

    def __init__(
        self,
        scheme: WatermarkScheme,
        statistic: str = DetectionSettings.statistic,
        alpha: float = DetectionSettings.alpha,
        max_chars: int | None = LimitSettings.max_text_chars,
        scan: bool = DetectionSettings.scan,
        mark: Mark | None = None,
    ):
        mark = mark or build_mark(scheme)
        if statistic not in mark.statistics:
            raise ValueError(f"statistic must be one of {list(mark.statistics)}, not {statistic!r}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"max_chars must be >= 1 or None, got {max_chars}")
        self.scheme = scheme
        self.statistic = statistic
        self.alpha = alpha
        self.max_chars = max_chars
        self.scan = scan
        self.mark = mark

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
        return self.score_batch(self.plan_batch(texts, prompts, progress))

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
                f"the {what} {size:,} characters; the limit is {self.max_chars:,} (limits.max_text_chars)"
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
                    sentences=sentences,
                    seed_sentence=seed,
                    completion=completion,
                    normalized=normalized,
                )
            )
            seeded.append(plans[-1])
            flat += ([seed] if seed is not None else []) + sentences
        show = progress and len(flat) > PROGRESS_SENTENCES
        emb = self.scheme.embed(flat, progress=show)
        located = self.scheme.locate(emb)[0]
        regions = iter(located.tolist())
        for plan in seeded:
            has_seed = plan.seed_sentence is not None
            plan.seed_region = next(regions) if has_seed else None
            plan.regions = [next(regions) for _ in plan.sentences]
            # A mark that scores the first unit on its own needs nothing before it.
            plan.roles = _roles(plan.sentences, has_seed or self.mark.scores_first)
        if seeded:
            self.mark.annotate(seeded, emb, located)
        return plans

    def score(self, plan: ScoringPlan) -> DetectionResult:
        """Apply the key (the scheme's mark, ``Mark.test``) and the statistic to one plan."""
        return self.score_batch([plan])[0]

    def score_batch(self, plans: Sequence[ScoringPlan]) -> list[DetectionResult]:
        """``score`` of many plans, batched across texts by the mark (``Mark.test_batch``)."""
        results: list[DetectionResult | None] = [
            None
            if plan.error is None
            else DetectionResult(status=plan.status, error=plan.error, statistic=self.statistic)
            for plan in plans
        ]
        ok = [i for i, result in enumerate(results) if result is None]
        tested = self.mark.test_batch([plans[i] for i in ok], self.statistic, self.alpha, self.scan)
        for i, result in zip(ok, tested, strict=True):
            results[i] = floored(result)
        return results


def floored(result: DetectionResult) -> DetectionResult:
    """``result`` with its p-value as every record reports one: a p-value below ``P_FLOOR``
    that the mark gave as a number is the floor, with its ``log10_p_value``; a mark that
    reports 0 breaks its contract (an exact p-value is never 0) and is refused."""
    p = result.p_value
    if p is None or result.log10_p_value is not None or p >= P_FLOOR:
        return result
    if p <= 0:
        raise ValueError(
            f"the {result.statistic} p-value of a text is {p}: a mark reports p > 0, giving one "
            "below 1e-300 as the floor with its log10_p_value (detection.stats.reported_p)"
        )
    result.p_value, result.log10_p_value = P_FLOOR, math.log10(p)
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
