"""Steering candidates toward the key: a logit bias from the meaning of each token.

Selection keeps the best of a round's candidates; steering moves the candidates themselves.
A vocabulary entry of the generator is read by the watermark's encoder as a text of its own
(``" council"``) and processed as a sentence is scored (the domain mean removed, the principal
components projected out, unit length: the mark's ``vectors``). The key's directions turn
these token vectors into each entry's projection on each region's direction, standardised per
blend of regions (``Steering``). While a candidate is sampled, an entry the LM finds plausible
at that step gains ``strength`` times its standardised projection on the direction of the
context being steered toward (a row of weights over the regions, as the mark's
``context_weights`` gives), so a sentence starts nearer the direction it will be scored on and
selection does the rest.

The token vectors are key-free and built lazily (``TokenTable``): an entry is embedded the
first time it is plausible at some step (a few thousand entries over a first text, seconds),
never the whole vocabulary unless steering is asked of every entry (``sampling.steer_plausible
0``, or an engine that takes one bias per request). The standardisation comes from a fixed
sample of ``SAMPLE`` entries spread over the vocabulary, so a generator with 262k entries
starts in seconds, not minutes. Vectors are cached on disk per generator vocabulary, encoder
and processing, and written as they grow. An entry's vector is the same bit for bit whenever
it is embedded, alone or with others: entries go through the encoder on one thread in batches
of equal token length and exactly ``MAX_BATCH`` rows (a batch of another number of rows can take
another matrix kernel, which rounds differently: fewer than 8 on an AMD EPYC, 8 against 64 on
an Intel Xeon), so a run with a cold cache writes what a run with a warm one writes.

The detector does not know about any of this: a text written without the key is scored exactly
as before, so the null and the calibration do not change. What steering costs is perplexity:
the bias is added before the temperature, and its size is in standard deviations of the
tokens' projections.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..text.normalize import normalize_text
from ..text.reading import reading_form
from .cutter import vocabulary_pieces
from .steering_cache import read_rows, write_rows

logger = logging.getLogger(__name__)

PROBES = (
    "The council met on Monday and approved the budget.",
    "Scientists found water on the planet.",
    "council",
)
"""Texts whose processed vectors identify an encoder and its processing in the cache key."""
SAMPLE = 4096
"""Vocabulary entries (spread evenly over the steered ones) whose projections standardise the
bias: the sample's mean and covariance over the regions."""
MAX_BATCH = 64
"""Rows of every encoder pass: entries of one token length, a shorter batch filled up with
copies of its first entry, so that every entry is computed by the same kernels."""
SAVE_SECONDS = 30.0
"""Seconds between writes of a growing cache (and once more when the process ends)."""
PROGRESS_SECONDS = 10.0
"""Seconds between the progress lines of many entries being embedded."""
CACHE_FORMAT = "lazy rows+sha256, equal-length batches of 64, one thread"
"""What a cached table is: a file of another format (an earlier one) has another name."""


def word_tokens(tokenizer: Any, vocab: int, pieces: list[str] | None = None) -> Tensor:
    """``(vocab,)`` whether each vocabulary entry decodes to something with a letter (what
    ``Steering`` biases); ``pieces``: the vocabulary decoded already."""
    pieces = pieces if pieces is not None else vocabulary_pieces(tokenizer, vocab)
    return torch.tensor([any(c.isalpha() for c in p) for p in pieces], dtype=torch.bool)


