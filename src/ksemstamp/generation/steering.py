"""Steering candidates toward the key: a logit bias from the meaning of each token.

Selection keeps the best of a round's candidates; steering moves the candidates themselves.
Every vocabulary entry of the generator is read by the watermark's encoder as a text of its
own (``" council"``) and processed as a sentence is scored (the domain mean removed, the
principal components projected out, unit length: ``WatermarkScheme.vectors``); the table of
these token vectors is key-free, computed once per generator vocabulary, encoder and centroid
file, and cached (``token_vectors``). At run time the key's directions turn it into a
``(V, K)`` table of each token's projection on each region's direction, standardised per
region (``Steering``). While a candidate is sampled, every token's logit gains ``strength``
times its standardised projection on the direction of the context being steered toward (a
row of weights over the regions, as ``WatermarkScheme.context_weights`` gives), so a sentence
starts nearer the direction it will be scored on and selection does the rest.

The detector does not know about it: a text written without the key is scored exactly as
before, so the null and the calibration do not change. What steering costs is perplexity: the
bias is added before the temperature, and its size is in standard deviations of the tokens'
projections.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .cutter import vocabulary_pieces

logger = logging.getLogger(__name__)

PROBES = (
    "The council met on Monday and approved the budget.",
    "Scientists found water on the planet.",
    "council",
)
"""Texts whose processed vectors identify an encoder and its processing in the cache key."""
BATCH = 512
"""Vocabulary entries embedded in one encoder pass."""
PROGRESS_SECONDS = 10.0
"""Seconds between the progress lines of a table being built (also without a terminal)."""
CACHE_FORMAT = "table+sha256, one thread"
"""What a cached table is: a file of another format (an earlier one) has another name."""


def token_vectors(
    tokenizer: Any,
    vocab: int,
    scheme: Any,
    mark: Any,
    cache: Path | None = None,
    pieces: list[str] | None = None,
) -> Tensor:
    """``(vocab, D)`` float32 processed vectors (``mark.vectors``) of the generator's
    vocabulary entries (on the scheme's device), read from ``cache`` (a folder) when it holds
    them, else embedded with ``scheme`` (about a minute for 49k entries on 2 CPU cores) and
    stored there.

    An entry that decodes to nothing but whitespace, or past the tokenizer's vocabulary (a
    padded output head), gets a zero vector: it is never steered for or against. A cached file
    that does not load, or does not hold a finite ``(vocab, D)`` fp16 table matching the
    checksum written with it, is rebuilt with one warning; a cache that cannot be written is
    warned about once and the table used from memory. The table is built on one thread, so it
    is the same bit for bit whatever threads the process runs with."""
    pieces = pieces if pieces is not None else vocabulary_pieces(tokenizer, vocab)
    probes = mark.vectors(scheme.embed(list(PROBES))).float().cpu()
    path = None
    if cache is not None:
        path = Path(cache) / f"{_cache_key(pieces, probes)}.pt"
        table = read_table(path, vocab, probes.shape[1])
        if table is not None:
            # Read on the CPU, then moved: any device the scheme is on, as a tensor made there.
            return table.to(scheme.device).float()
    table = _embed_entries(pieces, scheme, mark)
    if path is not None:
        write_table(path, table)
    return table.to(scheme.device).float()


def _embed_entries(pieces: list[str], scheme: Any, mark: Any) -> Tensor:
    """The fp16 table of ``pieces``' processed vectors, on the CPU, built on one thread, with
    progress lines (a terminal gets a bar as well)."""
    from tqdm.auto import tqdm

    vocab = len(pieces)
    logger.info(
        "embedding the generator's %d vocabulary entries once (cached for later runs)", vocab
    )
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = last = time.perf_counter()
    try:
        batches = range(0, vocab, BATCH)
        bar = tqdm(batches, desc="token vectors", unit="batch", leave=False, disable=None)
        for n, first in enumerate(bar):
            chunk = pieces[first : first + BATCH]
            texts = [p if p.strip() else "." for p in chunk]
            vectors = mark.vectors(scheme.embed(texts)).float().cpu()
            blank = torch.tensor([not p.strip() for p in chunk])
            rows.append(vectors.masked_fill(blank[:, None], 0.0))
            now = time.perf_counter()
            if now - last >= PROGRESS_SECONDS and n + 1 < len(batches):
                last = now
                done = min(first + BATCH, vocab)
                rate = done / (now - start)
                logger.info(
                    "token vectors: %d of %d entries (%.0f%%), %.0f/s, about %.0f s left",
                    done, vocab, 100 * done / vocab, rate, (vocab - done) / rate,
                )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    # Rounded as the cache stores it, so that the first run steers as every later one.
    return torch.cat(rows).half()


def read_table(path: Path, vocab: int, dim: int) -> Tensor | None:
    """The fp16 ``(vocab, dim)`` table cached at ``path``, or ``None`` when there is none, or
    when it does not load or does not match (then one warning says it is rebuilt)."""
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        table = saved.get("table") if isinstance(saved, dict) else None
        digest = saved.get("sha256") if isinstance(saved, dict) else None
        problem = None
        if not isinstance(table, Tensor) or table.dtype != torch.float16:
            problem = "not an fp16 table"
        elif tuple(table.shape) != (vocab, dim):
            problem = f"shape {tuple(table.shape)}, not ({vocab}, {dim})"
        elif not bool(torch.isfinite(table).all()):
            problem = "values that are not finite"
        elif digest != _digest(table):
            problem = "a checksum that does not match its values"
    except Exception as err:  # truncated, empty, random bytes, another layout
        problem = f"unreadable ({type(err).__name__})"
    if problem is None:
        return table
    logger.warning("steering table %s is damaged (%s): rebuilding it", path, problem)
    return None


def write_table(path: Path, table: Tensor) -> None:
    """Store ``table`` (fp16) at ``path`` with its checksum, atomically; a cache that cannot be
    written is warned about (once per folder) and skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"table": table.cpu(), "sha256": _digest(table)}, tmp)
        tmp.replace(path)
    except OSError as err:
        if str(path.parent) not in _UNWRITABLE:
            _UNWRITABLE.add(str(path.parent))
            logger.warning(
                "cannot write the steering table to %s (%s): it is used from memory and "
                "built again next run (KSEMSTAMP_CACHE moves the cache)",
                path.parent, err.strerror or err,
            )  # fmt: skip


