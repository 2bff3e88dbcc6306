"""What the detector scores in a text before any key is applied: the ``ScoringPlan``.

Planning (splitting, the seed, which sentences are scored, the embeddings) is ``Detector``'s;
applying a key to a plan is the mark's (``marks``, ``Mark.test``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .stats import transition_matrix

SEED, SCORED, REPEAT = "seed", "scored", "repeat"


@dataclass
class ScoringPlan:
    """What the detector scores in one text, before any key is applied.

    Attributes:
        sentences: the text's own sentences (the prompt's seeding sentence is not one of them).
        regions: their regions.
        seed_region: region of the prompt's last sentence when a prompt seeds the text.
        roles: per sentence ``seed`` (only sets the previous region), ``scored`` or ``repeat``.
        data: what the mark scores beyond the regions (``Mark.annotate``: the direction
            mark's vectors and context weights), ``None`` for a mark that needs nothing more.
        error: why the text could not be planned (then everything else is empty).
        status: ``ok``, or for a text that could not be planned ``error`` (bad input) or
            ``unsupported`` (a script the splitter and encoder do not read).
        seed_sentence: the sentence whose region is ``seed_region``.
        completion: the part of the text that completed a prompt ending mid-sentence.
        normalized: what normalising text and prompt took, per kind.
    """

    sentences: list[str] = field(default_factory=list)
    regions: list[int] = field(default_factory=list)
    seed_region: int | None = None
    roles: list[str] = field(default_factory=list)
    data: Any = None
    error: str | None = None
    status: str = "ok"
    seed_sentence: str | None = None
    completion: str | None = None
    normalized: dict[str, int] = field(default_factory=dict)

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

    def transition_counts(self, num_regions: int):
        """``(K, K)`` counts of the scored transitions ``(previous region, region)``."""
        if self.seed_region is None:
            return transition_matrix(self.regions, self.scored, num_regions)
        return transition_matrix(
            [self.seed_region, *self.regions], [False, *self.scored], num_regions
        )
