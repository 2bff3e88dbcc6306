import pytest
import torch
import torch.nn.functional as F

from ksemstamp.scheme.partition import KMeansPartition, LSHPartition, kmeans_regions, lsh_regions


def _naive_kmeans(emb, centroids, margin):
    regions, ok = [], []
    for v in emb:
        d = [1 - float(F.cosine_similarity(v, c, dim=0)) for c in centroids]
        q = min(range(len(d)), key=d.__getitem__)
        others = min(d[i] for i in range(len(d)) if i != q)
        regions.append(q)
        ok.append(d[q] < others - margin)
    return regions, ok


@pytest.mark.parametrize("margin", [0.0, 0.02, 0.05])
def test_kmeans_matches_naive_loop(margin):
    gen = torch.Generator().manual_seed(1)
    emb, cent = torch.randn(200, 16, generator=gen), torch.randn(8, 16, generator=gen)
    regions, ok = kmeans_regions(emb, cent, margin)
    want_r, want_ok = _naive_kmeans(emb, cent, margin)
    assert regions.tolist() == want_r
    assert ok.tolist() == want_ok
    if margin > 0:
        assert 0 < ok.float().mean() < 1  # the margin rejects some, not all


def test_lsh_bit_order_and_margin():
    normals = torch.eye(3, 5)  # n_1 = e_1 (most significant), n_2 = e_2, n_3 = e_3
    emb = torch.tensor(
        [[1.0, -1, -1, 0, 0], [-1, -1, 1, 0, 0], [1, 1, 1, 0, 0], [0.01, 1, 1, 0, 0]]
    )
    regions, ok = lsh_regions(emb, normals, margin=0.05)
    assert regions.tolist() == [0b100, 0b001, 0b111, 0b111]
    assert ok.tolist() == [True, True, True, False]  # last one is 0.007 from a hyperplane


def test_lsh_matches_naive_loop():
    gen = torch.Generator().manual_seed(2)
    emb, normals = torch.randn(100, 12, generator=gen), torch.randn(4, 12, generator=gen)
    regions, ok = lsh_regions(emb, normals, 0.1)
    for v, r, o in zip(emb, regions, ok, strict=True):
        cos = [float(F.cosine_similarity(v, n, dim=0)) for n in normals]
        assert int(r) == int("".join("1" if c > 0 else "0" for c in cos), 2)
        assert bool(o) == (min(abs(c) for c in cos) >= 0.1)


def test_modules_keep_state_and_validate():
    part = KMeansPartition(torch.randn(8, 16), margin=0.035)
    assert part.num_regions == 8
    assert "centroids" in part.state_dict()
    assert LSHPartition(16, bits=3).num_regions == 8
    # same seed, same hyperplanes
    assert torch.equal(LSHPartition(16, seed=3).normals, LSHPartition(16, seed=3).normals)
    with pytest.raises(ValueError):
        KMeansPartition(torch.randn(1, 16))
    with pytest.raises(ValueError):
        KMeansPartition(torch.randn(8, 16), margin=-0.1)
    with pytest.raises(ValueError):
        LSHPartition(16, bits=0)
