"""``KernelFeatures``: what the kernel objective scores a sentence embedding as.

The direction mark scores a unit by its processed embedding ``u`` (the domain mean removed,
the domain's leading components projected out) placed in the soft context of the region
centroids (``loss.scored_features``). The objective must see those features, so they are a
small module of fixed buffers: read from the base encoder's centroid file, or refitted on the
encoder being trained (``refit``), as ``KMeansCallback`` refits the shipped file afterwards.
The buffers are not saved in checkpoints: they are read again, or refitted, on every start.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..centroids import CentroidFile, principal_components
from .loss import scored_features


class KernelFeatures(nn.Module):
    """``(N, D)`` embeddings to ``(N, K * D)`` scored features under a fixed mean, components
    and centroids (``whiten`` 0: no components; ``temperature`` 0: one context)."""

    def __init__(
        self, mean: Tensor, components: Tensor | None, centroids: Tensor, temperature: float
    ) -> None:
        super().__init__()
        if components is not None:
            components = torch.linalg.qr(components.float().T).Q.T.contiguous()
        self.register_buffer("mean", mean.float(), persistent=False)
        self.register_buffer("components", components, persistent=False)
        self.register_buffer("centroids", centroids.float(), persistent=False)
        self.temperature = temperature

    @classmethod
    def from_file(cls, path: str | Path, whiten: int, temperature: float) -> KernelFeatures:
        """The features of a direction-scheme centroid file (its first ``whiten`` components)."""
        base = CentroidFile.load(path)
        base.require("direction", f"centroid file {path}", whiten=whiten)
        components = base.components[:whiten] if whiten else None
        return cls(base.mean, components, base.centroids, temperature)

    def forward(self, embeddings: Tensor) -> Tensor:
        return scored_features(
            embeddings, self.mean, self.components, self.centroids, self.temperature
        )

    @torch.no_grad()
    def refit(self, embeddings: Tensor, centroids: Tensor) -> None:
        """Mean and components refitted on ``(N, D)`` unit ``embeddings`` of the domain, and
        new ``(K', D)`` ``centroids`` (``K'`` may differ from the file's)."""
        mean = embeddings.float().mean(dim=0)
        self.mean = mean.to(self.mean)
        if self.components is not None:
            whiten = self.components.shape[0]
            # Eigenvectors of the covariance: already orthonormal rows.
            fitted = principal_components(embeddings.float().cpu(), mean.cpu(), whiten)
            self.components = fitted.to(self.mean)
        self.centroids = F.normalize(centroids.float(), dim=-1).to(self.mean)
