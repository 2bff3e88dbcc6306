"""The batched Hugging Face engine: many candidate rows decoded together, one token per step.

Each group (document) contributes ``rows[g]`` rows that share the group's prefix: the prefix is
run through the LM once (and kept for the next round; see ``kvcache``), and all rows of all
groups are decoded together, one token per step, each row attending to its group's prefix and
its own tokens. A row stops as soon as it holds one complete unit; rows the caller lets go leave
the batch, so the step cost shrinks as rows finish. What is kept of the rows (ordered
acceptance, pruning) is ``draw``'s, between two steps.

Unit ends are detected incrementally. Per vocabulary entry we precompute whether the token
starts with whitespace and whether it holds a line break. A row is handed to the splitter, with
its newest token, when that token starts a new word and the text before it contains sentence
punctuation (the splitter's ``terminals``; the sentence is complete once the next one has
begun: "... it. The"), or when that token is a line break or the first token after one (a
paragraph break ends the sentence whatever follows; a single line break decides nothing until
the next line's first token shows whether it continues the paragraph, as the splitter reads the
joined text: see ``normalize``). The token that showed the end is not part of the candidate,
which holds only its unit and the whitespace before it. The next round samples the next unit
afresh and rejects any candidate that would merge into this one at detection, so the word that
ended this unit need not be the one that follows it in the text. The text checked is the row's
own short continuation, never the whole document.

The caller's model and tokenizer are used as they are: the tokenizer is only read, and the
shared-prefix attention is switched on for a round and off again when it closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..settings.groups import SamplingSettings
from ..text.splitter import PunktSplitter
from . import hf
from .decoding import sample_rows, warp_logits
from .engine import Finished, Place, RoundRequest, Step
from .kvcache import CopiedCacheDecoder, PrefixStore, SharedPrefixDecoder, shared_prefix_attention


class BatchedEngine(hf.LMEngine):
    """Samples candidate units from a causal LM, many rows at a time (an ``engine.Engine``).
    Its arguments are ``hf.LMEngine``'s; the model must run ``forward`` with a cache."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        splitter: PunktSplitter,
        config: SamplingSettings | None = None,
        suppress_eos: bool = True,
    ) -> None:
        super().__init__(model, tokenizer, splitter, config, suppress_eos)
        self.prefixes = PrefixStore(model, tokenizer, self.device)
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        terminals = splitter.terminals
        starts_space = torch.zeros(self.vocab_size, dtype=torch.bool)
        has_terminal = torch.zeros(self.vocab_size, dtype=torch.bool)
        has_newline = torch.zeros(self.vocab_size, dtype=torch.bool)
        for i, piece in enumerate(pieces[: self.vocab_size]):
            starts_space[i] = piece[:1].isspace()
            has_terminal[i] = any(c in terminals for c in piece)
            has_newline[i] = "\n" in piece
        self.starts_space = starts_space.to(self.device)
        self.has_terminal = has_terminal.to(self.device)
        # A paragraph break after a sentence ends it, so a row is checked on the token that
        # writes a line break, without waiting for the next word.
        self.has_newline = has_newline.to(self.device)

    @torch.inference_mode()
    def open(self, request: RoundRequest) -> _BatchedRound:
        """Start the rows of ``request``: their prefixes run through the LM (or are taken from
        the last round's caches)."""
        stack = ExitStack()
        try:
            shared = stack.enter_context(shared_prefix_attention(self.model))
            return _BatchedRound(self, request, shared, stack)
        except BaseException:
            stack.close()
            raise

    def next_tokens(
        self,
        logits: Tensor,
        seen: Tensor,
        generator: torch.Generator | None,
        segments: Sequence[tuple[int, int, torch.Generator | None]] = (),
        bias: Tensor | None = None,
    ) -> Tensor:
        """Sample one token per row from ``(R, V)`` logits; ``seen`` marks tokens to penalise,
        ``bias`` (``(R, V)``, optional) is added to the logits first.

        ``segments`` optionally gives ``(start, stop, generator)`` row ranges that draw from
        their own generators (one per document, so a document's text does not depend on the
        other documents of its batch); otherwise ``generator`` serves every row.
        """
        suppress = self.eos_ids if self.suppress_eos else ()
        if bias is not None:
            logits = logits.float() + bias
        logits = warp_logits(logits, seen, self.config, suppress)
        probs = logits.softmax(dim=-1)
        if not segments:
            return sample_rows(probs, generator)
        return torch.cat([sample_rows(probs[a:b], g) for a, b, g in segments])

    def unit(self, context: str, tokens: list[int], final: bool, head: str = "") -> str | None:
        """The row's unit if it is complete (or ``final``), ``""`` if it can never be one,
        ``None`` to keep decoding."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        sentence, complete = self.splitter.next_sentence(context, head + text, require_end=not head)
        return sentence if complete or final else None

    def is_eos(self, ids: Tensor) -> Tensor:
        """Which of ``ids`` end the LM's text (never, with ``suppress_eos``)."""
        if not self.eos_ids or self.suppress_eos:
            return torch.zeros_like(ids, dtype=torch.bool)
        return torch.isin(ids, torch.tensor(self.eos_ids, device=ids.device))


@dataclass
class _LiveRows:
    """The rows a round holds, by position in the batch: their group, their index in it, their
    tokens so far, whether those hold sentence punctuation, and whether the last one wrote a
    line break (the next token then starts a line, which shows whether the break joins the
    lines, see ``normalize``, even without a leading space). Python lists: they are short."""

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

    def place(self, r: int) -> Place:
        """``(group, index in group)`` of the row at position ``r``."""
        return self.group[r], self.index[r]

    def keep(self, positions: list[int]) -> None:
        """Keep only the rows at ``positions``, in that order."""
        for name in ("group", "index", "tokens", "punct", "broke"):
            values = getattr(self, name)
            setattr(self, name, [values[r] for r in positions])


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


