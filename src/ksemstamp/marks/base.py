"""What a mark is to the sentence loop (``watermarker``) and to the ``Detector``.

A mark is the key's rule for one sentence. The loop draws rounds of candidate sentences and
asks the mark four things; the detector asks it one:

* ``prior``: the chance that one candidate is accepted before any was drawn (round sizing);
* ``judge``: each finished candidate's ``Judgement`` and whether it is accepted. The sampler
  keeps the first accepted candidate of a round in draw order (ordered first-valid); a mark
  that accepts none (``turns_down`` False) is a ranking: the loop keeps the best-scoring
  candidate of the budget;
* ``contexts``: what a kept sentence hands the sentence after it (``None``: nothing but its
  region);
* ``pruner``: optionally, when running candidate rows of a round stop early;
* ``test`` (``test_batch`` for many texts at once): the detector's verdict on a text's
  key-free ``ScoringPlan``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from torch import Tensor

from ..results import DetectionResult, Judgement

if TYPE_CHECKING:
    from ..detection.plans import ScoringPlan
    from ..generation.sampler import Pruner
    from ..scheme.core import WatermarkScheme

PLAN_FIELDS = ("sentences", "regions", "seed_region", "seed", "completion", "normalized")
"""What a ``DetectionResult`` reports of its text's ``ScoringPlan`` as it is."""
Verdict = tuple[bool, Judgement]
"""``(accepted, judgement)`` of one candidate, as the sampler's judge returns it."""


class SentenceState(Protocol):
    """What a mark may read of a document while its next sentence is searched."""

    previous: int  # region of the sentence before (or the seed's, or the keyed start value)
    weights: Tensor | None  # the context that sentence handed on (``Mark.contexts``)
    used: set[tuple[int, int]]  # the document's transitions so far
    seen: set[str]  # ``normalize.sentence_key`` of each sentence kept so far
    drawn: int  # candidates drawn for this sentence before the current round
    evidence: Tensor | None  # (K, D) sum over kept sentences of context (x) vector, or None
    evidence_score: float  # sum of the kept sentences' scores

    @property
    def completing(self) -> bool: ...


class Round(NamedTuple):
    """The finished candidates of a round, as a mark judges them."""

    docs: Sequence[SentenceState]
    rows: Sequence[tuple[int, int]]
    """``(document index in docs, index in the round)`` of each candidate."""
    emb: Tensor
    """``(N, D)`` their embeddings."""
    regions: Tensor
    """``(N,)`` their regions."""
    margin_ok: Tensor
    """``(N,)`` whether each lies at least the margin from its region's border."""
    texts: Sequence[str] = ()
    """Their texts (empty where a caller has none to give)."""


class Mark(ABC):
    """A watermark rule (see the module docstring). ``name`` is ``WatermarkScheme.mark``."""

    name: str = ""

    def __init__(self, scheme: WatermarkScheme) -> None:
        self.scheme = scheme

    @property
    def turns_down(self) -> bool:
        """Whether the rule rejects candidates: rejections are counted, and a sentence kept
        without an accepted candidate is a fallback. ``False``: a ranking mark, whose kept
        sentence is the best-scoring candidate of the budget by rule."""
        return True

    @abstractmethod
    def prior(self, previous: int) -> float:
        """Chance that one candidate after region ``previous`` is accepted, before any is drawn."""

    @abstractmethod
    def judge(self, drawn: Round) -> list[Verdict]:
        """One verdict per candidate of ``drawn``; ``Judgement.context`` is what the candidate
        would hand the sentence after it."""

    def contexts(self, emb: Tensor, regions: Tensor) -> list[Tensor | None]:
        """What each of ``(N, D)`` sentence embeddings hands the sentence after it."""
        return [None] * len(emb)

    def start_context(self) -> Tensor | None:
        """What the keyed start value hands the first sentence of a text that continues none."""
        return None

    def pruner(self, docs: Sequence[SentenceState]) -> Pruner | None:
        """When the running rows of a round stop early (``None``: every row finishes)."""
        return None

    def round_bias(self, docs: Sequence[SentenceState]) -> Tensor | None:
        """``(docs, V)`` logit bias the rows of each document's round decode with
        (``generation.steering``); ``None``: none."""
        return None

    @abstractmethod
    def test(self, plan: ScoringPlan, statistic: str, alpha: float, scan: bool) -> DetectionResult:
        """The detector's verdict on one text's ``plan`` (planned without error): its p-value
        under ``statistic``, watermarked at ``alpha``; ``scan``: also search the best span
        (a mark without windowed detection ignores it)."""

    def test_batch(
        self, plans: Sequence[ScoringPlan], statistic: str, alpha: float, scan: bool
    ) -> list[DetectionResult]:
        """``test`` of many plans at once; a mark that can batch across texts overrides it."""
        return [self.test(plan, statistic, alpha, scan) for plan in plans]


def plan_result(
    plan: ScoringPlan,
    statistic: str,
    verdicts: list[str],
    num_scored: int,
    scores: list[float | None] | None = None,
) -> DetectionResult:
    """The ``DetectionResult`` of a plan before its statistic: what was scored and how."""
    return DetectionResult(
        status="ok",
        num_scored=num_scored,
        num_valid=verdicts.count("valid"),
        statistic=statistic,
        verdicts=verdicts,
        scores=scores,
        **{name: getattr(plan, name) for name in PLAN_FIELDS},
    )