_UNWRITABLE: set[str] = set()


def _digest(table: Tensor) -> str:
    return hashlib.sha256(table.contiguous().cpu().numpy().tobytes()).hexdigest()


def word_tokens(tokenizer: Any, vocab: int, pieces: list[str] | None = None) -> Tensor:
    """``(vocab,)`` whether each vocabulary entry decodes to something with a letter (what
    ``Steering`` biases); ``pieces``: the vocabulary decoded already."""
    pieces = pieces if pieces is not None else vocabulary_pieces(tokenizer, vocab)
    return torch.tensor([any(c.isalpha() for c in p) for p in pieces], dtype=torch.bool)


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
        vectors: ``(V, D)`` token vectors (``token_vectors``).
        directions: ``(K, D)`` the key's directions.
        strength: the bias, in standard deviations of the tokens' projections (0: none).
        words: ``(V,)`` the entries to steer (``word_tokens``); ``None``: every entry with a
            vector.
    """

    def __init__(
        self,
        vectors: Tensor,
        directions: Tensor,
        strength: float,
        words: Tensor | None = None,
    ) -> None:
        if strength < 0:
            raise ValueError(f"steering strength must be >= 0, got {strength}")
        projections = vectors.float() @ directions.float().to(vectors.device).T  # (V, K)
        self.table = projections.T.contiguous()  # (K, V): a row of weights picks a blend
        self.strength = float(strength)
        active = vectors.abs().sum(dim=-1) > 0
        if words is not None:
            active = active & words.to(active.device)
        self.active = active

    @property
    def vocab(self) -> int:
        return int(self.table.shape[1])

    def bias(self, weights: Tensor) -> Tensor:
        """``(R, V)`` float32 logit biases toward ``(R, K)`` context weights (a zero row of
        weights gives a zero bias): each row's projections standardised over the steered
        entries (``words``: those that hold a letter), times ``strength``; the others (marks,
        digits, whitespace, special tokens) are not biased, so steering leaves where units end
        and how they are punctuated to the LM."""
        raw = (weights.float().to(self.table.device) @ self.table)[:, self.active]
        spread = raw.std(dim=-1, keepdim=True)
        scaled = (raw - raw.mean(dim=-1, keepdim=True)) / spread.clamp_min(1e-12)
        out = torch.zeros(len(weights), self.vocab, device=self.table.device)
        out[:, self.active] = scaled.masked_fill(spread == 0, 0.0) * self.strength
        return out
