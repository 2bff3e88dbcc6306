"""The watermark key: where it comes from, how strong it is, and its public fingerprint.

The key material the marks draw from it (valid tables, directions, the start value) is
``scheme.keyed``'s.

Strength: every output record carries the key's fingerprint, a hash of the key, so a key that
can be guessed can be recovered from any record by trying guesses against it. ``check_key``
refuses keys worth fewer than ``MIN_KEY_BITS`` bits (``key_strength``) unless weak keys are
allowed (``allow_weak_key`` setting, or ``KSEMSTAMP_ALLOW_WEAK_KEY=1``). A key that the standard
tools make (``openssl rand -hex 16``, ``openssl rand -base64 24``, ``secrets.token_urlsafe(16)``)
is random bytes written as hex or base64, and counts 8 bits a byte; any other key counts what
zxcvbn estimates (the guesser's model of words, names, keyboard patterns, repeats, sequences and
dates). ``new_key`` makes a strong one.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import secrets
import string
import warnings
from typing import NamedTuple

KEY_ENV = "KSEMSTAMP_KEY"
# Public and therefore forgeable: only for demos and tests. Real use sets KSEMSTAMP_KEY.
DEMO_KEY = "ksemstamp-public-demo-key"
WEAK_KEY_ENV = "KSEMSTAMP_ALLOW_WEAK_KEY"
MIN_KEY_BITS = 128
"""Least strength of a key (``key_strength``) accepted without allowing weak keys."""
MIN_KEY_BYTES = 16
"""Least bytes a hex or base64 key must encode to be counted by its length (``key_strength``)."""
RANDOM_SHARE = {"hex": 0.8, "base64": 0.85}
"""A hex or base64 key reads as random when zxcvbn's estimate of it is at least this share of
brute force over as many characters (zxcvbn's own 10 guesses a character): a word, name, date,
keyboard walk, repeat or sequence that covers part of the key lowers the estimate below that.
Random keys stay above it: the lowest of 20,000 random 32-digit hex keys read 0.84, of 20,000
22-character ``secrets.token_urlsafe(16)`` keys 0.88 (decimal digits in hex read as dates and
numbers, hence the lower share)."""
ESTIMATOR_CHARS = 72
"""Longest string zxcvbn estimates at once (its own bound: its search grows fast with length)."""
ESTIMATOR_WINDOWS = 16
"""Most windows of a longer key that are estimated (``key_entropy_bits``)."""
WORD_SHARE = 0.75
"""A key reads as words when words of three or more letters, each lower case, capitalised or
upper case, make up at least this share of its characters (separators aside): it is then
judged as words whatever alphabet it also fits (``phrase_bits``). Random keys stay well below
it: of 20,000 random keys in hex, base64 and URL-safe base64, words covered at most 0.57."""
PHRASE_CHARS = 144
"""Characters of a key (separators aside) that ``phrase_bits`` reads."""
BITS_PER_LETTER = 2.0
"""Most bits a letter of a key that reads as words is counted: English text carries about 1 to
1.5 bits a letter (Shannon's estimates), words drawn at random from a list about 2.4, so a
sentence is counted generously and a passphrase of random words needs a few more words."""


def new_key() -> str:
    """A new random key: 256 bits from the operating system's generator, as 64 hex digits."""
    return secrets.token_hex(32)


def key_entropy_bits(key: str) -> float:
    """An estimate of the bits of guessing it takes to find ``key``: ``log2`` of the guesses
    zxcvbn expects an attacker to need, who tries words, names, keyboard patterns, repeats,
    sequences, dates and the common substitutions first, then brute force.

    zxcvbn reads at most ``ESTIMATOR_CHARS`` characters at once; a longer key counts as its
    strongest window of that length (finding the key means finding every part of it), so that
    a long key made of one repeated pattern stays weak. The estimate never exceeds the length
    times ``log2`` of the alphabet the key draws from (16 for hex digits, 10 for decimal ones,
    else the classes it uses), which brute force over that alphabet reaches. ``new_key``
    gives a key whose bits are real."""
    from zxcvbn import zxcvbn

    if not key:
        return 0.0
    windows = _windows(key)
    guesses_log10 = max(zxcvbn(w, max_length=ESTIMATOR_CHARS)["guesses_log10"] for w in windows)
    return min(guesses_log10 * math.log2(10), _alphabet_bits(key))


class KeyStrength(NamedTuple):
    """How many bits a key is worth, and on what grounds (``key_strength``)."""

    bits: float
    basis: str
    """``"hex"`` or ``"base64"``: random bytes in that encoding, 8 bits a byte; ``"words"``: a
    key that reads as words, counted as words (``phrase_bits``); ``"zxcvbn"``: zxcvbn's
    estimate of the guesses it takes (``key_entropy_bits``)."""

    def describe(self) -> str:
        """The strength in words, for a message (never the key)."""
        if self.basis == "zxcvbn":
            return f"about {self.bits:.0f} bits by zxcvbn's estimate of the guesses it takes"
        if self.basis == "words":
            return (
                f"it reads as words: about {self.bits:.0f} bits counted as words of zxcvbn's "
                "dictionaries"
            )
        return f"{self.bits / 8:.0f} random bytes in {self.basis} ({self.bits:.0f} bits)"


def key_strength(key: str) -> KeyStrength:
    """The bits of guessing it takes to find ``key``.

    A key written as hex or base64 (standard or URL-safe, with or without padding; whitespace
    ignored) whose bytes look random counts by its length, 8 bits a byte: what ``openssl rand``,
    ``secrets.token_hex`` and ``secrets.token_urlsafe`` write. The bytes look random when they
    are at least ``MIN_KEY_BYTES`` (shorter ones count by their length all the same, and fall
    short), at least half of them distinct (at most 128 needed), no run of 4 bytes occurs twice,
    no 5 consecutive bytes step evenly (``01 23 45 67 89``), the hex digits mix letters and
    digits and the base64 mixes upper and lower case, and zxcvbn finds no pattern in the text
    (``RANDOM_SHARE``). zxcvbn under-counts random strings (a random 128-bit hex key reads
    about 100 bits): that is why such a key is counted by its length. Any other key counts
    zxcvbn's estimate (``key_entropy_bits``).

    A key that reads as words (``WORD_SHARE``) is judged as words first, whichever alphabet it
    also fits: ``TheQuickBrownFox...`` is not random base64 however long, and zxcvbn, which
    charges for every unmatched piece and the number of pieces, over-counts a sentence; such a
    key counts the smaller of zxcvbn's estimate and ``phrase_bits``. No check can tell the hash
    of a guessable phrase (the MD5 hex or base64 SHA-256 of ``password``) from random bytes:
    such a key is as guessable as the phrase."""
    phrase = phrase_bits(key)
    if phrase is not None:
        return KeyStrength(min(phrase, key_entropy_bits(key)), "words")
    decoded = decode_key(key)
    if decoded is not None:
        data, encoding = decoded
        text = "".join(key.split())
        if len(data) < MIN_KEY_BYTES and _random_text(text, encoding):
            return KeyStrength(8.0 * len(data), encoding)
        if _random_bytes(data) and _random_text(text, encoding):
            return KeyStrength(8.0 * len(data), encoding)
    return KeyStrength(key_entropy_bits(key), "zxcvbn")


_SEPARATORS = re.compile(r"[\s\-_.,;:!?'\"/+]+")


def phrase_bits(key: str) -> float | None:
    """The bits of ``key`` read as words, or ``None`` when it does not read as words.

    Separators (spaces, ``-``, ``_``, punctuation) are set aside; the rest is covered by the
    cheapest sequence of words of zxcvbn's ranked dictionaries (each costs ``log2`` of zxcvbn's
    guesses of it: its frequency rank, times its capitalisation and look-alike variants) and
    single characters (``log2`` of the key's alphabet each). When words cover ``WORD_SHARE``
    of it, the key is worth the cheaper of that cover and ``BITS_PER_LETTER`` a letter (plus
    its other characters at the alphabet's bits), and ``log2(33)`` for each kind of separator
    used. A longer key is judged on its first ``PHRASE_CHARS`` characters."""
    from zxcvbn import matching, scoring

    separators = set(_SEPARATORS.findall(key))
    text = _SEPARATORS.sub("", key)[:PHRASE_CHARS]
    if len(text) < 6:
        return None
    per_char = math.log2(_alphabet_size(text))
    ending: dict[int, list[dict]] = {}
    for m in matching.omnimatch(text):
        token = m["token"]
        cased = token.islower() or token.isupper() or token.istitle()
        if m["pattern"] == "dictionary" and len(token) >= 3 and cased:
            ending.setdefault(m["j"], []).append(m)
    n = len(text)
    best: list[tuple[float, int]] = [(0.0, 0)]  # (bits, characters in words) of text[:i]
    for j in range(n):
        bits, covered = best[j][0] + per_char, best[j][1]
        for m in ending.get(j, ()):
            word = best[m["i"]][0] + math.log2(max(float(scoring.estimate_guesses(m, text)), 1))
            if word < bits:
                bits, covered = word, best[m["i"]][1] + len(m["token"])
        best.append((bits, covered))
    if best[n][1] < WORD_SHARE * n:
        return None
    letters = sum(c.isalpha() for c in text)
    by_letter = BITS_PER_LETTER * letters + per_char * (len(text) - letters)
    return min(best[n][0], by_letter) + len(separators) * math.log2(33)


def decode_key(key: str) -> tuple[bytes, str] | None:
    """The bytes ``key`` writes as hex (an even number of hex digits) or base64 (standard or
    URL-safe alphabet, padding optional), and which encoding; ``None`` when it is neither.
    Whitespace (the line breaks ``openssl rand -base64`` puts in long output) is ignored."""
    text = "".join(key.split())
    if not text:
        return None
    if len(text) % 2 == 0 and re.fullmatch(r"[0-9a-fA-F]+", text):
        return bytes.fromhex(text), "hex"
    core = text.rstrip("=")
    if len(text) - len(core) > 2 or len(core) % 4 == 1:
        return None
    for alphabet, altchars in ((r"[A-Za-z0-9+/]+", None), (r"[A-Za-z0-9_-]+", b"-_")):
        if re.fullmatch(alphabet, core):
            padded = core + "=" * (-len(core) % 4)
            return base64.b64decode(padded, altchars=altchars, validate=True), "base64"
    return None


def _random_bytes(data: bytes) -> bool:
    """Whether ``data`` passes ``key_strength``'s checks of random bytes: enough of them, and
    no byte pattern a person types or a counter makes. Random bytes fail them rarely: a repeated
    run of 4 or 4 even steps turns up by chance about once in a million 16-byte keys and a few
    times in a million 64-byte ones (a refused random key: make another)."""
    n = len(data)
    if n < MIN_KEY_BYTES or len(set(data)) < min(n // 2, 128):
        return False
    runs = [data[i : i + 4] for i in range(n - 3)]
    if len(set(runs)) < len(runs):
        return False
    steps = [(b - a) % 256 for a, b in zip(data, data[1:], strict=False)]
    return not any(len(set(steps[i : i + 4])) == 1 for i in range(len(steps) - 3))


def _random_text(text: str, encoding: str) -> bool:
    """Whether the hex or base64 ``text`` reads as random: it mixes the character classes random
    text of its alphabet holds, and zxcvbn explains no real part of it (``RANDOM_SHARE``)."""
    from zxcvbn import zxcvbn

    if encoding == "hex":
        mixed = any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    else:
        mixed = any(c.isupper() for c in text) and any(c.islower() for c in text)
    if not mixed:
        return False
    for window in _windows(text):
        guesses_log10 = zxcvbn(window, max_length=ESTIMATOR_CHARS)["guesses_log10"]
        if guesses_log10 < RANDOM_SHARE[encoding] * len(window):
            return False
    return True


def _windows(key: str) -> list[str]:
    """The parts of ``key`` zxcvbn reads, ``ESTIMATOR_CHARS`` long (at most
    ``ESTIMATOR_WINDOWS`` and the last part)."""
    starts = range(0, max(len(key) - ESTIMATOR_CHARS, 0) + 1, ESTIMATOR_CHARS)
    windows = [key[i : i + ESTIMATOR_CHARS] for i in starts][:ESTIMATOR_WINDOWS]
    if len(key) > ESTIMATOR_CHARS:
        windows.append(key[-ESTIMATOR_CHARS:])
    return windows


def _alphabet_bits(key: str) -> float:
    """``len(key) * log2(alphabet)``: the bits of brute force over the key's alphabet."""
    return len(key) * math.log2(_alphabet_size(key))


def _alphabet_size(key: str) -> int:
    """The alphabet ``key`` draws from: 16 for hex digits of one case, 10 for decimal digits,
    else the sizes of the classes it uses."""
    if all(c in string.digits for c in key):
        return 10
    if all(c in string.hexdigits for c in key) and (key.islower() or key.isupper()):
        return 16
    classes = (
        (string.ascii_lowercase, 26),
        (string.ascii_uppercase, 26),
        (string.digits, 10),
        (string.punctuation + " ", 33),
    )
    alphabet = sum(size for chars, size in classes if any(c in chars for c in key))
    return alphabet + 256 * any(not c.isascii() for c in key)


def weak_keys_allowed(setting: bool = False) -> bool:
    """Whether weak keys are allowed: by the setting, or by ``KSEMSTAMP_ALLOW_WEAK_KEY``."""
    return setting or os.environ.get(WEAK_KEY_ENV, "").strip().lower() in ("1", "true", "yes")


def check_key(key: str, allow_weak: bool = False) -> None:
    """Raise ``ValueError`` (never quoting the key) when ``key`` is worth fewer than
    ``MIN_KEY_BITS`` bits (``key_strength``) and weak keys are not allowed
    (``weak_keys_allowed``). The public demo key is always allowed: it is public anyway, and
    says so when used."""
    if key == DEMO_KEY or weak_keys_allowed(allow_weak):
        return
    strength = key_strength(key)
    if strength.bits >= MIN_KEY_BITS:
        return
    raise ValueError(
        f"the watermark key is too weak: {strength.describe()}, under the {MIN_KEY_BITS} bits "
        "required. Every output record "
        "carries the key's fingerprint, from which a guessable key can be recovered. Make a "
        "strong key with `ksemstamp keygen`; to use this one anyway (a test key), "
        f"set allow_weak_key: true (--allow_weak_key) or {WEAK_KEY_ENV}=1"
    )


def resolve_key(key: str | None) -> str:
    """The key to use: ``key`` if given, else ``$KSEMSTAMP_KEY``, else the public demo key.

    An empty key, given or in ``$KSEMSTAMP_KEY``, raises ``ValueError``: it is a mistake, most
    often ``export KSEMSTAMP_KEY="$(ksemstamp keygen)"`` where ``ksemstamp`` is not on the
    ``PATH``, and falling back to the public demo key would hide it."""
    if key is not None and not key.strip():
        raise ValueError(
            "the watermark key is empty; give a key (make one with `ksemstamp keygen`), or "
            f"leave it out to use {KEY_ENV}"
        )
    if key:
        return key
    env = os.environ.get(KEY_ENV)
    if env is not None and not env.strip():
        raise ValueError(
            f"{KEY_ENV} is set but empty: was the key made by a command that failed (`export "
            f'{KEY_ENV}="$(ksemstamp keygen)"` where `ksemstamp` is not on the PATH: run '
            "`source .venv/bin/activate` first, or use `.venv/bin/ksemstamp keygen`)? Set it to "
            f"a key, or unset it (`unset {KEY_ENV}`) to use the public demo key"
        )
    if env:
        return env
    warnings.warn(
        f"no watermark key given: using the public demo key, so anyone can forge or strip this "
        f"mark. Set {KEY_ENV} or `key:` in the config for real use.",
        stacklevel=2,
    )
    return DEMO_KEY


def key_fingerprint(key: str) -> str:
    """A short public identifier of a key, stored beside outputs to catch key mix-ups.

    It reveals nothing useful about a long random key; a guessable key is guessable anyway.
    """
    return hashlib.sha256(b"ksemstamp-key-fingerprint|" + key.encode()).hexdigest()[:12]
