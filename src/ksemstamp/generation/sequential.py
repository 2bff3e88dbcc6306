"""The sequential baseline: one candidate per ``model.generate`` call, as the reference code.

``SequentialCandidateSampler`` has ``CandidateSampler``'s interface and yields the same kind of
candidates (cut by the same splitter rule); only the cost differs. It is selected with
``search.strategy: sequential`` and exists to be measured against (``python -m benchmarks bench``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..text.splitter import PunktSplitter
from .sampler import (
    Candidate,
    GroupResult,
    Judge,
    Pruner,
    PruneVerdict,
    RoundRequest,
    _LMSampler,
    _separator,
)


class _WholeTextSentenceStop:
    """Stops ``generate`` once the whole decoded text holds one sentence more than the prefix
    plus the candidate, i.e. once a further sentence has begun.

    It re-decodes and re-splits the entire sequence (prefix included) after every token, as the
    reference implementation does; that quadratic cost is part of what the sequential baseline
    measures, so it is kept on purpose.
    """

    def __init__(self, tokenizer, splitter: PunktSplitter, prefix_ids: Tensor) -> None:
        self.tokenizer = tokenizer
        self.splitter = splitter
        self.base = len(splitter.split(tokenizer.decode(prefix_ids, skip_special_tokens=True)))

    def __call__(self, input_ids: Tensor, scores: Tensor | None = None, **kwargs) -> Tensor:
        text = self.tokenizer.decode(input_ids[0], skip_special_tokens=True)
        done = len(self.splitter.split(text)) > self.base + 1
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class _AddBias:
    """A logits processor adding a fixed ``(V,)`` bias (``steering``) to the scores."""

    def __init__(self, bias: Tensor) -> None:
        self.bias = bias

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return scores + self.bias.to(scores.device, scores.dtype)


class SequentialCandidateSampler(_LMSampler):
    """One candidate per ``model.generate`` call: the reference implementation's strategy.

    A baseline for benchmarks, selected with ``search.strategy: sequential``. Each candidate
    re-encodes the whole prefix, decodes one row with Hugging Face ``generate`` (same
    temperature, repetition penalty, top-k/top-p and EOS suppression as ``CandidateSampler``)
    and stops through a criterion that re-decodes and re-splits the whole text after every
    token. Each finished candidate is judged at once and a group stops at its first accepted
    candidate, so nothing is ever decoded speculatively (``wasted_tokens`` stays 0). A logit
    bias (``steering``) is added after transformers' own processors.

    Sentences are cut with the same rule as ``CandidateSampler`` (``splitter.next_sentence`` on
    the previous sentence plus the continuation), so both samplers yield the same kind of
    candidates; only the cost differs. The interface is ``CandidateSampler.sample_round``'s.

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer.
        splitter: the sentence splitter shared with detection.
        config: the sampling settings (``None``: their defaults).
        suppress_eos: the LM never ends its text (see ``_LMSampler``).
    """

    def _prepare(self) -> None:
        from transformers import GenerationConfig

        tokenizer, cfg = self.tokenizer, self.config
        self.generation_config = GenerationConfig(
            do_sample=True,
            temperature=cfg.temperature,
            repetition_penalty=cfg.repetition_penalty,
            top_k=cfg.top_k,  # 0 disables top-k in transformers, as here
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_sentence_tokens,
            suppress_tokens=self.eos_ids if self.suppress_eos and self.eos_ids else None,
            eos_token_id=self.eos_ids or None,
            pad_token_id=tokenizer.pad_token_id,
        )

    def _round(self, request: RoundRequest) -> list[GroupResult]:
        """Draw up to ``rows[g]`` candidates after ``prefixes[g]``, one at a time, stopping a
        group at its first accepted candidate.

        With a ``pruner`` the candidates are drawn in stages of ``pruner.every`` tokens, one
        ``generate`` call per candidate and stage over the prefix and the candidate's text so
        far, and the pruner stops candidates between stages; a group then stops at the first
        candidate accepted in the order they finish."""
        r = request
        if r.pruner is not None:
            return [
                self._staged_group(
                    g,
                    prefix,
                    r.rows[g],
                    r.judge,
                    r.generator_of(g),
                    r.contexts[g],
                    r.heads[g],
                    r.pruner,
                    None if r.bias is None else r.bias[g],
                )
                for g, prefix in enumerate(r.prefixes)
            ]
        results = []
        for g, prefix in enumerate(r.prefixes):
            result = GroupResult()
            bias = None if r.bias is None else r.bias[g]
            for i in range(r.rows[g]):
                cand = self._draw(prefix, r.contexts[g], r.generator_of(g), r.heads[g], bias)
                result.decoded_tokens += cand.num_tokens
                ((ok, info),) = r.judge([(g, i)], [cand.text])
                cand.accepted, cand.info = bool(ok) and bool(cand.text), info
                result.candidates.append(cand)
                if cand.accepted:
                    result.accepted_index = i
                    break
            results.append(result)
        return results

    def _staged_group(
        self,
        g: int,
        prefix: str,
        num: int,
        judge: Judge,
        generator: torch.Generator | None,
        context: str,
        head: str,
        pruner: Pruner,
        bias: Tensor | None = None,
    ) -> GroupResult:
        """One group's candidates drawn stage by stage under ``pruner`` (see ``sample_round``)."""
        result = GroupResult()
        biases: list[Tensor | None] = [bias] * num
        partial: list[list[int]] = [[] for _ in range(num)]
        outcome: list[Candidate | None] = [None] * num
        step = 0
        while running := [i for i in range(num) if outcome[i] is None]:
            step += pruner.every
            for i in running:
                limit = min(step, self.config.max_sentence_tokens)
                partial[i] = self._extend(prefix, generator, partial[i], limit, biases[i])
                cand = self._finished(partial[i], context, head, final=len(partial[i]) < limit)
                if cand is None:
                    continue
                result.decoded_tokens += cand.num_tokens
                ((ok, info),) = judge([(g, i)], [cand.text])
                cand.accepted, cand.info = bool(ok) and bool(cand.text), info
                outcome[i] = cand
                if cand.accepted:
                    result.accepted_index = len([c for c in outcome if c is not None]) - 1
                    result.candidates = [c for c in outcome if c is not None]
                    return result
            running = [i for i in running if outcome[i] is None]
            if not running:
                break
            texts = [
                head + self.tokenizer.decode(partial[i], skip_special_tokens=True) for i in running
            ]
            finished = [[c for c in outcome if c is not None and not c.pruned]]
            verdict = pruner.decide(step, [(0, i) for i in running], texts, finished)
            flags = verdict.keep if isinstance(verdict, PruneVerdict) else verdict
            if isinstance(verdict, PruneVerdict) and verdict.bias is not None:
                for i, row in zip(running, verdict.bias, strict=True):
                    biases[i] = row
            for i, go_on in zip(running, flags, strict=True):
                if not go_on:
                    outcome[i] = Candidate("", len(partial[i]), False, pruned=True)
                    result.decoded_tokens += len(partial[i])
                    result.wasted_tokens += len(partial[i])
        result.candidates = [c for c in outcome if c is not None]
        return result

    def _draw(
        self,
        prefix: str,
        context: str,
        generator: torch.Generator | None,
        head: str = "",
        bias: Tensor | None = None,
    ) -> Candidate:
        """One candidate sentence from one ``generate`` call over the whole prefix (with a
        ``head``, the whole-text stop waits one sentence longer than needed; the candidate is
        still cut by ``next_sentence``)."""
        tokens = self._extend(prefix, generator, [], self.config.max_sentence_tokens, bias)
        cand = self._finished(tokens, context, head, final=True)
        assert cand is not None
        return cand

    def _extend(
        self,
        prefix: str,
        generator: torch.Generator | None,
        start: list[int],
        limit: int,
        bias: Tensor | None = None,
    ) -> list[int]:
        """``start`` extended by one ``generate`` call over the prefix and ``start``, until the
        whole text holds a further sentence or ``limit`` tokens (the reference's stop rule);
        ``bias``: a ``(V,)`` logit bias (``steering``)."""
        from transformers import LogitsProcessorList, StoppingCriteriaList

        enc = self.tokenizer(prefix, return_tensors="pt")
        prefix_ids = enc["input_ids"].to(self.device)
        input_ids = torch.cat(
            [prefix_ids, torch.tensor([start], dtype=torch.long, device=self.device)], dim=1
        )
        stop = StoppingCriteriaList(
            [_WholeTextSentenceStop(self.tokenizer, self.splitter, prefix_ids[0])]
        )
        kwargs = dict(
            attention_mask=torch.ones_like(input_ids),
            generation_config=self.generation_config,
            max_new_tokens=limit - len(start),
            stopping_criteria=stop,
        )
        if bias is not None:
            kwargs["logits_processor"] = LogitsProcessorList([_AddBias(bias)])
        if generator is None:
            out = self.model.generate(input_ids, **kwargs)
        else:
            # generate() samples from torch's global RNG: seed it from the document's own
            # stream inside a forked RNG state, so documents stay independent of each other.
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                out = self.model.generate(input_ids, **kwargs)
        return out[0, prefix_ids.shape[1] :].tolist()

    def _finished(
        self, tokens: list[int], context: str, head: str, final: bool
    ) -> Candidate | None:
        """The candidate that ``tokens`` make when they hold a sentence or ``final`` (else
        ``None``: it runs on)."""
        raw = self.tokenizer.decode(tokens, skip_special_tokens=True)
        sentence, complete = self.splitter.next_sentence(context, head + raw, require_end=not head)
        truncated = not complete and len(tokens) >= self.config.max_sentence_tokens
        if not (complete or truncated or final):
            return None
        return Candidate(
            sentence if complete else "", len(tokens), False, None, truncated, _separator(raw)
        )
