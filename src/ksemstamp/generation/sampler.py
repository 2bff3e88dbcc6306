"""Batched sampling of candidate next sentences.

One *round* samples candidate continuations for several documents ("groups") at once. Each
group contributes ``n_g`` rows that share the group's prefix: the prefix is run through the LM
once (and kept for the next round; see ``kvcache``), and all rows of all groups are decoded
together, one token per step, each row attending to its group's prefix and its own tokens. A row
stops as soon as it holds one complete sentence; finished rows leave the batch, so the step cost
shrinks as rows finish.

Acceptance is ordered, so that batching does not change what is sampled: within a group, row
``i`` stands for the ``i``-th candidate of the sequential algorithm. As rows finish, the caller's
``judge`` scores them (embedding, region, margin); a group is resolved once some accepted row
``i`` has every row before it finished and rejected (rows after ``i`` are dropped unfinished),
or when all its rows finished without an acceptance. The accepted sentence is therefore the first
valid one of an i.i.d. sequence of candidates, exactly as in Algorithm 1, and not "whichever valid
row happened to be shortest".

Sentence ends are detected incrementally. Per vocabulary entry we precompute whether the token
starts with whitespace and whether it holds a line break. A row is handed to the splitter,
with its newest token, when that token starts a new word and the text before it contains
sentence punctuation (the sentence is complete once the next one has begun: "... it. The"), or
when that token is a line break or the first token after one (a paragraph break ends the
sentence whatever follows; a single line break decides nothing until the next line's first
token shows whether it continues the paragraph, as the splitter reads the joined text: see
``normalize``). The token that showed the end is not part of the candidate, which
holds only its sentence and the whitespace before it. The next round samples the next sentence
afresh and rejects any candidate that would merge into this one at detection, so the word that
ended this sentence need not be the one that follows it in the text. The text checked is the
row's own short continuation, never the whole document.

The batched decode loop keeps its per-row bookkeeping in one function because every step
updates all of it; the pure parts (per-group generator ranges, group resolution, separators) are
functions of their own. Decoding settings and logits processing are in ``decoding``; the
sequential baseline with the same interface, which the benchmarks compare this sampler with, is
in ``sequential``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..settings import SamplingSettings
from ..text.splitter import PunktSplitter
from .decoding import sample_rows, warp_logits
from .kvcache import CopiedCacheDecoder, PrefixStore, SharedPrefixDecoder, enable_shared_prefix

TERMINALS = ".!?\u2026"

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
class Pruner:
    """Stops rows of a round before they finish.

    Every ``every`` tokens of a round, ``decide(tokens, rows, texts, finished)`` sees the rows
    still running (``rows[i] = (group, index in group)``, ``texts[i]`` their text so far, each
    ``tokens`` long) and, per group, the candidates already finished (``finished[g]``, judged,
    pruned ones left out), and returns one flag per running row: keep decoding it. A stopped row
    becomes a ``Candidate`` with ``pruned=True`` and no text; its tokens count as wasted.
    """

    every: int
    decide: Callable[[int, list[tuple[int, int]], list[str], list[list[Candidate]]], list[bool]]

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


class _LMSampler:
    """What both samplers hold: the LM and its tokenizer (left padding and a pad token, since
    batched prompts end where decoding starts), the splitter, the sampling settings, the
    model's device and the tokenizer's end-of-sequence ids. ``suppress_eos``: the LM never ends
    its text (a sentence ends at the splitter's end, the text at ``max_new_tokens``)."""

    def __init__(
        self,
        model,
        tokenizer,
        splitter: PunktSplitter,
        config: SamplingSettings | None = None,
        suppress_eos: bool = True,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.splitter = splitter
        self.config = config or SamplingSettings()
        self.suppress_eos = suppress_eos
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        eos = tokenizer.eos_token_id
        self.device = next(model.parameters()).device
        self.eos_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])


