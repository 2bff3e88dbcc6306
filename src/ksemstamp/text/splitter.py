"""Sentence splitting (``PunktSplitter`` and its clause form), shared by generation and detection.

Generation decides where a candidate sentence ends with the same splitter that detection later
uses to cut the text, so a sentence accepted during generation is the sentence scored at
detection (up to the splitter's own consistency on the joined text). The splitter reads every
text in its normalised form (``normalize.normalize_text``): sentences are substrings of the
normalised text, never of invisible characters, look-alike letters or hard line wraps.
"""

from __future__ import annotations

import re

import nupunkt

from .normalize import normalize_text


class PunktSplitter:
    """Punkt-style splitting with ``nupunkt``'s default English model (no data download needed).

    It handles abbreviations ("Mr.", "U.S.", "p.m.") and quotes well and takes ~20 microseconds
    for a short paragraph. Text is normalised first (``normalize_text``): a single line break
    inside a paragraph reads as a space; the line breaks that remain (paragraph breaks, list
    items, headings) end a sentence.
    """

    terminals = ".!?\u2026"
    """Characters one of which a unit's text holds before it can end (the sampler checks a row
    for an ending only once it has written one)."""

    def split(self, text: str) -> list[str]:
        """Sentences of the normalised ``text``, stripped, empty ones dropped."""
        out: list[str] = []
        for block in normalize_text(text).text.split("\n"):
            if block.strip():
                out.extend(s.strip() for s in nupunkt.sent_tokenize(block) if s.strip())
        return out

    def spans(self, text: str) -> list[tuple[int, str]]:
        """``(offset, sentence)`` for each sentence of ``split(text)``: where it starts in the
        normalised ``text`` (``text`` itself when it is normalised already, as callers pass it).
        Sentences are substrings of it (only trimmed), so each is found after the end of the
        one before."""
        text = normalize_text(text).text
        out: list[tuple[int, str]] = []
        cursor = 0
        for sentence in self.split(text):
            at = text.find(sentence, cursor)
            at = cursor if at < 0 else at
            out.append((at, sentence))
            cursor = at + len(sentence)
        return out

    def ends_sentence(self, sentence: str) -> bool:
        """Whether ``sentence`` is complete, i.e. a following capitalised word starts a new one."""
        return len(self.split(sentence.strip() + " The")) == 2

    def ends_inside_sentence(self, text: str) -> bool:
        """Whether ``text``, made of this splitter's units, stops inside a sentence. Never for
        whole sentences: generation keeps a sentence only once it is complete."""
        return False

    def next_sentence(
        self, context: str, continuation: str, require_end: bool = True
    ) -> tuple[str, bool]:
        """The first sentence that ``continuation`` adds after ``context``, and whether it is done.

        ``context`` is the sentence just before (or ``""``); ``continuation`` is appended to it
        verbatim, leading whitespace included, and the pair is split as detection would split
        the joined text. Returns:

        * ``(sentence, True)`` once a further sentence has begun after it ("... it. The"); a
          sentence is only known to be complete then ("... Mr." is not an ending), or once a
          line break that stays a break follows it (a blank line, a list item, a heading). A
          single line break at the end of the continuation decides nothing yet: the next line
          may continue the paragraph;
        * ``("", True)`` when the continuation does not start a sentence of its own in this
          context (it would merge into ``context`` at detection), so it can never become one;
        * ``("", True)`` as well when its first sentence is cut only by a paragraph break and
          does not end a sentence itself (a heading or list item without a full stop): a text
          that kept it would end open, and every sentence written after it would merge into it.
          ``require_end=False`` accepts such a sentence (the samplers do when completing the
          prompt's own open sentence, which may be a title);
        * ``(sentence_so_far, False)`` otherwise.
        """
        context = context.strip()
        continuation = normalize_text(continuation).text
        parts = self.split(context + continuation) if context else self.split(continuation)
        if context:
            if not parts:
                return "", False
            if parts[0] != context:
                return "", True
            parts = parts[1:]
        if not parts:
            return "", False
        # A line break left in the normalised text ends the sentence before it, whatever
        # follows; a single one at the very end may still be joined to the next line.
        body = continuation.lstrip().rstrip(" \t")
        if body.endswith("\n") and not body.endswith("\n\n"):
            body = body[:-1]
        complete = len(parts) > 1 or "\n" in body
        if require_end and complete and not self.ends_sentence(parts[0]):
            return "", True
        return parts[0], complete


