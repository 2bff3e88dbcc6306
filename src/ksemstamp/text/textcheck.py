"""Checks that an input is text the watermark can be read from, before any model sees it.

``readable`` cleans a string of code points no model can read (lone surrogates, which have
no UTF-8 form and make a tokenizer raise, and Unicode noncharacters); ``printable`` shows a
string on a terminal without letting its control characters act. Two cheap tests, pure
functions of the string, refuse what cleaning cannot mend:

* ``not_text``: a file of random or binary bytes, read as UTF-8 with replacement, is mostly
  control characters and U+FFFD; split into "sentences" and scored, it gives a number that means
  nothing (1,679 "sentences" and a paper z of 21.4 for 100 kB of random bytes). Such input is
  refused with an error.
* ``unsupported_script``: the sentence splitter (English Punkt) and the default encoder read
  Latin-script text. Chinese has no sentence end the splitter knows, so a Chinese text is one
  "sentence" and reported as too short, which misleads; emoji-only text has nothing an encoder
  can place. Such text gets its own status, ``unsupported``, and a message naming the script.

Both thresholds are shares of characters, so the verdict does not depend on a text's length.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

NOT_TEXT_SHARE = 0.25
"""Share of control, unassigned or undecodable characters above which input is not text. Text
read with a wrong encoding has one U+FFFD per accented letter or curly quote, rarely one in ten
characters; random bytes read as UTF-8 have over half, executables about two thirds."""
LATIN_SHARE = 0.5
"""Share of a text's letters that must be Latin-script for the splitter and encoder to read it."""
_WHITESPACE_CONTROLS = frozenset("\t\n\r\f\v")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_UNREADABLE = re.compile(
    "[\ud800-\udfff\ufdd0-\ufdef"
    + "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(17))
    + "]"
)
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def readable(text: str) -> tuple[str, int]:
    """``text`` without the code points no model can read, and how many were removed.

    A surrogate pair held as two code points (as some decoders leave it) is joined into the
    character it stands for. What is removed: lone surrogates (U+D800 to U+DFFF, which JSON's
    ``"\\ud800"`` can produce and which have no UTF-8 form, so tokenizers raise on them) and the
    66 Unicode noncharacters (U+FDD0 to U+FDEF, and the last two code points of every plane, such
    as U+FFFE), which are never text. Everything else, controls and unassigned code points
    included, is kept: ``not_text`` judges those. Pure and cheap: an ASCII string is returned as
    it is."""
    if text.isascii():
        return text, 0
    text = _SURROGATE_PAIR.sub(
        lambda m: m[0].encode("utf-16-le", "surrogatepass").decode("utf-16-le"), text
    )
    return _UNREADABLE.subn("", text)


def printable(text: str) -> str:
    """``text`` as it may be written to a terminal: control characters other than line breaks
    and tabs (escape sequences, carriage returns, backspaces, C1 controls) are shown as
    ``\\x1b``-style escapes instead of acting on the terminal."""
    return _TERMINAL_CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def _bad(char: str) -> bool:
    if char == "\ufffd":
        return True
    if char in _WHITESPACE_CONTROLS:
        return False
    # Cc control, Cs lone surrogate, Cn unassigned (U+FFFE and friends)
    return unicodedata.category(char) in ("Cc", "Cs", "Cn")


def not_text(text: str, name: str = "text") -> str | None:
    """Why ``text`` is not text (mostly control or undecodable characters), or ``None``;
    ``name`` says what it is in the message ("the prompt ...")."""
    if not text:
        return None
    bad = sum(_bad(c) for c in text)
    share = bad / len(text)
    if share <= NOT_TEXT_SHARE:
        return None
    return (
        f"the {name} is binary, not text: {share:.0%} of its characters are control characters "
        "or bytes that are not UTF-8; give it as UTF-8 text"
    )


def _script(char: str) -> str:
    """The script of a letter, as the first word of its Unicode name (LATIN, CJK, CYRILLIC...)."""
    if char.isascii():
        return "LATIN"
    name = unicodedata.name(char, "")
    return name.split(" ", 1)[0] if name else "UNKNOWN"


def unsupported_script(text: str) -> str | None:
    """Why the splitter and encoder cannot read ``text`` (no letters, or mostly letters of a
    script other than Latin), or ``None``. Blank text is left to the too-short rule."""
    if not text or text.isspace():
        return None
    scripts = Counter(_script(c) for c in text if c.isalpha())
    letters = sum(scripts.values())
    if letters == 0:
        return (
            "unsupported text: it has no letters (only digits, symbols or emoji), so no sentence "
            "can be placed in a region"
        )
    if scripts["LATIN"] / letters >= LATIN_SHARE:
        return None
    main = max((s for s in scripts if s != "LATIN"), key=lambda s: scripts[s])
    shown = main if len(main) <= 3 else main.title()  # CJK, Cyrillic, Arabic
    return (
        f"unsupported script: {scripts[main] / letters:.0%} of its letters are {shown}; "
        "the sentence splitter and the encoder read Latin-script (English) text, so its "
        "sentences cannot be found and scored"
    )
