"""The checkpoint setting refuses every file that is not a train.py final checkpoint."""

import pytest
import torch

from ksemstamp.builders import load_centroids
from ksemstamp.cli import main
from ksemstamp.scheme.centroids import CentroidFile, IncompleteCentroidsError
from ksemstamp.scheme.checkpoint import CheckpointError, checkpoint_centroids, read_checkpoint
from ksemstamp.settings import WatermarkSettings


def _ckpt(tmp_path, name="final.ckpt", **ksemstamp):
    path = tmp_path / name
    state = {"centroids": torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)}
    torch.save({"state_dict": state, "hyper_parameters": {}, "ksemstamp": ksemstamp}, path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.ckpt", "checkpoint not found"),
        (lambda p: (p / "x.ckpt").write_text("hello") and p / "x.ckpt", "not a PyTorch checkpoint"),
        (
            lambda p: torch.save({"a": 1}, p / "y.ckpt") or p / "y.ckpt",
            "not a checkpoint that train.py wrote",
        ),
        (
            lambda p: torch.save({"centroids": torch.ones(2, 2)}, p / "c.pt") or p / "c.pt",
            "centroid file",
        ),
        (lambda p: _ckpt(p, "last.ckpt", centroids_fitted=False), "use final.ckpt"),
    ],
)
def test_anything_but_a_final_checkpoint_is_refused_in_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(CheckpointError, match=message) as info:
        read_checkpoint(path)
    assert "\n" not in str(info.value)


def test_a_checkpoint_without_the_centroid_file_is_refused_for_the_direction_mark(tmp_path, capsys):
    # What train.py wrote before checkpoints carried the centroid file: centroids, no mean.
    path = _ckpt(tmp_path, centroids_fitted=True, encoder_fingerprint="abc")
    fitted = checkpoint_centroids(path)
    assert fitted.mean is None and fitted.encoder == str(path) and fitted.num_regions == 4
    with pytest.raises(IncompleteCentroidsError, match="embedding mean.*train again"):
        load_centroids(
            WatermarkSettings.from_dict({"model": {"checkpoint": str(path)}, "key": "k"})
        )
    # The region mark needs no mean.
    load_centroids(
        WatermarkSettings.from_dict(
            {
                "model": {"checkpoint": str(path)},
                "mark": {"kind": "region", "gamma": 0.5},
                "key": "k",
            }
        )
    )
    # On the command line: one line, exit status 2, before any model is loaded.
    assert main(["detect", "--model.checkpoint", str(path), "--text", "One. Two."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint") and "refit" in err and err.count("\n") == 1


def test_the_centroid_file_inside_a_checkpoint_is_used_whole(tmp_path):
    inside = CentroidFile(
        torch.randn(4, 8), "ignored", "abc", torch.ones(4, 4), {"k": 4}, torch.zeros(8)
    )
    inside.components = torch.linalg.qr(torch.randn(8, 8)).Q[:, :4].T.contiguous()
    path = _ckpt(tmp_path, centroids_fitted=True, centroid_file=inside.to_payload())
    fitted = load_centroids(
        WatermarkSettings.from_dict(
            {"model": {"checkpoint": str(path)}, "mark": {"remove_components": 4}, "key": "k"}
        )
    )
    assert fitted.encoder == str(path) and torch.equal(fitted.mean, inside.mean)
    assert torch.equal(fitted.transition, inside.transition)
    assert torch.equal(fitted.components, inside.components)
    # More components than the file holds: refused with the way to a complete file.
    with pytest.raises(IncompleteCentroidsError, match="5 principal components.*holds 4"):
        load_centroids(
            WatermarkSettings.from_dict(
                {"model": {"checkpoint": str(path)}, "mark": {"remove_components": 5}, "key": "k"}
            )
        )
