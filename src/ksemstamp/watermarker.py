"""Watermarked generation: the sentence loop of k-SemStamp's Algorithm 1, batched, for any mark.

For each new sentence of each document the loop draws rounds of candidate sentences and asks
the document's mark (``marks``: ``region``, k-SemStamp's valid regions; ``direction``, keyed
scores) to judge them. The sampler keeps the first accepted candidate of a round in draw order.
After ``max_candidates`` draws without one, the loop keeps the best-scoring candidate when the
mark scores them (the ``direction`` mark: by rule without a threshold, else a fallback), and
otherwise the last one drawn (a *fallback*). Candidates are drawn in rounds of several rows per
document (see ``sampler``), several documents per round. The first generated sentence is
seeded by the region of the prompt's last sentence. A prompt that ends mid-sentence is first
completed (one unwatermarked candidate at a time, judged only on whether detection will cut the
completed sentence where generation did), and the completed sentence seeds; an empty prompt or
an instruction (``chat``) seeds the first sentence with the scheme's keyed start value. See
``prompts`` for the kinds of prompt.

Sentence time budget (an option, ``sentence_time_budget``; ``None`` is the paper's rule): a
sentence whose search has run that many seconds ends as at ``max_candidates`` (the region mark
keeps the last candidate drawn, a fallback; the direction mark its best so far), checked between
rounds. It bounds the stall of a sentence whose valid
regions the LM rarely reaches, at the price of a text that depends on the machine's speed.

Round size: with acceptance probability ``p`` for the current valid set and a round of ``n``
rows costing about ``1 + row_cost * (n - 1)`` single-row decodes (``ROW_COST``), the expected
cost per accepted sentence is ``(1 + row_cost (n - 1)) / (1 - (1 - p)^n)``; we take the
``n <= candidate_batch`` minimising it. ``p`` is a running acceptance rate per previous region,
started from the mark's prior (``Mark.prior``) worth ``PRIOR_WEIGHT`` observations. The
generator's own text soon overrides the prior where it differs from the domain's.

What ``generate`` returns (``GenerationResult`` and the rest) is defined in ``results`` and
re-exported here. The loop itself is the named steps below (``_start``, ``_judge``, ``_tally``,
``_choose``, ``_append``, ``_complete``), for every mark and every kind of prompt.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from tqdm.auto import tqdm

from .detector import continuation_sentences
from .marks import Mark, make_mark
from .prompts import CHAT, COMPLETE, CONTINUE, chat_prefix, lm_context, plan_prompt, prompt_budget
from .pruning import PruneRule
from .results import GenerationProgress, GenerationResult, Judgement, SentenceRecord, summarize
from .sampler import Candidate, CandidateSampler, GroupResult
from .scheme import WatermarkScheme
from .textcheck import readable

__all__ = [
    "GenerationProgress",
    "GenerationResult",
    "Judgement",
    "SentenceRecord",
    "Watermarker",
    "summarize",
]

ROW_COST = 0.065
"""Relative cost of one more row in a batched decode step: measured on 2 CPU cores with
SmolLM2-135M, 8 rows cost 1.9x one row, 16 rows 2.2x, 32 rows 2.9x."""
PRIOR_WEIGHT = 4.0
"""Observations the mark's prior acceptance rate is worth in a previous region's running rate."""
MIN_ACCEPTANCE = 1e-3
"""Floor of the acceptance rate a round is sized for (a round never grows without bound)."""
COST_TOLERANCE = 1e-12
"""A larger round must cost less than this below a smaller one's expected cost to be chosen."""
PLAIN = Judgement(-1, True, True, True)
"""The verdict on a candidate drawn without a watermark: always kept."""


