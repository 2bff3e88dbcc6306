"""One document's state in the sentence loop (``watermarker``), and the steps that move it on.

A ``Document`` holds what the loop knows of one continuation while it is generated: its text
and the LM's prefix so far, the previous unit's region and the mark's own state (what the mark
reads, see ``marks.SentenceState``), and the counts of the search for the next unit.
``append`` takes a kept unit; ``take_completion`` the words that complete a prompt's open
sentence.
Clock readings are passed in, so that the loop alone reads the clock.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..results import NO_REGION, GenerationResult, Judgement, SentenceRecord
from ..text.normalize import sentence_key
from ..text.splitter import PunktSplitter, continuation_sentences
from .engine import Candidate, GroupResult
from .prompts import CHAT, COMPLETE, CONTINUE, PromptStart


@dataclass
class Document:
    """Mutable state of one document during generation (a ``marks.SentenceState``)."""

    result: GenerationResult
    prefix: str
    last_sentence: str
    """The text's (or prompt's) last sentence: the next unit's end is decided after it."""
    previous: int
    started: float
    generator: torch.Generator
    state: Any = None
    """The mark's own state of this document (``Mark.new_state``, ``Mark.commit``)."""
    sentence_started: float = 0.0
    timed_out: bool = False  # the kept sentence's search ended by ``sentence_time_budget``
    stats: dict[int, list[float]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    """``normalize.sentence_key`` of every unit kept: a repeat is not scored by detection."""
    before_last: str = ""
    """The unit before ``last_sentence`` (``normalize.repeats_itself`` reads both)."""
    drawn: int = 0
    pruned: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Candidates the mark turned down for the current unit, by reason (``Mark.rejections``)."""
    scored: list[Candidate] = field(default_factory=list)
    """The usable candidates a scoring mark scored for the current unit (``Mark.pick`` keeps
    one of them past the budget)."""
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

    @classmethod
    def start(
        cls,
        prompt: str,
        start: PromptStart,
        generator: torch.Generator,
        now: float,
        state: Any,
        keyed: Callable[[Any], tuple[int, Any]],
        rejections: tuple[str, ...] = (),
    ) -> Document:
        """The document of ``prompt`` as ``prompts.plan_prompt`` planned it (``start``), begun at
        ``now`` with the mark's fresh ``state``: finished with its error, set to complete the
        prompt's open sentence, or seeded by the keyed start value (``keyed(state)``: its region
        and the state it leaves) when it continues no sentence. A prompt that ends a sentence
        is seeded by the caller (from its region). ``rejections``: the reasons the mark counts."""
        result = GenerationResult(
            prompt=prompt, prompt_dropped_chars=start.dropped_chars, chat=start.kind == CHAT
        )
        doc = cls(
            result,
            prefix=start.prefix,
            last_sentence=start.last_sentence,
            previous=NO_REGION,
            started=now,
            generator=generator,
            state=state,
            sentence_started=now,
            rejected=dict.fromkeys(rejections, 0),
        )
        if start.error is not None:
            result.status, result.error = "error", start.error
            doc.done = True
        elif start.kind == COMPLETE:
            doc.open_sentence, doc.head = start.open_sentence, start.head
        elif start.kind != CONTINUE:  # an empty prompt or chat
            (doc.previous, doc.state), doc.keyed_start = keyed(state), True
        return doc

    @property
    def completing(self) -> bool:
        return bool(self.open_sentence)

    @property
    def finished(self) -> int:
        """Candidates drawn for the current sentence that ran to their end (not pruned): what
        the ``max_candidates`` budget counts."""
        return self.drawn - self.pruned

    def tally(
        self,
        res: GroupResult,
        rates: Callable[[int, dict[int, list[float]]], list[float]] | None,
        rejects_candidates: bool,
    ) -> None:
        """Count a round's candidates: drawn, pruned, the scored ones, and (``rates``:
        the running ``[accepted, drawn]`` counts after a previous region; ``None`` for plain
        or completing draws) acceptance and why the mark rejected each (unless it only ranks:
        ``rejects_candidates`` false)."""
        self.result.decoded_tokens += res.decoded_tokens
        self.result.wasted_tokens += res.wasted_tokens
        for cand in res.candidates:
            self.drawn += 1
            self.pruned += cand.pruned
            if cand.info is None or rates is None:
                continue
            verdict: Judgement = cand.info
            # A repeat is no candidate to keep: detection would not score it.
            if cand.text and verdict.novel and not math.isnan(verdict.score):
                self.scored.append(cand)
            counts = rates(self.previous, self.stats)
            counts[0] += cand.accepted
            counts[1] += 1
            if rejects_candidates and verdict.reason is not None:
                self.rejected[verdict.reason] = self.rejected.get(verdict.reason, 0) + 1

    def choose(
        self,
        res: GroupResult,
        max_candidates: int,
        timed_out: Callable[[], bool],
        rejects_candidates: bool,
        pick: Callable[[list[Candidate]], Candidate],
    ) -> tuple[Candidate, bool] | None:
        """The sentence to keep after a round and whether it is a fallback, or ``None`` (draw
        again, or give up once the budget holds only empty candidates). Past the budget of
        ``max_candidates`` (or once ``timed_out()``), the one ``pick`` chooses of the scored
        candidates is kept (``Mark.pick``: a fallback when the mark ``rejects_candidates``,
        else its rule), or the last usable one drawn (a fallback)."""
        if res.accepted_index is not None:
            return res.candidates[res.accepted_index], False
        out_of_time = timed_out()
        if self.drawn < max_candidates and not out_of_time:
            return None
        self.timed_out = self.drawn < max_candidates
        if self.completing:
            self.done = True
            self.result.status = "error"
            self.result.error = (
                f"the prompt's last sentence could not be completed in {self.drawn} draws (none "
                "ended it where the sentence splitter cuts the whole text)"
            )
            return None
        if self.scored:
            return pick(self.scored), rejects_candidates
        usable = [c for c in res.candidates if c.text]
        if usable:
            return usable[-1], True
        if self.finished < max_candidates:
            # Out of time, or rows were pruned, and nothing finished is a sentence: draw again
            # (pruned rows do not spend the budget).
            return None
        self.done = True
        if self.result.sentences:
            # The LM keeps ending the text here (end of text, or nothing a sentence can be cut
            # from): keep what it wrote, a shorter text.
            self.result.ended_by_model = True
        else:
            self.result.status = "error"
            self.result.error = "the model produced no usable sentence"
        return None

    def _reset_counts(self) -> None:
        self.drawn = 0
        self.rejected = dict.fromkeys(self.rejected, 0)

    def append(self, chosen: Candidate, fallback: bool, now: float) -> None:
        """Add the kept sentence and move the state to the search for the next one, which
        starts at ``now``."""
        region = chosen.info.region if chosen.info else NO_REGION
        self.result.sentences.append(
            SentenceRecord(
                text=chosen.text,
                region=region,
                candidates=self.drawn,
                rejected=dict(self.rejected),
                fallback=fallback,
                num_tokens=chosen.num_tokens,
                pruned=self.pruned,
                timed_out=self.timed_out,
                score=score_of(chosen),
            )
        )
        first = not self.result.text and not self.verbatim
        self.result.text += ("" if first else chosen.separator) + chosen.text
        if self.keyed_start and len(self.result.sentences) == 1:
            # The first sentence of an answer or of an empty prompt starts the LM's text: no
            # space the LM did not write. Its step from the start value is never scored.
            self.prefix += chosen.text
        else:
            self.prefix += chosen.separator + chosen.text
        self.before_last, self.last_sentence = self.last_sentence, chosen.text
        self.seen.add(sentence_key(chosen.text))
        self.previous = region
        self._reset_counts()
        self.pruned = 0
        self.sentence_started, self.timed_out = now, False
        self.scored = []

    def completion(self, splitter: PunktSplitter, sentence: str) -> str | None:
        """The completion in ``sentence`` (the prompt's open sentence, completed), or ``None``
        when detection would not cut the prompt plus it into exactly that sentence."""
        if not sentence.startswith(self.open_sentence):
            return None
        completion = sentence[len(self.open_sentence) :]
        cut = continuation_sentences(splitter, self.result.prompt, completion)
        return completion if cut == (sentence, [], completion) else None

    def take_completion(self, chosen: Candidate, completion: str) -> None:
        """Take the ``completion`` of the prompt's open sentence in ``chosen``: it starts the
        text, and the completed sentence seeds the first watermarked one."""
        self.result.completion = completion
        self.result.completion_tokens = chosen.num_tokens
        self.result.text = completion
        self.prefix += completion
        self.last_sentence = chosen.text
        self.previous = chosen.info.region
        self.open_sentence = self.head = ""
        self.verbatim = True
        self._reset_counts()


def score_of(candidate: Candidate) -> float | None:
    """A candidate's score, or ``None`` when its mark gave it none."""
    info = candidate.info
    return None if info is None or math.isnan(info.score) else float(info.score)


def random_seed() -> int:
    """A fresh seed from the operating system's generator, for a document sampled without one."""
    return secrets.randbits(63)


def document_generator(seed: int, prompt: object) -> torch.Generator:
    """The sampling generator of one document: seeded from ``seed`` and its prompt alone."""
    digest = hashlib.sha256(f"{seed}|{prompt}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
