"""What the detector scores in a text before any key is applied: the ``ScoringPlan``.

Planning (splitting, the seed, which sentences are scored, the embeddings) is ``Detector``'s;
applying a key to a plan is the mark's (``marks``, ``Mark.test``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

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
