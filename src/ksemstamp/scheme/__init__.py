"""The watermark scheme and its pieces: how a sentence becomes a region, a vector and a score.
May import: ksemstamp core modules and settings, text; never cli, builders, watermarker, detector, marks or training.

* ``core``: ``WatermarkScheme``, what generation and detection share (encoder, partition, key,
  the mark's rule);
* ``encoding``: sentences to unit vectors on the encoder's device; ``partition``: regions of
  k-means centroids (k-SemStamp) or random hyperplanes (SemStamp), and their margins;
* ``centroids``: centroid files (centroids, domain mean, components, the encoder's
  fingerprint) and ``ksemstamp centroids``, which fits them; ``adapter``: an encoder's
  low-rank adapters, shipped inside a centroid file;
* ``keys``: the secret key, its checks, and what it draws (directions, valid tables, the start
  value); ``cudarand``: the reference code's CUDA permutation, for the paper's public table.

``WatermarkScheme`` is importable from here, loaded on first use (``keys`` is read by commands
that must answer before torch is imported).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"WatermarkScheme": "core", "soft_context_weights": "core"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
