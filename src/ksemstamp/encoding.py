"""Turning sentences into unit vectors with a sentence-transformers encoder."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .text.reading import reading_form


@torch.inference_mode()
def embed(
    encoder, sentences: Sequence[str], batch_size: int = 64, progress: bool = False
) -> Tensor:
    """``(N, D)`` float32 unit-norm embeddings on the CPU, one encoder pass for all ``sentences``,
    each read in its ``reading_form`` (web addresses left out, see ``text.reading``)."""
    if len(sentences) == 0:
        dim = encoder.get_embedding_dimension()
        return torch.empty(0, dim)
    out = encoder.encode(
        [reading_form(s) for s in sentences],
        batch_size=batch_size,
        convert_to_tensor=True,
        show_progress_bar=progress,
    )
    return F.normalize(out.float(), dim=-1).cpu()
