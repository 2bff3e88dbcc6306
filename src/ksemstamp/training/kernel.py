"""``KernelFeatures``: what the kernel objective scores a sentence embedding as.

The direction mark scores a unit by its processed embedding ``u`` (the domain mean removed,
the domain's leading components projected out) placed in the soft context of the region
centroids (``loss.scored_features``). The objective must see those features, so they are a
small module of fixed buffers: read from the base encoder's centroid file, or refitted on the
encoder being trained (``refit``), as ``KMeansCallback`` refits the shipped file afterwards.
The buffers are not saved in checkpoints: they are read again, or refitted, on every start.
Beside it, the gather of the objective's columns under DDP.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn

from ..scheme.centroids import CentroidFile, principal_components
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
        base.require("the kernel objective", f"centroid file {path}", mean=True, components=whiten)
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


def gather_columns(module: LightningModule, local: Tensor, ok: Tensor) -> tuple[Tensor, Tensor]:
    """``local`` ``(n, F)`` columns then every other rank's (with gradients back to them), and
    ``ok`` ``(U, n)`` extended by True for those: other ranks hold other windows. Ranks may
    hold different numbers of columns, so each pads to the largest before the gather."""
    sizes = module.all_gather(torch.tensor([len(local)], device=local.device)).reshape(-1)
    width = int(sizes.max())
    padded = torch.cat([local, local.new_zeros(width - len(local), local.shape[1])])
    gathered = module.all_gather(padded, sync_grads=True)  # (world, width, F)
    rank = module.global_rank
    rest = [gathered[r, : int(sizes[r])] for r in range(len(sizes)) if r != rank]
    columns = torch.cat([local, *rest])
    extra = columns.shape[0] - local.shape[0]
    return columns, torch.cat([ok, ok.new_ones(ok.shape[0], extra)], dim=1)
