from pathlib import Path

import pytest
import torch

from ksemstamp.assets import encoder_fingerprint
from ksemstamp.centroids import CentroidFile, CentroidMismatchError, fit_kmeans, transition_counts
from ksemstamp.config import WatermarkConfig, build_scheme, load_settings_file


def test_validation_lists_every_problem():
    with pytest.raises(ValueError) as err:
        WatermarkConfig(gamma=1.5, margin=-1, candidate_batch=0, partition="grid")
    message = str(err.value)
    for word in ("gamma", "margin", "candidate_batch", "partition"):
        assert word in message


def test_key_never_in_dict_or_repr():
    cfg = WatermarkConfig(key="super-secret-value")
    assert "super-secret-value" not in repr(cfg)
    assert "key" not in cfg.to_dict()


def test_yaml_roundtrip_and_unknown_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gamma: 0.5\nmargin: 0.01\n")
    cfg = WatermarkConfig.from_yaml(path, seed=3)
    assert (cfg.gamma, cfg.margin, cfg.seed) == (0.5, 0.01, 3)
    path.write_text("gama: 0.5\n")
    with pytest.raises(ValueError, match="unknown settings"):
        WatermarkConfig.from_yaml(path)


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
        build_scheme(
            WatermarkConfig(centroids=str(tmp_path / "other.pt"), key="k"), encoder=encoder
        )


def test_shipped_centroids_belong_to_the_default_encoder(encoder):
    paper = WatermarkConfig.from_dict(
        load_settings_file(Path(__file__).parents[1] / "configs/ksemstamp-paper.yaml")
    )
    for cfg, k in ((WatermarkConfig(), 64), (paper, 8)):
        cf = CentroidFile.load(cfg.centroid_path())
        cf.check_encoder(encoder_fingerprint(encoder))
        assert cf.num_regions == k and cf.transition is not None
        assert cf.settings["num_sentences"] >= 10000


def test_default_centroids_ship_inside_the_package():
    import ksemstamp
    from ksemstamp.config import DEFAULT_CENTROIDS, REPO_ROOT

    package = Path(ksemstamp.__file__).resolve().parent
    for path in DEFAULT_CENTROIDS.values():
        assert path.is_file() and package in path.resolve().parents
        # the checkout's checkpoints/ path keeps working for settings that name it
        old = REPO_ROOT / "checkpoints" / path.name
        assert old.resolve() == path.resolve()


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_watermark_config_loads(path):
    # A typo in a shipped file (an unknown key, a bad value) fails here, not in a user's run.
    cfg = WatermarkConfig.from_dict(load_settings_file(path))
    assert cfg.max_candidates >= 1


def test_choices_are_literal_types_checked_once():
    from typing import get_args

    from ksemstamp.assets import LM_DTYPES
    from ksemstamp.settings import LmDtype, WatermarkConfig, _choices

    choices = _choices(WatermarkConfig)
    assert {"lm_dtype", "partition", "valid_mode", "mark", "context", "statistic"} <= set(choices)
    assert set(get_args(LmDtype)) == set(LM_DTYPES)
    with pytest.raises(ValueError, match=r"context must be one of \['own', 'previous'\]"):
        WatermarkConfig(context="next")
