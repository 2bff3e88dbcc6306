"""Where a candidate unit ends in a stream of tokens: one rule for every engine.

An engine only produces tokens; ``UnitCutter`` decides, token by token, when a row holds one
complete unit (a sentence, or a clause under clause units). Per vocabulary entry it reads once
whether the token starts with whitespace, holds sentence punctuation (the splitter's
``terminals``) or a line break. A row is handed to the splitter, with its newest token, when that
token starts a new word and the text before it holds punctuation (the sentence is complete once
the next one has begun: "... it. The"), or when that token is a line break or the first token
after one (a paragraph break ends the sentence whatever follows; a single line break decides
nothing until the next line's first token shows whether it continues the paragraph, as the
splitter reads the joined text: see ``normalize``). The token that showed the end is not part of
the candidate, which holds only its unit and the whitespace before it. The text checked is the
row's own short continuation, never the whole document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def vocabulary_pieces(tokenizer: Any, vocab_size: int) -> list[str]:
    """Each of ``vocab_size`` entries decoded alone (``""`` past the tokenizer's vocabulary, for
    a padded output head)."""
    pieces = tokenizer.batch_decode([[i] for i in range(min(vocab_size, len(tokenizer)))])
    return pieces + [""] * (vocab_size - len(pieces))


def separator(raw: str) -> str:
    """The whitespace to put before a unit: the newlines the model wrote before it, or a
    space."""
    lead = raw[: len(raw) - len(raw.lstrip())]
    return "\n" * lead.count("\n") if "\n" in lead else " "


@dataclass
class RowCut:
    """One row's tokens so far, whether they hold sentence punctuation, whether the last one
    wrote a line break (the next token then starts a line, which shows whether the break joins
    the lines, even without a leading space), and how many tokens the LM sampled for it.

    ``decoded`` is the one definition of a row's decoded tokens, which every engine reports:
    every token sampled for the row, the token that showed its end (or the LM's end of text)
    included, and tokens an engine sampled past that end (a chunk) too. ``logprob`` sums the
    LM's own log-probability of each of ``tokens`` (``nan`` once an engine gave one token
    without it)."""

    tokens: list[int] = field(default_factory=list)
    punct: bool = False
    broke: bool = False
    decoded: int = 0
    logprob: float = 0.0


@dataclass(frozen=True)
class Cut:
    """A finished row: its unit (``""``: it can never be one), its tokens, whether no unit
    ended within ``max_unit_tokens`` (``truncated``), and its ``fluency``: the mean of the LM's
    log-probability of its tokens (``nan`` where the engine did not give them)."""

    text: str
    num_tokens: int
    truncated: bool
    separator: str
    fluency: float = math.nan


def mean_logprob(total: float, tokens: int) -> float:
    """``total`` log-probability per token (``nan`` for no token)."""
    return total / tokens if tokens else math.nan


class UnitCutter:
    """The unit rule of the module docstring, fed one token at a time.

    Args:
        tokenizer: the LM's tokenizer (only read).
        splitter: the sentence splitter shared with detection (``next_sentence``, ``terminals``).
        vocab_size: entries of the LM's next-token logits.
        max_unit_tokens: a row with no unit end within this many tokens finishes empty and
            truncated.
        pieces: the vocabulary decoded entry by entry, when the caller has it already.
    """

    def __init__(
        self,
        tokenizer: Any,
        splitter: Any,
        vocab_size: int,
        max_unit_tokens: int,
        pieces: list[str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.splitter = splitter
        self.max_unit_tokens = max_unit_tokens
        pieces = pieces if pieces is not None else vocabulary_pieces(tokenizer, vocab_size)
        self.pieces = pieces
        terminals = splitter.terminals
        self.starts_space = [p[:1].isspace() for p in pieces]
        self.has_terminal = [any(c in terminals for c in p) for p in pieces]
        self.has_newline = ["\n" in p for p in pieces]

    def checks(self, row: RowCut, token: int, eos: bool = False) -> bool:
        """Whether ``token`` may show that ``row`` holds a complete unit (so the splitter must
        read it)."""
        newline = self.has_newline[token]
        starts = self.starts_space[token] or newline or eos
        return (starts or row.broke) and (row.punct or eos or newline)

    def push(
        self,
        row: RowCut,
        token: int,
        last_unit: str,
        head: str = "",
        eos: bool = False,
        logprob: float = math.nan,
    ) -> Cut | None:
        """Give ``row`` its next ``token``; the finished candidate when the row is done (the
        token that showed the end is not part of it), else ``None``.

        ``last_unit``: the prefix's last unit (a row that would merge into it at detection is an
        empty candidate); ``head``: the start of an unfinished sentence the row completes;
        ``eos``: the LM ended its text with this token; ``logprob``: the LM's log-probability
        of ``token`` (at temperature 1, before any processing), where the engine has it.
        """
        row.decoded += 1
        text, truncated = None, False
        if self.checks(row, token, eos):
            seen = row.tokens if eos else row.tokens + [token]
            text = self.unit(last_unit, seen, eos, head)
        if text is None and not eos:
            row.tokens.append(token)
            row.logprob += logprob
            row.punct = row.punct or self.has_terminal[token]
            row.broke = self.has_newline[token]
            if len(row.tokens) < self.max_unit_tokens:
                return None
            text, truncated = "", True
        raw = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        fluency = mean_logprob(row.logprob, len(row.tokens))
        return Cut(text or "", len(row.tokens), truncated, separator(raw), fluency)

    def unit(self, last_unit: str, tokens: list[int], final: bool, head: str = "") -> str | None:
        """The row's unit if it is complete (or ``final``), ``""`` if it can never be one,
        ``None`` to keep decoding."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        sentence, complete = self.splitter.next_sentence(
            last_unit, head + text, require_end=not head
        )
        return sentence if complete or final else None
