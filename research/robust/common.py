"""Shared pieces of the robustness study: cached embeddings, features, the kernel.

Every direction-style mark scores a sentence ``x`` as ``s(x) = <N, phi(x)>`` for a key-drawn
Gaussian ``N`` and a key-free feature map ``phi``; over keys the scores of any texts are jointly
normal with covariance ``k(x, y) = <phi(x), phi(y)>``. The shipped default has
``phi(x) = a(x) (x) u(x)`` (soft context weights times the processed vector), so
``k = (a . a')(u . u')``. Two numbers bound detection:

* retention of a sentence under an attack: ``k(x, x') / sqrt(k(x, x) k(x', x'))``, the
  correlation over keys of its score and its attacked counterpart's;
* the effective number of independent sentences of a text, ``N^2 / sum_{t,t'} k_tt'`` (unit
  variances): the z of a text whose sentences all score ``s`` is ``s sqrt(N_eff)``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ksemstamp.assets import load_encoder
from ksemstamp.centroids import CentroidFile
from ksemstamp.encoding import embed
from ksemstamp.io import atomic_target
from ksemstamp.scheme import soft_context_weights
from ksemstamp.text.normalize import normalize_text
from ksemstamp.text.reading import READING_VERSION

RUNS = Path("runs/robust")
DEFAULT_CENTROIDS = "src/ksemstamp/data/centroids-all-minilm-l6-v2-k64.pt"


def cache_path(encoder: str) -> Path:
    """The default store of ``EmbeddingCache(encoder)``: one per encoder spec and reading rule."""
    return RUNS / f"emb-{hashlib.sha1(encoder.encode()).hexdigest()[:8]}-read{READING_VERSION}.pt"


class EmbeddingCache:
    """Base-encoder embeddings of sentences (normalised as the scheme does), kept on disk."""

    def __init__(self, encoder: str = "all-minilm-l6-v2", path: Path | None = None) -> None:
        self.spec = encoder
        self.path = path or cache_path(encoder)
        self.store: dict[str, torch.Tensor] = {}
        if self.path.exists():
            self.store = torch.load(self.path, weights_only=True)
        self._encoder = None

    def __call__(self, sentences: Sequence[str]) -> torch.Tensor:
        keys = [normalize_text(s).text for s in sentences]
        missing = sorted({k for k in keys if k not in self.store})
        if missing:
            if self._encoder is None:
                if self.spec.startswith("file:"):
                    fitted = CentroidFile.load(self.spec[5:])
                    self._encoder = fitted.adapted(load_encoder(fitted.encoder))
                else:
                    self._encoder = load_encoder(self.spec)
            emb = embed(self._encoder, missing, batch_size=64, progress=len(missing) > 500)
            for k, e in zip(missing, emb, strict=True):
                self.store[k] = e.float().cpu()
            self.save()
        if not keys:
            return torch.zeros(0, 384)
        return torch.stack([self.store[k] for k in keys])

    def save(self) -> None:
        """Write the store, merged with what another cache on the same file saved meanwhile
        (a feature map that builds its own cache beside the caller's), through a temporary file
        so that an interrupted save leaves the former file whole."""
        if self.path.exists():
            for k, e in torch.load(self.path, weights_only=True).items():
                self.store.setdefault(k, e)
        with atomic_target(self.path) as tmp:
            torch.save(self.store, tmp)


class BaseFeatures:
    """The shipped default's features: soft contexts (tau) over K centroids, and the embedding
    minus the domain mean with the top ``whiten`` components projected out, unit length."""

    def __init__(
        self,
        centroids: str = DEFAULT_CENTROIDS,
        tau: float = 0.1,
        whiten: int = 64,
        regions: bool = True,
    ) -> None:
        fitted = CentroidFile.load(centroids)
        self.centroids = fitted.centroids.float()
        self.mean = fitted.mean.float()
        comp = fitted.components[:whiten].float() if whiten else None
        self.comp = None if comp is None else torch.linalg.qr(comp.T).Q.T
        self.tau = tau
        self.regions = regions

    def vectors(self, emb: torch.Tensor) -> torch.Tensor:
        v = emb.float() - self.mean
        if self.comp is not None:
            v = v - (v @ self.comp.T) @ self.comp
        return F.normalize(v, dim=-1)

    def contexts(self, emb: torch.Tensor) -> torch.Tensor:
        if not self.regions:
            return torch.ones(len(emb), 1, dtype=torch.float64)
        return soft_context_weights(emb, self.centroids, self.tau)

    def __call__(self, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.vectors(emb).double(), self.contexts(emb).double()


def kernel(f1, f2) -> torch.Tensor:
    """``(N, M)`` covariance over keys of the scores of two feature sets ``(u, a)``."""
    (u1, a1), (u2, a2) = f1, f2
    return (a1 @ a2.T) * (u1 @ u2.T)


def retention(f1, f2) -> torch.Tensor:
    """``(N,)`` correlation over keys of row i of f1 with row i of f2."""
    (u1, a1), (u2, a2) = f1, f2
    k12 = (a1 * a2).sum(-1) * (u1 * u2).sum(-1)
    k11 = (a1 * a1).sum(-1) * (u1 * u1).sum(-1)
    k22 = (a2 * a2).sum(-1) * (u2 * u2).sum(-1)
    return k12 / (k11 * k22).sqrt()


def summed_retention(f1, f2) -> float:
    """Correlation over keys of the summed scores of two texts' units (``f1``, ``f2`` their
    features): the retention of a text, window or merged pair as a whole."""
    k12 = float(kernel(f1, f2).sum())
    return k12 / float(np.sqrt(float(kernel(f1, f1).sum()) * float(kernel(f2, f2).sum())))


def effective_n(feats) -> float:
    """``N^2 / sum k`` of one text's unit-variance scores."""
    k = kernel(feats, feats)
    d = k.diagonal().sqrt()
    k = k / d[:, None] / d[None, :]
    return float(len(k) ** 2 / k.sum())


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summary(values) -> dict:
    v = np.asarray(list(values), dtype=float)
    if not len(v):
        return {}
    return {
        "n": int(len(v)),
        "mean": float(v.mean()),
        "median": float(np.median(v)),
        "p10": float(np.quantile(v, 0.1)),
        "p90": float(np.quantile(v, 0.9)),
    }
