"""Early pruning of candidate rows under the direction mark (best of ``max_candidates``).

Choosing the best of more candidates raises a sentence's score, and with it the evidence that
survives a paraphrase, but every candidate costs decoding. A candidate's first few tokens
already say much about where its whole sentence will point: on the design study's pool
(docs/studies/prune.md), the score of a candidate's first 8 tokens correlates 0.62 with the whole
sentence's score along a random direction (0.87 after 16 tokens). So a round draws many rows,
and every ``every`` tokens the rows still running are scored on their text so far:

* at the first check, only the ``keep`` best rows go on (rows that have already finished are
  among them: they are complete candidates and cost nothing more);
* at every check, a running row whose partial score is below the best finished candidate's
  score minus ``margin`` stops: it is unlikely to overtake it, and the longest rows are the ones
  a round would otherwise wait for.

The kept sentence is still the best-scoring *finished* candidate. Which rows are stopped depends
on the key only through the scores, as the choice of the kept sentence does; the detector is
unchanged, so its p-values are exactly as calibrated as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..settings.groups import DirectionSearch


@dataclass(frozen=True)
class PruneRule:
    """When running candidate rows stop (see the module docstring).

    Attributes:
        every: tokens between checks (the first check comes after this many tokens).
        top: rows that go on after the first check, finished ones included.
        margin: a running row stops at any check when its partial score is below the best
            finished candidate's score minus this; ``None`` never stops a row this way.
    """

    every: int = DirectionSearch.prune_tokens
    top: int = DirectionSearch.prune_keep
    margin: float | None = DirectionSearch.prune_margin

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"prune_tokens must be >= 1, got {self.every}")
        if self.top < 1:
            raise ValueError(f"prune_keep must be >= 1, got {self.top}")
        if self.margin is not None and self.margin < 0:
            raise ValueError(f"prune_margin must be >= 0 or null, got {self.margin}")


def prune_rule(search: DirectionSearch) -> PruneRule | None:
    """The rule of ``search.prune_tokens``, ``prune_keep`` and ``prune_margin``; ``None`` when
    ``prune_tokens`` is ``None`` (every candidate finishes)."""
    if search.prune_tokens is None:
        return None
    return PruneRule(search.prune_tokens, search.prune_keep, search.prune_margin)


def rows_to_keep(
    rule: PruneRule, tokens: int, partial: Sequence[float], finished: Sequence[float]
) -> list[bool]:
    """Which running rows of one document's round go on.

    Args:
        rule: the pruning rule.
        tokens: tokens each running row holds (a multiple of ``rule.every``).
        partial: the running rows' scores on their text so far, in row order.
        finished: the scores of the candidates already finished (usable sentences only).

    Returns one flag per running row. Ties keep the earlier row, so the outcome depends only on
    the scores and the rows' order.
    """
    keep = [True] * len(partial)
    if tokens == rule.every:
        room = max(rule.top - len(finished), 0)
        ranked = sorted(range(len(partial)), key=lambda i: (-partial[i], i))
        for i in ranked[room:]:
            keep[i] = False
    if rule.margin is not None and finished:
        floor = max(finished) - rule.margin
        keep = [k and score >= floor for k, score in zip(keep, partial, strict=True)]
    return keep
