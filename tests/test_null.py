"""Under the null (text unrelated to the key), sentences land in valid regions at rate gamma."""

import math

import pytest
import torch
import torch.nn.functional as F

from ksemstamp.scheme.keyed import valid_table
from ksemstamp.scheme.partition import kmeans_regions, lsh_regions

N = 20000  # transitions per key


def _rate(regions: torch.Tensor, table: torch.Tensor) -> float:
    return table[regions[:-1], regions[1:]].float().mean().item()


def _tolerance(n: int, gamma: float) -> float:
    # 4.5 binomial standard deviations: a false failure has probability ~1e-5 per check.
    return 4.5 * math.sqrt(gamma * (1 - gamma) / n)


def _orthonormal(rows: int, dim: int, seed: int) -> torch.Tensor:
    """``rows`` random orthonormal vectors: with them every region is equally likely for
    isotropic embeddings, so the null valid rate is exactly gamma whatever the key."""
    q, _ = torch.linalg.qr(torch.randn(dim, rows, generator=torch.Generator().manual_seed(seed)))
    return q.T


KEYS = ["alpha", "beta", "third-key"]


@pytest.mark.parametrize("key_index", range(len(KEYS)))
@pytest.mark.parametrize("gamma", [0.25, 0.5])
def test_lsh_null_rate(key_index, gamma):
    gen = torch.Generator().manual_seed(100 + key_index)
    emb = F.normalize(torch.randn(N + 1, 64, generator=gen), dim=-1)
    regions, _ = lsh_regions(emb, _orthonormal(3, 64, key_index), 0.0)
    table = valid_table(8, gamma, KEYS[key_index])
    assert abs(_rate(regions, table) - gamma) < _tolerance(N, gamma)


@pytest.mark.parametrize("key_index", range(len(KEYS)))
@pytest.mark.parametrize("gamma", [0.25, 0.5])
def test_kmeans_null_rate(key_index, gamma):
    gen = torch.Generator().manual_seed(200 + key_index)
    emb = torch.randn(N + 1, 64, generator=gen)
    regions, _ = kmeans_regions(emb, _orthonormal(8, 64, 50 + key_index), 0.0)
    table = valid_table(8, gamma, KEYS[key_index])
    assert abs(_rate(regions, table) - gamma) < _tolerance(N, gamma)


def test_real_centroids_null_rate_over_keys(default_scheme):
    # With the shipped centroids, random unit vectors are not spread evenly over regions, so
    # a single key can deviate; averaged over keys the valid rate is gamma exactly.
    gen = torch.Generator().manual_seed(5)
    emb = F.normalize(torch.randn(4001, 384, generator=gen), dim=-1)
    regions, _ = default_scheme.partition(emb)
    k = default_scheme.num_regions
    rates = [_rate(regions, valid_table(k, 0.25, f"key-{i}")) for i in range(200)]
    mean = sum(rates) / len(rates)
    spread = (sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)) ** 0.5
    assert abs(mean - 0.25) < 4.5 * spread / math.sqrt(len(rates)) + 0.005
