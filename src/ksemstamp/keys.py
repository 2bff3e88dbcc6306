"""The valid-region table ``G``: for each previous region, the ``gamma * K`` regions that are valid.

Default: keyed. Row ``q`` ranks the ``K`` regions by ``HMAC-SHA256(key, "q|j")`` and keeps the
first ``gamma * K``; without the key the table cannot be rebuilt, and the result is the same on
every platform and device (no framework RNG involved).

Keyed directions (the ``direction`` mark): for each context region ``c``, a vector
``n_c`` of ``D`` independent standard normal components, expanded from ``HMAC-SHA256(key, c)``
with SHAKE-256 and mapped to normals by the Box-Muller transform in float64 (numpy), so every
platform rebuilds the same directions and nothing depends on a framework's random generator.

Strength: every output record carries the key's fingerprint, a hash of the key, so a key that
can be guessed can be recovered from any record by trying guesses against it. ``check_key``
refuses keys that take fewer than ``2**MIN_KEY_BITS`` guesses by zxcvbn's estimate (the
guesser's model of words, names, keyboard patterns, repeats, sequences and dates) unless weak
keys are allowed (``allow_weak_key`` setting, or ``KSEMSTAMP_ALLOW_WEAK_KEY=1``); ``new_key``
makes a strong one.

Compatibility: ``mode="paper"`` is the reference code's table: row ``q`` keeps the first
``gamma * K`` of ``torch.randperm(K)`` drawn on the GPU by a CUDA generator seeded with
``q * 15485863``, recomputed on the CPU (``cudarand.cuda_randperm``), so the same table comes out
on every machine. It is public: anyone holding the partition can rebuild it and forge or strip
the mark.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import string
import warnings

import numpy as np
import torch
from torch import Tensor

from .cudarand import cuda_randperm

PAPER_PRIME = 15485863
KEY_ENV = "KSEMSTAMP_KEY"
# Public and therefore forgeable: only for demos and tests. Real use sets KSEMSTAMP_KEY.
DEMO_KEY = "ksemstamp-public-demo-key"
WEAK_KEY_ENV = "KSEMSTAMP_ALLOW_WEAK_KEY"
MIN_KEY_BITS = 128
"""Least estimated strength of a key (``key_entropy_bits``) accepted without allowing weak keys."""
ESTIMATOR_CHARS = 72
"""Longest string zxcvbn estimates at once (its own bound: its search grows fast with length)."""
ESTIMATOR_WINDOWS = 16
"""Most windows of a longer key that are estimated (``key_entropy_bits``)."""


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
    starts = range(0, max(len(key) - ESTIMATOR_CHARS, 0) + 1, ESTIMATOR_CHARS)
    windows = [key[i : i + ESTIMATOR_CHARS] for i in starts][:ESTIMATOR_WINDOWS]
    if len(key) > ESTIMATOR_CHARS:
        windows.append(key[-ESTIMATOR_CHARS:])
    guesses_log10 = max(zxcvbn(w, max_length=ESTIMATOR_CHARS)["guesses_log10"] for w in windows)
    return min(guesses_log10 * math.log2(10), _alphabet_bits(key))


def _alphabet_bits(key: str) -> float:
    """``len(key) * log2(alphabet)``: the bits of brute force over the key's alphabet."""
    if all(c in string.digits for c in key):
        alphabet = 10
    elif all(c in string.hexdigits for c in key) and (key.islower() or key.isupper()):
        alphabet = 16
    else:
        classes = (
            (string.ascii_lowercase, 26),
            (string.ascii_uppercase, 26),
            (string.digits, 10),
            (string.punctuation + " ", 33),
        )
        alphabet = sum(size for chars, size in classes if any(c in chars for c in key))
        alphabet += 256 * any(not c.isascii() for c in key)
    return len(key) * math.log2(alphabet)


def weak_keys_allowed(setting: bool = False) -> bool:
    """Whether weak keys are allowed: by the setting, or by ``KSEMSTAMP_ALLOW_WEAK_KEY``."""
    return setting or os.environ.get(WEAK_KEY_ENV, "").strip().lower() in ("1", "true", "yes")


