"""The generation engine interface: what the sentence loop asks of whatever samples candidates.

A *round* draws candidate units for several documents ("groups") at once: ``rows[g]`` rows
after ``prefixes[g]`` (``RoundRequest``). An ``Engine`` opens a round (``Engine.open``), and the
``Round`` it returns decodes its rows a little at a time (``Round.advance``: until some rows hold
a complete unit, or every running row holds the tokens of the next pruning check), tells which
rows are still decoding and their text so far, steers rows with a logit bias, and stops the rows
the caller no longer wants (``Round.retain``). The engine never sees a mark: the caller
(``draw.draw_round``) judges the finished rows, closes a group at its first accepted row and asks
the mark's ``Pruner`` which running rows go on, between two ``advance`` calls.

Four engines implement it: ``batched.BatchedEngine`` (a Hugging Face causal LM decoding all
rows of all groups together over a shared-prefix KV cache, the default),
``sequential.SequentialEngine`` (one ``generate`` call per candidate, as the reference code: a
baseline for benchmarks), and ``stream.StreamEngine`` over a backend that only samples tokens:
vLLM in process (``vllm_engine``) or an OpenAI-compatible server (``openai_engine``). Where a
row's unit ends is one rule for all of them (``cutter.UnitCutter``). Another engine is one more
class with ``open`` and ``from_settings`` (or a ``stream.TokenStreamer``), registered with
``settings.groups.register_engine``.

Rows are named by their *place* ``(group, index in group)``. Row ``i`` of a group stands for the
``i``-th candidate of the sequential algorithm, whatever order the rows finish in.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .steering import SteerBias


class EngineUnavailable(ConnectionError):
    """The engine's backend cannot be used: not installed, or a server that is down, refuses,
    or answers garbage. The command line prints it as one line (status 2); records written
    before it stay, and rerunning the command resumes."""


Place = tuple[int, int]
"""A row of a round: ``(group, index in group)``."""

Judge = Callable[[list[Place], list[str]], list[tuple[bool, Any]]]
"""``judge(rows, texts)``: one ``(accepted, info)`` pair per finished row's text."""


@dataclass
class Candidate:
    """One finished candidate row."""

    text: str
    num_tokens: int
    accepted: bool
    info: Any = None
    truncated: bool = False
    separator: str = " "
    """Whitespace the model put before the unit (a space, or its newlines)."""
    pruned: bool = False
    """Stopped unfinished by a ``Pruner`` (empty text, never accepted)."""
    fluency: float = math.nan
    """The mean of the LM's log-probability of its tokens (``Finished.fluency``)."""


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


@dataclass(frozen=True)
class PruneVerdict:
    """A pruner's answer: one flag per running row (keep decoding it) and, optionally, the
    ``(rows, V)`` logit bias each running row decodes with from now on (a ``SteerBias``)."""

    go_on: list[bool]
    bias: SteerBias | None = None


@dataclass(frozen=True)
class Pruner:
    """Stops rows of a round before they finish.

    Every ``every`` tokens of a round, ``decide(tokens, rows, texts, finished)`` sees the rows
    still running (``rows[i]`` their places, ``texts[i]`` their text so far, each ``tokens``
    long) and, per group, the candidates already finished (``finished[g]``, judged, pruned ones
    left out), and returns one flag per running row: keep decoding it (or a ``PruneVerdict``,
    which may also steer the rows anew). A stopped row becomes a ``Candidate`` with
    ``pruned=True`` and no text; its tokens count as wasted.
    """

    every: int
    decide: Callable[
        [int, list[Place], list[str], list[list[Candidate]]], list[bool] | PruneVerdict
    ]

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"a pruner checks every >= 1 tokens, got {self.every}")


@dataclass(frozen=True)
class RoundRequest:
    """What one round draws: ``rows[g]`` candidates after ``prefixes[g]`` for every group.

    Attributes:
        prefixes: each group's text so far (prompt and kept units).
        rows: candidate rows per group (each >= 1).
        generator: one generator for all rows, or one per group (a document's text then depends
            on nothing else in its batch), or ``None`` (torch's global one).
        last_units: each prefix's last unit: a row's unit ends where detection, splitting that
            unit and the row's text, ends it; a row that would merge into it is an empty (never
            accepted) candidate.
        heads: the start of an unfinished sentence ending each prefix (with the whitespace
            before it), or ``""``: rows then complete the head's sentence and the candidate is
            the whole sentence, head included.
        bias: the ``(groups, V)`` logit biases every row of group ``g`` adds to its logits
            before the sampling settings (a ``steering.SteerBias``: its values are made for
            the entries asked, ``among`` those plausible at a step, or ``dense``), or ``None``.
    """

    prefixes: list[str]
    rows: list[int]
    generator: torch.Generator | Sequence[torch.Generator] | None
    last_units: list[str]
    heads: list[str]
    bias: SteerBias | None = None

    @classmethod
    def of(
        cls,
        prefixes: Sequence[str],
        rows: Sequence[int],
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        last_units: Sequence[str] | None = None,
        heads: Sequence[str] | None = None,
        bias: SteerBias | None = None,
    ) -> RoundRequest:
        """The request, or ``ValueError`` naming what does not fit (last units and heads:
        empty ones when none are given)."""
        if bias is not None and len(bias) != len(prefixes):
            raise ValueError("need one row of logit bias per prefix")
        if isinstance(generator, Sequence) and len(generator) != len(prefixes):
            raise ValueError("need one generator per prefix")
        if len(prefixes) != len(rows) or not prefixes:
            raise ValueError("need one row count per prefix, and at least one prefix")
        if any(n < 1 for n in rows):
            raise ValueError(f"every group needs at least one row, got {list(rows)}")
        for name, given in (("last unit", last_units), ("head", heads)):
            if given is not None and len(given) != len(prefixes):
                raise ValueError(f"need one {name} (or '') per prefix")
        empty = [""] * len(prefixes)
        return cls(
            list(prefixes),
            list(rows),
            generator,
            list(last_units) if last_units is not None else empty,
            list(heads) if heads is not None else empty,
            bias,
        )

    @property
    def per_group(self) -> bool:
        """Whether ``generator`` is one per group."""
        return isinstance(self.generator, Sequence)

    def generator_of(self, group: int) -> torch.Generator | None:
        """The generator group ``group`` draws from."""
        return self.generator[group] if self.per_group else self.generator


