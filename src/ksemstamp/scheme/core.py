"""The watermark scheme shared by generation and detection: encoder, partition, key, mark settings.

Generator and detector are built from the same ``WatermarkScheme``, so they cannot disagree on
how a unit maps to a region or which mark, under which key, scores it. The scheme is key-free
apart from holding the key in memory: the key's material (a valid table, directions) and
everything that reads it belong to the mark (``marks``), which the ``Detector`` and the
``Watermarker`` make from the scheme's settings (``marks.build_mark``).

What the scheme holds beside the encoder and partition are the domain's statistics from the
centroid file, which a mark may use: the mean embedding (``center``), the top principal
components (``components``) and the region transition counts (``transition``).
``soft_context_weights`` is the softmax of a unit's cosines to the centroids, which contexts
and steering share.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..keys import key_fingerprint
from ..settings.groups import DirectionSettings, MarkSettings
from ..text.normalize import normalize_text
from ..text.splitter import PunktSplitter
from .encoding import embed, encoder_device
from .keyed import start_region

WEIGHT_FLOOR = 0.01
"""Soft context weights below this share of a context's largest weight are dropped."""


def soft_context_weights(emb: Tensor, centroids: Tensor, temperature: float) -> Tensor:
    """``(N, K)`` float64 soft context weights of ``(N, D)`` embeddings (on their device): the
    softmax of their cosines to ``(K, D)`` centroids over ``temperature > 0``, weights under
    ``WEIGHT_FLOOR`` of the largest set to zero, unit length."""
    emb = torch.nn.functional.normalize(emb.float(), dim=-1)
    cos = emb @ torch.nn.functional.normalize(centroids.float().to(emb.device), dim=-1).T
    weights = torch.exp((cos - cos.max(dim=-1, keepdim=True).values).double() / temperature)
    weights = weights.masked_fill(weights < WEIGHT_FLOOR, 0.0)
    return torch.nn.functional.normalize(weights, dim=-1)


class WatermarkScheme:
    """Maps units to regions, and holds what the mark of its settings is made from.

    Its tensors (partition, center, components) sit on the encoder's device (``device``) and
    everything it returns is computed there.

    Args:
        encoder: a ``SentenceTransformer`` (or anything with ``encode``).
        partition: ``KMeansPartition`` or ``LSHPartition``.
        key: the secret key (kept in memory only; never stored or printed), ``None`` for a mark
            whose table is public.
        splitter: the unit splitter.
        mark: the mark's settings (``settings.groups.MARK_KINDS``); ``None``: the default mark's.
        transition: optional ``(K, K)`` domain transition counts, for acceptance estimates.
        center: ``(D,)`` the domain's mean embedding (``None``: none).
        components: ``(M, D)`` the domain's top principal components (``None``: none).
        encode_batch_size: encoder batch size.
    """

    def __init__(
        self,
        encoder,
        partition: nn.Module,
        key: str | None,
        splitter: PunktSplitter,
        mark: MarkSettings | None = None,
        transition: Tensor | None = None,
        center: Tensor | None = None,
        components: Tensor | None = None,
        encode_batch_size: int = 64,
    ) -> None:
        self.settings = DirectionSettings() if mark is None else mark
        self.encoder = encoder
        self.device = encoder_device(encoder)
        self.partition = partition.to(self.device)
        self.splitter = splitter
        self.key = key
        self.center = None if center is None else center.float().reshape(-1).to(self.device)
        self.components = None
        if components is not None and len(components):
            self.components = components.float().to(self.device)
        keyed = self.settings.keyed
        mode = "keyed" if keyed else "paper"
        # Seeds the first unit of a text that continues none (empty prompt, chat answer);
        # generation only: never shown, as it is derived from the key.
        self.start_region = start_region(partition.num_regions, key, mode)
        self.key_fingerprint = key_fingerprint(key) if keyed else "paper"
        self.encode_batch_size = encode_batch_size
        self.transition = transition
        self.identity: dict | None = None
        """What a detector must share with the generator (``settings.identity``), set by the
        builder that loaded the encoder and the centroids; ``None``: not known."""

    def __repr__(self) -> str:  # never show the key
        return (
            f"WatermarkScheme(mark={self.settings!r}, partition={type(self.partition).__name__}, "
            f"K={self.num_regions}, key_fingerprint={self.key_fingerprint})"
        )

    @property
    def num_regions(self) -> int:
        return int(self.partition.num_regions)

    def embed(self, sentences: Sequence[str], progress: bool = False) -> Tensor:
        """``(N, D)`` unit embeddings of sentences in their normalised form (``normalize``;
        the splitter's sentences are already), in one encoder pass (``progress``: the
        encoder's progress bar)."""
        sentences = [normalize_text(s).text for s in sentences]
        return embed(self.encoder, sentences, batch_size=self.encode_batch_size, progress=progress)

    def regions(self, sentences: Sequence[str], progress: bool = False) -> tuple[Tensor, Tensor]:
        """Regions ``(N,)`` and margin masks ``(N,)`` of sentences, in one encoder pass."""
        return self.locate(self.embed(sentences, progress=progress))

    def locate(self, emb: Tensor) -> tuple[Tensor, Tensor]:
        """Regions ``(N,)`` and margin masks ``(N,)`` of ``(N, D)`` embeddings."""
        if len(emb) == 0:
            empty = torch.empty(0, dtype=torch.long, device=emb.device)
            return empty, empty.bool()
        return self.partition(emb)
