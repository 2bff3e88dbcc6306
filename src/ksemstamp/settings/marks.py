"""The ``mark`` group of the settings: one settings class per kind of mark, and the one registry
of kinds (``MARK_KINDS``, ``register_mark``). Each class names its ``Mark`` and says what only it
reads of the other groups, and its ``search`` group (``DirectionSearch``, ``RegionSearch``: the
shared ``search.SearchSettings`` and its own knobs); the other groups are ``groups``' (whose
``DetectionSettings`` the methods here read: typed ``Any`` so that this module imports none)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Annotated, Any, ClassVar, Literal

from .checks import Range, check
from .search import SearchSettings, search_for

ValidMode = Literal["keyed", "paper"]
Context = Literal["own", "previous"]
Selection = Literal["text", "sentence"]

TYPICAL_UNIT_Z = 1.5
"""The direction mark's typical z over the square root of a clean text's scored units, measured
(docs/design.md, "Constants measured once")."""
SCAN_TESTS = ("text", "span", "mixture", "weighted")
"""The tests ``detection.scan`` combines into one p-value, in the order it computes them
(``detection.scan``; ``weighted`` where the null has weights): the combined p is at most
``len(SCAN_TESTS)`` times the smallest."""


MAX_STEER = 10.0
"""The largest ``search.steer``: ten standard deviations already leave the LM little say."""


@dataclass(frozen=True)
class DirectionSearch(SearchSettings):
    """The ``search`` group under the direction mark: the shared fields, then how it prunes,
    selects and steers."""

    prune_tokens: Annotated[int, Range(1, 4096)] | None = 8
    """Without a threshold: every this many tokens of a round, the candidates still running
    are scored on their text so far, and ``prune_keep`` and ``prune_margin`` stop the
    unpromising ones (``generation.pruning``; docs/studies/prune.md). ``None``: every candidate
    finishes."""
    prune_keep: Annotated[int, Range(1, 10_000)] = 12
    """Candidates that go on after the first pruning check (those already finished count)."""
    prune_margin: float | None = 0.3
    """At every pruning check, a running candidate whose partial score is below the best
    finished candidate's score minus this stops; ``None`` never stops one this way."""
    threshold: float | None = None
    """Accept the first candidate scoring at least this; after ``max_candidates`` draws keep
    the best-scoring one. ``None``: always the best of ``max_candidates`` (a unit's candidates
    are then drawn in one batched round, and ``prune_*`` apply)."""
    selection: Selection = "text"
    """Which candidate a unit keeps. ``text``: the one that raises the whole text's z most, its
    score less what it repeats of the units kept before it
    (``marks.direction_stats.text_gains``); ``sentence``: the best-scoring one. Ranked by its
    own score, a candidate that restates an earlier high-scoring unit wins often, and the units
    of a text then move together under the key: they count like far fewer independent ones and
    the text's z stays low."""
    steer: Annotated[float, Range(0, MAX_STEER)] = 1.0
    """While candidates are sampled, every word token's logit gains this many standard
    deviations of its meaning's projection on the key's direction for the context being
    written toward (the previous unit's, then, from the first pruning check, each row's own
    text so far: ``generation.steering``), among the entries the LM finds plausible at each
    step (``sampling.steer_plausible``), so that candidates start nearer the key and more of
    the mark outlasts a paraphrase. On 48 ``val`` prompts x 3 keys 1.0 kept perplexity at
    0.90 of plain sampling's and 0.85 (worst key 0.75) of texts at p <= 1% after a paraphrase;
    0.75 (three samples): 0.88, 0.92 and 0.94, and 0.88 (0.81), 0.83 (0.75) and 0.83 (0.75);
    0.5: 0.87 and 0.83 (0.62) (docs/evaluation/quality.md). ``0``: candidates are sampled
    as the LM alone would (``configs/ksemstamp-unsteered.yaml``). Detection does not depend on
    it. vLLM in this process steers inside its sampler (``generation.vllm_steer``); an
    engine that takes one bias per request (``openai``, vLLM over several GPUs) is not
    steered unless ``sampling.steer_plausible`` is 0."""
    fluent_share: Annotated[float, Range(0, 1)] = 0.75
    """A unit is kept from the most fluent of its scored candidates only: this share of them
    (rounded up, at least one), ranked by their mean log-probability per token under the LM
    itself, and among them the best-ranked. Ranked by score alone, a round keeps a clause in
    another language or a list of labels for its score. On 48 ``val`` prompts
    (docs/evaluation/quality.md) the default's texts read 0.78 times as perplexing as plain
    sampling [0.67, 0.91] (``1``: 1.10 [0.93, 1.33]; ``0.5``: 0.57, and bland, repetitive
    texts); each unit is the best of fewer candidates, so it carries less of the mark (clean
    median z 5.7 against 6.2). ``1``: every scored candidate; an engine that gives no
    log-probabilities (``sequential``) ranks every one too."""
    skip_repeating: bool = True
    """A candidate that repeats itself (a word piece or a word over and over, a word 3-gram
    twice, one long word three times, a question opening as the question before it, a short
    unit that differs from an earlier one in one word, a third unit in a row opening with the
    same three words: ``text.normalize.repeats_itself``) is
    not kept for its score, as a repeat of an earlier unit is not. ``false``: only repeats of
    earlier units are (docs/evaluation/quality.md)."""

    def problems(self) -> list[str]:
        out = super().problems()
        if not 0 < self.fluent_share <= 1:
            out.append(f"fluent_share must be in (0, 1], got {self.fluent_share}")
        if self.prune_margin is not None and self.prune_margin < 0:
            out.append(f"prune_margin must be >= 0 or null, got {self.prune_margin}")
        return out