class TokenTable:
    """The key-free token vectors of a generator's vocabulary, embedded as they are needed.

    Args:
        pieces: every entry decoded alone.
        dim: the vectors' width.
        embed: texts to their ``(N, dim)`` processed vectors (the mark's ``vectors`` of the
            scheme's embeddings); ``None`` for a table given whole (``fixed``).
        lengths: texts to their encoder token counts (entries of one count share a batch).
        cache: the file the vectors are kept in across runs, or ``None``.
    """

    def __init__(
        self,
        pieces: Sequence[str],
        dim: int,
        embed: Callable[[list[str]], Tensor] | None = None,
        lengths: Callable[[list[str]], list[int]] | None = None,
        cache: Path | None = None,
    ) -> None:
        self.pieces = list(pieces)
        self.vectors = torch.zeros(len(self.pieces), dim, dtype=torch.float16)
        self.known = torch.zeros(len(self.pieces), dtype=torch.bool)
        self.embed = embed
        self.lengths = lengths or (lambda texts: [len(t) for t in texts])
        self.cache = cache
        self.unsaved = 0
        self.saved_at = time.monotonic()
        self.listeners: list[Callable[[Tensor], None]] = []
        if cache is not None:
            ids, vectors = read_rows(cache, len(self.pieces), dim)
            self.vectors[ids] = vectors
            self.known[ids] = True
            _UNSAVED.add(self)

    @classmethod
    def fixed(cls, vectors: Tensor) -> TokenTable:
        """A table of the given ``(V, D)`` vectors, every entry known (a zero row: no vector)."""
        table = cls([""] * len(vectors), vectors.shape[1])
        table.vectors = vectors.detach().half().cpu()
        table.known[:] = True
        return table

    def __len__(self) -> int:
        return len(self.pieces)

    def ensure(self, ids: Tensor) -> Tensor:
        """Embed the entries of ``ids`` not known yet; returns the ids embedded now (CPU)."""
        ids = ids.cpu()
        missing = ids[~self.known[ids]].unique()
        if len(missing) == 0:
            return missing
        if self.embed is None:
            raise RuntimeError("a fixed token table cannot embed new entries")
        self._learn(missing, self._embed_canonically(missing.tolist()))
        self.unsaved += len(missing)
        if self.cache is not None and time.monotonic() - self.saved_at >= SAVE_SECONDS:
            self.save()
        return missing

    def _learn(self, ids: Tensor, vectors: Tensor) -> None:
        """Entries ``ids`` known from now on, with their fp16 ``vectors`` (listeners told)."""
        self.vectors[ids] = vectors
        self.known[ids] = True
        for listener in self.listeners:
            listener(ids)

    def _embed_canonically(self, ids: list[int]) -> Tensor:
        """fp16 vectors of entries ``ids``, each computed as it would be in any other company
        (see the module docstring), on one thread, with progress lines for long work."""
        from tqdm.auto import tqdm

        assert self.embed is not None
        texts = [self.pieces[i] for i in ids]
        groups: dict[int, list[int]] = defaultdict(list)
        for pos, n in enumerate(self.lengths(texts)):
            groups[n].append(pos)
        batches = [
            members[a : a + MAX_BATCH]
            for _, members in sorted(groups.items())
            for a in range(0, len(members), MAX_BATCH)
        ]
        out = torch.zeros(len(ids), self.vectors.shape[1], dtype=torch.float16)
        long = len(ids) > 20 * MAX_BATCH
        if long:
            logger.info("embedding %d vocabulary entries for steering (cached)", len(ids))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        start = last = time.perf_counter()
        try:
            bar = tqdm(batches, desc="token vectors", unit="batch", leave=False, disable=not long)
            done = 0
            for batch in bar:
                chunk = [texts[p] for p in batch]
                chunk += [chunk[0]] * (MAX_BATCH - len(chunk))
                vectors = self.embed(chunk).float().cpu()[: len(batch)]
                out[torch.tensor(batch)] = vectors.half()
                done += len(batch)
                now = time.perf_counter()
                if long and now - last >= PROGRESS_SECONDS and done < len(ids):
                    last, rate = now, done / (now - start)
                    logger.info(
                        "token vectors: %d of %d entries (%.0f%%), %.0f/s, about %.0f s left",
                        done, len(ids), 100 * done / len(ids), rate, (len(ids) - done) / rate,
                    )  # fmt: skip
        finally:
            torch.set_num_threads(threads)
        return out

    def save(self) -> None:
        """Write the known vectors to the cache (merged with what another process wrote there
        meanwhile), when anything is new."""
        if self.cache is None or self.unsaved == 0:
            return
        ids, vectors = read_rows(self.cache, len(self), self.vectors.shape[1], quiet=True)
        theirs = ~self.known[ids]
        if theirs.any():
            self._learn(ids[theirs], vectors[theirs])
        mine = self.known.nonzero().squeeze(-1)
        write_rows(self.cache, mine, self.vectors[mine])
        self.unsaved, self.saved_at = 0, time.monotonic()


