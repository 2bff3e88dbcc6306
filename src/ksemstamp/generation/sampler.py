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
sentence punctuation (the splitter's ``terminals``; the sentence is complete once the next one
has begun: "... it. The"), or
when that token is a line break or the first token after one (a paragraph break ends the
sentence whatever follows; a single line break decides nothing until the next line's first
token shows whether it continues the paragraph, as the splitter reads the joined text: see
``normalize``). The token that showed the end is not part of the candidate, which
holds only its sentence and the whitespace before it. The next round samples the next sentence
afresh and rejects any candidate that would merge into this one at detection, so the word that
ended this sentence need not be the one that follows it in the text. The text checked is the
row's own short continuation, never the whole document.

The loop of a round is ``sample_round``; what a step does to the live rows is ``_advance``;
the round's data and bookkeeping (candidates, group results, the live rows, group resolution)
are ``batch``'s, logits processing is ``decoding``'s, and the sequential baseline with the same
interface, which the benchmarks compare this sampler with, is ``sequential``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..settings.groups import SamplingSettings
from ..text.splitter import PunktSplitter
from .batch import (
    Candidate,
    GroupResult,
    Judge,
    Pruner,
    PruneVerdict,
    RoundRequest,
    _count_tokens,
    _LiveRows,
    _resolve,
    _segments,
    _separator,
)
from .decoding import sample_rows, warp_logits
from .kvcache import CopiedCacheDecoder, PrefixStore, SharedPrefixDecoder, enable_shared_prefix


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
        self._prepare()

    def _prepare(self) -> None:
        """What a sampler builds once from its LM, after the shared state above."""

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
        bias: Tensor | None = None,
    ) -> list[GroupResult]:
        """Sample ``rows[g]`` candidate sentences after ``prefixes[g]`` for every group ``g``.

        ``contexts[g]`` is the last sentence of ``prefixes[g]``: sentence ends are decided on it
        plus the row's text, as detection will split them, and a row that would merge into it is
        stopped as an empty (never accepted) candidate.

        ``heads[g]`` (optional) is the start of an unfinished sentence that ends ``prefixes[g]``,
        with the whitespace before it; ``contexts[g]`` is then the sentence before that one.
        Rows complete the head's sentence: the candidate is the whole sentence, head included.

        ``generator`` is one generator for all rows or one per group.

        ``pruner`` (optional) stops running rows early (see ``Pruner``); it may also give the
        rows it keeps a new logit bias.

        ``bias`` (optional) is a ``(groups, V)`` logit bias that every row of group ``g`` adds
        to its logits before the sampling settings (``steering``).

        Returns one ``GroupResult`` per group with its candidates in draw order up to the first
        accepted one (or all of them when none was accepted).
        """
        request = RoundRequest.of(prefixes, rows, judge, generator, contexts, heads, pruner, bias)
        return self._round(request)

    def _round(self, request: RoundRequest) -> list[GroupResult]:
        """The candidates of a checked request (the strategy's own)."""
        raise NotImplementedError


