"""Fitting, saving and loading k-SemStamp centroids.

A centroid file is a ``torch.save`` dict of tensors and plain types (loadable with
``weights_only=True``)::

    centroids            (K, D) float32, unit norm
    encoder              the encoder spec the centroids were fitted with
    encoder_fingerprint  hash of that encoder's weights (see ``assets.encoder_fingerprint``)
    transition           (K, K) float64 counts of region q -> region j between consecutive
                         domain sentences (used to size candidate batches)
    mean                 (D,) float32 mean of the unit embeddings the centroids were fitted on
                         (the ``direction`` mark scores embeddings minus this)
    components           (M, D) float32, the top M = min(128, D) principal directions of those
                         centred embeddings, largest first (the ``direction`` mark projects the
                         first ``mark.remove_components`` of them out of what it scores)
    settings             dict: k, seed, num_sentences, num_documents, source (where the
                         sentences came from)

Every writer (``ksemstamp centroids``, ``KMeansCallback``'s export, the final training
checkpoint, which holds the same dict) builds it with ``centroid_file_from``. Generation and
detection refuse a file whose fingerprint differs from the loaded encoder's, and a file that
lacks what the configured mark needs (``CentroidFile.require``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from ..assets import DEFAULT_ENCODER
from ..io import atomic_target
from ..settings.checks import SEED, Range

if TYPE_CHECKING:
    from torch import Tensor

# torch is imported where it is used: the ``centroids`` command's options are read without it.

DEFAULT_REGIONS = 64
"""K of the default mark's centroids (the shipped file); the paper's K is 8."""

FORMAT_VERSION = 1
NUM_COMPONENTS = 128
"""Principal components a centroid file stores (the default mark uses the first 64)."""


class CentroidMismatchError(ValueError):
    """Centroids were fitted for a different encoder than the one in use."""


class IncompleteCentroidsError(ValueError):
    """A centroid file lacks something the configured mark needs."""


@dataclass
class CentroidFile:
    """Centroids plus the identity of the encoder they belong to."""

    centroids: Tensor
    encoder: str
    encoder_fingerprint: str
    transition: Tensor | None = None
    settings: dict = field(default_factory=dict)
    mean: Tensor | None = None
    components: Tensor | None = None
    adapter: dict | None = None
    """Adapters (``ksemstamp.scheme.adapter``) that turn the encoder named here, whose fingerprint is
    ``encoder_fingerprint``, into the one the centroids belong to; ``None``: the encoder as
    it is."""

    @property
    def num_regions(self) -> int:
        return int(self.centroids.shape[0])

    def content_fingerprint(self) -> str:
        """A short hash of what a detector scores with: the centroids, the domain's mean and
        components, and the adapter's weights (not the file's path or its settings)."""
        import hashlib

        digest = hashlib.sha256()
        for tensor in (self.centroids, self.mean, self.components):
            if tensor is not None:
                digest.update(tensor.float().cpu().contiguous().numpy().tobytes())
        if self.adapter is not None:
            from .adapter import adapter_id

            digest.update(adapter_id(self.adapter).encode())
        return digest.hexdigest()[:16]

    def to_payload(self) -> dict:
        """The file's dict: tensors and plain types only (``weights_only`` loading)."""
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
        if self.components is not None:
            payload["components"] = self.components.float().cpu()
        if self.adapter is not None:
            payload["adapter"] = self.adapter
        return payload

    @classmethod
    def from_payload(cls, payload: object, origin: str) -> CentroidFile:
        """The inverse of ``to_payload``; ``origin`` names the file in errors."""
        if not isinstance(payload, dict) or "centroids" not in payload:
            raise ValueError(f"{origin} is not a ksemstamp centroid file")
        return cls(
            centroids=payload["centroids"],
            encoder=payload.get("encoder", ""),
            encoder_fingerprint=payload.get("encoder_fingerprint", ""),
            transition=payload.get("transition"),
            settings=payload.get("settings", {}),
            mean=payload.get("mean"),
            components=payload.get("components"),
            adapter=payload.get("adapter"),
        )

    def save(self, path: str | Path) -> None:
        """Write atomically (temporary file, then rename)."""
        import torch

        with atomic_target(path) as tmp:
            torch.save(self.to_payload(), tmp)

    @classmethod
    def load(cls, path: str | Path) -> CentroidFile:
        """The centroid file at ``path``; raises ``ValueError`` naming what it is instead."""
        import torch

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"centroid file not found: {path}")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # pickle, zip and format errors alike
            raise ValueError(f"{path} is not a ksemstamp centroid file ({err})") from None
        if isinstance(payload, dict) and "state_dict" in payload:
            raise ValueError(f"{path} is a training checkpoint: pass it as `model.checkpoint`")
        return cls.from_payload(payload, str(path))

    def require(
        self,
        who: str,
        origin: str,
        refit: str | None = None,
        mean: bool = False,
        components: int = 0,
    ) -> None:
        """Raise ``IncompleteCentroidsError`` unless this file has what ``who`` (``the
        direction mark``) needs (``MarkSettings.domain_needs``): the domain's ``mean``, and
        this many principal ``components``.

        ``origin`` names the file; ``refit`` is the command that makes a complete one (by
        default ``ksemstamp centroids`` for this file's encoder and K).
        """
        missing = []
        if not self.encoder_fingerprint:
            missing.append("the encoder's fingerprint")
        if mean and self.mean is None:
            missing.append(f"the embedding mean {who} subtracts")
        k = self.settings.get("k")
        if k is not None and int(k) != self.num_regions:
            missing.append(f"a consistent K (settings say {k}, it holds {self.num_regions})")
        dim = self.centroids.shape[-1]
        if self.mean is not None and self.mean.numel() != dim:
            missing.append(f"a mean of the centroids' dimension {dim}")
        have = 0 if self.components is None else len(self.components)
        if components > have:
            missing.append(f"{components} principal components of its sentences (it holds {have})")
        elif self.components is not None and self.components.shape[-1] != dim:
            missing.append(f"principal components of the centroids' dimension {dim}")
        if not missing:
            return
        refit = refit or (
            f"ksemstamp centroids --encoder {self.encoder or 'ENCODER'} "
            f"--k {self.num_regions} [--corpus FILE] --output FILE"
        )
        raise IncompleteCentroidsError(
            f"{origin} lacks {' and '.join(missing)}, which {who} needs; refit the "
            f"centroids (`{refit}`) and use the new file"
        )

    def adapted(self, encoder, spec: str = "", copy: bool = False):
        """The encoder these centroids belong to, made from ``encoder``: checked against the
        recorded fingerprint, then (when the file carries an adapter) with the adapter merged
        into its weights; ``copy`` adapts a copy and leaves ``encoder`` as it is. An encoder
        this file has adapted already is returned as it is."""
        from ..assets import encoder_fingerprint
        from .adapter import adapter_id, load_adapter

        if self.adapter is None:
            self.check_encoder(encoder_fingerprint(encoder), spec)
            return encoder
        if getattr(encoder, "ksemstamp_adapter", None) == adapter_id(self.adapter):
            return encoder
        self.check_encoder(encoder_fingerprint(encoder), spec)
        if copy:
            import copy as copying

            encoder = copying.deepcopy(encoder)
        return load_adapter(encoder, self.adapter)

    def check_encoder(self, fingerprint: str, spec: str = "") -> None:
        """Raise ``CentroidMismatchError`` unless the centroids belong to this encoder."""
        if fingerprint != self.encoder_fingerprint:
            raise CentroidMismatchError(
                f"these centroids were fitted for encoder '{self.encoder}' (fingerprint "
                f"{self.encoder_fingerprint}) but the encoder in use{f' ({spec})' if spec else ''} "
                f"has fingerprint {fingerprint}; refit centroids for this encoder "
                f"(`ksemstamp centroids --encoder ...`) or load the matching encoder"
            )


