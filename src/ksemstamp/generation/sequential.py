"""The sequential engine: one candidate per ``model.generate`` call, as the reference code.

``SequentialEngine`` is an ``engine.Engine`` like ``batched.BatchedEngine`` and yields the same
kind of candidates (cut by the same splitter rule), without their fluency (``generate``
samples without the LM's log-probabilities here, so ``search.fluent_share`` ranks every
candidate); otherwise only the cost differs. It is selected with
``sampling.engine: sequential`` and exists to be measured against (``python -m benchmarks
generation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..text.splitter import PunktSplitter
from . import hf
from .cutter import separator
from .decoding import steer_logits
from .engine import Finished, Place, RoundRequest, Step


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
    """A logits processor steering the scores by a fixed bias (``(V,)``, or one row of a
    ``SteerBias``) among the plausible entries (``decoding.steer_logits``); transformers runs
    it after the repetition penalty and before the temperature, where the batched engine
    steers too."""

    def __init__(self, bias: Any, plausible: float, temperature: float) -> None:
        self.bias = bias
        self.plausible = plausible
        self.temperature = temperature

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if isinstance(self.bias, Tensor):
            bias = self.bias.to(scores.device, torch.float32).expand_as(scores)
        else:  # a SteerBias of one row
            bias = self.bias.rows([0] * len(scores))
        steered = steer_logits(scores.float(), bias, self.plausible, self.temperature)
        return steered.to(scores.dtype)


class SequentialEngine(hf.LMEngine):
    """One candidate per ``model.generate`` call: the reference implementation's way.

    A baseline for benchmarks, selected with ``sampling.engine: sequential``. Each candidate
    re-encodes the whole prefix, decodes one row with Hugging Face ``generate`` (same
    temperature, repetition penalty, top-k/top-p and EOS suppression as ``BatchedEngine``) and
    stops through a criterion that re-decodes and re-splits the whole text after every token.
    Without pruning, each ``advance`` draws the next candidate in order, which is judged before
    another is drawn, so nothing is decoded speculatively (``wasted_tokens`` stays 0). With a
    pruner, the candidates are drawn in stages of ``pruner.every`` tokens, one ``generate``
    call per candidate and stage over the prefix and the candidate's text so far. A logit bias
    (``steering``) is added after transformers' own processors.

    Sentences are cut with the same rule as ``BatchedEngine`` (``splitter.next_sentence`` on the
    previous unit plus the continuation), so both engines yield the same kind of candidates;
    only the cost differs. Its arguments are ``hf.LMEngine``'s.
    """

    def prepare(self) -> None:
        """The ``GenerationConfig`` every ``generate`` call samples with."""
        from transformers import GenerationConfig

        cfg, tokenizer, suppress_eos = self.config, self.tokenizer, self.suppress_eos
        self.generation_config = GenerationConfig(
            do_sample=True,
            temperature=cfg.temperature,
            repetition_penalty=cfg.repetition_penalty,
            top_k=cfg.top_k,  # 0 disables top-k in transformers, as here
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_sentence_tokens,
            suppress_tokens=self.eos_ids if suppress_eos and self.eos_ids else None,
            eos_token_id=self.eos_ids or None,
            pad_token_id=hf.pad_id(tokenizer),
        )

    def open(self, request: RoundRequest) -> _SequentialRound:
        """Start the rows of ``request`` (nothing is decoded before ``advance``)."""
        return _SequentialRound(self, request)

    def extend(
        self,
        prefix: str,
        generator: torch.Generator | None,
        start: list[int],
        limit: int,
        bias: Any = None,
    ) -> list[int]:
        """``start`` extended by one ``generate`` call over the prefix and ``start``, until the
        whole text holds a further sentence or ``limit`` tokens (the reference's stop rule);
        ``bias``: a ``(V,)`` logit bias or one row of a ``SteerBias`` (``steering``)."""
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
            steer = _AddBias(bias, self.config.steer_plausible, self.config.temperature)
            kwargs["logits_processor"] = LogitsProcessorList([steer])
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

    def finished(
        self, place: Place, tokens: list[int], context: str, head: str, final: bool
    ) -> Finished | None:
        """The candidate that ``tokens`` make when they hold a sentence or ``final`` (else
        ``None``: it runs on)."""
        raw = self.tokenizer.decode(tokens, skip_special_tokens=True)
        sentence, complete = self.splitter.next_sentence(context, head + raw, require_end=not head)
        truncated = not complete and len(tokens) >= self.config.max_sentence_tokens
        if not (complete or truncated or final):
            return None
        text = sentence if complete else ""
        return Finished(place, text, len(tokens), truncated, separator(raw))


class _SequentialRound:
    """One round of ``SequentialEngine`` (see its docstring)."""

    def __init__(self, engine: SequentialEngine, request: RoundRequest) -> None:
        self.engine = engine
        self.request = request
        self._live: list[Place] = [(g, i) for g, n in enumerate(request.rows) for i in range(n)]
        self.tokens: dict[Place, list[int]] = {place: [] for place in self._live}
        bias = request.bias
        self.bias: dict[Place, Any] = {
            (g, i): None if bias is None else bias.rows([g]) for g, i in self._live
        }

    @property
    def live(self) -> list[Place]:
        return list(self._live)

    def advance(self, until: int | None = None) -> Step:
        if until is None:  # the next candidate in order, whole
            return Step([self._draw(self._live[0], self.engine.max_unit_tokens)], None)
        limit = min(until, self.engine.max_unit_tokens)
        done = [self._draw(place, limit) for place in self._live]
        return Step([f for f in done if f is not None], until)

    def _draw(self, place: Place, limit: int) -> Finished | None:
        """Extend the row at ``place`` to ``limit`` tokens, or to the end of its unit; the row
        as a candidate when it finished."""
        g, _ = place
        r, engine = self.request, self.engine
        start = self.tokens[place]
        tokens = engine.extend(r.prefixes[g], r.generator_of(g), start, limit, self.bias[place])
        self.tokens[place] = tokens
        final = len(tokens) < limit or limit == engine.max_unit_tokens
        return engine.finished(place, tokens, r.last_units[g], r.heads[g], final)

    def partial_texts(self, rows: Sequence[Place]) -> list[str]:
        decode = self.engine.tokenizer.decode
        return [
            self.request.heads[g] + decode(self.tokens[(g, i)], skip_special_tokens=True)
            for g, i in rows
        ]

    def tokens_of(self, row: Place) -> int:
        return len(self.tokens[row])

    def steer(self, rows: Sequence[Place], bias: Any) -> None:
        if bias.shape != (len(rows), self.engine.vocab_size):
            raise ValueError(f"a bias of shape {tuple(bias.shape)} for {len(rows)} rows")
        for i, place in enumerate(rows):
            self.bias[place] = bias.rows([i])

    def retain(self, rows: Sequence[Place]) -> list[tuple[Place, int]]:
        wanted = set(rows)
        stopped = [(p, len(self.tokens[p])) for p in self._live if p not in wanted]
        self._live = [p for p in self._live if p in wanted]
        return stopped

    def close(self) -> None:
        """Nothing is held between rounds."""