class CandidateSampler(_LMSampler):
    """Samples candidate sentences from a causal LM, many rows at a time.

    Args:
        model: a Hugging Face causal LM (``forward`` with ``cache``).
        tokenizer: its tokenizer (left padding and a pad token are set here).
        splitter: the sentence splitter shared with detection.
        config: the sampling settings (``None``: their defaults).
        suppress_eos: the LM never ends its text (see ``_LMSampler``).
    """

    def _prepare(self) -> None:
        model, tokenizer, splitter = self.model, self.tokenizer, self.splitter
        self.shared_prefix = enable_shared_prefix(model)
        self.prefixes = PrefixStore(model, tokenizer, self.device)
        vocab = model.get_output_embeddings().out_features  # also for a quantised head
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        terminals = splitter.terminals
        starts_space = torch.zeros(vocab, dtype=torch.bool)
        has_terminal = torch.zeros(vocab, dtype=torch.bool)
        has_newline = torch.zeros(vocab, dtype=torch.bool)
        for i, piece in enumerate(pieces[:vocab]):
            starts_space[i] = piece[:1].isspace()
            has_terminal[i] = any(c in terminals for c in piece)
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

    # ------------------------------------------------------------------ one round
    def _round(self, request: RoundRequest) -> list[GroupResult]:
        prefixes, rows, judge, pruner = (
            request.prefixes,
            request.rows,
            request.judge,
            request.pruner,
        )
        contexts, heads, generator = request.contexts, request.heads, request.generator
        per_group = request.per_group
        states = self.prefixes.get(prefixes)
        live = _LiveRows.start(rows)
        decoder_class = SharedPrefixDecoder if self.shared_prefix else CopiedCacheDecoder
        decoder = decoder_class(self.model, states, live.group, self.config.max_sentence_tokens)
        index = torch.tensor(live.group, device=self.device)
        logits = torch.stack([s.logits for s in states])[index]
        seen = torch.zeros(len(states), logits.shape[-1], dtype=torch.bool, device=self.device)
        for g, state in enumerate(states):
            seen[g, state.ids] = True
        seen = seen[index]
        bias = None if request.bias is None else request.bias.float().to(self.device)[index]
        results = [GroupResult() for _ in rows]
        # outcome[g][i]: None while row i of group g runs, else its Candidate
        outcome: list[list[Candidate | None]] = [[None] * n for n in rows]
        resolved = [False] * len(rows)

        step = 0  # tokens each running row holds after this step
        while len(live):
            step += 1
            segments = _segments(live.group, generator) if per_group else []
            next_ids = self._next_tokens(
                logits, seen, None if per_group else generator, segments, bias
            )
            seen[torch.arange(len(live), device=self.device), next_ids] = True
            finished = self._advance(live, next_ids, contexts, heads)
            if finished:
                places = [live.place(r) for r, _, _, _ in finished]
                verdicts = judge(places, [text for _, text, _, _ in finished])
                for (r, text, trunc, sep), (ok, info) in zip(finished, verdicts, strict=True):
                    g, i = live.place(r)
                    accepted = bool(ok) and bool(text)
                    outcome[g][i] = Candidate(text, len(live.tokens[r]), accepted, info, trunc, sep)

            _resolve(outcome, resolved, results)
            if pruner is not None and step % pruner.every == 0:
                bias = self._prune(pruner, step, live, outcome, resolved, heads, bias)
                _resolve(outcome, resolved, results)
            # Rows continue while their group is open and they have not finished.
            keep = [
                r
                for r, (g, i) in enumerate(zip(live.group, live.index, strict=True))
                if not resolved[g] and outcome[g][i] is None
            ]
            _count_tokens(live, set(keep), outcome, results)
            if not keep:
                break
            if len(keep) < len(live):
                keep_t = torch.tensor(keep, device=self.device)
                decoder.keep(keep_t)
                seen, next_ids = seen[keep_t], next_ids[keep_t]
                bias = None if bias is None else bias[keep_t]
                live.keep(keep)
            logits = decoder.step(next_ids, live.group)
        return results

    def _advance(
        self, live: _LiveRows, next_ids: Tensor, contexts: list[str], heads: list[str]
    ) -> list[tuple[int, str, bool, str]]:
        """Give every live row its new token, or finish it: ``(position, text, truncated,
        separator)`` of each row that finished at this step.

        A row is checked when its new token is the first token of the next sentence's first
        word, or a line break (see the module docstring); the token that showed the end is
        never part of the candidate. A row with no sentence end within ``max_sentence_tokens``
        finishes empty and truncated: not a usable sentence (it would leave the document with
        an unfinished sentence that swallows the next one).
        """
        step_is_eos = self._is_eos(next_ids)
        newline = self.has_newline[next_ids]
        check = (self.starts_space[next_ids] | newline | step_is_eos).tolist()
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
                text = self._sentence(contexts[g], seen_ids, eos_rows[r], heads[g])
            if text is None and not eos_rows[r]:
                tokens.append(tok)
                live.punct[r] = live.punct[r] or bool(self.has_terminal[tok])
                live.broke[r] = newline[r]
                if len(tokens) < self.config.max_sentence_tokens:
                    continue
                text, trunc = "", True
            separator = _separator(self.tokenizer.decode(tokens, skip_special_tokens=True))
            finished.append((r, text or "", trunc, separator))
        return finished

    def _prune(
        self,
        pruner: Pruner,
        step: int,
        live: _LiveRows,
        outcome: list[list[Candidate | None]],
        resolved: list[bool],
        heads: list[str],
        bias: Tensor | None,
    ) -> Tensor | None:
        """Ask ``pruner`` about the rows still running in open groups; mark the ones it stops.
        Returns the live rows' logit bias, with the new bias of the rows it steered anew."""
        running = [
            r
            for r, (g, i) in enumerate(zip(live.group, live.index, strict=True))
            if not resolved[g] and outcome[g][i] is None
        ]
        if not running:
            return bias
        texts = [
            heads[live.group[r]] + self.tokenizer.decode(live.tokens[r], skip_special_tokens=True)
            for r in running
        ]
        finished = [[c for c in row if c is not None and not c.pruned] for row in outcome]
        verdict = pruner.decide(step, [live.place(r) for r in running], texts, finished)
        flags = verdict.keep if isinstance(verdict, PruneVerdict) else verdict
        if isinstance(verdict, PruneVerdict) and verdict.bias is not None:
            steered = verdict.bias.float().to(self.device)
            if steered.shape != (len(running), self.has_newline.shape[0]):
                raise ValueError(f"the pruner's bias has shape {tuple(steered.shape)}")
            if bias is None:
                bias = torch.zeros(len(live), steered.shape[1], device=self.device)
            bias = bias.clone()
            bias[torch.tensor(running, device=self.device)] = steered
        if len(flags) != len(running):
            raise ValueError(f"the pruner returned {len(flags)} flags for {len(running)} rows")
        for r, go_on in zip(running, flags, strict=True):
            if not go_on:
                g, i = live.place(r)
                outcome[g][i] = Candidate("", len(live.tokens[r]), False, pruned=True)
        return bias

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