@dataclass(frozen=True)
class RegionSearch(SearchSettings):
    """The ``search`` group under the region mark: the shared fields, then its margin and
    patience."""

    margin: float = 0.035
    """A candidate is accepted only at least this far from its region's border (k-SemStamp
    paper: 0.035; SemStamp paper: 0.02). Detection applies no margin."""
    novelty_patience: Annotated[int, Range(0, 10_000)] = 10
    """Candidates after which a valid but already-used region transition is accepted; 0 is the
    paper's rule. A repeated transition adds no evidence for the exact test."""
    margin_patience: Annotated[int, Range(0, 10_000)] | None = 20
    """Candidates after which a candidate in a valid region is accepted without the margin;
    ``None`` keeps the margin to ``max_candidates`` (the paper's rule)."""

    def problems(self) -> list[str]:
        out = super().problems()
        if self.margin < 0:
            out.append(f"margin must be >= 0, got {self.margin}")
        return out


@dataclass(frozen=True)
class DirectionSettings:
    """``mark: {kind: direction}``, the default: the key draws a direction per region, and a
    unit's score is its processed embedding projected on the direction of its context's
    regions (``marks.direction``); generation keeps high scorers, detection sums the scores into
    an exact z. These settings are what a detector must share with the generator; how hard
    generation tries is ``search``'s."""

    kind: Literal["direction"] = field(default="direction", init=False)
    mark: ClassVar[str] = "ksemstamp.marks.direction:DirectionMark"
    """The ``Mark`` class these settings make (``marks.build_mark``)."""
    keyed: ClassVar[bool] = True
    """The key draws the mark (its fingerprint names it in records)."""
    search: ClassVar[type] = DirectionSearch
    """Its ``search`` group: the shared fields and the knobs only this mark reads."""
    options: ClassVar[tuple[str, ...]] = ("scan",)
    """The ``detection`` settings only this mark reads."""
    statistics: ClassVar[tuple[str, ...]] = ("exact",)
    """The ``detection.statistic`` values its detector offers."""
    context: Context = "own"
    """Whose context gives a sentence its direction. ``own``: the sentence's own, so its score
    does not depend on the sentences around it and survives reordering, merging and mixing with
    human text; ``previous``: the sentence before it (the chained design,
    ``lab/configs/ksemstamp-chained.yaml``)."""
    context_temperature: float = 0.1
    """``0``: the context region's direction alone; ``tau > 0``: every region's direction
    weighted by a softmax of the context's cosines to the centroids over ``tau``, so that a
    paraphrase across a border changes the direction a little, not entirely (``scheme``; the
    default's measurement: docs/design.md, "Constants measured once"). Under
    ``partition.kind: lsh`` (no centroids) it is ``0``."""
    remove_components: Annotated[int, Range(0, 4096)] = 64
    """With centroids: this many of the domain's top principal components (stored in the
    centroid file) are projected out of what is scored. Sentences on one topic share those
    components, so without them a text's scores under one key move together (the default's
    measurement: docs/design.md, "Constants measured once"). ``0``: none."""
    units: Literal["sentences", "clauses"] = "clauses"
    """What generation draws and detection scores: ``clauses`` (cut after , ; : once ``clause_words``
    words precede: more evidence after a paraphrase, a third more decoding) or ``sentences``."""
    clause_words: Annotated[int, Range(1, 100)] = 4
    """``clauses``: the fewest words a clause holds before a comma, semicolon or colon may end
    it (a shorter piece runs on into the next); a sentence's last clause may be shorter."""

    def __post_init__(self) -> None:
        problems = []
        if self.context_temperature < 0:
            problems.append(f"context_temperature must be >= 0, got {self.context_temperature}")
        check(self, problems)

    def partition_margin(self, search: Any) -> float:
        """The margin the partition reports (the direction mark reads none)."""
        return 0.0

    def domain_needs(self) -> dict[str, Any]:
        """What the mark needs of a centroid file: the domain's mean and ``remove_components``
        principal components."""
        return {"mean": True, "components": self.remove_components}

    def splitting(self) -> tuple[str, int]:
        """The units text is cut into, and the fewest words a clause holds (``units``,
        ``clause_words``)."""
        return self.units, self.clause_words

    @property
    def scores_first(self) -> bool:
        """A text's first unit is scored on its own context, with nothing before it."""
        return self.context == "own"

    def units_needed(self, detection: Any) -> tuple[int, int]:
        """``(least, typical)`` scored units to reach ``detection.alpha``
        (``detection.detectable``): the scores are not bounded, so one unit can in principle
        reach any p; a clean text's z grows as about ``TYPICAL_UNIT_Z`` times the square root
        of its units, and with ``detection.scan`` the p-value combines the ``SCAN_TESTS``."""
        tests = len(SCAN_TESTS) if detection.scan else 1
        z = NormalDist().inv_cdf(1 - detection.alpha / tests)
        return 1, max(1, math.ceil((z / TYPICAL_UNIT_Z) ** 2 - 1e-9))

    def without_centroids(self) -> DirectionSettings:
        """These settings on a partition without centroids (``lsh``): hard contexts."""
        return dataclasses.replace(self, context_temperature=0.0)

    def identity(self) -> dict[str, Any]:
        """What a detector must share with the generator, of these settings."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RegionSettings:
    """``mark: {kind: region}``: k-SemStamp's (and SemStamp's) rule. A sentence is valid when
    its region is in the valid set the key draws for the previous sentence's region and it lies
    at least ``margin`` from its region's border (``marks.region``)."""

    kind: Literal["region"] = field(default="region", init=False)
    mark: ClassVar[str] = "ksemstamp.marks.region:RegionMark"
    """The ``Mark`` class these settings make (``marks.build_mark``)."""
    search: ClassVar[type] = RegionSearch
    """Its ``search`` group: the shared fields and the knobs only this mark reads."""
    options: ClassVar[tuple[str, ...]] = ()
    """The ``detection`` settings only this mark reads."""
    statistics: ClassVar[tuple[str, ...]] = ("exact", "paper")
    """The ``detection.statistic`` values its detector offers."""
    gamma: float = 0.25
    """Share of valid regions per previous region (paper: 0.25)."""
    valid_mode: ValidMode = "keyed"
    """``keyed`` (HMAC of the secret key) or ``paper`` (the reference code's public table,
    seeded by ``q * 15485863``)."""

    @property
    def keyed(self) -> bool:
        """The key draws the table (``paper``: a public one, anyone can rebuild)."""
        return self.valid_mode == "keyed"

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.gamma < 1:
            problems.append(f"gamma must be in (0, 1), got {self.gamma}")
        check(self, problems)

    def partition_margin(self, search: Any) -> float:
        """The margin the partition reports: ``search.margin``."""
        return float(search.margin)

    def domain_needs(self) -> dict[str, Any]:
        """What the mark needs of a centroid file beyond its centroids: nothing."""
        return {}

    def splitting(self) -> tuple[str, int]:
        """The units text is cut into: sentences (the paper's)."""
        return "sentences", 4

    scores_first: ClassVar[bool] = False
    """A text's first unit only seeds: each is scored after the one before it."""

    def units_needed(self, detection: Any) -> tuple[int, int]:
        """``(least, typical)`` scored units to reach ``detection.alpha``
        (``detection.detectable``): the exact test of ``n`` valid units, each after another
        region, gives ``p = gamma ** n``; the paper's z-test ``z = sqrt(n (1 - gamma) /
        gamma)``. Generated units are valid but for rare fallbacks: it needs the least."""
        alpha = detection.alpha
        if detection.statistic == "paper":
            z = NormalDist().inv_cdf(1 - alpha)
            least = math.ceil(z * z * self.gamma / (1 - self.gamma) - 1e-9)
        else:
            least = math.ceil(math.log(alpha) / math.log(self.gamma) - 1e-9)
        return max(1, least), max(1, least)

    def without_centroids(self) -> RegionSettings:
        """These settings on a partition without centroids: the same."""
        return self

    def identity(self) -> dict[str, Any]:
        """What a detector must share with the generator, of these settings."""
        return dataclasses.asdict(self)