def fit_kmeans(embeddings: Tensor, k: int = 8, seed: int = 0, n_init: int = 10) -> Tensor:
    """``(k, D)`` unit-norm centroids of unit-normalised embeddings (spherical-style k-means).

    Embeddings are normalised first so that Euclidean k-means ranks points as cosine distance does.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F
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
    import torch

    counts = torch.zeros(k, k, dtype=torch.float64)
    for regions in regions_per_doc:
        if len(regions) > 1:
            idx = regions[:-1] * k + regions[1:]
            counts += torch.bincount(idx, minlength=k * k).reshape(k, k).double()
    return counts


def principal_components(embeddings: Tensor, mean: Tensor, m: int = NUM_COMPONENTS) -> Tensor:
    """``(min(m, D), D)`` the top principal directions of ``(N, D)`` embeddings centred on
    ``mean`` (eigenvectors of their covariance, largest eigenvalue first)."""
    import torch

    centred = embeddings.double() - mean.double()
    cov = centred.T @ centred / max(1, len(centred))
    _, vectors = torch.linalg.eigh(cov)
    return vectors.flip(1)[:, : min(m, cov.shape[0])].T.float().contiguous()


def centroid_file_from(
    embeddings: Tensor,
    doc_lengths: Sequence[int],
    centroids: Tensor,
    encoder: str,
    fingerprint: str,
    settings: dict,
) -> CentroidFile:
    """A complete ``CentroidFile`` for ``centroids`` fitted on ``(N, D)`` domain ``embeddings``
    (documents of ``doc_lengths`` sentences, in order): with their transition counts, their
    mean, principal components, K and the number of sentences and documents added to
    ``settings`` (which should name the ``source`` and the ``seed``)."""
    import torch
    import torch.nn.functional as F

    from .partition import kmeans_regions

    emb = F.normalize(embeddings.float().cpu(), dim=-1)
    centroids = centroids.float().cpu()
    regions, _ = kmeans_regions(emb, centroids, 0.0)
    per_doc = list(torch.split(regions, list(doc_lengths)))
    return CentroidFile(
        centroids=centroids,
        encoder=encoder,
        encoder_fingerprint=fingerprint,
        transition=transition_counts(per_doc, centroids.shape[0]),
        mean=emb.mean(dim=0),
        components=principal_components(emb, emb.mean(dim=0)),
        settings={
            **settings,
            "k": int(centroids.shape[0]),
            "num_sentences": len(emb),
            "num_documents": len(doc_lengths),
        },
    )


def fit_centroid_file(
    encoder_spec: str,
    k: int = DEFAULT_REGIONS,
    max_sentences: int = 20000,
    seed: int = 0,
    batch_size: int = 64,
    corpus: str | None = None,
    split: str = "fit",
    min_words: int = 5,
    progress: bool = True,
    adapter: dict | None = None,
) -> CentroidFile:
    """Embed domain sentences with an encoder and fit ``k`` centroids.

    The sentences are those of ``corpus`` (a corpus file, see ``ksemstamp.text.corpusfile``) or,
    when it is ``None``, of the bundled news corpus: ``split``'s sentences of at least
    ``min_words`` words, at most ``max_sentences``. The corpus is read and checked (not text,
    empty, too small for ``k``) before the encoder is loaded. ``adapter`` (``ksemstamp.scheme.adapter``
    payload): merged into the encoder before it embeds; the file carries it, with the fingerprint
    of the encoder it adapts.
    """
    from ..assets import encoder_fingerprint, load_encoder
    from ..text.corpusfile import domain_documents, require_sentences
    from .adapter import load_adapter
    from .encoding import embed

    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    domain = domain_documents(corpus, max_sentences, min_words, split, progress)
    require_sentences(domain, k)
    encoder = load_encoder(encoder_spec)
    fingerprint = encoder_fingerprint(encoder)
    if adapter is not None:
        encoder = load_adapter(encoder, adapter)
    emb = embed(encoder, domain.sentences, batch_size=batch_size, progress=progress)
    fitted = centroid_file_from(
        emb,
        [len(d) for d in domain.documents],
        fit_kmeans(emb, k=k, seed=seed),
        encoder_spec,
        fingerprint,
        {"seed": seed, "source": domain.source},
    )
    fitted.adapter = adapter
    return fitted


def centroids(
    output: str,
    encoder: str = DEFAULT_ENCODER,
    k: Annotated[int, Range(2, 4096)] = DEFAULT_REGIONS,
    corpus: str | None = None,
    split: Literal["fit", "val", "test", "all"] = "fit",
    min_words: Annotated[int, Range(1, 1000)] = 5,
    max_sentences: Annotated[int, Range(1, 10_000_000)] = 20000,
    seed: Annotated[int, SEED] = 0,
    batch_size: Annotated[int, Range(1, 4096)] = 64,
    quiet: bool = False,
) -> int:
    """Fit k-means centroids of an encoder's sentence embeddings and write a centroid file.

    Args:
        output: the centroid file to write.
        encoder: alias, folder or Hub id.
        k: number of regions (the default mark: 64; paper: 8).
        corpus: your corpus: plain text, one document per line, or JSONL with a 'text' field
            (default: the bundled news corpus).
        split: part of the corpus's documents to use.
        min_words: skip shorter sentences.
        max_sentences: sentences fitted on, at most.
        seed: k-means seed.
        batch_size: encoder batch size.
        quiet: no progress bars.
    """
    fitted = fit_centroid_file(
        encoder,
        k,
        max_sentences,
        seed,
        batch_size,
        corpus=corpus,
        split=split,
        min_words=min_words,
        progress=not quiet,
    )
    fitted.save(output)
    print(
        f"wrote {output}: K={fitted.num_regions}, {fitted.settings['num_sentences']} "
        f"sentences of {fitted.settings['num_documents']} documents ({fitted.settings['source']})"
    )
    return 0
