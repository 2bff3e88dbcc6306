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
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

PROBES = (
    "The council met on Monday and approved the budget.",
    "Scientists found water on the planet.",
    "council",
)
"""Texts whose processed vectors identify an encoder and its processing in the cache key."""
BATCH = 512
"""Vocabulary entries embedded in one encoder pass."""


def token_vectors(
    tokenizer: Any, vocab: int, scheme: Any, mark: Any, cache: Path | None = None
) -> Tensor:
    """``(vocab, D)`` float32 processed vectors (``mark.vectors``) of the generator's
    vocabulary entries (on the scheme's device), read from ``cache`` (a folder) when it holds
    them, else embedded with ``scheme`` (about
    40 s for 49k entries on 2 CPU cores) and stored there.

    An entry that decodes to nothing but whitespace, or past the tokenizer's vocabulary (a
    padded output head), gets a zero vector: it is never steered for or against."""
    pieces = tokenizer.batch_decode([[i] for i in range(min(vocab, len(tokenizer)))])
    pieces += [""] * (vocab - len(pieces))
    path = None
    if cache is not None:
        path = Path(cache) / f"{_cache_key(pieces, scheme, mark)}.pt"
        if path.exists():
            # Read on the CPU, then moved: any device the scheme is on, as a tensor made there.
            table = torch.load(path, map_location="cpu", weights_only=True)
            return table.to(scheme.device).float()
    from tqdm.auto import tqdm

    logger.info(
        "embedding the generator's %d vocabulary entries once (cached for later runs)", vocab
    )
    rows = []
    batches = range(0, vocab, BATCH)
    # A bar on a terminal only (tqdm's disable=None): records and logs stay clean.
    for start in tqdm(batches, desc="token vectors", unit="batch", leave=False, disable=None):
        chunk = pieces[start : start + BATCH]
        texts = [p if p.strip() else "." for p in chunk]
        vectors = mark.vectors(scheme.embed(texts)).float()
        blank = torch.tensor([not p.strip() for p in chunk], device=vectors.device)
        rows.append(vectors.masked_fill(blank[:, None], 0.0))
    # Rounded as the cache stores it, so that the first run steers as every later one.
    table = torch.cat(rows).half().float()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(table.half().cpu(), tmp)
        tmp.replace(path)
    return table


def word_tokens(tokenizer: Any, vocab: int) -> Tensor:
    """``(vocab,)`` whether each vocabulary entry decodes to something with a letter (what
    ``Steering`` biases)."""
    pieces = tokenizer.batch_decode([[i] for i in range(min(vocab, len(tokenizer)))])
    words = [any(c.isalpha() for c in p) for p in pieces] + [False] * (vocab - len(pieces))
    return torch.tensor(words, dtype=torch.bool)


def _cache_key(pieces: list[str], scheme: Any, mark: Any) -> str:
    """A hash of the vocabulary and of what the scheme makes of a few probe texts: the same
    generator vocabulary, encoder and processing give the same table."""
    digest = hashlib.sha256("\x00".join(pieces).encode("utf-8", "surrogatepass"))
    probes = mark.vectors(scheme.embed(list(PROBES))).float().cpu()
    digest.update(torch.round(probes * 1e4).to(torch.int32).numpy().tobytes())
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