MarkSettings = Any
"""A mark's settings: an instance of one of ``MARK_KINDS``' classes."""
MARK_KINDS: dict[str, type] = {
    "direction": DirectionSettings,
    "region": RegionSettings,
}
"""The kinds of mark, by the name ``mark.kind`` gives them; the first is the default. The one
registry of marks: each settings class names its ``Mark`` (``mark``), its ``search`` group (a
``SearchSettings`` with the knobs only it reads), the ``detection`` settings only it reads
(``options``), the statistics its detector
offers (``statistics``), whether the key draws it
(``keyed``), the margin its partition reports (``partition_margin``), what it needs of a
centroid file (``domain_needs``), the units it scores (``splitting``, ``scores_first``) and
how many a text needs (``units_needed``), its form on a
partition without centroids (``without_centroids``) and what a detector must share with its
generator (``identity``)."""


MARK_NEEDS = (
    "mark",
    "search",
    "options",
    "statistics",
    "keyed",
    "partition_margin",
    "domain_needs",
    "splitting",
    "scores_first",
    "units_needed",
    "without_centroids",
    "identity",
)
"""What every settings class of ``MARK_KINDS`` has (``register_mark`` checks each)."""


def default_kind() -> str:
    """The kind a ``mark`` without one is (the first of ``MARK_KINDS``)."""
    return next(iter(MARK_KINDS))