@dataclass(frozen=True)
class Finished:
    """A row that holds a complete unit (or never will: ``text`` empty)."""

    place: Place
    text: str
    num_tokens: int
    truncated: bool = False
    """No unit ended within ``max_unit_tokens`` tokens."""
    separator: str = " "
    fluency: float = math.nan
    """The mean of the LM's log-probability of its tokens (``cutter.Cut``; ``nan``: the engine
    does not give it)."""


@dataclass(frozen=True)
class Step:
    """What one ``Round.advance`` call decoded.

    Attributes:
        finished: the rows that finished, in row order.
        tokens: the tokens every row still running holds, where that is one number (a point
            at which a pruner may check); ``None`` otherwise.
    """

    finished: list[Finished]
    tokens: int | None


@runtime_checkable
class Round(Protocol):
    """One open round of an engine (see the module docstring)."""

    @property
    def live(self) -> list[Place]:
        """The rows the round holds, in row order: those still decoding, and those that
        finished at the last step until ``retain`` lets them go."""
        ...

    def advance(self, until: int | None) -> Step:
        """Decode until some rows finish or, when ``until`` is given, the running rows hold
        ``until`` tokens (never past it); a round with no live row may not be advanced."""
        ...

    def partial_texts(self, rows: Sequence[Place]) -> list[str]:
        """The text so far of live ``rows`` (a head included)."""
        ...

    def tokens_of(self, row: Place) -> int:
        """Tokens live ``row`` holds so far."""
        ...

    def steer(self, rows: Sequence[Place], bias: SteerBias) -> None:
        """Live ``rows`` decode with the ``(len(rows), V)`` logit biases from now on."""
        ...

    def retain(self, rows: Sequence[Place]) -> list[tuple[Place, int]]:
        """Go on with live ``rows`` only; returns ``(place, tokens decoded)`` of every row that
        stops now (those that finished at the last step among them)."""
        ...

    def close(self) -> None:
        """Release what the round holds; the engine's model is as it was before ``open``."""
        ...


@runtime_checkable
class Engine(Protocol):
    """Samples rounds of candidate units (see the module docstring).

    Attributes:
        tokenizer: the LM's tokenizer, which measures prompts (``None``: prompts are not cut).
        context_length: the LM's context in tokens (``None``: unbounded or unknown).
        max_unit_tokens: a row with no unit end within this many tokens is an empty candidate.
        vocab_size: entries of a logit bias's last dimension.
        model: the LM itself where it runs in this process (for device checks), else ``None``.
        pieces: the vocabulary decoded entry by entry where the engine has it (steering reads
            it rather than decoding the vocabulary again), else ``None``.
        steers_per_step: whether a steering bias is applied step by step among the plausible
            entries (``sampling.steer_plausible``) rather than once per request to every one.
    """

    tokenizer: Any
    context_length: int | None
    max_unit_tokens: int
    vocab_size: int
    model: Any
    pieces: list[str] | None
    steers_per_step: bool

    def open(self, request: RoundRequest) -> Round:
        """Start a round's rows."""
        ...

    @classmethod
    def from_settings(cls, settings: Any, splitter: Any, lm: Any = None) -> Engine:
        """The engine of ``settings`` (``WatermarkSettings``: ``model``, ``sampling`` and, for
        the served engines, ``engine``) with ``splitter`` (detection's); ``lm``: a loaded model
        (or backend) to use as it is, or a name instead of ``model.lm``."""
        ...


def engine_class(name: str) -> Any:
    """The engine class ``sampling.engine: name`` selects (``settings.groups.ENGINES``)."""
    from ..settings.groups import ENGINES, load_engine_plugins

    if name not in ENGINES:
        load_engine_plugins()
    if name not in ENGINES:
        raise ValueError(f"sampling.engine must be one of {sorted(ENGINES)}, got {name!r}")
    target = ENGINES[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    if not callable(getattr(target, "from_settings", None)):  # the one way engines are built
        raise TypeError(f"engine {name!r} ({target!r}) has no from_settings constructor")
    return target
