"""What a mark is: the only code that knows its kind.

A mark is the key's rule for one unit of text (a sentence or a clause). It holds its key
material (built from the key when the mark is made), and everything that depends on it:

* **generation** (the sentence loop, ``watermarker``): ``new_state`` makes a document's own
  state (what the mark remembers of the units kept so far), ``seed`` and ``start`` set it from
  the prompt's last sentence or the keyed start value, ``prior`` sizes rounds, ``judge`` gives
  each finished candidate its ``Judgement`` (accepted or not, and why), ``pick`` chooses the
  unit kept when none was accepted, ``commit`` updates the state with the unit kept, and
  ``pruner`` and ``round_bias`` (optional) stop running rows early and steer them;
* **detection** (``Detector``): ``annotate`` adds what the mark scores to each text's key-free
  ``ScoringPlan``, ``evidence`` keeps the key-free part of its statistic, ``p_values`` applies
  keys to it (the detector's own key, or many keys at once in calibration: one
  implementation of each statistic), and ``test_batch`` turns a batch of plans into results;
* **presentation** (the CLI, the web page, the calibration and evaluation reports):
  ``report_lines``, ``view``, ``describe``.

The settings class of each kind (``settings.groups.MARK_KINDS``, the one registry) names its
mark (``MarkSettings.mark``), and ``marks.build_mark`` makes it. A new mark is one settings
class and one ``Mark`` subclass: nothing else compares kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import numpy as np
from torch import Tensor

from ..results import DetectionResult, Judgement, rank_of

if TYPE_CHECKING:
    from ..detection.plans import ScoringPlan
    from ..generation.engine import Candidate, Pruner
    from ..scheme.core import WatermarkScheme

PLAN_FIELDS = (
    "sentences",
    "regions",
    "seed_region",
    "seed_sentence",
    "completion",
    "normalized",
)
"""What a ``DetectionResult`` reports of its text's ``ScoringPlan`` as it is."""
Verdict = tuple[bool, Judgement]
"""``(accepted, judgement)`` of one candidate, as the sampler's judge returns it."""


class SentenceState(Protocol):
    """What a mark may read of a document while its next unit is searched."""

    previous: int  # region of the unit before (or the seed's, or the keyed start value)
    state: Any  # the mark's own per-document state (``Mark.new_state``)
    seen: set[str]  # ``normalize.sentence_key`` of each unit kept so far
    drawn: int  # candidates drawn for this unit before the current round

    @property
    def completing(self) -> bool: ...


class Drawn(NamedTuple):
    """The finished candidates of a round, as a mark judges them."""

    docs: Sequence[SentenceState]
    rows: Sequence[tuple[int, int]]
    """``(document index in docs, index in the round)`` of each candidate."""
    emb: Tensor
    """``(N, D)`` their embeddings."""
    regions: Tensor
    """``(N,)`` their regions."""
    margin_ok: Tensor
    """``(N,)`` whether each lies at least the partition's margin from its region's border."""
    texts: Sequence[str] = ()
    """Their texts (empty where a caller has none to give)."""