# A clause ends after a comma, semicolon or colon that whitespace follows ("1,000" goes on).
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+")


def clauses(sentence: str, min_words: int) -> list[str]:
    """``sentence`` cut into clauses, left to right: a clause ends at the first comma, semicolon
    or colon followed by whitespace once it holds at least ``min_words`` words, and the last one
    ends with the sentence, however short. Reading from a clause's start gives the same cuts as
    reading from the sentence's, which lets generation decide each clause's end on the clause
    before it alone, as it does for sentences. Clauses are substrings of the stripped sentence,
    its whitespace kept."""
    sentence = sentence.strip()
    out: list[str] = []
    start = 0
    for end in _CLAUSE_END.finditer(sentence):
        if len(sentence[start : end.start()].split()) >= min_words:
            out.append(sentence[start : end.start()])
            start = end.end()
    if start < len(sentence):
        out.append(sentence[start:])
    return out


class ClauseSplitter(PunktSplitter):
    """Units shorter than sentences: each of ``PunktSplitter``'s sentences cut into clauses
    (``clauses``). Generation draws, and detection scores, a clause at a time, so a text of the
    same length holds more units, each with the evidence a best-of-N selection gives it."""

    terminals = PunktSplitter.terminals + ",;:"

    def __init__(self, min_words: int = 4) -> None:
        if min_words < 1:
            raise ValueError(f"a clause holds at least one word, got min_words={min_words}")
        self.min_words = min_words

    def split(self, text: str) -> list[str]:
        """Clauses of the sentences of the normalised ``text``."""
        return [c for s in super().split(text) for c in clauses(s, self.min_words)]

    def ends_inside_sentence(self, text: str) -> bool:
        """Whether ``text`` stops inside a sentence: after a clause that ends with a comma,
        semicolon or colon, read as sentences are (a following capitalised word would not start
        a new sentence)."""
        sentences = PunktSplitter.split(self, text)
        return bool(sentences) and len(PunktSplitter.split(self, sentences[-1] + " The")) != 2


SPLITTERS = ("sentences", "clauses")


def get_splitter(name: str = "sentences", min_words: int = 4) -> PunktSplitter:
    """The splitter of ``name``: ``sentences`` (Punkt), or ``clauses`` (its sentences cut into
    clauses of at least ``min_words`` words; ``ClauseSplitter``). ``punkt`` names
    ``sentences``."""
    if name in ("sentences", "punkt"):
        return PunktSplitter()
    if name == "clauses":
        return ClauseSplitter(min_words)
    raise ValueError(f"unknown splitter {name!r}; available: {', '.join(SPLITTERS)}")


def continuation_sentences(
    splitter: PunktSplitter, prompt: str | None, text: str
) -> tuple[str | None, list[str], str | None]:
    """How a ``text`` that continues ``prompt`` is cut: ``(seed, sentences, completion)``.

    * no prompt, or a blank one: no seed; ``sentences`` are the text's own.
    * a prompt that ends a sentence: its last sentence seeds; the text is split on its own.
    * a prompt that ends mid-sentence: ``prompt.rstrip() + text`` is split as one text; the
      sentence holding the prompt's end seeds, the sentences starting after it are the
      text's, and ``completion`` is the part of the text inside the seed (``""`` when the
      text adds nothing to it).

    ``completion`` is ``None`` unless the prompt ends mid-sentence. Both are read in their
    normalised form (``normalize``), and ``completion`` is part of the normalised text.
    """
    text = normalize_text(text).text
    prompt = normalize_text(prompt).text if prompt else prompt
    prompt_sentences = splitter.split(prompt) if prompt else []
    if not prompt_sentences:
        return None, splitter.split(text), None
    if splitter.ends_sentence(prompt_sentences[-1]):
        return prompt_sentences[-1], splitter.split(text), None
    head = prompt.rstrip()
    spans = splitter.spans(head + text)
    start, seed = [(at, s) for at, s in spans if at < len(head)][-1]
    completion = text[: max(0, start + len(seed) - len(head))]
    return seed, [s for at, s in spans if at >= len(head)], completion
