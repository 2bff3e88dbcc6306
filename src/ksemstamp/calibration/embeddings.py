"""Sentence embeddings for calibration: each distinct sentence embedded once, kept on disk."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch

from ..assets import cache_dir, encoder_fingerprint
from ..io import atomic_target
from ..plots import progress_bar
from ..scheme.core import WatermarkScheme
from ..scheme.encoding import embed, encoder_device
from ..text.reading import READING_VERSION


class CachedEncoder:
    """Wraps a sentence encoder so that each distinct sentence is embedded only once.

    ``prefill`` embeds new sentences in chunks (with a progress bar); ``encode`` answers from
    the cache, embedding whatever is missing. Embeddings are unit vectors, as ``embed`` returns,
    kept on the CPU (a corpus' worth) and answered on the encoder's device (``device``).

    With ``store`` (a ``.pt`` file, one per encoder: name it by the encoder's fingerprint) the
    cache starts from the file's embeddings and ``prefill`` writes it back when it embedded
    something new, so a second calibration of the same texts embeds nothing.
    """

    def __init__(self, encoder, batch_size: int = 64, store: str | Path | None = None) -> None:
        self.encoder = encoder
        self.device = encoder_device(encoder)
        self.batch_size = batch_size
        self.cache: dict[str, torch.Tensor] = {}
        self.store = Path(store) if store is not None else None
        if self.store is not None and self.store.is_file():
            saved = torch.load(self.store, weights_only=True)
            self.cache.update(zip(saved["sentences"], saved["embeddings"], strict=True))

    def get_embedding_dimension(self) -> int:
        return self.encoder.get_embedding_dimension()

    def prefill(self, sentences: Sequence[str], progress: bool = False, chunk: int = 512) -> None:
        """Embed every sentence not yet in the cache."""
        todo = sorted({s for s in sentences if s not in self.cache})
        bar = progress_bar(total=len(todo), unit="sent", desc="embed", disable=not progress)
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            vectors = embed(self.encoder, part, batch_size=self.batch_size).cpu()
            self.cache.update(zip(part, vectors, strict=True))
            bar.update(len(part))
        bar.close()
        if todo and self.store is not None:
            saved = {
                "sentences": list(self.cache),
                "embeddings": torch.stack(list(self.cache.values())),
            }
            with atomic_target(self.store) as tmp:  # an interrupted save leaves the old file
                torch.save(saved, tmp)

    def encode(self, sentences, batch_size=None, convert_to_tensor=True, show_progress_bar=False):
        self.prefill(sentences)
        if not sentences:
            return torch.empty(0, self.get_embedding_dimension(), device=self.device)
        return torch.stack([self.cache[s] for s in sentences]).to(self.device)


def with_cached_encoder(
    scheme: WatermarkScheme, store: str | Path | None = None
) -> WatermarkScheme:
    """A shallow copy of ``scheme`` whose encoder embeds each distinct sentence once (and keeps
    the embeddings in ``store``, see ``CachedEncoder``)."""
    if isinstance(scheme.encoder, CachedEncoder):
        return scheme
    cached = copy.copy(scheme)
    cached.encoder = CachedEncoder(scheme.encoder, scheme.encode_batch_size, store)
    return cached


def embedding_store(encoder) -> Path | None:
    """Where calibration keeps ``encoder``'s sentence embeddings: one file per weights
    fingerprint, maximum sequence length and reading rule (``text.reading``: the file maps a
    sentence to what the encoder made of its reading form), ``None`` for an encoder that is not
    a module."""
    if not isinstance(encoder, torch.nn.Module):
        return None
    length = getattr(encoder, "max_seq_length", None)
    return (
        cache_dir()
        / "embeddings"
        / f"{encoder_fingerprint(encoder)}-len{length}-read{READING_VERSION}.pt"
    )
