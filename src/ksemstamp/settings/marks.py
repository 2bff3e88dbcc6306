"""The ``mark`` group of the settings: one settings class per kind of mark, and the one registry
of kinds (``MARK_KINDS``, ``register_mark``). Each class names its ``Mark`` and says what only it
reads of the other groups; the groups themselves are ``groups``' (whose ``SearchSettings`` and
``DetectionSettings`` the methods here read: typed ``Any`` so that this module imports none of
them)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Annotated, Any, ClassVar, Literal

from .checks import Range, check

ValidMode = Literal["keyed", "paper"]
Context = Literal["own", "previous"]

TYPICAL_UNIT_Z = 1.5
"""The direction mark's typical z over the square root of a clean text's scored units, measured
(docs/design.md, "Constants measured once")."""
SCAN_TESTS = ("text", "span", "mixture", "weighted")
"""The tests ``detection.scan`` combines into one p-value, in the order it computes them
(``detection.scan``; ``weighted`` where the null has weights): the combined p is at most
``len(SCAN_TESTS)`` times the smallest."""


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
    effort: ClassVar[tuple[str, ...]] = (
        "threshold",
        "selection",
        "prune_tokens",
        "prune_keep",
        "prune_margin",
        "steer",
    )
    """The ``search`` settings only this mark reads."""
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
    effort: ClassVar[tuple[str, ...]] = ("margin", "novelty_patience", "margin_patience")
    """The ``search`` settings only this mark reads."""
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
registry of marks: each settings class names its ``Mark`` (``mark``), the ``search`` and
``detection`` settings only it reads (``effort``, ``options``), the statistics its detector
offers (``statistics``), whether the key draws it
(``keyed``), the margin its partition reports (``partition_margin``), what it needs of a
centroid file (``domain_needs``), the units it scores (``splitting``, ``scores_first``) and
how many a text needs (``units_needed``), its form on a
partition without centroids (``without_centroids``) and what a detector must share with its
generator (``identity``)."""


MARK_NEEDS = (
    "mark",
    "effort",
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
    MARK_KINDS[kind] = settings
    return settings