def _check_round(
    prefixes, rows, generator, contexts, heads=None
) -> tuple[bool, list[str], list[str]]:
    """Validate ``sample_round``'s arguments; returns whether ``generator`` is one per group,
    and the contexts and heads (empty ones when none are given)."""
    per_group = isinstance(generator, Sequence)
    if per_group and len(generator) != len(prefixes):
        raise ValueError("need one generator per prefix")
    if len(prefixes) != len(rows) or not prefixes:
        raise ValueError("need one row count per prefix, and at least one prefix")
    if any(n < 1 for n in rows):
        raise ValueError(f"every group needs at least one row, got {list(rows)}")
    if heads is not None and len(heads) != len(prefixes):
        raise ValueError("need one head (or '') per prefix")
    empty = [""] * len(prefixes)
    return (
        per_group,
        list(contexts) if contexts is not None else empty,
        list(heads) if heads is not None else empty,
    )


class CandidateSampler(_LMSampler):
    """Samples candidate sentences from a causal LM, many rows at a time.

    Args:
        model: a Hugging Face causal LM (``forward`` with ``cache``).
        tokenizer: its tokenizer (left padding and a pad token are set here).
        splitter: the sentence splitter shared with detection.
        config: the sampling settings (``None``: their defaults).
        suppress_eos: the LM never ends its text (see ``_LMSampler``).
    """

    def __init__(
        self,
        model,
        tokenizer,
        splitter: PunktSplitter,
        config: SamplingSettings | None = None,
        suppress_eos: bool = True,
    ):
        super().__init__(model, tokenizer, splitter, config, suppress_eos)
        self.shared_prefix = enable_shared_prefix(model)
        self.prefixes = PrefixStore(model, tokenizer, self.device)
        vocab = model.get_output_embeddings().out_features  # also for a quantised head
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        starts_space = torch.zeros(vocab, dtype=torch.bool)
        has_terminal = torch.zeros(vocab, dtype=torch.bool)
        has_newline = torch.zeros(vocab, dtype=torch.bool)
        for i, piece in enumerate(pieces[:vocab]):
            starts_space[i] = piece[:1].isspace()
            has_terminal[i] = any(c in TERMINALS for c in piece)
            has_newline[i] = "\n" in piece
        self.starts_space = starts_space.to(self.device)
        self.has_terminal = has_terminal.to(self.device)
        # A paragraph break after a sentence ends it, so a row is checked on the token that
        # writes a line break, without waiting for the next word.
        self.has_newline = has_newline.to(self.device)

    # ------------------------------------------------------------------ logits processing
    def _next_tokens(
        self,
        logits: Tensor,
        seen: Tensor,
        generator: torch.Generator | None,
        segments: Sequence[tuple[int, int, torch.Generator | None]] = (),
    ) -> Tensor:
        """Sample one token per row from ``(R, V)`` logits; ``seen`` marks tokens to penalise.

        ``segments`` optionally gives ``(start, stop, generator)`` row ranges that draw from
        their own generators (one per document, so a document's text does not depend on the
        other documents of its batch); otherwise ``generator`` serves every row.
        """
        suppress = self.eos_ids if self.suppress_eos else ()
        logits = warp_logits(logits, seen, self.config, suppress)
        probs = logits.softmax(dim=-1)
        if not segments:
            return sample_rows(probs, generator)
        return torch.cat([sample_rows(probs[a:b], g) for a, b, g in segments])

    # ------------------------------------------------------------------ one round
    @torch.inference_mode()
    def sample_round(
        self,
        prefixes: Sequence[str],
        rows: Sequence[int],
        judge: Judge,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        contexts: Sequence[str] | None = None,
        heads: Sequence[str] | None = None,
        pruner: Pruner | None = None,
    ) -> list[GroupResult]:
        """Sample ``rows[g]`` candidate sentences after ``prefixes[g]`` for every group ``g``.

        ``contexts[g]`` is the last sentence of ``prefixes[g]``: sentence ends are decided on it
        plus the row's text, as detection will split them, and a row that would merge into it is
        stopped as an empty (never accepted) candidate.

        ``heads[g]`` (optional) is the start of an unfinished sentence that ends ``prefixes[g]``,
        with the whitespace before it; ``contexts[g]`` is then the sentence before that one.
        Rows complete the head's sentence: the candidate is the whole sentence, head included.

        ``generator`` is one generator for all rows or one per group.

        ``pruner`` (optional) stops running rows early (see ``Pruner``).

        Returns one ``GroupResult`` per group with its candidates in draw order up to the first
        accepted one (or all of them when none was accepted).
        """
        per_group, contexts, heads = _check_round(prefixes, rows, generator, contexts, heads)
        states = self.prefixes.get(prefixes)
        group_of = [g for g, n in enumerate(rows) for _ in range(n)]
        decoder_class = SharedPrefixDecoder if self.shared_prefix else CopiedCacheDecoder
        decoder = decoder_class(self.model, states, group_of, self.config.max_sentence_tokens)
        index = torch.tensor(group_of, device=self.device)
        logits = torch.stack([s.logits for s in states])[index]
        seen = torch.zeros(len(states), logits.shape[-1], dtype=torch.bool, device=self.device)
        for g, state in enumerate(states):
            seen[g, state.ids] = True
        seen = seen[index]
        # Bookkeeping per live row, as Python lists (they are short).
        live_group = list(group_of)
        live_index = [i for n in rows for i in range(n)]
        tokens: list[list[int]] = [[] for _ in live_group]
        punct = [False] * len(live_group)
        # The row's last token wrote a line break: its next token starts a line, which shows
        # whether the break joins the lines (see ``normalize``) even without a leading space.
        broke = [False] * len(live_group)

        results = [GroupResult() for _ in rows]
        # outcome[g][i]: None while row i of group g runs, else its Candidate
        outcome: list[list[Candidate | None]] = [[None] * n for n in rows]
        resolved = [False] * len(rows)

        step = 0  # tokens each running row holds after this step
        while live_group:
            step += 1
            segments = _segments(live_group, generator) if per_group else []
            next_ids = self._next_tokens(logits, seen, None if per_group else generator, segments)
            seen[torch.arange(len(live_group), device=self.device), next_ids] = True
            step_is_eos = self._is_eos(next_ids)
            newline = self.has_newline[next_ids]
            check = (self.starts_space[next_ids] | newline | step_is_eos).tolist()
            newline = newline.tolist()
            ids = next_ids.tolist()
            eos_rows = step_is_eos.tolist()

            finished: list[int] = []  # positions in the live batch
            finished_text: list[str] = []
            finished_trunc: list[bool] = []
            finished_sep: list[str] = []
            for r, tok in enumerate(ids):
                text = None
                trunc = False
                if (check[r] or broke[r]) and (punct[r] or eos_rows[r] or newline[r]):
                    # Checked with the new token: the first token of the next sentence's first
                    # word, or a line break, ends the sentence before it (see the module
                    # docstring); the token itself is never part of the candidate.
                    g = live_group[r]
                    seen_ids = tokens[r] if eos_rows[r] else tokens[r] + [tok]
                    text = self._sentence(contexts[g], seen_ids, eos_rows[r], heads[g])
                if text is None and not eos_rows[r]:
                    tokens[r].append(tok)
                    punct[r] = punct[r] or bool(self.has_terminal[tok])
                    broke[r] = newline[r]
                    if len(tokens[r]) < self.config.max_sentence_tokens:
                        continue
                    # No sentence end within the limit: not a usable sentence (it would leave
                    # the document with an unfinished sentence that swallows the next one).
                    text, trunc = "", True
                finished.append(r)
                finished_text.append(text or "")
                finished_trunc.append(trunc)
                finished_sep.append(
                    _separator(self.tokenizer.decode(tokens[r], skip_special_tokens=True))
                )

            if finished:
                verdicts = judge([(live_group[r], live_index[r]) for r in finished], finished_text)
                for r, text, trunc, sep, (ok, info) in zip(
                    finished, finished_text, finished_trunc, finished_sep, verdicts, strict=True
                ):
                    g, i = live_group[r], live_index[r]
                    accepted = bool(ok) and bool(text)
                    outcome[g][i] = Candidate(text, len(tokens[r]), accepted, info, trunc, sep)

            _resolve(outcome, resolved, results)
            if pruner is not None and step % pruner.every == 0:
                self._prune(pruner, step, live_group, live_index, tokens, outcome, resolved, heads)
                _resolve(outcome, resolved, results)
            # Rows continue while their group is open and they have not finished.
            keep = [
                r
                for r in range(len(live_group))
                if not resolved[live_group[r]] and outcome[live_group[r]][live_index[r]] is None
            ]
            kept = set(keep)
            for r in range(len(live_group)):
                g = live_group[r]
                if r not in kept:
                    results[g].decoded_tokens += len(tokens[r]) + 1
                    cand = outcome[g][live_index[r]]
                    used = results[g].accepted_index
                    if cand is None or cand.pruned or (used is not None and live_index[r] > used):
                        results[g].wasted_tokens += len(tokens[r]) + 1
            if not keep:
                break
            if len(keep) < len(live_group):
                keep_t = torch.tensor(keep, device=self.device)
                decoder.keep(keep_t)
                seen, next_ids = seen[keep_t], next_ids[keep_t]
                live_group = [live_group[r] for r in keep]
                live_index = [live_index[r] for r in keep]
                tokens = [tokens[r] for r in keep]
                punct = [punct[r] for r in keep]
                broke = [broke[r] for r in keep]
            logits = decoder.step(next_ids, live_group)
        return results

    def _prune(
        self,
        pruner: Pruner,
        step: int,
        live_group: list[int],
        live_index: list[int],
        tokens: list[list[int]],
        outcome: list[list[Candidate | None]],
        resolved: list[bool],
        heads: list[str],
    ) -> None:
        """Ask ``pruner`` about the rows still running in open groups; mark the ones it stops."""
        running = [
            r
            for r, g in enumerate(live_group)
            if not resolved[g] and outcome[g][live_index[r]] is None
        ]
        if not running:
            return
        texts = [
            heads[live_group[r]] + self.tokenizer.decode(tokens[r], skip_special_tokens=True)
            for r in running
        ]
        finished = [[c for c in row if c is not None and not c.pruned] for row in outcome]
        rows = [(live_group[r], live_index[r]) for r in running]
        flags = pruner.decide(step, rows, texts, finished)
        if len(flags) != len(running):
            raise ValueError(f"the pruner returned {len(flags)} flags for {len(running)} rows")
        for r, go_on in zip(running, flags, strict=True):
            if not go_on:
                outcome[live_group[r]][live_index[r]] = Candidate(
                    "", len(tokens[r]), False, pruned=True
                )

    def _sentence(self, context: str, tokens: list[int], final: bool, head: str = "") -> str | None:
        """The row's sentence if it is complete (or ``final``), ``""`` if it can never be one,
        ``None`` to keep decoding."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        sentence, complete = self.splitter.next_sentence(context, head + text, require_end=not head)
        return sentence if complete or final else None

    def _is_eos(self, ids: Tensor) -> Tensor:
        if not self.eos_ids or self.suppress_eos:
            return torch.zeros_like(ids, dtype=torch.bool)
        return torch.isin(ids, torch.tensor(self.eos_ids, device=ids.device))

    def sample_sentences(
        self, prefix: str, num: int, generator: torch.Generator | None = None
    ) -> list[str]:
        """``num`` independent candidate sentences after ``prefix`` (no acceptance rule)."""
        sentences = self.splitter.split(prefix)
        context = sentences[-1] if sentences else ""
        result = self.sample_round(
            [prefix], [num], lambda g, t: [(False, None)] * len(t), generator, [context]
        )
        return [c.text for c in result[0].candidates]
