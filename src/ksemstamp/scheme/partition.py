"""Semantic partitions of the embedding space and their margin rules, as tensor functions.

Two partitions, each mapping a batch of unit-normalised embeddings ``(N, D)`` to region ids
``(N,)`` and a margin mask ``(N,)``:

* k-SemStamp: region ``q = argmin_i d_cos(v, c_i)``; a candidate is *margin-safe* when
  ``d_cos(v, c_q) < min_{i != q} d_cos(v, c_i) - m``.
* SemStamp (LSH): ``d`` Gaussian normals; bit ``i = [n_i . v > 0]``, read with ``n_1`` as the most
  significant bit; margin-safe when ``min_i |cos(v, n_i)| >= m``.

The margin is only used to reject candidates during generation; detection ignores it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..settings.groups import PartitionSettings, RegionSearch


def kmeans_regions(emb: Tensor, centroids: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """Nearest-centroid regions under cosine distance and the k-SemStamp margin mask.

    Args:
        emb: ``(N, D)`` embeddings (normalised here, so any scale is accepted).
        centroids: ``(K, D)`` centroids (normalised here).
        margin: ``m >= 0``.

    Returns:
        ``regions`` ``(N,)`` int64 and ``margin_ok`` ``(N,)`` bool.
    """
    regions, gap = kmeans_gap(emb, centroids)
    return regions, gap > margin


def kmeans_gap(emb: Tensor, centroids: Tensor) -> tuple[Tensor, Tensor]:
    """Nearest-centroid regions and each embedding's distance from a boundary.

    Returns ``regions`` ``(N,)`` int64 and ``gap`` ``(N,)``: cosine distance to the second-nearest
    centroid minus that to the nearest, the largest margin ``m`` the embedding passes.
    """
    dist = 1.0 - F.normalize(emb, dim=-1) @ F.normalize(centroids, dim=-1).T  # (N, K)
    two = torch.topk(dist, k=2, dim=-1, largest=False)
    return two.indices[:, 0], two.values[:, 1] - two.values[:, 0]


def lsh_regions(emb: Tensor, normals: Tensor, margin: float) -> tuple[Tensor, Tensor]:
    """SemStamp's LSH regions (``n_1`` is the most significant bit) and its margin mask.

    Args:
        emb: ``(N, D)`` embeddings.
        normals: ``(d, D)`` hyperplane normals.
        margin: ``m >= 0``; a candidate is safe when every ``|cos(v, n_i)| >= m``.
    """
    cos = F.normalize(emb, dim=-1) @ F.normalize(normals, dim=-1).T  # (N, d)
    bits = (cos > 0).long()
    weights = 2 ** torch.arange(normals.shape[0] - 1, -1, -1, device=emb.device)
    regions = (bits * weights).sum(dim=-1)
    margin_ok = cos.abs().min(dim=-1).values >= margin
    return regions, margin_ok


class KMeansPartition(nn.Module):
    """k-SemStamp partition: ``K`` centroids kept as a buffer (saved and restored with state);
    ``margin`` is the region mark's (``RegionSearch.margin``)."""

    def __init__(self, centroids: Tensor, margin: float = RegionSearch.margin) -> None:
        super().__init__()
        if centroids.ndim != 2 or centroids.shape[0] < 2:
            raise ValueError(f"centroids must be (K >= 2, D), got {tuple(centroids.shape)}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.register_buffer("centroids", F.normalize(centroids.float(), dim=-1))
        self.margin = float(margin)

    @property
    def num_regions(self) -> int:
        return int(self.centroids.shape[0])

    def forward(self, emb: Tensor) -> tuple[Tensor, Tensor]:
        """``(N, D)`` embeddings -> ``(regions, margin_ok)``, each ``(N,)``."""
        return kmeans_regions(emb, self.centroids.to(emb.device, emb.dtype), self.margin)


class LSHPartition(nn.Module):
    """SemStamp partition: ``bits`` random normals from a fixed seed, ``2**bits`` regions
    (``PartitionSettings.lsh_bits`` and ``lsh_seed``); ``margin`` is the region mark's (the
    SemStamp paper's 0.02: ``configs/semstamp.yaml``)."""

    def __init__(
        self,
        dim: int,
        bits: int = PartitionSettings.lsh_bits,
        margin: float = RegionSearch.margin,
        seed: int = PartitionSettings.lsh_seed,
    ) -> None:
        super().__init__()
        if bits < 1:
            raise ValueError(f"bits must be >= 1, got {bits}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("normals", torch.randn(bits, dim, generator=gen))
        self.margin = float(margin)

    @property
    def num_regions(self) -> int:
        return 2 ** int(self.normals.shape[0])

    def forward(self, emb: Tensor) -> tuple[Tensor, Tensor]:
        """``(N, D)`` embeddings -> ``(regions, margin_ok)``, each ``(N,)``."""
        return lsh_regions(emb, self.normals.to(emb.device, emb.dtype), self.margin)
