"""Edits people make to a text without any language model, for the evaluation.

Besides paraphrasing, a text is reordered, cropped, merged, split, pasted among other sentences,
re-wrapped or re-typed. Each edit here is a pure function of the text, a seeded random stream
and (for the interleavings) human sentences, so an evaluation applies the same edit to every
watermark's texts. Sentence-level edits cut the text with the project's splitter; character-level
edits work on the text as written.

=================  =====================================================================
``reorder``        the sentences shuffled
``swap``           neighbouring sentences swapped in pairs (1-2, 3-4, ...)
``merge``          pairs of neighbouring sentences joined with ", and"
``split``          each sentence of 16+ words split in two at a comma near its middle
``drop``           30% of the sentences dropped at random (at least one kept)
``crop``           the first half of the sentences kept
``interleave-50``  one human sentence after each sentence (half the sentences human)
``interleave-75``  three human sentences after each (three quarters human)
``hard-wrap``      every paragraph wrapped at 72 columns with single line breaks
``homoglyphs``     15% of the letters that have a Cyrillic look-alike replaced by it
``zero-width``     a zero-width character inserted after 15% of the letters
=================  =====================================================================
"""

from __future__ import annotations

import random
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .splitter import PunktSplitter, get_splitter

CYRILLIC = {"a": "а", "c": "с", "e": "е", "i": "і", "o": "о", "p": "р", "x": "х", "y": "у",
            "A": "А", "B": "В", "C": "С", "E": "Е", "H": "Н", "K": "К", "M": "М", "O": "О",
            "P": "Р", "T": "Т", "X": "Х"}  # fmt: skip
"""Latin letters and the Cyrillic letters that render like them (the usual homoglyph swap)."""
ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff")
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)]*$")

Edit = Callable[[list[str], random.Random, Sequence[str]], list[str]]


def _lower_first(sentence: str) -> str:
    """The sentence with its first letter in lower case, unless its first word looks like a
    name or an acronym ("I", "NASA", "McCain")."""
    word = sentence.split(" ", 1)[0]
    if word == "I" or sum(c.isupper() for c in word) > 1:
        return sentence
    return sentence[:1].lower() + sentence[1:]


def merge_pair(first: str, second: str) -> str:
    """``first`` without its final punctuation, ", and ", then ``second``."""
    head = _SENTENCE_END.sub("", first.rstrip())
    return f"{head}, and {_lower_first(second)}"


def split_sentence(sentence: str, min_words: int = 16) -> list[str]:
    """A sentence of ``min_words``+ words cut at the comma nearest its middle into two
    sentences (both of 4+ words); else the sentence alone."""
    words = sentence.split()
    if len(words) < min_words:
        return [sentence]
    cuts = [m.start() for m in re.finditer(r",\s", sentence)]
    cuts = [c for c in cuts if len(sentence[:c].split()) >= 4 and len(sentence[c:].split()) >= 5]
    if not cuts:
        return [sentence]
    at = min(cuts, key=lambda c: abs(c - len(sentence) / 2))
    rest = sentence[at + 1 :].strip()
    rest = rest[:1].upper() + rest[1:]
    return [sentence[:at] + ".", rest]


def _reorder(sentences, rng, human):
    out = list(sentences)
    rng.shuffle(out)
    return out


def _swap(sentences, rng, human):
    out = list(sentences)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def _merge(sentences, rng, human):
    out = []
    for i in range(0, len(sentences), 2):
        pair = sentences[i : i + 2]
        out.append(merge_pair(*pair) if len(pair) == 2 else pair[0])
    return out


def _split(sentences, rng, human):
    return [part for s in sentences for part in split_sentence(s)]


def _drop(sentences, rng, human):
    keep = max(1, round(len(sentences) * 0.7))
    chosen = sorted(rng.sample(range(len(sentences)), keep))
    return [sentences[i] for i in chosen]