@dataclass
class _Doc:
    """Mutable state of one document during generation (a ``marks.SentenceState``)."""

    result: GenerationResult
    prefix: str
    context: str
    previous: int
    started: float
    generator: torch.Generator
    weights: torch.Tensor | None = None
    """What the previous sentence (or start value) hands on (``Mark.contexts``)."""
    sentence_started: float = 0.0
    timed_out: bool = False  # the kept sentence's search ended by ``sentence_time_budget``
    stats: dict[int, list[float]] = field(default_factory=dict)
    used: set[tuple[int, int]] = field(default_factory=set)
    drawn: int = 0
    pruned: int = 0
    rejected_region: int = 0
    rejected_margin: int = 0
    rejected_repeat: int = 0
    best: Candidate | None = None  # best-scoring usable candidate so far (a scoring mark)
    done: bool = False
    open_sentence: str = ""
    """While the prompt's unfinished last sentence is being completed: that sentence."""
    head: str = ""
    """The open sentence with the whitespace before it, given to the sampler (see there)."""
    verbatim: bool = False
    """``text`` continues the prompt with no space added (after a completion): every
    sentence keeps its separator, the first one too."""
    keyed_start: bool = False
    """The first sentence is seeded by the keyed start value, a transition no detector scores."""

    @property
    def completing(self) -> bool:
        return bool(self.open_sentence)

    @property
    def finished(self) -> int:
        """Candidates drawn for the current sentence that ran to their end (not pruned): what
        the ``max_candidates`` budget counts."""
        return self.drawn - self.pruned

    def next_sentence(self) -> None:
        """Start the search for the next sentence: nothing drawn, rejected or kept yet."""
        self.drawn = self.rejected_region = self.rejected_margin = self.rejected_repeat = 0
        self.pruned = 0
        self.sentence_started, self.timed_out = time.perf_counter(), False
        self.best = None


