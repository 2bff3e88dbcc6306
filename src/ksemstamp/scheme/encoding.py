"""Turning sentences into unit vectors with a sentence-transformers encoder."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..text.reading import reading_form


@torch.inference_mode()
def embed(
    encoder, sentences: Sequence[str], batch_size: int = 64, progress: bool = False
) -> Tensor:
    """``(N, D)`` float32 unit-norm embeddings on the encoder's device (``encoder_device``), one
    encoder pass for all ``sentences``, each read in its ``reading_form`` (web addresses left
    out, see ``text.reading``)."""
    if len(sentences) == 0:
        dim = encoder.get_embedding_dimension()
        return torch.empty(0, dim, device=encoder_device(encoder))
    out = encoder.encode(
        [reading_form(s) for s in sentences],
        batch_size=batch_size,
        convert_to_tensor=True,
        show_progress_bar=progress,
    )
    return F.normalize(out.float(), dim=-1)


def encoder_device(encoder) -> torch.device:
    """Where ``encoder`` computes: its ``device`` (a ``SentenceTransformer``'s), else the CPU
    (a stand-in without one)."""
    return torch.device(getattr(encoder, "device", "cpu"))
