"""Centroid files: fitting, saving, loading, the checks against an encoder, the shipped ones."""

from pathlib import Path

import pytest
import torch

from ksemstamp.assets import encoder_fingerprint
from ksemstamp.builders import build_scheme
from ksemstamp.scheme.centroids import (
    CentroidFile,
    CentroidMismatchError,
    fit_kmeans,
    transition_counts,
)
from ksemstamp.settings import PartitionSettings, WatermarkSettings
from ksemstamp.settings.files import load_watermark_settings


def test_fit_kmeans_and_transitions():
    gen = torch.Generator().manual_seed(0)
    centers = torch.nn.functional.normalize(torch.randn(3, 16, generator=gen), dim=-1)
    points = torch.cat([c + 0.05 * torch.randn(50, 16, generator=gen) for c in centers])
    fitted = fit_kmeans(points, k=3, seed=0)
    assert fitted.shape == (3, 16)
    assert torch.allclose(fitted.norm(dim=-1), torch.ones(3), atol=1e-5)
    # each true center has a fitted centroid close to it
    assert (centers @ fitted.T).max(dim=1).values.min() > 0.95
    counts = transition_counts([torch.tensor([0, 0, 1]), torch.tensor([2])], 3)
    assert counts[0, 0] == 1 and counts[0, 1] == 1 and counts.sum() == 2
    with pytest.raises(ValueError):
        fit_kmeans(points[:2], k=3)


def test_centroid_file_roundtrip_and_mismatch(tmp_path, encoder):
    fp = encoder_fingerprint(encoder)
    cf = CentroidFile(torch.randn(8, 384), "all-minilm-l6-v2", fp, torch.ones(8, 8), {"k": 8})
    cf.save(tmp_path / "c.pt")
    back = CentroidFile.load(tmp_path / "c.pt")
    assert torch.allclose(back.centroids, cf.centroids) and back.settings == {"k": 8}
    back.check_encoder(fp)
    with pytest.raises(CentroidMismatchError, match="refit"):
        back.check_encoder("0000000000000000")
    other = CentroidFile(
        torch.randn(8, 384),
        "some-other-encoder",
        "deadbeefdeadbeef",
        mean=torch.zeros(384),
        components=torch.linalg.qr(torch.randn(384, 128))[0].T,
    )
    other.save(tmp_path / "other.pt")
    with pytest.raises(CentroidMismatchError):
        partition = PartitionSettings(centroids=str(tmp_path / "other.pt"))
        build_scheme(WatermarkSettings(partition=partition, key="k"), encoder=encoder)


def test_shipped_centroids_belong_to_the_default_encoder(encoder):
    paper = load_watermark_settings([Path(__file__).parents[1] / "configs/ksemstamp-paper.yaml"])
    for cfg, k in ((WatermarkSettings(), 64), (paper, 8)):
        cf = CentroidFile.load(cfg.centroid_path())
        cf.check_encoder(encoder_fingerprint(encoder))
        assert cf.num_regions == k and cf.transition is not None
        assert cf.settings["num_sentences"] >= 10000


def test_default_centroids_ship_inside_the_package():
    import ksemstamp
    from ksemstamp.settings import DEFAULT_CENTROIDS, REPO_ROOT

    package = Path(ksemstamp.__file__).resolve().parent
    for path in DEFAULT_CENTROIDS.values():
        assert path.is_file() and package in path.resolve().parents
        # the checkout's checkpoints/ path keeps working for settings that name it
        old = REPO_ROOT / "checkpoints" / path.name
        assert old.resolve() == path.resolve()