def check_key(key: str, allow_weak: bool = False) -> None:
    """Raise ``ValueError`` (never quoting the key) when ``key`` is estimated to take fewer
    than ``2**MIN_KEY_BITS`` guesses (``key_entropy_bits``) and weak keys are not allowed
    (``weak_keys_allowed``). The public demo key is always allowed: it is public anyway, and
    says so when used."""
    if key == DEMO_KEY or weak_keys_allowed(allow_weak):
        return
    bits = key_entropy_bits(key)
    if bits >= MIN_KEY_BITS:
        return
    raise ValueError(
        f"the watermark key is too weak: about {bits:.0f} bits by zxcvbn's estimate of the "
        f"guesses it takes to find it, under the {MIN_KEY_BITS} required. Every output record "
        "carries the key's fingerprint, from which a guessable key can be recovered. Make a "
        "strong key with `ksemstamp keygen`; to use this one anyway (a test key), "
        f"set allow_weak_key: true (--allow_weak_key) or {WEAK_KEY_ENV}=1"
    )


def num_valid(num_regions: int, gamma: float) -> int:
    """``gamma * K`` as an integer; raises unless it is a whole number in ``[1, K)``."""
    count = gamma * num_regions
    if abs(count - round(count)) > 1e-9 or not 1 <= round(count) < num_regions:
        raise ValueError(
            f"gamma * K must be a whole number in [1, K): gamma={gamma}, K={num_regions} gives "
            f"{count:g}; pick gamma as a multiple of 1/K (e.g. {1 / num_regions:g})"
        )
    return int(round(count))


def resolve_key(key: str | None) -> str:
    """The key to use: ``key`` if given, else ``$KSEMSTAMP_KEY``, else the public demo key."""
    if key:
        return key
    env = os.environ.get(KEY_ENV)
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


def start_region(num_regions: int, key: str | None, mode: str = "keyed") -> int:
    """The keyed start value: the region that stands before the first sentence of a text that
    continues no sentence (an empty prompt, a chat answer), so that sentence is drawn under the
    key like every other. ``keyed``: from an HMAC of the key, under a label no table entry uses;
    ``paper``: a public value, as the paper's table is public."""
    if mode == "keyed":
        if not key:
            raise ValueError("keyed start value needs a key")
        digest = hmac.new(key.encode(), f"start|{num_regions}".encode(), "sha256").digest()
    else:
        digest = hashlib.sha256(f"ksemstamp-paper-start|{num_regions}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % num_regions


def valid_table(num_regions: int, gamma: float, key: str | None, mode: str = "keyed") -> Tensor:
    """``(K, K)`` bool table: ``table[q, j]`` is True when region ``j`` is valid after region ``q``.

    Every row has exactly ``gamma * K`` True entries.
    """
    n_valid = num_valid(num_regions, gamma)
    table = torch.zeros(num_regions, num_regions, dtype=torch.bool)
    for q in range(num_regions):
        if mode == "keyed":
            if not key:
                raise ValueError("keyed valid table needs a key")
            scores = [
                hmac.new(key.encode(), f"valid|{num_regions}|{q}|{j}".encode(), "sha256").digest()
                for j in range(num_regions)
            ]
            chosen = sorted(range(num_regions), key=lambda j: scores[j])[:n_valid]
            table[q, chosen] = True
        elif mode == "paper":
            table[q, cuda_randperm(num_regions, q * PAPER_PRIME)[:n_valid]] = True
        else:
            raise ValueError(f"valid-table mode must be 'keyed' or 'paper', not {mode!r}")
    return table


def keyed_directions(num_contexts: int, dim: int, key: str) -> Tensor:
    """``(num_contexts, dim)`` float32 directions with i.i.d. standard normal components.

    Row ``c`` depends only on the key, ``c`` and the shape, and is the same on every platform.
    Over uniformly random keys the rows are independent Gaussian vectors: the ``direction``
    detector's exact null law rests on this (see ``stats.direction_z``).
    """
    if not key:
        raise ValueError("keyed directions need a key")
    if num_contexts < 1 or dim < 1:
        raise ValueError(f"need num_contexts >= 1 and dim >= 1, got {num_contexts}, {dim}")
    half = (dim + 1) // 2
    rows = []
    for c in range(num_contexts):
        seed = hmac.new(key.encode(), f"direction|{num_contexts}|{dim}|{c}".encode(), "sha256")
        words = np.frombuffer(hashlib.shake_256(seed.digest()).digest(16 * half), dtype="<u8")
        # 53-bit uniforms in (0, 1]: the logarithm below never sees zero.
        u = ((words >> np.uint64(11)).astype(np.float64) + 1.0) / 2.0**53
        radius = np.sqrt(-2.0 * np.log(u[:half]))
        angle = 2.0 * np.pi * u[half:]
        rows.append(np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:dim])
    return torch.from_numpy(np.stack(rows)).float()
