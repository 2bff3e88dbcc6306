"""Watermarked generation: the sentence loop of k-SemStamp's Algorithm 1, batched, for any mark.

For each new sentence of each document the loop draws rounds of candidate sentences and asks
the document's mark (``marks``: ``region``, k-SemStamp's valid regions; ``direction``, keyed
scores) to judge them. A round keeps the first accepted candidate in draw order (``draw``).
After ``max_candidates`` draws without one, the loop keeps the best-scoring candidate when the
mark scores them (the ``direction`` mark: by rule without a threshold, else a fallback), and
otherwise the last one drawn (a *fallback*). Candidates are drawn by the generation ``Engine``
in rounds of several rows per document (see ``rounds``), several documents per round. The first
generated sentence is seeded by the region of the prompt's last sentence. A prompt that ends mid-sentence is first
completed (one unwatermarked candidate at a time, judged only on whether detection will cut the
completed sentence where generation did), and the completed sentence seeds; an empty prompt or
an instruction (``chat``) seeds the first sentence with the scheme's keyed start value. See
``prompts`` for the kinds of prompt.

Sentence time budget (an option, ``sentence_time_budget``; ``None`` is the paper's rule): a
sentence whose search has run that many seconds ends as at ``max_candidates`` (the region mark
keeps the last candidate drawn, a fallback; the direction mark its best so far), checked between
rounds. It bounds the stall of a sentence whose valid regions the LM rarely reaches, at the
price of a text that depends on the machine's speed. How many rows a round draws is ``rounds``'s.

What ``generate`` returns (``GenerationResult`` and the rest) is defined in ``results`` and
re-exported here. The loop itself is the named steps below (``_start``, ``_judge``, ``_tally``,
``_keep``; a document's own steps, counting a round and choosing what to keep, are in
``documents``), for every mark and every
kind of prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

import torch

from .generation.documents import Document, document_generator, random_seed
from .generation.draw import draw_round
from .generation.engine import Candidate, Engine, RoundRequest
from .generation.prompts import CONTINUE, chat_prefix, plan_prompt, prompt_budget
from .generation.rounds import PRIOR_WEIGHT, ROW_COST, acceptance, round_size
from .marks import Drawn, Mark, build_mark
from .plots import progress_bar
from .results import (
    NO_REGION,
    GenerationProgress,
    GenerationResult,
    Judgement,
    SentenceRecord,
    summarize,
)
from .scheme.core import WatermarkScheme
from .settings.groups import LimitSettings, SamplingSettings, SearchSettings
from .settings.watermark import WatermarkSettings
from .text.textcheck import readable

__all__ = [
    "GenerationProgress",
    "GenerationResult",
    "Judgement",
    "SentenceRecord",
    "Watermarker",
    "summarize",
]

PLAIN = Judgement(NO_REGION, True, True)
"""The verdict on a candidate drawn without a watermark: always kept."""


class Watermarker:
    """Generates watermarked text with a ``WatermarkScheme`` and a generation ``Engine``.

    Args:
        scheme: encoder, partition, key and the mark's settings (``scheme.settings``).
        engine: what samples the candidates (``generation.engine``: the batched Hugging Face
            engine, the sequential baseline, or any other ``Engine``).
        search: how a unit's candidates are drawn: ``max_candidates`` (``N_max``),
            ``candidate_batch``, ``adaptive_batch`` (size rounds from the expected acceptance,
            else always ``candidate_batch``), ``sentence_time_budget``, and what the mark reads
            of it (its kind's ``search`` class: ``DirectionSearch``, ``RegionSearch``).
            ``None``: the defaults.
        sampling: ``max_new_tokens`` (stop a document once its continuation has this many
            tokens and ends a sentence: a clause kept past the budget inside a sentence is
            followed by more, while fewer than ``max_sentence_tokens`` tokens over) and ``seed`` (the same seed, prompt and settings give the same text;
            ``None``: each document draws a fresh seed, which its result carries,
            ``GenerationResult.seed``). The engine holds the rest. ``None``: the defaults.
        limits: ``max_prompt_tokens`` (most prompt tokens the LM sees, the left part of a
            longer prompt dropped; also bounded by the LM's context less the continuation) and
            ``max_text_chars`` (longest prompt accepted; longer: an error record).
        chat: prompts are instructions, wrapped in the LM's chat template (see ``prompts``).
        mark: the ``marks.Mark`` to generate with, instead of the one the scheme's settings
            make with ``search`` (``build_watermarker`` passes one that steers, as
            ``search.steer`` asks: ``Mark.steer``).
        max_sentences: optional cap on sentences per document.
        row_cost: relative cost of one extra row in a batched decode step.
    """

    def __init__(
        self,
        scheme: WatermarkScheme,
        engine: Engine,
        search: SearchSettings | None = None,
        sampling: SamplingSettings | None = None,
        limits: LimitSettings | None = None,
        *,
        chat: bool = WatermarkSettings.chat,
        mark: Mark | None = None,
        max_sentences: int | None = None,
        row_cost: float = ROW_COST,
    ) -> None:
        search = search or SearchSettings()
        sampling = sampling or SamplingSettings()
        limits = limits or LimitSettings()
        self.scheme = scheme
        self.engine = engine
        self.mark = mark or build_mark(scheme, search)
        self.max_candidates = search.max_candidates
        self.candidate_batch = search.candidate_batch
        self.adaptive_batch = search.adaptive_batch
        self.sentence_time_budget = search.sentence_time_budget
        self.row_cost = row_cost
        self.max_new_tokens = sampling.max_new_tokens
        self.max_overrun = sampling.max_sentence_tokens
        self.seed = sampling.seed
        self.max_sentences = max_sentences
        self.prior_weight = PRIOR_WEIGHT
        self.chat = chat
        self.max_prompt_chars = limits.max_text_chars
        # The engine's tokenizer and LM decide how much of a prompt the LM can see; an engine
        # without a tokenizer sees every prompt whole.
        self.tokenizer = engine.tokenizer
        self.prompt_budget = prompt_budget(
            limits.max_prompt_tokens,
            engine.context_length,
            self.max_new_tokens,
            engine.max_unit_tokens,
        )
        if chat:
            chat_prefix(self.tokenizer, "")  # an LM without a chat template: refused now

    # ------------------------------------------------------------------ round sizing
    def rows_for(
        self, previous: int, drawn: int, stats: dict[int, list[float]], watermark: bool = True
    ) -> int:
        """Rows to draw for a document whose previous region is ``previous``.

        ``stats`` maps a previous region to its running ``[accepted, drawn]`` counts (prior
        pseudo-counts included); it lives for one ``generate`` call, so the same inputs and seed
        always give the same rounds and the same text.
        """
        budget = self.max_candidates - drawn
        if not watermark:
            return 1
        if not self.adaptive_batch:
            return max(1, min(self.candidate_batch, budget))
        accepted, drawn_all = self._acceptance(previous, stats)
        return max(
            1, min(round_size(accepted / drawn_all, self.candidate_batch, self.row_cost), budget)
        )

    def _acceptance(self, previous: int, stats: dict[int, list[float]]) -> list[float]:
        return acceptance(stats, previous, self.mark.prior, self.prior_weight)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str],
        watermark: bool = True,
        progress: bool = False,
        generator: torch.Generator | None = None,
        on_progress: Callable[[GenerationProgress], None] | None = None,
    ) -> list[GenerationResult]:
        """Continue each prompt; with ``watermark=False`` the first candidate is always kept
        (plain sentence-by-sentence sampling with the same settings).

        ``on_progress`` is called after every round of candidates with a ``GenerationProgress``
        (totals over all documents), e.g. to stream progress to a user.

        Each document samples from its own generator, seeded from ``seed`` (or a fresh seed of
        its own when ``seed`` is ``None``) and its prompt, and learns its own acceptance rates,
        so its text depends only on the seed, the prompt and the settings: not on the other
        prompts of its batch, nor on an interrupted earlier run. ``generator`` replaces that
        with one generator shared by all documents.
        """
        docs = self._start(prompts, generator)
        bar = progress_bar(
            total=len(docs) * self.max_new_tokens, disable=not progress, unit="tok", desc="generate"
        )
        while active := [d for d in docs if not d.done]:
            rows = [
                self.rows_for(d.previous, d.finished, d.stats, watermark and not d.completing)
                for d in active
            ]
            pruner = bias = None
            if watermark and not all(d.completing for d in active):
                pruner = self.mark.pruner(active)
                bias = self.mark.round_bias(active)
            request = RoundRequest.of(
                [d.prefix for d in active],
                rows,
                generator or [d.generator for d in active],
                [d.last_sentence for d in active],
                [d.head for d in active],
                bias,
            )
            judge = partial(self._judge, active, watermark)
            results = draw_round(self.engine, request, judge, pruner)
            for doc, res in zip(active, results, strict=True):
                rates = self._acceptance if watermark and not doc.completing else None
                doc.tally(res, rates, self.mark.rejects_candidates)
                chosen = doc.choose(
                    res,
                    self.max_candidates,
                    partial(self._timed_out, doc),
                    self.mark.rejects_candidates,
                    self.mark.pick,
                )
                if chosen is not None:
                    self._keep(doc, *chosen)
            # The bar counts the texts' tokens: a text that finishes its sentence past the
            # budget grows the total with it, so the bar ends at the texts' own length.
            done = [d.result.num_tokens for d in docs]
            bar.total = sum(max(self.max_new_tokens, n) for n in done)
            bar.update(sum(done) - bar.n)
            for doc in active:
                if doc.done:
                    doc.result.seconds = time.perf_counter() - doc.started
            # Long searches for one sentence should be visible, not look like a hang.
            now = self._progress(docs, active)
            bar.set_postfix(
                sentences=now.sentences, drawn_for_current=now.drawn_for_current, refresh=False
            )
            if on_progress is not None:
                on_progress(now)
        bar.close()
        return [d.result for d in docs]

    def _start(self, prompts: Sequence[str], generator: torch.Generator | None) -> list[Document]:
        """One document per prompt, started as ``prompts.plan_prompt`` says: seeded by the region
        of the prompt's last sentence, set to complete an unfinished one first, or seeded by the
        keyed start value (empty prompt, chat); a prompt that cannot be used gives a finished
        document with an error."""
        docs: list[Document] = []
        seeds: list[tuple[Document, str]] = []
        for prompt in prompts:
            # What no model can read (a lone surrogate) is dropped, never raised on.
            prompt = readable(prompt)[0] if isinstance(prompt, str) else prompt
            start = plan_prompt(
                prompt,
                self.scheme.splitter,
                self.tokenizer,
                chat=self.chat,
                budget=self.prompt_budget,
                max_chars=self.max_prompt_chars,
            )
            seed = random_seed() if self.seed is None else self.seed
            own = generator or document_generator(seed, prompt)
            mark = self.mark
            doc = Document.start(
                prompt, start, own, time.perf_counter(), mark.new_state(), mark.start,
                mark.rejections,
            )  # fmt: skip
            if generator is None and self.seed is None:
                doc.result.seed = seed  # drawn here: the record says it, so it can be reproduced
            if start.kind == CONTINUE and start.error is None:
                seeds.append((doc, start.last_sentence))
            docs.append(doc)
        if seeds:
            emb = self.scheme.embed([sentence for _, sentence in seeds])
            located = self.scheme.locate(emb)[0]
            states = self.mark.seed([doc.state for doc, _ in seeds], emb, located)
            for (doc, _), region, state in zip(seeds, located.tolist(), states, strict=True):
                doc.previous, doc.state = region, state
        return docs

    def _progress(self, docs: list[Document], active: list[Document]) -> GenerationProgress:
        """Where generation stands after a round (``active``: the documents in it)."""
        return GenerationProgress(
            sentences=sum(d.result.num_sentences for d in docs),
            candidates=sum(d.result.candidates + d.drawn for d in docs),
            drawn_for_current=max(d.drawn for d in active),
            tokens=sum(d.result.num_tokens for d in docs),
            max_tokens=len(docs) * self.max_new_tokens,
            texts=[d.result.text for d in docs],
        )

    def _judge(
        self, active: list[Document], watermark: bool, rows: list[tuple[int, int]], texts: list[str]
    ) -> list[tuple[bool, Judgement]]:
        """The round's judge: ``(accepted, Judgement)`` for candidate ``texts`` drawn for
        ``rows`` (``(document index in active, candidate index in the round)``), as the mark
        judges them. A candidate that completes a prompt's sentence is accepted when detection
        will cut that sentence the same way; its region then seeds the first watermarked one."""
        completing = [active[g].completing for g, _ in rows]
        if not watermark and not any(completing):
            return [(True, PLAIN) for _ in texts]
        emb = self.scheme.embed(texts)
        regions, margin_ok = self.scheme.locate(emb)
        verdicts = self.mark.judge(Drawn(active, rows, emb, regions, margin_ok, texts))
        out = []
        for (g, _), text, (accepted, verdict) in zip(rows, texts, verdicts, strict=True):
            doc = active[g]
            if doc.completing:
                ok = doc.completion(self.scheme.splitter, text) is not None
                out.append((ok, Judgement(verdict.region, True, True, data=verdict.data)))
            elif not watermark:  # as in the plain path above, whatever else is in the round
                out.append((True, PLAIN))
            else:
                out.append((accepted, verdict))
        return out

    def _timed_out(self, doc: Document) -> bool:
        """Whether the search for ``doc``'s sentence ran out of ``sentence_time_budget`` (the
        prompt's open sentence is completed whatever it takes)."""
        return (
            self.sentence_time_budget is not None
            and not doc.completing
            and time.perf_counter() - doc.sentence_started >= self.sentence_time_budget
        )

    def _keep(self, doc: Document, chosen: Candidate, fallback: bool) -> None:
        """Take the chosen candidate: the completion of the prompt's open sentence, or the
        next sentence; a document that reached its length is done."""
        if doc.completing:
            completion = doc.completion(self.scheme.splitter, chosen.text)
            assert completion is not None  # the judge accepted it
            # The completed sentence seeds the first watermarked unit; it is not scored.
            doc.state = self.mark.commit(doc.state, doc.previous, chosen.info, scored=False)
            doc.take_completion(chosen, completion)
            return
        if chosen.info is not None:
            # The first unit after the keyed start value is scored only by a mark that scores
            # a text's first unit on its own.
            first_after_start = doc.keyed_start and not doc.result.sentences
            scored = not first_after_start or self.mark.scores_first
            doc.state = self.mark.commit(doc.state, doc.previous, chosen.info, scored)
        doc.append(chosen, fallback, time.perf_counter())
        if self.max_sentences is not None and doc.result.num_sentences >= self.max_sentences:
            doc.done = True
        elif doc.result.num_tokens >= self.max_new_tokens:
            # Past the budget, a text that stops inside a sentence (after a clause) goes on to
            # the sentence's end, never into a new one, while fewer than max_overrun tokens over.
            over = doc.result.num_tokens - self.max_new_tokens
            inside = self.scheme.splitter.ends_inside_sentence(doc.result.text)
            doc.done = not inside or over >= self.max_overrun
            doc.result.ended_inside_sentence = inside and doc.done