def load_mark_plugins() -> None:
    """Register the marks installed packages offer (``settings.plugins``): their settings
    classes, checked as ``register_mark`` checks them."""
    from .plugins import MARKS, register_plugins

    def add(point: Any) -> None:
        if point.name not in MARK_KINDS:
            register_mark(point.load())

    register_plugins(MARKS, add)


def register_mark(settings: type) -> type:
    """Add a kind of mark: a frozen settings dataclass with a ``kind`` field (its default the
    kind's name, ``init=False``) and the class attributes of ``MARK_KINDS``' classes. Returns
    the class (usable as a decorator)."""
    kind = dataclasses.fields(settings)[0].default if dataclasses.is_dataclass(settings) else None
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{settings.__name__} needs a kind field whose default names it")
    missing = [name for name in MARK_NEEDS if not hasattr(settings, name)]
    if missing:
        raise TypeError(f"{settings.__name__} has no {', '.join(map(repr, missing))}")
    search = settings.search
    if not (isinstance(search, type) and issubclass(search, SearchSettings)):
        raise TypeError(
            f"{settings.__name__}.search must be a SearchSettings class, not {search!r}"
        )
    MARK_KINDS[kind] = settings
    return settings


def search_of(mark: Any, search: Any = None) -> Any:
    """``search`` (any kind's ``SearchSettings``, or ``None`` for the defaults) as the search
    group of ``mark`` (its settings): see ``search.search_for``."""
    return search_for(type(mark).search, search, mark.kind, search_owners())


def search_owners() -> dict[str, type]:
    """Every registered kind's ``search`` class, by kind."""
    return {k: c.search for k, c in MARK_KINDS.items()}
