"""The batched Hugging Face engine: many candidate rows decoded together, one token per step.

Each group (document) contributes ``rows[g]`` rows that share the group's prefix: the prefix is
run through the LM once (and kept for the next round; see ``kvcache``), and all rows of all
groups are decoded together, one token per step, each row attending to its group's prefix and
its own tokens. A row stops as soon as it holds one complete unit; rows the caller lets go leave
the batch, so the step cost shrinks as rows finish. What is kept of the rows (ordered
acceptance, pruning) is ``draw``'s, between two steps.

Where a unit ends is ``cutter.UnitCutter``'s rule (every engine shares it), applied to each
row's newest token between two steps.

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

from . import hf
from .cutter import RowCut, UnitCutter
from .decoding import sample_rows, warp_logits
from .engine import Finished, Place, RoundRequest, Step
from .kvcache import CopiedCacheDecoder, PrefixStore, SharedPrefixDecoder, shared_prefix_attention
from .steering import SteerBias


class BatchedEngine(hf.LMEngine):
    """Samples candidate units from a causal LM, many rows at a time (an ``engine.Engine``).
    Its arguments are ``hf.LMEngine``'s; the model must run ``forward`` with a cache."""

    def prepare(self) -> None:
        """The prefix caches kept between rounds, and the unit cutter (the vocabulary read
        once)."""
        self.prefixes = PrefixStore(self.model, self.tokenizer, self.device)
        self.cutter = UnitCutter(
            self.tokenizer, self.splitter, self.vocab_size, self.max_unit_tokens
        )
        self.pieces = self.cutter.pieces

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
        bias: Any = None,
    ) -> Tensor:
        """Sample one token per row from ``(R, V)`` logits; ``seen`` marks tokens to penalise,
        ``bias`` (a ``SteerBias`` or ``(R, V)``, optional) steers them
        (``decoding.steer_logits``).

        ``segments`` optionally gives ``(start, stop, generator)`` row ranges that draw from
        their own generators (one per document, so a document's text does not depend on the
        other documents of its batch); otherwise ``generator`` serves every row.
        """
        suppress = self.eos_ids if self.suppress_eos else ()
        logits = warp_logits(logits, seen, self.config, suppress, bias)
        probs = logits.softmax(dim=-1)
        if not segments:
            return sample_rows(probs, generator)
        return torch.cat([sample_rows(probs[a:b], g) for a, b, g in segments])

    def is_eos(self, ids: Tensor) -> Tensor:
        """Which of ``ids`` end the LM's text (never, with ``suppress_eos``)."""
        if not self.eos_ids or self.suppress_eos:
            return torch.zeros_like(ids, dtype=torch.bool)
        return torch.isin(ids, torch.tensor(self.eos_ids, device=ids.device))


def token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """``(R,)`` the LM's own log-probability of each row's token ``ids`` under its raw ``(R, V)``
    ``logits`` (temperature 1, before the sampling settings and steering): what a candidate's
    fluency averages."""
    picked = logits.gather(1, ids[:, None])[:, 0].float()
    return picked - logits.float().logsumexp(dim=-1)


@dataclass
class _LiveRows:
    """The rows a round holds, by position in the batch: their group, their index in it, and
    what the unit cutter knows of them (``cutter.RowCut``). Python lists: they are short."""

    group: list[int]
    index: list[int]
    cuts: list[RowCut]

    @classmethod
    def start(cls, rows: Sequence[int]) -> _LiveRows:
        """``rows[g]`` rows for each group ``g``, ordered by group."""
        group = [g for g, n in enumerate(rows) for _ in range(n)]
        index = [i for n in rows for i in range(n)]
        return cls(group, index, [RowCut() for _ in group])

    def __len__(self) -> int:
        return len(self.group)

    def place(self, r: int) -> Place:
        """``(group, index in group)`` of the row at position ``r``."""
        return self.group[r], self.index[r]

    def keep(self, positions: list[int]) -> None:
        """Keep only the rows at ``positions``, in that order."""
        for name in ("group", "index", "cuts"):
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
        self.bias = None if bias is None else bias.rows(index)
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
        logprobs = token_logprobs(self.logits, next_ids)
        self.seen[torch.arange(len(rows), device=engine.device), next_ids] = True
        self.next_ids, self.logits = next_ids, None
        return Step(self._finish(next_ids, logprobs), self.step)

    def _finish(self, next_ids: Tensor, logprobs: Tensor) -> list[Finished]:
        """Give every live row its new token and its log-probability, or finish it
        (``cutter.UnitCutter.push``)."""
        engine, live, request = self.engine, self.rows, self.request
        eos_rows = engine.is_eos(next_ids).tolist()
        finished = []
        for r, (tok, lp) in enumerate(zip(next_ids.tolist(), logprobs.tolist(), strict=True)):
            g = live.group[r]
            cut = engine.cutter.push(
                live.cuts[r], tok, request.last_units[g], request.heads[g], eos_rows[r], lp
            )
            if cut is not None:
                place = live.place(r)
                finished.append(
                    Finished(
                        place, cut.text, cut.num_tokens, cut.truncated, cut.separator, cut.fluency
                    )
                )
        return finished

    def _positions(self, rows: Sequence[Place]) -> list[int]:
        where = {place: r for r, place in enumerate(self.live)}
        return [where[place] for place in rows]

    def partial_texts(self, rows: Sequence[Place]) -> list[str]:
        decode, heads = self.engine.tokenizer.decode, self.request.heads
        return [
            heads[self.rows.group[r]] + decode(self.rows.cuts[r].tokens, skip_special_tokens=True)
            for r in self._positions(rows)
        ]

    def tokens_of(self, row: Place) -> int:
        return len(self.rows.cuts[self._positions([row])[0]].tokens)

    @torch.inference_mode()
    def steer(self, rows: Sequence[Place], bias: SteerBias) -> None:
        if bias.shape != (len(rows), self.engine.vocab_size):
            raise ValueError(f"a bias of shape {tuple(bias.shape)} for {len(rows)} rows")
        if self.bias is None:
            self.bias = SteerBias.none(bias.steering, len(self.rows))
        self.bias = self.bias.put(self._positions(rows), bias)

    @torch.inference_mode()
    def retain(self, rows: Sequence[Place]) -> list[tuple[Place, int]]:
        keep = self._positions(rows)
        kept = set(keep)
        stopped = [
            (self.rows.place(r), self.rows.cuts[r].decoded)
            for r in range(len(self.rows))
            if r not in kept
        ]
        if keep and len(keep) < len(self.rows):
            keep_t = torch.tensor(keep, device=self.engine.device)
            self.decoder.keep(keep_t)
            self.seen, self.next_ids = self.seen[keep_t], self.next_ids[keep_t]
            self.bias = None if self.bias is None else self.bias.rows(keep)
        self.rows.keep(keep)
        return stopped

    def close(self) -> None:
        self.stack.close()