_UNSAVED: weakref.WeakSet[TokenTable] = weakref.WeakSet()
"""Cached tables still alive, saved once more when the process ends."""


@atexit.register
def _save_at_exit() -> None:
    for table in list(_UNSAVED):
        table.save()


def token_table(
    tokenizer: Any, vocab: int, scheme: Any, mark: Any, cache: Path | None, pieces: Any = None
) -> TokenTable:
    """The lazily built ``TokenTable`` of a generator's ``vocab`` entries as ``mark`` processes
    ``scheme``'s embeddings, cached in the folder ``cache`` (``None``: in memory only)."""
    pieces = pieces if pieces is not None else vocabulary_pieces(tokenizer, vocab)
    probes = mark.vectors(scheme.embed(list(PROBES))).float().cpu()
    path = None if cache is None else Path(cache) / f"{_cache_key(pieces, probes)}.pt"
    encoder_tokenizer = getattr(scheme.encoder, "tokenizer", None)

    def lengths(texts: list[str]) -> list[int]:
        read = [reading_form(normalize_text(t).text) for t in texts]
        if encoder_tokenizer is None:
            return [len(t) for t in read]
        return [len(ids) for ids in encoder_tokenizer(read)["input_ids"]]

    def embed(texts: list[str]) -> Tensor:
        return mark.vectors(scheme.embed(texts))

    return TokenTable(pieces, probes.shape[1], embed, lengths, path)


def _cache_key(pieces: list[str], probes: Tensor) -> str:
    """A hash of the vocabulary and of what the scheme makes of a few probe texts (``probes``:
    their processed vectors): the same generator vocabulary, encoder and processing give the
    same table."""
    digest = hashlib.sha256("\x00".join(pieces).encode("utf-8", "surrogatepass"))
    digest.update(torch.round(probes * 1e4).to(torch.int32).numpy().tobytes())
    digest.update(CACHE_FORMAT.encode())
    return digest.hexdigest()[:24]