def _crop(sentences, rng, human):
    return sentences[: max(1, len(sentences) // 2)]


def _interleave(per_sentence: int) -> Edit:
    def edit(sentences, rng, human):
        if len(human) < per_sentence * len(sentences):
            raise ValueError(
                f"interleaving {per_sentence} human sentences after each of {len(sentences)} "
                f"needs {per_sentence * len(sentences)}, got {len(human)}"
            )
        pool = iter(human)
        return [s for own in sentences for s in [own] + [next(pool) for _ in range(per_sentence)]]

    return edit


def hard_wrap(text: str, width: int = 72) -> str:
    """Every paragraph of ``text`` wrapped at ``width`` columns with single line breaks."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width) for p in paragraphs)


def homoglyphs(text: str, rng: random.Random, share: float = 0.15) -> str:
    """``share`` of the letters that have a Cyrillic look-alike replaced by it."""
    return "".join(CYRILLIC[c] if c in CYRILLIC and rng.random() < share else c for c in text)


def zero_width(text: str, rng: random.Random, share: float = 0.15) -> str:
    """A zero-width character inserted after ``share`` of the letters."""
    return "".join(
        c + rng.choice(ZERO_WIDTH) if c.isalpha() and rng.random() < share else c for c in text
    )


@dataclass(frozen=True)
class EditRule:
    """One edit: ``apply(text, rng, human, splitter)``, and the human sentences it needs per
    sentence of the text (the interleavings)."""

    apply: Callable[[str, random.Random, Sequence[str], PunktSplitter], str]
    human_per_sentence: int = 0


def _by_sentence(edit: Edit) -> Callable[[str, random.Random, Sequence[str], PunktSplitter], str]:
    """A sentence-level edit as an edit of the text: its sentences edited, joined by single
    spaces (paragraph breaks go); a text without sentences as it is."""

    def apply(text: str, rng: random.Random, human: Sequence[str], splitter: PunktSplitter) -> str:
        sentences = splitter.split(text)
        return " ".join(edit(sentences, rng, human)) if sentences else text

    return apply


EDITS: dict[str, EditRule] = {
    "reorder": EditRule(_by_sentence(_reorder)),
    "swap": EditRule(_by_sentence(_swap)),
    "merge": EditRule(_by_sentence(_merge)),
    "split": EditRule(_by_sentence(_split)),
    "drop": EditRule(_by_sentence(_drop)),
    "crop": EditRule(_by_sentence(_crop)),
    "interleave-50": EditRule(_by_sentence(_interleave(1)), human_per_sentence=1),
    "interleave-75": EditRule(_by_sentence(_interleave(3)), human_per_sentence=3),
    "hard-wrap": EditRule(lambda text, rng, human, splitter: hard_wrap(text)),
    "homoglyphs": EditRule(lambda text, rng, human, splitter: homoglyphs(text, rng)),
    "zero-width": EditRule(lambda text, rng, human, splitter: zero_width(text, rng)),
}
"""Every edit by name, in the order of the table above: the one list of them."""


def needs_human(name: str) -> int:
    """Human sentences the edit ``name`` needs per sentence of the text (0 for most)."""
    return EDITS[name].human_per_sentence


def apply_edit(
    name: str,
    text: str,
    seed: int | str = 0,
    human: Sequence[str] = (),
    splitter: PunktSplitter | None = None,
) -> str:
    """``text`` after the edit ``name`` (one of ``EDITS``), with a random stream seeded by
    ``seed`` and, for the interleavings, ``human`` sentences (``needs_human`` per sentence).

    Sentence-level edits return the sentences joined by single spaces (paragraph breaks go).
    """
    if name not in EDITS:
        raise ValueError(f"unknown edit {name!r}; known: {', '.join(EDITS)}")
    rng = random.Random(f"{name}|{seed}")
    return EDITS[name].apply(text, rng, human, splitter or get_splitter())
