"""Sentence splitting behind one small interface, shared by generation and detection.

Generation decides where a candidate sentence ends with the same splitter that detection later
uses to cut the text, so a sentence accepted during generation is the sentence scored at
detection (up to the splitter's own consistency on the joined text).
"""

from __future__ import annotations

from typing import Protocol

import nupunkt


class SentenceSplitter(Protocol):
    """Anything that splits text into sentences."""

    def split(self, text: str) -> list[str]:
        """Sentences of ``text``, stripped, empty ones dropped."""
        ...


class PunktSplitter:
    """Punkt-style splitting with ``nupunkt``'s default English model (no data download needed).

    It handles abbreviations ("Mr.", "U.S.", "p.m.") and quotes well and takes ~20 microseconds
    for a short paragraph. Paragraph breaks always end a sentence.
    """

    def split(self, text: str) -> list[str]:
        out: list[str] = []
        for paragraph in text.split("\n"):
            if paragraph.strip():
                out.extend(s.strip() for s in nupunkt.sent_tokenize(paragraph) if s.strip())
        return out

    def first_sentence(self, text: str) -> tuple[str, bool]:
        """The first sentence of ``text`` and whether a second one has begun after it.

        A sentence is only known to be complete once the next one has started ("... Mr." is
        not an ending; "... it. The" is), so callers generate until this returns ``True``.
        """
        head, sep, _ = text.lstrip().partition("\n")
        if sep and head.strip():
            return head.strip(), True
        sentences = self.split(head)
        if not sentences:
            return "", False
        return sentences[0], len(sentences) > 1


def get_splitter(name: str = "punkt") -> PunktSplitter:
    """The splitter registered under ``name`` (only ``punkt`` for now)."""
    if name != "punkt":
        raise ValueError(f"unknown sentence splitter {name!r}; available: 'punkt'")
    return PunktSplitter()
