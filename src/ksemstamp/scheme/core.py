"""The watermark scheme shared by generation and detection: encoder, partition, the key's rule.

Generator and detector are built from the same ``WatermarkScheme``, so they cannot disagree on
how a sentence maps to a region, which regions are valid or how a sentence is scored.

Two marks (``mark``):

* ``region`` (k-SemStamp, SemStamp): a sentence is valid when its region is in the valid set
  that the key draws for the previous sentence's region (``table``).
* ``direction``: the key draws a direction ``n_r`` for each region ``r``; a sentence's score is
  the projection of its centred unit embedding on the direction of its *context*, the previous
  sentence. The generator keeps candidates that score high; the detector adds the scores up
  (see ``stats.direction_z``). A paraphrase moves a sentence's embedding a little and its score
  a little, where under ``region`` it may move the sentence across a border and lose it whole.

A context is a weight vector over the regions (``context_weights``), and its direction is
``sum_r w_r n_r``. With ``context_temperature = 0`` the weights are the previous sentence's
region alone (one of K directions). A paraphrase that moves the previous sentence into another
region then hands the sentence a direction independent of the one it was chosen for, and its
evidence is lost. With a temperature ``tau > 0`` the weights are a softmax of the previous
sentence's cosine similarities to the centroids (divided by ``tau``, weights under 1% of the
largest dropped, unit length): a paraphrase moves them a little, and the direction with them.

Whose context: ``previous`` scores a sentence on the context of the sentence before it (the
text's order then carries the evidence: moving, merging or interleaving sentences scores them on
unrelated directions); ``own`` on its own context, so a sentence's score depends on the
sentence alone and survives any reordering, cropping or mixing of the text.

Whitening: the vectors scored are the embeddings minus the domain mean, with the domain's top
principal components (``components``, what sentences on one topic share) projected out, unit
length. Sentences of one text then point alike less often, so the scores of a text vary more
independently and the same selection among candidates yields a larger z.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..keys import key_fingerprint, keyed_directions, start_region, valid_table
from ..settings.groups import DirectionSettings, MarkSettings
from ..text.normalize import normalize_text
from ..text.splitter import PunktSplitter
from .encoding import embed, encoder_device

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
    """Maps sentences to regions and decides which regions are valid after which, or which
    direction scores a sentence.

    Its tensors (partition, valid table, directions, mean, components) sit on the encoder's
    device (``device``) and everything it returns is computed there: embeddings never leave
    the device between the encoder and the statistic. The key's table and directions are drawn
    on the CPU and moved, so they are the same on every device.

    Args:
        encoder: a ``SentenceTransformer`` (or anything with ``encode``).
        partition: ``KMeansPartition`` or ``LSHPartition``.
        key: the secret key (kept in memory only; never stored or printed).
        splitter: the sentence splitter.
        mark: the mark's settings: ``RegionSettings`` (the valid-region table of ``gamma`` and
            ``valid_mode``) or ``DirectionSettings`` (keyed directions; ``context`` and
            ``context_temperature``, k-means partitions only above 0; see the module
            docstring). ``None``: the default mark's.
        transition: optional ``(K, K)`` domain transition counts, for acceptance estimates.
        center: ``(D,)`` domain mean embedding subtracted before a ``direction`` score (the
            part all sentences of a domain share carries no information and only adds to the
            variance of the score); ``None`` subtracts nothing.
        components: ``(M, D)`` the domain's top principal components, projected out of the
            ``direction`` mark's vectors (``None``: none).
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
        mark = DirectionSettings() if mark is None else mark
        direction = mark.kind == "direction"
        self.settings = mark
        self.mark = mark.kind
        self.gamma = None if direction else float(mark.gamma)
        self.valid_mode = "keyed" if direction else mark.valid_mode
        self.context = mark.context if direction else "previous"
        self.context_temperature = float(mark.context_temperature) if direction else 0.0
        if self.context_temperature > 0 and not hasattr(partition, "centroids"):
            raise ValueError("a context temperature needs a k-means partition (centroids)")
        self.encoder = encoder
        self.device = encoder_device(encoder)
        self.partition = partition.to(self.device)
        self.splitter = splitter
        self.table: Tensor | None = None
        self.directions: Tensor | None = None
        if not direction:
            table = valid_table(partition.num_regions, mark.gamma, key, self.valid_mode)
            self.table = table.to(self.device)
        else:
            dim = int(encoder.get_embedding_dimension())
            self.directions = keyed_directions(partition.num_regions, dim, key).to(self.device)
        self.center = None
        if center is not None:
            self.center = center.float().reshape(-1).to(self.device)
        self.components = None
        if components is not None and len(components):
            # Orthonormal rows, so the projection is v - (v C^T) C; factored on the CPU, so
            # that every device scores on the same components.
            basis = torch.linalg.qr(components.float().cpu().T).Q.T.contiguous()
            self.components = basis.to(self.device)
        # Seeds the first sentence of a text that continues none (empty prompt, chat answer);
        # generation only: never shown, as it is derived from the key.
        self.start_region = start_region(partition.num_regions, key, self.valid_mode)
        self.key_fingerprint = key_fingerprint(key) if self.valid_mode == "keyed" else "paper"
        self.encode_batch_size = encode_batch_size
        self.transition = transition

    def __repr__(self) -> str:  # never show the key
        whiten = 0 if self.components is None else len(self.components)
        return (
            f"WatermarkScheme(mark={self.mark}, context={self.context}, whiten={whiten}, "
            f"context_temperature={self.context_temperature:g}, partition={type(self.partition).__name__}, "
            f"K={self.num_regions}, gamma={self.gamma}, mode={self.valid_mode}, "
            f"key_fingerprint={self.key_fingerprint})"
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

    def vectors(self, emb: Tensor) -> Tensor:
        """``(N, D)`` what the ``direction`` mark scores: embeddings minus ``center``, with the
        ``components`` projected out, unit norm.

        Key-free: the detector's scoring plans keep these, and any key's scores follow from them.
        """
        emb = emb.float()
        if self.center is not None:
            emb = emb - self.center
        if self.components is not None:
            emb = emb - (emb @ self.components.T) @ self.components
        return torch.nn.functional.normalize(emb, dim=-1)

    def context_weights(self, emb: Tensor, regions: Tensor | None = None) -> Tensor:
        """``(N, K)`` float64 context weights that ``(N, D)`` sentence embeddings give the
        sentence after each (key-free): the one-hot region at temperature 0 (``regions``, when
        the caller has located them already), else the softmax of the cosines to the centroids
        over the temperature, weights under ``WEIGHT_FLOOR`` of the largest dropped, unit
        length."""
        if self.context_temperature == 0:
            if regions is None:
                regions, _ = self.locate(emb.float())
            return self.region_weights(regions)
        return soft_context_weights(emb, self.partition.centroids, self.context_temperature)

    def region_weights(self, regions: Tensor | Sequence[int]) -> Tensor:
        """``(N, K)`` one-hot context weights of ``regions`` (a known region, or the keyed start
        value of a text that continues nothing)."""
        index = torch.as_tensor(regions, dtype=torch.long, device=self.device).reshape(-1)
        return torch.nn.functional.one_hot(index, self.num_regions).double()

    def scores(self, vectors: Tensor, contexts: Tensor | Sequence[int]) -> Tensor:
        """``(N,)`` direction scores: each row of ``vectors`` projected on the direction of its
        context: ``(N, K)`` weights (``context_weights``), or ``(N,)`` regions, each the context
        of a sentence following that region at temperature 0 (``direction`` mark only)."""
        if self.directions is None:
            raise ValueError("scores are defined for the direction mark only")
        contexts = torch.as_tensor(contexts, device=vectors.device)
        if contexts.ndim == 1:
            contexts = self.region_weights(contexts)
        directions = contexts.float() @ self.directions
        return (directions * vectors.float()).sum(dim=-1)

    def is_valid(self, previous: Tensor | int, region: Tensor | int) -> Tensor:
        """Whether ``region`` is valid after ``previous`` (element-wise on tensors; ``region``
        mark only)."""
        if self.table is None:
            raise ValueError("valid regions are defined for the region mark only")
        device = self.table.device
        return self.table[
            torch.as_tensor(previous, device=device), torch.as_tensor(region, device=device)
        ]

    def acceptance_rate(self, previous: int) -> float:
        """Estimated chance that the LM's next sentence lands in a valid region after ``previous``.

        From the domain transition counts (add-one smoothed) when the partition came with them,
        else ``gamma`` (regions taken as independent and equally likely).
        """
        if self.table is None:
            raise ValueError("acceptance_rate is defined for the region mark only")
        if self.transition is None:
            return self.gamma
        row = self.transition[previous].double().cpu() + 1.0
        return float((row / row.sum())[self.table[previous].cpu()].sum())
