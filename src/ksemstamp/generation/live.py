"""Rows kept running in the backend across pruning checks: rounds over a ``LiveStreamer``.

A ``stream.StreamEngine`` over a plain ``TokenStreamer`` sends every chunk of a row as a new
request, so the backend reads the row again from its last whole cached block each time. A
``LiveStreamer`` (vLLM's engine step API: ``vllm_engine.VllmStreamer``) keeps a row's request
running instead: a round starts one request per row with the row's whole token budget, collects
the tokens the backend has sampled since the last look (``pull``) and stops a request the moment
its row is done, pruned, or no longer needed (``stop``). A row is never read twice, and it stops
at the token that shows its unit's end, not at a chunk's.

The backend may run ahead of the caller (vLLM's engine core is its own process): tokens past the
point the caller asked for (the next pruning check) wait in the row's buffer and are fed to the
cutter on the next ``advance``, so a pruner sees each row at exactly its check, as with every
other engine. Tokens that were sampled but never used (past a unit's end, or waiting in a
stopped row's buffer) count as the row's decoded tokens, as a chunk's do; what a backend still
sends for a request after it was stopped is dropped unseen, so not counted.

Randomness: a row's request is seeded from the row's seed and its length when it starts
(``stream.extension_seed``), so its text depends on its document's seed and the settings, not
on the other rows. Steering a row anew (``steer``) stops its request and starts another from the
row's tokens so far with the new bias.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

from .engine import Finished, Place, RoundRequest, Step
from .stream import Extension, Sampled, StreamEngine, StreamRound, _Row, extension_seed

if TYPE_CHECKING:
    from .steering import SteerBias


def _same(row: _Row, bias: dict[int, float] | None, steer: SteerBias | None) -> bool:
    """Whether ``row`` is biased as ``bias`` and ``steer`` biased it."""
    if row.bias != bias or (row.steer_bias is None) != (steer is None):
        return False
    return steer is None or torch.equal(row.steer_bias.weights, steer.weights)


class Delta(NamedTuple):
    """New tokens of one running request: its key, the tokens (``Sampled``) and whether the
    backend has finished it (its ``max_tokens`` reached, or its context full)."""

    key: str
    new: Sampled
    finished: bool


@runtime_checkable
class LiveStreamer(Protocol):
    """A ``TokenStreamer`` whose requests stay running between calls (see the module
    docstring)."""

    def start(self, key: str, job: Extension) -> None:
        """Start sampling ``job`` (up to ``job.max_tokens`` tokens) under ``key``."""
        ...

    def pull(self) -> list[Delta]:
        """The tokens sampled since the last pull, per request (blocks until there are some
        while a request runs)."""
        ...

    def stop(self, keys: Sequence[str]) -> None:
        """Stop the requests ``keys`` (tokens of theirs still in flight are dropped)."""
        ...


_KEYS = itertools.count()


@dataclass(eq=False)
class LiveEngine(StreamEngine):
    """A ``StreamEngine`` whose rounds keep rows running (``LiveRound``) when its streamer can
    (a ``LiveStreamer``) and ``keep_rows`` is set; chunked rounds otherwise."""

    def open(self, request: RoundRequest) -> StreamRound:
        """Start the rows of ``request`` (nothing is sampled before ``advance``)."""
        if self.keep_rows and isinstance(self.streamer, LiveStreamer):
            return LiveRound(self, request)
        return super().open(request)


class LiveRound(StreamRound):
    """A ``StreamEngine`` round over a ``LiveStreamer`` (an ``engine.Round``)."""

    def __init__(self, engine: StreamEngine, request: RoundRequest) -> None:
        super().__init__(engine, request)
        self.streamer: LiveStreamer = engine.streamer  # type: ignore[assignment]
        self._keys: dict[Place, str] = {}
        self._rows: dict[str, _Row] = {}
        self._buffers: dict[Place, tuple[list[int], list[float] | None]] = {}
        self._ended: set[Place] = set()  # the backend finished the row's request

    def advance(self, until: int | None = None) -> Step:
        engine = self.engine
        running = [r for r in self.rows if not r.done]
        if not running:
            raise RuntimeError("a round with no running row may not be advanced")
        cap = engine.max_unit_tokens
        limits = {
            r.place: min(cap, len(r.cut.tokens) + engine.chunk_tokens if until is None else until)
            for r in running
        }
        finished: list[Finished] = []
        for row in running:
            if row.place not in self._keys and row.place not in self._ended:
                self._start(row)
        pending = self._feed_all(running, limits, finished)
        while pending:
            deltas = self.streamer.pull()
            for delta in deltas:
                row = self._rows.get(delta.key)
                if row is None:  # a request stopped meanwhile: its late tokens are dropped
                    continue
                ids, logprobs = self._buffers.get(row.place, ([], []))
                new_lp = delta.new.logprobs
                if logprobs is None or new_lp is None or len(new_lp) != len(delta.new.ids):
                    logprobs = None
                else:
                    logprobs = logprobs + list(new_lp)
                self._buffers[row.place] = (ids + list(delta.new.ids), logprobs)
                if delta.finished:
                    self._forget(row.place)
                    self._ended.add(row.place)
            pending = self._feed_all(pending, limits, finished)
        finished.sort(key=lambda f: f.place)
        return Step(finished, until)

    def _start(self, row: _Row) -> None:
        """Start the row's request: its whole remaining budget, from its tokens so far."""
        engine = self.engine
        ids = self.ids[row.place[0]] + row.cut.tokens
        budget = engine.max_unit_tokens - len(row.cut.tokens)
        if engine.context_length is not None:
            budget = min(budget, engine.context_length - len(ids))
        if budget < 1:  # no room left: the row ends empty when it is fed
            self._ended.add(row.place)
            return
        key = f"ksemstamp-{next(_KEYS)}"
        seed = extension_seed(row.seed, len(row.cut.tokens))
        self.streamer.start(key, Extension(ids, budget, seed, row.bias, row.steer_bias))
        self._keys[row.place] = key
        self._rows[key] = row

    def _feed_all(
        self, rows: list[_Row], limits: dict[Place, int], finished: list[Finished]
    ) -> list[_Row]:
        """Feed each row's buffered tokens up to its limit; the rows still short of it."""
        pending = []
        for row in rows:
            done = self._feed_upto(row, limits[row.place])
            if done is not None:
                finished.append(done)
            elif not row.done and len(row.cut.tokens) < limits[row.place]:
                pending.append(row)
        return pending

    def _feed_upto(self, row: _Row, limit: int) -> Finished | None:
        """Push the row's buffered tokens through the cutter up to ``limit`` tokens; the row as
        a candidate once it is done (its request stopped, unused tokens counted as decoded)."""
        ids, logprobs = self._buffers.pop(row.place, ([], []))
        take = max(0, limit - len(row.cut.tokens))
        if ids[:take]:
            part = Sampled(ids[:take], None if logprobs is None else logprobs[:take])
            done = self._feed(row, part)
            if done is not None:
                row.cut.decoded += len(ids) - len(part.ids)  # sampled past the part
                self._stop([row.place])
                return done
        if ids[take:]:
            self._buffers[row.place] = (ids[take:], None if logprobs is None else logprobs[take:])
        elif row.place in self._ended and len(row.cut.tokens) < limit:
            # The backend finished the request short of the limit: its context is full.
            return self._feed(row, Sampled([]))
        return None

    def _forget(self, place: Place) -> None:
        key = self._keys.pop(place, None)
        if key is not None:
            self._rows.pop(key, None)

    def _stop(self, places: Sequence[Place]) -> None:
        """Stop the rows' requests; their buffered tokens count as decoded."""
        keys = []
        for place in places:
            key = self._keys.get(place)
            if key is not None:
                keys.append(key)
                self._forget(place)
            ids, _ = self._buffers.pop(place, ([], []))
            if ids:
                self._of([place])[0].cut.decoded += len(ids)
        if keys:
            self.streamer.stop(keys)

    def steer(self, rows: Sequence[Place], bias: SteerBias) -> None:
        before = {r.place: (r.bias, r.steer_bias) for r in self._of(rows)}
        super().steer(rows, bias)
        changed = [r.place for r in self._of(rows) if not _same(r, *before[r.place])]
        # Sampled under the old bias: the rows go on from their tokens so far with the new one.
        self._stop(changed)
        self._ended.difference_update(changed)

    def retain(self, rows: Sequence[Place]) -> list[tuple[Place, int]]:
        wanted = set(rows)
        self._stop([r.place for r in self.rows if r.place not in wanted])
        return super().retain(rows)

    def close(self) -> None:
        """Stop every request the round still runs."""
        self._stop([r.place for r in self.rows])
        self._buffers.clear()
