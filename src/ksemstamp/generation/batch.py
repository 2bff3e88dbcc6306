"""The data and the bookkeeping of one batched round of candidates (``sampler``).

A round draws rows for several groups (documents) at once. ``Candidate`` is a finished row,
``GroupResult`` what a group drew, ``Judge`` the caller's verdict on finished rows and
``Pruner`` its way to stop running rows early. ``_LiveRows`` holds the rows still decoding, and
``_resolve`` closes a group as soon as its outcome is known (ordered acceptance: see the
``sampler`` module docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# judge(rows, texts) -> one (accepted, info) pair per text; rows[i] = (group, index in group)
Judge = Callable[[list[tuple[int, int]], list[str]], list[tuple[bool, Any]]]


@dataclass
class Candidate:
    """One finished candidate row."""

    text: str
    num_tokens: int
    accepted: bool
    info: Any = None
    truncated: bool = False
    separator: str = " "
    """Whitespace the model put before the sentence (a space, or its newlines)."""
    pruned: bool = False
    """Stopped unfinished by a ``Pruner`` (empty text, never accepted)."""


@dataclass(frozen=True)
class PruneVerdict:
    """A pruner's answer: one flag per running row (keep decoding it) and, optionally, the
    ``(rows, V)`` logit bias each running row decodes with from now on (``steering``)."""

    keep: list[bool]
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class Pruner:
    """Stops rows of a round before they finish.

    Every ``every`` tokens of a round, ``decide(tokens, rows, texts, finished)`` sees the rows
    still running (``rows[i] = (group, index in group)``, ``texts[i]`` their text so far, each
    ``tokens`` long) and, per group, the candidates already finished (``finished[g]``, judged,
    pruned ones left out), and returns one flag per running row: keep decoding it (or a
    ``PruneVerdict``, which may also steer the rows anew). A stopped row becomes a
    ``Candidate`` with ``pruned=True`` and no text; its tokens count as wasted.
    """

    every: int
    decide: Callable[
        [int, list[tuple[int, int]], list[str], list[list[Candidate]]], list[bool] | PruneVerdict
    ]

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"a pruner checks every >= 1 tokens, got {self.every}")


@dataclass
class GroupResult:
    """What one group's round produced, in draw order, up to and including the accepted row."""

    candidates: list[Candidate] = field(default_factory=list)
    accepted_index: int | None = None
    decoded_tokens: int = 0
    wasted_tokens: int = 0

    @property
    def pruned(self) -> int:
        """Rows a ``Pruner`` stopped before they finished."""
        return sum(c.pruned for c in self.candidates)


def _segments(
    live_group: list[int], generators: Sequence[torch.Generator]
) -> list[tuple[int, int, torch.Generator]]:
    """``(start, stop, generator)`` of each group's rows; live rows stay ordered by group, so
    each group's rows are one contiguous range."""
    segments = []
    start = 0
    for r in range(1, len(live_group) + 1):
        if r == len(live_group) or live_group[r] != live_group[start]:
            segments.append((start, r, generators[live_group[start]]))
            start = r
    return segments


def _separator(raw: str) -> str:
    """The whitespace to put before a sentence: the newlines the model wrote before it, or a
    space."""
    lead = raw[: len(raw) - len(raw.lstrip())]
    return "\n" * lead.count("\n") if "\n" in lead else " "


def _resolve(
    outcome: list[list[Candidate | None]], resolved: list[bool], results: list[GroupResult]
) -> None:
    """Close every group whose first accepted row has all rows before it finished, or whose rows
    all finished without an acceptance; a closed group keeps its candidates up to the accepted
    one (ordered acceptance, see the module docstring)."""
    for g, row_outcomes in enumerate(outcome):
        if resolved[g]:
            continue
        for i, cand in enumerate(row_outcomes):
            if cand is None:
                break
            if cand.accepted:
                results[g].accepted_index = i
                resolved[g] = True
                break
        else:
            resolved[g] = True  # every row finished, none accepted
        if resolved[g]:
            last = results[g].accepted_index
            kept = row_outcomes if last is None else row_outcomes[: last + 1]
            results[g].candidates = [c for c in kept if c is not None]


