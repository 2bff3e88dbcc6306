"""A trained adapter at a fraction of its strength, with centroids refitted for it.

The kernel objective's adapter (``checkpoints/centroids-all-minilm-l6-v2-kernel-k64.pt``) raises
what a sentence keeps under a paraphrase, and widens the spread of false positives over keys.
A LoRA update is ``(alpha / rank) B A``; scaling ``alpha`` by ``s`` moves the encoder a fraction
``s`` of the way from the base weights to the trained ones. This writes a centroid file for that
encoder: the same adapter with ``alpha * s``, and the K = 64 centroids, domain mean and
components refitted on its embeddings of the same domain sentences as the shipped files (fit
split of the bundled news corpus, sentences of >= 5 words, 20,000 at most, k-means seed 0).

    python -m research.robust.scaled --scale 0.5 --output runs/robust/scaled-0.5.pt

The file is read by every command that takes a centroid file (``--partition.centroids``) and by
``research.robust.bounds --features file:PATH``.
"""

from __future__ import annotations

import argparse
import copy

from ksemstamp.centroids import CentroidFile, fit_centroid_file

TRAINED = "checkpoints/centroids-all-minilm-l6-v2-kernel-k64.pt"


def scaled_adapter(payload: dict | None, scale: float) -> dict:
    """A copy of the adapter ``payload`` (``ksemstamp.adapter.adapter_payload``) whose update
    is ``scale`` times the original's: merged, it moves each weight ``scale`` of the way from
    the base to the trained one."""
    if payload is None:
        raise ValueError("the centroid file holds no adapter")
    if not scale > 0.0:
        raise ValueError(f"scale must be > 0, got {scale}")
    scaled = copy.deepcopy(payload)
    scaled["alpha"] = float(payload["alpha"]) * scale
    return scaled


def scaled_file(
    trained: CentroidFile, scale: float, origin: str = TRAINED, seed: int = 0
) -> CentroidFile:
    """``trained`` (read from ``origin``)'s adapter at ``scale`` of its strength, with centroids
    refitted for it."""
    adapter = scaled_adapter(trained.adapter, scale)
    fitted = fit_centroid_file(trained.encoder, k=trained.num_regions, seed=seed, adapter=adapter)
    fitted.check_encoder(trained.encoder_fingerprint, trained.encoder)
    fitted.settings |= {"adapter_of": origin, "adapter_scale": scale}
    return fitted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, required=True)
    p.add_argument("--trained", default=TRAINED)
    p.add_argument("--output", required=True)
    a = p.parse_args()
    scaled_file(CentroidFile.load(a.trained), a.scale, a.trained).save(a.output)
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
