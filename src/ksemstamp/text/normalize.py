"""Text normalisation: the one form of a text that generation, detection and the web page read.

A watermark read from sentence meaning should not depend on how a text is typed. Four edits
that leave a text looking the same change what the splitter and encoder see:

* **invisible characters** (zero-width spaces and joiners, soft hyphens, bidirectional
  controls, variation selectors, tag characters): they cut words into pieces the encoder reads
  as other words. They are removed. So is what no model can read (``textcheck.readable``: lone
  surrogates, noncharacters).
* **compatibility forms** (ligatures, full-width letters, mathematical letters, exotic spaces,
  the one-character ellipsis): Unicode NFKC maps them to their plain forms.
* **look-alike letters** from other scripts (Cyrillic ``а`` for Latin ``a``, Greek ``Ο`` for
  ``O``): in a word whose letters are all Latin or look-alikes, each look-alike is read as the
  Latin letter it imitates. A word with letters that have no Latin look-alike (a real Russian
  or Greek word) is left alone. A text that needed this was almost certainly altered on
  purpose, so the count is reported.
* **line breaks**: other line separators (CR LF, CR, U+0085, U+2028; U+2029 is a paragraph
  break) become ``\\n``; a single line break inside a paragraph (a hard-wrapped line) is read as
  a space. A blank line, a line that starts a list item (``-``, ``*``, ``+``, ``•``, ``1.``,
  ``1)``) or a heading (``#``), and the line after a heading stay breaks.

``normalize_text`` is idempotent: normalising its output changes nothing. The sentence splitter
applies it before splitting, so generation (which decides where a candidate sentence ends with
the splitter) and detection cut and embed the same sentences.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from .textcheck import readable

LOOK_ALIKES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "і": "i", "ј": "j", "к": "k", "м": "m", "н": "h", "о": "o",
    "п": "n", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "һ": "h", "ԁ": "d",
    "ԛ": "q", "ԝ": "w", "ӏ": "l", "ү": "y",
    "А": "A", "В": "B", "Е": "E", "І": "I", "Ј": "J", "К": "K", "М": "M", "Н": "H", "О": "O",
    "Р": "P", "С": "C", "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "Һ": "H", "Ԁ": "D", "Ԛ": "Q",
    "Ԝ": "W", "Ӏ": "I", "Ү": "Y",
    # Greek
    "α": "a", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    # Armenian, and Latin letters outside ASCII that imitate ASCII ones
    "օ": "o", "ս": "u", "հ": "h", "ց": "g", "ı": "i", "ɑ": "a", "ɡ": "g",
}  # fmt: skip
"""Letters of other scripts (and a few Latin ones outside ASCII) that render like an ASCII
letter, and that letter."""

_INVISIBLE_EXTRA = frozenset(
    "\u034f"  # combining grapheme joiner
    "\u115f\u1160\u3164\uffa0"  # Hangul fillers (render as nothing)
    "\u180e"  # Mongolian vowel separator
)
_LIST_ITEM = re.compile(r"\s*([-*+\u2022\u2023\u25e6]|\d{1,3}[.)])\s")
_CLOSED = re.compile(r"[.!?:;\u2026][\"'\u201d\u2019)\]]*\s*$")
_LINE_BREAKS = re.compile(r"\r\n|[\r\x85\u2028]")
_WORD = re.compile(r"[^\W\d_]+")


@dataclass
class NormalizedText:
    """A normalised text and what it took.

    Attributes:
        text: the normalised text.
        counts: characters changed per kind: ``invisible`` (removed), ``invalid`` (lone
            surrogates and noncharacters, removed), ``compatibility`` (characters NFKC changed), ``look_alike``
            (letters read as the Latin letter they imitate), ``line_breaks`` (single line
            breaks read as spaces). Kinds with nothing to report are left out.
    """

    text: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def tampered(self) -> bool:
        """See ``tampered``."""
        return tampered(self.counts)


_SPACE = re.compile(r"\s+")


def sentence_key(sentence: str) -> str:
    """What makes two sentences of one text the same sentence to the detector: their text with
    case and whitespace ignored. A sentence whose key an earlier sentence of the text has is a
    repeat: it is not scored, so generation does not choose one for its score either."""
    return _SPACE.sub(" ", sentence).strip().lower()


_PIECE_RUN = re.compile(r"([^\W\d_]{2,}?)\1{2,}")
_WORD_RUN = re.compile(r"\b([^\W\d_]+)(?:[\W_]+\1\b){2,}", re.I)
_WORDS = re.compile(r"[^\W_]+")
SHORT_UNIT = 4
"""Units of at most this many words are compared whole with the text's earlier ones
(``repeats_itself``): under it a 3-gram rule sees too little of a unit."""
_BLANK = "*"
OPENING = 3
"""A unit that opens with the same this many words as each of the two units before it repeats
a template (``repeats_itself``); a third unit in a row in about 3,000 of human news."""


def repeats_itself(
    unit: str,
    before: str = "",
    history: Iterable[str] = (),
    said: set[tuple[str, ...]] | None = None,
    earlier: str = "",
) -> bool:
    """Whether a candidate unit reads as degenerate, the way a small LM's text runs away
    (``before``: the unit before it; ``earlier``: the unit before that; ``history``: the
    text's units so far, as ``sentence_key`` gives them):

    - a word piece three or more times in a row ("LabLabLab"), or a word ("E.E.E.", "very,
      very, very"), the run's start in the unit before included ("Brazil, Brazil," then
      "Brazil, Mexico,");
    - a unit of at most two words that only echoes the end of the unit before ("China."
      after "It's all about China.");
    - a unit of three or four words (``SHORT_UNIT``) that differs in at most one word from an
      earlier unit of the text as long ("China 3 News." after "China 2 News.", "Hong Kong on
      Tuesday." after "Hong Kong on Monday.": a list of headlines that goes on);
    - four or more words of which at most half differ ("Frogs, Frogs, Lions, Lions,");
    - a word 3-gram twice in the unit, or at least two 3-grams with a word of five or more
      letters, half of the unit's 3-grams or more, said earlier in the text (a list that goes
      on: "China Pet Thermal Energy," again);
    - one word of five or more letters three times in the unit, or twice in it and once in the
      unit before;
    - a question that opens with the same two words as the unit before it, itself a question
      ("What's the impact? What's the message?");
    - the third unit in a row to open with the same three words (``OPENING``: "He is not King
      John. He is not King George. He is not ...", a template that goes on).

    ``said``: ``said_grams(history)``, when the caller judges many candidates against one
    history. Generation does not keep such a candidate for its score (``marks.direction``);
    detection scores every unit as it is."""
    if _PIECE_RUN.search(unit) or _runs_on(unit, before):
        return True
    words = [w.lower() for w in _WORDS.findall(unit)]
    previous = [w.lower() for w in _WORDS.findall(before)]
    if 0 < len(words) <= 2 and previous[-len(words) :] == words:
        return True
    if len(words) >= 4 and len(set(words)) * 2 <= len(words):
        return True
    grams = list(zip(words, words[1:], words[2:], strict=False))
    if len(set(grams)) < len(grams):
        return True
    if grams:
        said = said_grams(history) if said is None else said
        if _short(words) and not said.isdisjoint(_blanked(words)):
            return True
        again = sum(g in said and max(map(len, g)) >= 5 for g in grams)
        if again >= 2 and again * 2 >= len(grams):
            return True
    for word in set(words):
        mine = words.count(word)
        if len(word) >= 5 and (mine >= 3 or (mine == 2 and word in previous)):
            return True
    opening = words[:OPENING]
    if (
        len(opening) == OPENING
        and previous[:OPENING] == opening == _WORDS.findall(earlier.lower())[:OPENING]
    ):
        return True
    asks = unit.rstrip().endswith("?") and before.rstrip().endswith("?")
    return asks and words[:2] == previous[:2]


def _runs_on(unit: str, before: str) -> bool:
    """Whether ``unit`` holds a run of one word (``_WORD_RUN``) or carries on one that the last
    two words of ``before`` begin ("Brazil, Brazil," then "Brazil, Mexico,")."""
    tail = " ".join(before.split()[-2:])
    joined = f"{tail} {unit}" if tail else unit
    return any(m.end() > len(joined) - len(unit) for m in _WORD_RUN.finditer(joined))


def said_grams(history: Iterable[str]) -> set[tuple[str, ...]]:
    """What ``repeats_itself`` compares a unit with (its ``said``): the word 3-grams of the
    units ``history``, and of each of them of three or four words (``SHORT_UNIT``), every
    copy with one word blanked."""
    said: set[tuple[str, ...]] = set()
    for earlier in history:
        words = _WORDS.findall(earlier.lower())
        said.update(_grams(words))
        if _short(words):
            said.update(_blanked(words))
    return said


def _short(words: list[str]) -> bool:
    """Whether a unit of ``words`` is compared whole (``SHORT_UNIT``)."""
    return 3 <= len(words) <= SHORT_UNIT


def _blanked(words: list[str]) -> set[tuple[str, ...]]:
    """``words`` once per position with that word blanked: two units share one exactly when
    they are as long and differ in at most one word."""
    return {tuple(words[:i]) + (_BLANK,) + tuple(words[i + 1 :]) for i in range(len(words))}


def _grams(words: list[str]) -> set[tuple[str, ...]]:
    return set(zip(words, words[1:], words[2:], strict=False))


def tampered(counts: dict[str, int]) -> bool:
    """Whether normalisation ``counts`` show characters that make a text look the same but read
    differently (invisible characters or look-alike letters): a sign it was altered on purpose."""
    return bool(counts.get("invisible") or counts.get("look_alike"))


def _invisible(char: str) -> bool:
    if char in _INVISIBLE_EXTRA:
        return True
    code = ord(char)
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:  # variation selectors
        return True
    return unicodedata.category(char) == "Cf"


def _fold_word(word: str) -> tuple[str, int]:
    """``word`` with its look-alike letters read as ASCII ones when every letter of it outside
    ASCII is a look-alike (else unchanged), and how many were."""
    foreign = [c for c in word if not c.isascii()]
    if not foreign or not all(c in LOOK_ALIKES for c in foreign):
        return word, 0
    return "".join(LOOK_ALIKES.get(c, c) for c in word), len(foreign)


def fold_look_alikes(text: str) -> tuple[str, int]:
    """``text`` with look-alike letters of other scripts read as Latin (see the module
    docstring), and how many were."""
    if text.isascii():
        return text, 0
    count = 0

    def fold(match: re.Match) -> str:
        nonlocal count
        word, n = _fold_word(match.group())
        count += n
        return word

    return _WORD.sub(fold, text), count


def join_lines(text: str) -> tuple[str, int]:
    """``text`` (with ``\\n`` line breaks) with every single line break inside a paragraph read
    as a space, and how many were. Blank lines, list items and headings stay breaks."""
    if "\n" not in text:
        return text, 0
    lines = text.split("\n")
    out = [lines[0]]
    joined = 0
    before = lines[0]  # the line as it reads so far, joined lines included (so a second pass
    # decides as the first did: idempotence)
    for line in lines[1:]:
        if (
            not before.strip()
            or not line.strip()
            or line.lstrip().startswith("#")
            or before.lstrip().startswith("#")
            or (_LIST_ITEM.match(line) and (_CLOSED.search(before) or _LIST_ITEM.match(before)))
        ):
            out.append("\n" + line)
            before = line
        else:
            out[-1] = out[-1].rstrip()
            out.append(" " + line.lstrip())
            before = before.rstrip() + " " + line.lstrip()
            joined += 1
    return "".join(out), joined


def normalize_text(text: str, lines: bool = True) -> NormalizedText:
    """The normalised form of ``text`` (see the module docstring) and what it took;
    ``lines=False`` leaves line breaks as they are (apart from unifying separators)."""
    counts: dict[str, int] = {}

    def note(kind: str, n: int) -> None:
        if n:
            counts[kind] = counts.get(kind, 0) + n

    if not text.isascii():
        text, n = readable(text)
        note("invalid", n)
        kept = [char for char in text if not _invisible(char)]
        note("invisible", len(text) - len(kept))
        text = "".join(kept)
        text = text.replace("\u2029", "\n\n")
        nfkc = unicodedata.normalize("NFKC", text)
        if nfkc != text:
            note("compatibility", sum(unicodedata.normalize("NFKC", c) != c for c in text))
            text = nfkc
        text, n = fold_look_alikes(text)
        note("look_alike", n)
    if "\r" in text or not text.isascii():
        text = _LINE_BREAKS.sub("\n", text)
    if lines:
        text, n = join_lines(text)
        note("line_breaks", n)
    return NormalizedText(text, counts)