@dataclass
class _LiveRows:
    """The rows of a round still decoding, by position in the batch: their group, their index
    in it, their tokens so far, whether those hold sentence punctuation, and whether the last
    one wrote a line break (the next token then starts a line, which shows whether the break
    joins the lines, see ``normalize``, even without a leading space). Python lists: they are
    short."""

    group: list[int]
    index: list[int]
    tokens: list[list[int]]
    punct: list[bool]
    broke: list[bool]

    @classmethod
    def start(cls, rows: Sequence[int]) -> _LiveRows:
        """``rows[g]`` rows for each group ``g``, ordered by group."""
        group = [g for g, n in enumerate(rows) for _ in range(n)]
        index = [i for n in rows for i in range(n)]
        size = len(group)
        return cls(group, index, [[] for _ in group], [False] * size, [False] * size)

    def __len__(self) -> int:
        return len(self.group)

    def place(self, r: int) -> tuple[int, int]:
        """``(group, index in group)`` of the row at position ``r``."""
        return self.group[r], self.index[r]

    def keep(self, positions: list[int]) -> None:
        """Keep only the rows at ``positions``, in that order."""
        for name in ("group", "index", "tokens", "punct", "broke"):
            values = getattr(self, name)
            setattr(self, name, [values[r] for r in positions])


def _count_tokens(
    live: _LiveRows,
    kept: set[int],
    outcome: list[list[Candidate | None]],
    results: list[GroupResult],
) -> None:
    """Add the tokens of the rows that stop now (not in ``kept``) to their group's decoded
    tokens, and to its wasted ones when the row was pruned, unfinished, or drawn after the
    accepted one."""
    for r, (g, i) in enumerate(zip(live.group, live.index, strict=True)):
        if r in kept:
            continue
        spent = len(live.tokens[r]) + 1
        results[g].decoded_tokens += spent
        cand = outcome[g][i]
        used = results[g].accepted_index
        if cand is None or cand.pruned or (used is not None and i > used):
            results[g].wasted_tokens += spent


@dataclass(frozen=True)
class RoundRequest:
    """What one ``sample_round`` call asks for, checked (see ``_LMSampler.sample_round``)."""

    prefixes: list[str]
    rows: list[int]
    judge: Judge
    generator: torch.Generator | Sequence[torch.Generator] | None
    contexts: list[str]
    heads: list[str]
    pruner: Pruner | None
    bias: torch.Tensor | None = None
    """``(groups, V)`` logit bias each group's rows decode with (``steering``), or ``None``."""

    @classmethod
    def of(
        cls, prefixes, rows, judge, generator, contexts, heads, pruner, bias=None
    ) -> RoundRequest:
        """The request, or ``ValueError`` naming what does not fit (contexts and heads: empty
        ones when none are given)."""
        if bias is not None and (bias.ndim != 2 or len(bias) != len(prefixes)):
            raise ValueError("need one row of logit bias per prefix")
        if isinstance(generator, Sequence) and len(generator) != len(prefixes):
            raise ValueError("need one generator per prefix")
        if len(prefixes) != len(rows) or not prefixes:
            raise ValueError("need one row count per prefix, and at least one prefix")
        if any(n < 1 for n in rows):
            raise ValueError(f"every group needs at least one row, got {list(rows)}")
        if heads is not None and len(heads) != len(prefixes):
            raise ValueError("need one head (or '') per prefix")
        empty = [""] * len(prefixes)
        return cls(
            list(prefixes),
            list(rows),
            judge,
            generator,
            list(contexts) if contexts is not None else empty,
            list(heads) if heads is not None else empty,
            pruner,
            bias,
        )

    @property
    def per_group(self) -> bool:
        """Whether ``generator`` is one per group."""
        return isinstance(self.generator, Sequence)

    def generator_of(self, group: int) -> torch.Generator | None:
        """The generator group ``group`` draws from."""
        return self.generator[group] if self.per_group else self.generator
