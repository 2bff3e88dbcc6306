"""Watermarking straight from a training checkpoint: the fine-tuned encoder and its centroids.

``train.py`` ends by writing ``final.ckpt`` (``KMeansCallback``): the encoder's weights, the
k-means ``centroids`` buffer, and under ``checkpoint["ksemstamp"]["centroid_file"]`` the complete
centroid file (mean, transitions, source, K). The ``model.checkpoint`` setting
(``--model.checkpoint PATH``, ``model: {checkpoint: PATH}`` in YAML) takes the encoder and the
centroids from there instead of ``model.encoder`` and ``partition.centroids``.

Anything else is refused with one line saying what it is: a missing file, a file that is not a
PyTorch checkpoint, a centroid file, a checkpoint of another program, and Lightning's
``last.ckpt`` or per-epoch checkpoints, which are written before the centroids are fitted.
Checkpoints are read with ``weights_only=True``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .centroids import CentroidFile


class CheckpointError(ValueError):
    """A file that is not a usable ``train.py`` checkpoint; the message says why."""


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint dict of a ``final.ckpt`` that ``train.py`` wrote, checked (tensors are
    memory-mapped, so reading it for the centroids alone is cheap)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # pickle, zip and format errors alike
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({first})") from None
    if isinstance(ckpt, dict) and "centroids" in ckpt and "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path} is a centroid file: pass it as `partition.centroids`, not `model.checkpoint`"
        )
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "ksemstamp" not in ckpt:
        raise CheckpointError(
            f"{path} is not a checkpoint that train.py wrote (it has no ksemstamp section)"
        )
    if not ckpt["ksemstamp"].get("centroids_fitted"):
        raise CheckpointError(
            f"{path} holds no fitted centroids: last.ckpt and the per-epoch checkpoints are "
            "written before k-means; use final.ckpt, which train.py writes when training ends"
        )
    return ckpt


def checkpoint_centroids(path: str | Path, ckpt: dict | None = None) -> CentroidFile:
    """The centroid file inside a ``train.py`` checkpoint (its ``encoder`` is the checkpoint).

    A checkpoint of an earlier version holds the centroids without the centroid file: they come
    back without mean or transitions, and ``CentroidFile.require`` refuses them for the
    direction mark.
    """
    ckpt = ckpt if ckpt is not None else read_checkpoint(path)
    info = ckpt["ksemstamp"]
    payload = info.get("centroid_file")
    if payload is None:
        return CentroidFile(
            centroids=ckpt["state_dict"]["centroids"].float().clone(),
            encoder=str(path),
            encoder_fingerprint=info.get("encoder_fingerprint", ""),
        )
    fitted = CentroidFile.from_payload(payload, str(path))
    fitted.encoder = str(path)
    return fitted


REFIT = (
    "train again (final.ckpt then holds the centroid file), or fit centroids for the exported "
    "encoder (`ksemstamp centroids --encoder EXPORT_DIR --output FILE`) and pass "
    "`model.encoder` and `partition.centroids` instead of `model.checkpoint`"
)
"""How to get what an incomplete checkpoint lacks (``CentroidFile.require``'s ``refit``)."""


def load_checkpoint_encoder(
    path: str | Path, device: str | torch.device = "cpu", ckpt: dict | None = None
):
    """The fine-tuned ``SentenceTransformer`` of a ``train.py`` checkpoint, in eval mode on
    ``device``: the base encoder its hyperparameters name (it must be loadable here), with the
    adapters training added (merged into plain layers) and the checkpoint's weights, checked
    against the fingerprint the checkpoint records. Nothing of the training code is needed."""
    from ..assets import encoder_fingerprint, load_encoder
    from .adapter import adapter_id, adapter_payload, add_adapters, merge_adapters

    ckpt = ckpt if ckpt is not None else read_checkpoint(path)
    hparams = ckpt.get("hyper_parameters", {})
    if not isinstance(hparams.get("encoder"), str):
        raise CheckpointError(f"{path} does not name the encoder it was trained from")
    encoder = load_encoder(hparams["encoder"], "cpu")
    if hparams.get("max_seq_length"):
        encoder.max_seq_length = hparams["max_seq_length"]
    rank, alpha = hparams.get("adapter_rank", 0), hparams.get("adapter_alpha", 16.0)
    if rank:
        add_adapters(encoder, rank, alpha)
    prefix = "encoder."
    weights = {k[len(prefix) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    encoder.load_state_dict(weights)
    encoder = encoder.to(device).eval()
    recorded = ckpt["ksemstamp"].get("encoder_fingerprint")
    if recorded and encoder_fingerprint(encoder) != recorded:
        raise CheckpointError(
            f"{path}: the encoder rebuilt from it has fingerprint {encoder_fingerprint(encoder)}, "
            f"but the checkpoint records {recorded}; was it written by another version?"
        )
    if rank:
        # Trained with adapters: merged into plain layers, and marked as adapted by the
        # checkpoint's own adapter, which its centroid file carries.
        payload = adapter_payload(encoder, rank, alpha)
        merge_adapters(encoder)
        encoder.ksemstamp_adapter = adapter_id(payload)
    return encoder
