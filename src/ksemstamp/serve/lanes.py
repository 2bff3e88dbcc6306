"""Keeping the page responsive while large texts are scored: two lanes and a fair encoder.

A detection of a few paragraphs must not wait behind texts of 200,000 characters. So:

* **Two lanes.** A detection of at most ``SMALL_CHARS`` characters (text and prompt) runs on a
  pool of its own; larger ones and batch uploads run on the heavy pool, and at most
  ``MAX_HEAVY`` of them may be running or waiting at once: one more is answered 503 with a
  ``Retry-After``, at once, instead of waiting minutes for a thread.
* **A fair encoder.** The encoder takes one pass at a time (its tokenizer is not thread-safe).
  A pass of more than ``PASS_SENTENCES`` sentences is cut into passes of that many, and a small
  pass waiting for the encoder goes before the next piece of a large one, so a small request
  waits for at most one piece, not a whole text (docs/web.md has the latency measured).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from fastapi import HTTPException

SMALL_CHARS = 20_000
"""A detection of at most this many characters (text and prompt) runs in the small lane."""
MAX_HEAVY = 4
"""Large detections and batch uploads running or waiting at once; one more gets 503."""
PASS_SENTENCES = 256
"""Sentences of one piece of a large encoder pass; a pass of at most this many is small."""
RETRY_AFTER = 30
"""Seconds a refused client is asked to wait (``Retry-After``)."""


class EncoderGate:
    """One encoder pass at a time, small passes first (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._small_waiting = 0

    @contextmanager
    def hold(self, small: bool) -> Iterator[None]:
        """The encoder, once no other pass holds it (and, for a large piece, once no small
        pass waits for it)."""
        with self._cond:
            self._small_waiting += small
            while self._busy or (not small and self._small_waiting):
                self._cond.wait()
            self._small_waiting -= small
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def fair_embed(
    embed: Callable[..., torch.Tensor], gate: EncoderGate
) -> Callable[..., torch.Tensor]:
    """``embed(sentences, progress=False)`` through ``gate``: a pass of more than
    ``PASS_SENTENCES`` sentences in pieces of that many, each holding the encoder alone."""

    def fair(sentences: Any, progress: bool = False) -> torch.Tensor:
        sentences = list(sentences)
        if len(sentences) <= PASS_SENTENCES:
            with gate.hold(small=True):
                return embed(sentences, progress=progress)
        pieces = []
        for start in range(0, len(sentences), PASS_SENTENCES):
            with gate.hold(small=False):
                pieces.append(embed(sentences[start : start + PASS_SENTENCES], progress=False))
        return torch.cat(pieces)

    return fair


class Lanes:
    """The small and heavy pools, and the heavy lane's admission (module docstring)."""

    def __init__(self, workers: int = 2, max_heavy: int = MAX_HEAVY) -> None:
        self.small = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ksemstamp-small")
        self.heavy = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ksemstamp-heavy")
        self.max_heavy = max_heavy
        self.heavy_in = 0
        self._lock = threading.Lock()

    async def run(self, heavy: bool, function: Callable, *args: Any) -> Any:
        """``function(*args)`` in its lane; a heavy one beyond ``max_heavy`` gets 503."""
        loop = asyncio.get_running_loop()
        if not heavy:
            return await loop.run_in_executor(self.small, partial(function, *args))
        with self._lock:
            if self.heavy_in >= self.max_heavy:
                raise HTTPException(
                    503,
                    f"busy: {self.heavy_in} large detections or uploads are running or waiting "
                    f"(at most {self.max_heavy}); try again in a minute. Texts of up to "
                    f"{SMALL_CHARS:,} characters are still scored at once",
                    headers={"Retry-After": str(RETRY_AFTER)},
                )
            self.heavy_in += 1
        try:
            return await loop.run_in_executor(self.heavy, partial(function, *args))
        finally:
            with self._lock:
                self.heavy_in -= 1

    def shutdown(self) -> None:
        self.small.shutdown(wait=False, cancel_futures=True)
        self.heavy.shutdown(wait=False, cancel_futures=True)