class Mark(ABC):
    """A watermark rule (see the module docstring), made from its settings, the scheme it
    scores with and the key (``None`` for a mark whose table is public). ``search``: the
    generation effort settings a mark made for generation reads (its settings' ``search``
    class; search settings of another kind become it, ``settings.marks.search_of``);
    ``steering``: a logit bias toward the key (``generation.steering``), for a mark that
    steers."""

    kind: ClassVar[str] = ""
    rejections: ClassVar[tuple[str, ...]] = ()
    """Why it turns candidates down (the reasons ``Judgement.reason`` names), counted per unit
    in the records as ``rejected_REASON``."""
    keyed: ClassVar[bool] = True

    def __init__(
        self,
        scheme: WatermarkScheme,
        settings: Any,
        key: str | None,
        search: Any = None,
        steering: Any = None,
    ) -> None:
        from ..settings.marks import search_of

        self.scheme = scheme
        self.settings = settings
        self.configure(key, search_of(settings, search), steering)

    @abstractmethod
    def configure(self, key: str | None, search: Any, steering: Any) -> None:
        """Build what this kind needs from the key, the generation effort ``search`` and
        ``steering`` (called by ``__init__`` once ``scheme`` and ``settings`` are set)."""

    @property
    def statistics(self) -> tuple[str, ...]:
        """The statistics its detector offers (``MarkSettings.statistics``)."""
        return tuple(type(self.settings).statistics)

    # ------------------------------------------------------------------ the key
    @property
    def key_fingerprint(self) -> str:
        """What records carry to name the key (never the key)."""
        return self.scheme.key_fingerprint

    @abstractmethod
    def material(self, key: str | None) -> Any:
        """The key material this mark draws from ``key`` (for calibration's random keys)."""

    @property
    @abstractmethod
    def own_material(self) -> Any:
        """The key material of the mark's own key."""

    # ------------------------------------------------------------------ generation
    @property
    def rejects_candidates(self) -> bool:
        """Whether the rule rejects candidates: rejections are counted, and a unit kept without
        an accepted candidate is a fallback. ``False``: a ranking mark, whose kept unit is the
        best-scoring candidate of the budget by rule."""
        return True

    def new_state(self) -> Any:
        """A document's state before its first unit (``None``: the mark keeps none)."""
        return None

    def seed(self, states: Sequence[Any], emb: Tensor, regions: Tensor) -> list[Any]:
        """The states of documents whose first unit follows sentences with ``(N, D)``
        embeddings ``emb`` in ``regions`` (a prompt's last sentence)."""
        return list(states)

    def start(self, state: Any) -> tuple[int, Any]:
        """The keyed start value's region, and the state it leaves, for a document that
        continues no sentence (an empty prompt, a chat answer)."""
        return self.scheme.start_region, state

    @abstractmethod
    def prior(self, previous: int) -> float:
        """Chance that one candidate after region ``previous`` is accepted, before any is drawn."""

    @abstractmethod
    def judge(self, drawn: Drawn) -> list[Verdict]:
        """One verdict per candidate of ``drawn``."""

    def pick(self, candidates: list[Candidate]) -> Candidate:
        """The one of a unit's scored ``candidates`` (each with its ``Judgement`` as ``info``) to
        keep when none was accepted: the first best-ranked (``results.rank_of``)."""
        return max(candidates, key=lambda c: rank_of(c.info))

    def commit(self, state: Any, previous: int, kept: Judgement, scored: bool) -> Any:
        """The state after a unit was kept after region ``previous`` (``scored``: detection will
        score it; ``False`` for a unit that only seeds: a completed prompt sentence)."""
        return state

    def pruner(self, docs: Sequence[SentenceState]) -> Pruner | None:
        """When the running rows of a round stop early (``None``: every row finishes)."""
        return None

    def steer(self, tokenizer: Any, vocab: int, cache: Any = None, pieces: Any = None) -> None:
        """Steer this mark's rounds toward the key for a generator of this ``tokenizer`` and
        ``vocab`` entries, as ``search.steer`` asks (``cache``: a folder for what steering
        computes once per vocabulary; ``pieces``: the vocabulary decoded entry by entry, when
        the engine has it); a mark that does not steer ignores it."""
        return None

    def round_bias(self, docs: Sequence[SentenceState]) -> Tensor | None:
        """``(docs, V)`` logit bias the rows of each document's round decode with
        (``generation.steering``); ``None``: none."""
        return None

    # ------------------------------------------------------------------ detection
    @property
    def scores_first(self) -> bool:
        """Whether a text's first unit is scored without a unit before it
        (``MarkSettings.scores_first``)."""
        return bool(self.settings.scores_first)

    def annotate(self, plans: Sequence[ScoringPlan], emb: Tensor, regions: Tensor) -> None:
        """Give each plan what the mark scores (``ScoringPlan.data``): ``emb`` and ``regions``
        hold, for the plans in order, the seed's row (when the plan has a seed) and then one
        row per sentence. A mark that scores regions alone needs nothing more."""
        return None

    @abstractmethod
    def evidence(self, plans: Sequence[ScoringPlan], scan: bool = False) -> list[Any]:
        """The key-free part of the statistic of each plan (each with something to score);
        ``scan``: what the mark's windowed tests need too."""

    def batch(self, evidence: Sequence[Any]) -> Any:
        """Many texts' evidence stacked once, for ``p_values`` under many keys."""
        return list(evidence)

    @abstractmethod
    def p_values(
        self, batch: Any, materials: Sequence[Any], rng: np.random.Generator | None = None
    ) -> list[dict[str, np.ndarray]]:
        """Per key material, each text of ``batch`` (``batch(evidence)``): its ``z`` and its
        p-value under every statistic of ``statistics`` (``rng``: also the tie-randomised
        ones, ``exact_randomised``, a calibration diagnostic, exactly uniform under the
        null)."""

    @abstractmethod
    def test_batch(
        self, plans: Sequence[ScoringPlan], statistic: str, alpha: float, scan: bool
    ) -> list[DetectionResult]:
        """The detector's verdicts on plans planned without error, under the mark's own key:
        ``p_value`` under ``statistic``, watermarked at ``alpha``; ``scan``: also the windowed
        tests, for a mark that has them."""

    def simulated_power(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Power on simulated watermarked texts for calibration, where the mark can simulate
        them (``None``: it cannot)."""
        return None

    # ------------------------------------------------------------------ presentation
    @abstractmethod
    def describe(self, scan: bool = False) -> dict[str, Any]:
        """What the mark is, in words and settings, for reports: ``keys`` (what a key draws),
        ``statistic`` (the p-value in words), ``counted`` (what ``num_valid`` counts),
        ``z`` (what ``z_score`` is), ``settings`` (its identity settings) and ``statistics``."""

    def report_lines(self, result: DetectionResult, unit: str) -> list[str]:
        """The further tests of a result, one entry each, as the CLI's report lists them
        (their p-value combined into ``p_value``); none by default."""
        return []

    @abstractmethod
    def view(self, result: DetectionResult, alpha: float, unit: str) -> dict[str, Any]:
        """What the web page shows of a result beyond the common fields: ``explanation``,
        ``null`` (the chart of the null law), ``expected`` (units by chance), ``previous``
        (whether a unit's verdict depends on the one before it) and the mark's own fields."""


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