class Steering:
    """The key's logit bias (see the module docstring).

    Args:
        table: the token vectors (``token_table``, or ``TokenTable.fixed``).
        directions: ``(K, D)`` the key's directions (their device is where biases are made).
        strength: the bias, in standard deviations of the tokens' projections (0: none).
        words: ``(V,)`` the entries to steer (``word_tokens``); ``None``: every entry.
    """

    def __init__(
        self,
        table: TokenTable,
        directions: Tensor,
        strength: float,
        words: Tensor | None = None,
    ) -> None:
        if strength < 0:
            raise ValueError(f"steering strength must be >= 0, got {strength}")
        self.tokens = table
        self.directions = directions.float()
        self.device = self.directions.device
        self.strength = float(strength)
        vocab = len(table)
        words = torch.ones(vocab, dtype=torch.bool) if words is None else words.cpu()
        self.words = words.to(self.device)
        # Steered: words with a vector (an entry not embedded yet counts as one until it is).
        self.active = self.words.clone()
        self.table = torch.zeros(len(self.directions), vocab, device=self.device)  # (K, V)
        table.listeners.append(self._project)
        self._project(table.known.nonzero().squeeze(-1))
        steered = self.active.nonzero().squeeze(-1).cpu()
        picks = torch.linspace(0, len(steered) - 1, min(SAMPLE, len(steered))).round().long()
        sample = steered[picks.unique()] if len(steered) else steered
        table.ensure(sample)
        sample = sample[self.active[sample.to(self.device)].cpu()]  # blank ones left out
        projections = self.table[:, sample.to(self.device)].T.double()  # (n, K)
        self.mean = projections.mean(dim=0)
        centered = projections - self.mean
        self.covariance = centered.T @ centered / max(len(projections) - 1, 1)

    def _project(self, ids: Tensor) -> None:
        """Columns ``ids`` of the projection table, from their new token vectors."""
        if len(ids) == 0:
            return
        vectors = self.tokens.vectors[ids].float().to(self.device)
        at = ids.to(self.device)
        self.table[:, at] = self.directions @ vectors.T
        self.active[at] = self.words[at] & (vectors.abs().sum(dim=-1) > 0)

    @property
    def vocab(self) -> int:
        return int(self.table.shape[1])

    def bias(self, weights: Tensor) -> SteerBias:
        """The logit biases toward ``(R, K)`` context weights (a zero row gives none)."""
        return SteerBias(self, weights.float().to(self.device))

    def values(self, weights: Tensor, ids: Tensor) -> Tensor:
        """``(R, len(ids))`` biases of entries ``ids`` (embedded now where not known yet): each
        row's projections standardised by the sample's mean and spread for that row's blend,
        times ``strength``; entries that are not steered get 0."""
        ids = ids.to(self.device)
        self.tokens.ensure(ids[self.words[ids]])  # marks and whitespace are never embedded
        w = weights.double()
        mean = w @ self.mean
        spread = ((w @ self.covariance) * w).sum(dim=-1).clamp_min(0).sqrt()
        raw = weights @ self.table[:, ids]
        scaled = (raw - mean[:, None].float()) / spread[:, None].float().clamp_min(1e-12)
        scaled = scaled.masked_fill((spread == 0)[:, None], 0.0) * self.strength
        return scaled.masked_fill(~self.active[ids][None], 0.0)


class SteerBias:
    """``(R, V)`` logit biases of a ``Steering``, made where they are needed: ``among`` the
    entries plausible at a step (embedding what is new), or ``dense`` over every entry."""

    def __init__(self, steering: Steering, weights: Tensor) -> None:
        self.steering = steering
        self.weights = weights

    def __len__(self) -> int:
        return len(self.weights)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.weights), self.steering.vocab)

    def rows(self, index: Tensor | Sequence[int]) -> SteerBias:
        """The biases of rows ``index`` (repeats allowed)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.weights.device)
        return SteerBias(self.steering, self.weights[index])

    def put(self, index: Sequence[int], other: SteerBias) -> SteerBias:
        """These biases with rows ``index`` replaced by ``other``'s."""
        weights = self.weights.clone()
        weights[torch.as_tensor(index, dtype=torch.long, device=weights.device)] = other.weights
        return SteerBias(self.steering, weights)

    @staticmethod
    def none(steering: Steering, rows: int) -> SteerBias:
        """``rows`` rows of no bias."""
        return SteerBias(
            steering, torch.zeros(rows, len(steering.directions), device=steering.device)
        )

    def among(self, inside: Tensor) -> Tensor:
        """``(R, V)`` float32 biases on ``inside``'s device, filled at the entries ``inside``
        ``(R, V)`` marks in any row (0 elsewhere)."""
        ids = inside.any(dim=0).nonzero().squeeze(-1)
        out = torch.zeros(inside.shape, device=inside.device)
        if len(ids):
            out[:, ids] = self.steering.values(self.weights, ids).to(inside.device)
        return out

    def dense(self) -> Tensor:
        """``(R, V)`` float32 biases of every entry (the whole vocabulary embedded once)."""
        every = torch.arange(self.steering.vocab, device=self.steering.device)
        return self.steering.values(self.weights, every)
