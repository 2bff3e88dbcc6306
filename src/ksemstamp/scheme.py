"""The watermark scheme shared by generation and detection: encoder, partition, valid table.

Generator and detector are built from the same ``WatermarkScheme``, so they cannot disagree on
how a sentence maps to a region or which regions are valid.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .encoding import embed
from .keys import key_fingerprint, start_region, valid_table
from .splitter import PunktSplitter


class WatermarkScheme:
    """Maps sentences to regions and decides which regions are valid after which.

    Args:
        encoder: a ``SentenceTransformer`` (or anything with ``encode``).
        partition: ``KMeansPartition`` or ``LSHPartition``.
        gamma: share of valid regions per row of the table.
        key: the secret key (kept in memory only; never stored or printed).
        valid_mode: ``keyed`` (HMAC table, default) or ``paper`` (public seeded table).
        splitter: the sentence splitter.
        transition: optional ``(K, K)`` domain transition counts, for acceptance estimates.
        encode_batch_size: encoder batch size.
    """

    def __init__(
        self,
        encoder,
        partition: nn.Module,
        gamma: float,
        key: str,
        splitter: PunktSplitter,
        valid_mode: str = "keyed",
        transition: Tensor | None = None,
        encode_batch_size: int = 64,
    ) -> None:
        self.encoder = encoder
        self.partition = partition
        self.gamma = float(gamma)
        self.splitter = splitter
        self.valid_mode = valid_mode
        self.table = valid_table(partition.num_regions, gamma, key, valid_mode)
        # Seeds the first sentence of a text that continues none (empty prompt, chat answer);
        # generation only: never shown, as it is derived from the key.
        self.start_region = start_region(partition.num_regions, key, valid_mode)
        self.key_fingerprint = key_fingerprint(key) if valid_mode == "keyed" else "paper"
        self.encode_batch_size = encode_batch_size
        self.transition = transition

    def __repr__(self) -> str:  # never show the key
        return (
            f"WatermarkScheme(partition={type(self.partition).__name__}, "
            f"K={self.num_regions}, gamma={self.gamma}, mode={self.valid_mode}, "
            f"key_fingerprint={self.key_fingerprint})"
        )

    @property
    def num_regions(self) -> int:
        return int(self.partition.num_regions)

    def regions(self, sentences: Sequence[str], progress: bool = False) -> tuple[Tensor, Tensor]:
        """Regions ``(N,)`` and margin masks ``(N,)`` of sentences, in one encoder pass
        (``progress``: the encoder's progress bar)."""
        if not sentences:
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty.bool()
        emb = embed(self.encoder, sentences, batch_size=self.encode_batch_size, progress=progress)
        regions, margin_ok = self.partition(emb)
        return regions.cpu(), margin_ok.cpu()

    def is_valid(self, previous: Tensor | int, region: Tensor | int) -> Tensor:
        """Whether ``region`` is valid after ``previous`` (element-wise on tensors)."""
        return self.table[torch.as_tensor(previous), torch.as_tensor(region)]

    def acceptance_rate(self, previous: int) -> float:
        """Estimated chance that the LM's next sentence lands in a valid region after ``previous``.

        From the domain transition counts (add-one smoothed) when the partition came with them,
        else ``gamma`` (regions taken as independent and equally likely).
        """
        if self.transition is None:
            return self.gamma
        row = self.transition[previous].double() + 1.0
        return float((row / row.sum())[self.table[previous]].sum())