class Watermarker:
    """Generates watermarked text with a ``WatermarkScheme`` and a ``CandidateSampler``.

    Args:
        scheme: encoder, partition and valid table.
        sampler: the batched candidate sampler.
        max_candidates: ``N_max``, candidates per sentence before falling back (paper: 100).
        candidate_batch: most rows per document per round.
        adaptive_batch: size rounds from the expected acceptance (else always ``candidate_batch``).
        row_cost: relative cost of one extra row in a batched decode step.
        max_new_tokens: stop a document once its continuation has this many tokens.
        max_sentences: optional cap on sentences per document.
        novelty_patience: ``region`` mark: candidates after which a repeated valid transition
            is accepted (0: always, the paper's rule; see ``marks.region``).
        margin_patience: ``region`` mark: candidates after which the margin is no longer
            required: a candidate in a valid region is then accepted whatever its distance to
            the region's border (``None``: the margin holds until ``max_candidates``, the
            paper's rule).
        threshold: ``direction`` mark: the score that accepts a candidate at once (``None``:
            none does; the best of ``max_candidates`` is kept).
        prune: ``direction`` mark without a threshold: when running candidate rows stop early
            (``None``: every row finishes).
        seed: seed of the sampling RNG (same seed, inputs and settings give the same text).
        sentence_time_budget: seconds after which a sentence's search falls back as at
            ``max_candidates`` (checked between rounds; ``None``: no limit, the paper's rule).
        chat: prompts are instructions, wrapped in the LM's chat template (see ``prompts``).
        max_prompt_tokens: most prompt tokens the LM sees (the left part of a longer prompt is
            dropped); also bounded by the LM's context less the continuation.
        max_prompt_chars: longest prompt accepted, in characters (longer: an error record).
        mark: the ``marks.Mark`` to generate with, instead of the one ``scheme.mark`` names
            (built from ``novelty_patience``, ``margin_patience``, ``threshold`` and ``prune``).
    """

    def __init__(
        self,
        scheme: WatermarkScheme,
        sampler: CandidateSampler,
        max_candidates: int = 100,
        candidate_batch: int = 32,
        adaptive_batch: bool = True,
        row_cost: float = ROW_COST,
        max_new_tokens: int = 200,
        max_sentences: int | None = None,
        novelty_patience: int = 0,
        margin_patience: int | None = None,
        threshold: float | None = None,
        prune: PruneRule | None = None,
        seed: int = 0,
        sentence_time_budget: float | None = None,
        chat: bool = False,
        max_prompt_tokens: int | None = None,
        max_prompt_chars: int | None = None,
        mark: Mark | None = None,
    ) -> None:
        for name, value in (
            ("max_candidates", max_candidates),
            ("candidate_batch", candidate_batch),
            ("max_new_tokens", max_new_tokens),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if sentence_time_budget is not None and sentence_time_budget <= 0:
            raise ValueError(
                f"sentence_time_budget must be > 0 or None, got {sentence_time_budget}"
            )
        self.scheme = scheme
        self.sampler = sampler
        self.mark = mark or make_mark(
            scheme,
            threshold=threshold,
            prune=prune,
            novelty_patience=novelty_patience,
            margin_patience=margin_patience,
        )
        self.max_candidates = max_candidates
        self.candidate_batch = candidate_batch
        self.adaptive_batch = adaptive_batch
        self.row_cost = row_cost
        self.max_new_tokens = max_new_tokens
        self.max_sentences = max_sentences
        self.seed = seed
        self.sentence_time_budget = sentence_time_budget
        self.prior_weight = PRIOR_WEIGHT
        self.chat = chat
        self.max_prompt_chars = max_prompt_chars
        # The sampler's tokenizer and LM decide how much of a prompt the LM can see; a sampler
        # without them (tests) sees every prompt whole.
        self.tokenizer = getattr(sampler, "tokenizer", None)
        sentence_tokens = getattr(getattr(sampler, "config", None), "max_sentence_tokens", 0)
        self.prompt_budget = prompt_budget(
            max_prompt_tokens,
            lm_context(getattr(sampler, "model", None)),
            max_new_tokens,
            sentence_tokens,
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
        p = min(max(accepted / drawn_all, MIN_ACCEPTANCE), 1.0)
        best, best_cost = 1, math.inf
        for n in range(1, self.candidate_batch + 1):
            cost = (1 + self.row_cost * (n - 1)) / (1 - (1 - p) ** n)
            if cost < best_cost - COST_TOLERANCE:
                best, best_cost = n, cost
        return max(1, min(best, budget))

    def _acceptance(self, previous: int, stats: dict[int, list[float]]) -> list[float]:
        if previous not in stats:
            stats[previous] = [self.mark.prior(previous) * self.prior_weight, self.prior_weight]
        return stats[previous]

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

        Each document samples from its own generator, seeded from ``seed`` and its prompt, and
        learns its own acceptance rates, so its text depends only on the seed, the prompt and
        the settings: not on the other prompts of its batch, nor on an interrupted earlier run.
        ``generator`` replaces that with one generator shared by all documents.
        """
        docs = self._start(prompts, generator)
        bar = tqdm(
            total=len(docs) * self.max_new_tokens, disable=not progress, unit="tok", desc="generate"
        )
        while active := [d for d in docs if not d.done]:
            rows = [
                self.rows_for(d.previous, d.finished, d.stats, watermark and not d.completing)
                for d in active
            ]
            # Heads only while a prompt is being completed: samplers written for the plain
            # interface keep working for prompts that end a sentence.
            heads = {"heads": [d.head for d in active]} if any(d.completing for d in active) else {}
            pruner = None
            if watermark and not all(d.completing for d in active):
                pruner = self.mark.pruner(active)
            results = self.sampler.sample_round(
                [d.prefix for d in active],
                rows,
                partial(self._judge, active, watermark),
                generator or [d.generator for d in active],
                [d.context for d in active],
                **heads,
                **({"pruner": pruner} if pruner is not None else {}),
            )
            for doc, res in zip(active, results, strict=True):
                completing = doc.completing
                self._tally(doc, res, watermark and not completing)
                chosen = self._choose(doc, res)
                if chosen is not None:
                    (self._complete if completing else self._append)(doc, *chosen)
                    bar.update(chosen[0].num_tokens)
            for doc in active:
                if doc.done:
                    doc.result.seconds = time.perf_counter() - doc.started
            # Long searches for one sentence should be visible, not look like a hang.
            bar.set_postfix(
                sentences=sum(d.result.num_sentences for d in docs),
                drawn_for_current=max(d.drawn for d in active),
                refresh=False,
            )
            if on_progress is not None:
                on_progress(
                    GenerationProgress(
                        sentences=sum(d.result.num_sentences for d in docs),
                        candidates=sum(d.result.candidates + d.drawn for d in docs),
                        drawn_for_current=max(d.drawn for d in active),
                        tokens=sum(d.result.num_tokens for d in docs),
                        max_tokens=len(docs) * self.max_new_tokens,
                        texts=[d.result.text for d in docs],
                    )
                )
        bar.close()
        return [d.result for d in docs]

    def _start(self, prompts: Sequence[str], generator: torch.Generator | None) -> list[_Doc]:
        """One document per prompt, started as ``prompts.plan_prompt`` says: seeded by the region
        of the prompt's last sentence, set to complete an unfinished one first, or seeded by the
        keyed start value (empty prompt, chat); a prompt that cannot be used gives a finished
        document with an error."""
        docs: list[_Doc] = []
        seeds: list[tuple[_Doc, str]] = []
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
            result = GenerationResult(
                prompt=prompt, prompt_dropped_chars=start.dropped_chars, chat=start.kind == CHAT
            )
            doc = _Doc(
                result,
                prefix=start.prefix,
                context=start.context,
                previous=-1,
                started=time.perf_counter(),
                generator=generator or _document_generator(self.seed, prompt),
            )
            doc.sentence_started = doc.started
            if start.error is not None:
                result.status, result.error = "error", start.error
                doc.done = True
            elif start.kind == CONTINUE:
                seeds.append((doc, start.context))
            elif start.kind == COMPLETE:
                doc.open_sentence, doc.head = start.open_sentence, start.head
            else:  # an empty prompt or chat: the keyed start value seeds the first sentence
                doc.previous, doc.keyed_start = self.scheme.start_region, True
                doc.weights = self.mark.start_context()
            docs.append(doc)
        if seeds:
            emb = self.scheme.embed([sentence for _, sentence in seeds])
            located = self.scheme.locate(emb)[0]
            contexts = self.mark.contexts(emb, located)
            for (doc, _), region, context in zip(seeds, located.tolist(), contexts, strict=True):
                doc.previous, doc.weights = region, context
        return docs

    def _judge(
        self, active: list[_Doc], watermark: bool, rows: list[tuple[int, int]], texts: list[str]
    ) -> list[tuple[bool, Judgement]]:
        """The sampler's judge: ``(accepted, Judgement)`` for candidate ``texts`` drawn for
        ``rows`` (``(document index in active, candidate index in the round)``), as the mark
        judges them. A candidate that completes a prompt's sentence is accepted when detection
        will cut that sentence the same way; its region then seeds the first watermarked one."""
        completing = [active[g].completing for g, _ in rows]
        if not watermark and not any(completing):
            return [(True, PLAIN) for _ in texts]
        emb = self.scheme.embed(texts)
        regions, margin_ok = self.scheme.locate(emb)
        verdicts = self.mark.judge(active, rows, emb, regions, margin_ok)
        out = []
        for (g, _), text, (accepted, verdict) in zip(rows, texts, verdicts, strict=True):
            doc = active[g]
            if doc.completing:
                ok = self._completion(doc, text) is not None
                out.append(
                    (ok, Judgement(verdict.region, True, True, True, context=verdict.context))
                )
            elif not watermark:  # as in the plain path above, whatever else is in the round
                out.append((True, PLAIN))
            else:
                out.append((accepted, verdict))
        return out

    def _tally(self, doc: _Doc, res: GroupResult, watermark: bool) -> None:
        """Count a round's candidates: drawn, acceptance rate, and why each was rejected."""
        doc.result.decoded_tokens += res.decoded_tokens
        doc.result.wasted_tokens += res.wasted_tokens
        for cand in res.candidates:
            doc.drawn += 1
            doc.pruned += cand.pruned
            if cand.info is None or not watermark:
                continue
            verdict: Judgement = cand.info
            scored = cand.text and not math.isnan(verdict.score)
            if scored and (doc.best is None or verdict.score > doc.best.info.score):
                doc.best = cand
            counts = self._acceptance(doc.previous, doc.stats)
            counts[0] += cand.accepted
            counts[1] += 1
            if not self.mark.turns_down:
                continue  # a ranking: no candidate is turned down by a rule
            if not verdict.valid:
                doc.rejected_region += 1
            elif not verdict.margin_ok:
                doc.rejected_margin += 1
            elif not verdict.novel:
                doc.rejected_repeat += 1

    def _choose(self, doc: _Doc, res: GroupResult) -> tuple[Candidate, bool] | None:
        """The sentence to keep after a round and whether it is a fallback, or ``None`` (draw
        again, or give up once the budget holds only empty candidates)."""
        if res.accepted_index is not None:
            return res.candidates[res.accepted_index], False
        timed_out = (
            self.sentence_time_budget is not None
            and not doc.completing  # the prompt's open sentence is completed whatever it takes
            and time.perf_counter() - doc.sentence_started >= self.sentence_time_budget
        )
        if doc.drawn < self.max_candidates and not timed_out:
            return None
        doc.timed_out = doc.drawn < self.max_candidates
        if doc.completing:
            doc.done = True
            doc.result.status = "error"
            doc.result.error = (
                f"the prompt's last sentence could not be completed in {doc.drawn} draws (none "
                "ended it where the sentence splitter cuts the whole text)"
            )
            return None
        if doc.best is not None:
            # Under a ranking mark, the best of max_candidates is the rule, not a fallback.
            return doc.best, self.mark.turns_down
        usable = [c for c in res.candidates if c.text]
        if usable:
            return usable[-1], True
        if doc.finished < self.max_candidates:
            # Out of time, or rows were pruned, and nothing finished is a sentence: draw again
            # (pruned rows do not spend the budget).
            return None
        doc.done = True
        if doc.result.sentences:
            # The LM keeps ending the text here (end of text, or nothing a sentence can be cut
            # from): keep what it wrote, a shorter text.
            doc.result.ended_by_model = True
        else:
            doc.result.status = "error"
            doc.result.error = "the model produced no usable sentence"
        return None

    def _append(self, doc: _Doc, chosen: Candidate, fallback: bool) -> None:
        """Add the kept sentence to the document and move its state to the next sentence."""
        region = chosen.info.region if chosen.info else -1
        doc.result.sentences.append(
            SentenceRecord(
                text=chosen.text,
                region=region,
                candidates=doc.drawn,
                rejected_region=doc.rejected_region,
                rejected_margin=doc.rejected_margin,
                rejected_repeat=doc.rejected_repeat,
                fallback=fallback,
                num_tokens=chosen.num_tokens,
                pruned=doc.pruned,
                timed_out=doc.timed_out,
                score=_score_of(chosen),
            )
        )
        first = not doc.result.text and not doc.verbatim
        doc.result.text += ("" if first else chosen.separator) + chosen.text
        if doc.keyed_start and len(doc.result.sentences) == 1:
            # The first sentence of an answer or of an empty prompt starts the LM's text: no
            # space the LM did not write. Its step from the start value is never scored.
            doc.prefix += chosen.text
        else:
            doc.prefix += chosen.separator + chosen.text
            doc.used.add((doc.previous, region))
        doc.context = chosen.text
        doc.previous = region
        if chosen.info is not None and chosen.info.context is not None:
            doc.weights = chosen.info.context
        doc.next_sentence()
        if doc.result.num_tokens >= self.max_new_tokens or (
            self.max_sentences is not None and doc.result.num_sentences >= self.max_sentences
        ):
            doc.done = True

    def _completion(self, doc: _Doc, sentence: str) -> str | None:
        """The completion in ``sentence`` (the prompt's open sentence, completed), or ``None``
        when detection would not cut the prompt plus it into exactly that sentence."""
        if not sentence.startswith(doc.open_sentence):
            return None
        completion = sentence[len(doc.open_sentence) :]
        cut = continuation_sentences(self.scheme.splitter, doc.result.prompt, completion)
        return completion if cut == (sentence, [], completion) else None

    def _complete(self, doc: _Doc, chosen: Candidate, fallback: bool = False) -> None:
        """Take the completion of the prompt's open sentence: it starts the text, and the
        completed sentence seeds the first watermarked one."""
        completion = self._completion(doc, chosen.text)
        assert completion is not None  # the judge accepted it
        doc.result.completion = completion
        doc.result.completion_tokens = chosen.num_tokens
        doc.result.text = completion
        doc.prefix += completion
        doc.context = chosen.text
        doc.previous = chosen.info.region
        doc.weights = chosen.info.context
        doc.open_sentence = doc.head = ""
        doc.verbatim = True
        doc.drawn = doc.rejected_region = doc.rejected_margin = doc.rejected_repeat = 0


def _score_of(candidate: Candidate) -> float | None:
    info = candidate.info
    return None if info is None or math.isnan(info.score) else float(info.score)


def _document_generator(seed: int, prompt: object) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}|{prompt}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