class _BatchedRound:
    """One round of ``BatchedEngine``: every ``advance`` decodes one token for every live row."""

    def __init__(
        self, engine: BatchedEngine, request: RoundRequest, shared: bool, stack: ExitStack
    ) -> None:
        self.engine = engine
        self.request = request
        self.stack = stack
        device = engine.device
        states = engine.prefixes.get(request.prefixes)
        self.rows = _LiveRows.start(request.rows)
        decoder_class = SharedPrefixDecoder if shared else CopiedCacheDecoder
        self.decoder = decoder_class(
            engine.model, states, self.rows.group, engine.config.max_sentence_tokens
        )
        index = torch.tensor(self.rows.group, device=device)
        self.logits: Tensor | None = torch.stack([s.logits for s in states])[index]
        seen = torch.zeros(len(states), self.logits.shape[-1], dtype=torch.bool, device=device)
        for g, state in enumerate(states):
            seen[g, state.ids] = True
        self.seen = seen[index]
        bias = request.bias
        self.bias = None if bias is None else bias.float().to(device)[index]
        self.next_ids: Tensor | None = None
        self.step = 0  # tokens each running row holds after the last step

    @property
    def live(self) -> list[Place]:
        return [self.rows.place(r) for r in range(len(self.rows))]

    @torch.inference_mode()
    def advance(self, until: int | None = None) -> Step:
        engine, rows, request = self.engine, self.rows, self.request
        if self.logits is None:  # rows were kept since the last step: decode their new token
            self.logits = self.decoder.step(self.next_ids, rows.group)
        self.step += 1
        per_group = request.per_group
        segments = _segments(rows.group, request.generator) if per_group else []
        next_ids = engine.next_tokens(
            self.logits, self.seen, None if per_group else request.generator, segments, self.bias
        )
        self.seen[torch.arange(len(rows), device=engine.device), next_ids] = True
        self.next_ids, self.logits = next_ids, None
        return Step(self._finish(next_ids), self.step)

    def _finish(self, next_ids: Tensor) -> list[Finished]:
        """Give every live row its new token, or finish it.

        A row is checked when its new token is the first token of the next sentence's first
        word, or a line break (see the module docstring); the token that showed the end is
        never part of the candidate. A row with no unit end within ``max_sentence_tokens``
        finishes empty and truncated: not a usable unit (it would leave the document with an
        unfinished sentence that swallows the next one).
        """
        engine, live, request = self.engine, self.rows, self.request
        step_is_eos = engine.is_eos(next_ids)
        newline = engine.has_newline[next_ids]
        check = (engine.starts_space[next_ids] | newline | step_is_eos).tolist()
        newline = newline.tolist()
        eos_rows = step_is_eos.tolist()
        finished = []
        for r, tok in enumerate(next_ids.tolist()):
            text = None
            trunc = False
            tokens = live.tokens[r]
            if (check[r] or live.broke[r]) and (live.punct[r] or eos_rows[r] or newline[r]):
                g = live.group[r]
                seen_ids = tokens if eos_rows[r] else tokens + [tok]
                text = engine.unit(request.last_units[g], seen_ids, eos_rows[r], request.heads[g])
            if text is None and not eos_rows[r]:
                tokens.append(tok)
                live.punct[r] = live.punct[r] or bool(engine.has_terminal[tok])
                live.broke[r] = newline[r]
                if len(tokens) < engine.config.max_sentence_tokens:
                    continue
                text, trunc = "", True
            sep = hf.separator(engine.tokenizer.decode(tokens, skip_special_tokens=True))
            finished.append(Finished(live.place(r), text or "", len(tokens), trunc, sep))
        return finished

    def _positions(self, rows: Sequence[Place]) -> list[int]:
        where = {place: r for r, place in enumerate(self.live)}
        return [where[place] for place in rows]

    def partial_texts(self, rows: Sequence[Place]) -> list[str]:
        decode, heads = self.engine.tokenizer.decode, self.request.heads
        return [
            heads[self.rows.group[r]] + decode(self.rows.tokens[r], skip_special_tokens=True)
            for r in self._positions(rows)
        ]

    def tokens_of(self, row: Place) -> int:
        return len(self.rows.tokens[self._positions([row])[0]])

    @torch.inference_mode()
    def steer(self, rows: Sequence[Place], bias: Tensor) -> None:
        steered = bias.float().to(self.engine.device)
        if steered.shape != (len(rows), self.engine.vocab_size):
            raise ValueError(f"a bias of shape {tuple(steered.shape)} for {len(rows)} rows")
        if self.bias is None:
            self.bias = torch.zeros(len(self.rows), steered.shape[1], device=self.engine.device)
        self.bias = self.bias.clone()
        self.bias[torch.tensor(self._positions(rows), device=self.engine.device)] = steered

    @torch.inference_mode()
    def keep(self, rows: Sequence[Place]) -> list[tuple[Place, int]]:
        keep = self._positions(rows)
        kept = set(keep)
        # A row that stops now decoded its tokens and the one sampled at the last step.
        stopped = [
            (self.rows.place(r), len(self.rows.tokens[r]) + 1)
            for r in range(len(self.rows))
            if r not in kept
        ]
        if keep and len(keep) < len(self.rows):
            keep_t = torch.tensor(keep, device=self.engine.device)
            self.decoder.keep(keep_t)
            self.seen, self.next_ids = self.seen[keep_t], self.next_ids[keep_t]
            self.bias = None if self.bias is None else self.bias[keep_t]
        self.rows.keep(keep)
        return stopped

    def close(self) -> None:
        self.stack.close()
