"""Margin contrastive loss for paraphrase-robust sentence embeddings, as pure tensor functions.

For each pair ``i`` of a text ``s_i`` and its paraphrase ``t_i``::

    l_i = max(delta - cos(s_i, t_i) + cos(s_i, t'_i), 0)

where ``t'_i`` is the hardest negative: the paraphrase column ``t_j`` (``j != i``) most similar
to ``s_i``. Rows are this process's anchors; columns are the paraphrases of this process or,
under data parallelism, of every process (gathered in rank order). ``offset`` is where this
process's own paraphrases start among the columns (``rank * batch``).

``region_consistency_loss`` is an optional second term, not in the paper: it pulls a text and
its paraphrase into the same k-means region of given centroids (see its docstring).

``kernel_alignment_loss`` trains for the quantity the default direction mark's detector uses
instead of raw cosines: over random keys, a sentence's score ``<N, phi(x)>`` and its
paraphrase's are jointly normal with correlation ``cos(phi(x), phi(x'))``, where ``phi`` is the
scored feature (``scored_features``: soft context (x) processed vector). That correlation is the
*retention* of a sentence's evidence under the paraphrase; the correlation between different
sentences of one text sets how many independent sentences the text counts as. The loss raises
the first to 1 and the second to 0 (see its docstring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_REDUCTIONS = ("sum", "mean", "none")


def hardest_negative_cosines(anchor: Tensor, candidates: Tensor, offset: int = 0) -> Tensor:
    """``(B,)`` highest cosine between each anchor and a candidate column other than its own.

    Args:
        anchor: ``(B, D)`` anchor embeddings (any scale; normalised here).
        candidates: ``(C, D)`` column embeddings with ``C >= offset + B`` and ``C >= 2``.
        offset: column index of anchor 0's own positive; anchor ``i`` owns column ``offset + i``.
    """
    batch = anchor.shape[0]
    if candidates.shape[0] < 2:
        raise ValueError("need at least two candidate columns to have a negative")
    if offset < 0 or offset + batch > candidates.shape[0]:
        raise ValueError(
            f"own columns [{offset}, {offset + batch}) fall outside {candidates.shape[0]} columns"
        )
    sim = F.normalize(anchor, dim=-1) @ F.normalize(candidates, dim=-1).T  # (B, C)
    rows = torch.arange(batch, device=sim.device)
    # -inf keeps the own positive out of the max and gives it no gradient.
    own = torch.zeros_like(sim, dtype=torch.bool)
    own[rows, rows + offset] = True
    return sim.masked_fill(own, float("-inf")).max(dim=-1).values


def margin_contrastive_loss(
    anchor: Tensor,
    positive: Tensor,
    candidates: Tensor | None = None,
    delta: float = 0.8,
    offset: int = 0,
    reduction: str = "sum",
) -> Tensor:
    """Hinge loss pushing each paraphrase ``delta`` closer to its text than the hardest negative.

    Args:
        anchor: ``(B, D)`` embeddings of the texts ``s_i``.
        positive: ``(B, D)`` embeddings of their paraphrases ``t_i`` (row ``i`` pairs with row ``i``).
        candidates: ``(C, D)`` columns to draw negatives from; ``None`` means ``positive`` (in-batch
            negatives). Under DDP pass the paraphrases of all ranks and ``offset = rank * B``.
        delta: the margin (paper: 0.8).
        offset: where this batch's own paraphrases sit among ``candidates``.
        reduction: ``"sum"`` (the paper's formula), ``"mean"`` or ``"none"`` (per-pair ``(B,)``).

    Returns:
        The reduced loss (a scalar) or the ``(B,)`` per-pair losses.
    """
    if anchor.shape != positive.shape or anchor.ndim != 2:
        raise ValueError(
            f"anchor and positive must both be (B, D), got {tuple(anchor.shape)} "
            f"and {tuple(positive.shape)}"
        )
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if candidates is None:
        candidates, offset = positive, 0
    pos = F.cosine_similarity(anchor, positive, dim=-1)  # (B,)
    neg = hardest_negative_cosines(anchor, candidates, offset)  # (B,)
    return _reduce(torch.clamp(delta - pos + neg, min=0.0), reduction)


def region_consistency_loss(
    anchor: Tensor,
    positive: Tensor,
    centroids: Tensor,
    temperature: float = 0.05,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy pulling a text and its paraphrase into the region of their midpoint.

    The target region of pair ``i`` is the centroid nearest (by cosine) to the mean of the unit
    vectors of ``s_i`` and ``t_i``; each side is then scored by the cross-entropy of its
    softmax over ``cos(x, c_k) / temperature`` against that target, and the two are averaged.
    A pair straddling a boundary is pulled to one side of it; a pair deep inside one region,
    whose cosine to its centroid beats the next by several temperatures, contributes almost
    nothing. The watermark's margin test (the gap between the two nearest centroids) rewards
    the same thing, so the term also keeps fewer texts near boundaries.

    Args:
        anchor: ``(B, D)`` embeddings of the texts.
        positive: ``(B, D)`` embeddings of their paraphrases.
        centroids: ``(K, D)`` region centroids (normalised here); treated as constants.
        temperature: softmax temperature on cosines (> 0).
        reduction: ``"sum"``, ``"mean"`` or ``"none"`` (per-pair ``(B,)``).
    """
    if anchor.shape != positive.shape or anchor.ndim != 2:
        raise ValueError(
            f"anchor and positive must both be (B, D), got {tuple(anchor.shape)} "
            f"and {tuple(positive.shape)}"
        )
    if centroids.ndim != 2 or centroids.shape[-1] != anchor.shape[-1]:
        raise ValueError(f"centroids must be (K, {anchor.shape[-1]}), got {tuple(centroids.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    c = F.normalize(centroids.detach().to(anchor.dtype), dim=-1)
    a = F.normalize(anchor, dim=-1)
    p = F.normalize(positive, dim=-1)
    with torch.no_grad():
        target = ((a + p) @ c.T).argmax(dim=-1)
    losses = 0.5 * (
        F.cross_entropy(a @ c.T / temperature, target, reduction="none")
        + F.cross_entropy(p @ c.T / temperature, target, reduction="none")
    )
    return _reduce(losses, reduction)


def _reduce(losses: Tensor, reduction: str) -> Tensor:
    if reduction == "sum":
        return losses.sum()
    if reduction == "mean":
        return losses.mean()
    return losses


def cosine_gap(anchor: Tensor, positive: Tensor) -> Tensor:
    """``(B,)`` cos(text, own paraphrase) minus cos(text, hardest other paraphrase in the batch).

    Positive means the paraphrase is closer than any other pair's paraphrase; the loss asks for
    a gap of at least ``delta``.
    """
    pos = F.cosine_similarity(anchor, positive, dim=-1)
    return pos - hardest_negative_cosines(anchor, positive, 0)


def scored_features(
    embeddings: Tensor,
    mean: Tensor,
    components: Tensor | None,
    centroids: Tensor | None,
    temperature: float,
) -> Tensor:
    """``(N, K * D)`` the direction mark's scored features ``a (x) u`` of ``(N, D)`` embeddings,
    differentiable: ``u`` the unit embedding less ``mean`` with ``components`` (orthonormal rows)
    projected out, unit length; ``a`` the soft context (softmax of cosines to ``centroids`` over
    ``temperature``, unit length; weights under 1% of the largest dropped as the scheme drops
    them). ``centroids`` ``None`` or ``temperature`` 0: one context (``K = 1``)."""
    u = F.normalize(embeddings, dim=-1) - mean.to(embeddings)
    if components is not None:
        c = components.to(embeddings)
        u = u - (u @ c.T) @ c
    u = F.normalize(u, dim=-1)
    if centroids is None or temperature <= 0:
        return u
    cos = F.normalize(embeddings, dim=-1) @ F.normalize(centroids.to(embeddings), dim=-1).T
    weights = torch.softmax(cos / temperature, dim=-1)
    kept = weights >= 0.01 * weights.max(dim=-1, keepdim=True).values
    a = F.normalize(weights * kept, dim=-1)
    return (a.unsqueeze(-1) * u.unsqueeze(1)).flatten(1)


def unit_sums(features: Tensor, owner: Tensor, count: int) -> Tensor:
    """``(count, F)`` the sum of the ``(N, F)`` features of the rows each unit owns (``owner``
    ``(N,)`` unit index of each row): a unit of several sentences scores their sum."""
    out = torch.zeros(count, features.shape[1], dtype=features.dtype, device=features.device)
    return out.index_add(0, owner.to(features.device), features)


def kernel_alignment_loss(
    anchor: Tensor,
    positive: Tensor,
    others: Tensor,
    positive_ok: Tensor,
    others_ok: Tensor,
    decorrelation: float = 1.0,
    same_text: Tensor | None = None,
    coherence: float = 0.0,
) -> Tensor:
    """Retention to 1, correlations between different sentences to 0.

    ``mean_i (1 - cos(A_i, B_i)) + decorrelation * mean cos(x, y)^2`` over the pairs ``(x, y)``
    that share no source sentence: every anchor against every other unit's positive and every
    sentence column, and the sentence columns among themselves. A unit ``A_i`` and ``B_i`` are
    two ways of writing the same content (a sentence and its paraphrase, two sentences and their
    merge, a passage and its rewrite), each the sum of its sentences' features; the sentence
    columns are the sentences of the batch's documents, so a sentence meets the other sentences
    of its own text, the hardest negatives and the ones whose correlation costs detection most.
    Squared, not signed: a correlation of either sign between sentences of a text moves their
    scores together or against each other under a key, and either way concentrates evidence.

    Args:
        anchor: ``(U, F)`` features of the units' first sides (``unit_sums``).
        positive: ``(C, F)`` features of the units' second sides; row ``i < U`` pairs with
            anchor ``i`` (under DDP the other ranks' positives follow as extra columns).
        others: ``(S, F)`` features of single sentences (columns).
        positive_ok: ``(U, C)`` True where positive column ``j`` shares no source with anchor
            ``i`` (the pair's own column may be either: it is never a negative).
        others_ok: ``(U, S)`` True where sentence column ``j`` is not part of anchor ``i``.
        decorrelation: weight of the correlation term.
        same_text: ``(S0, S0)`` True where the first ``S0`` sentence columns are two different
            sentences (or clauses) of one text; ``None``: no such term.
        coherence: weight of ``mean cos(x, y)`` over those pairs, *signed*. A text's z is its
            summed score over ``sqrt(n + n (n - 1) rho)``, ``rho`` the mean correlation of its
            units, so the mean itself, not its square, is what costs detection: with 17 units a
            correlation of 0.05 already takes 0.8 of the variance's 17. The squared term alone
            lets every sentence of a text drift one way together while it raises retention.
    """
    count = anchor.shape[0]
    if positive.shape[0] < count:
        raise ValueError("every anchor needs its positive among the positive columns")
    a, p, o = (F.normalize(x, dim=-1) for x in (anchor, positive, others))
    own = torch.zeros_like(positive_ok, dtype=torch.bool)
    own[torch.arange(count), torch.arange(count)] = True
    retained = (a * p[:count]).sum(dim=-1)
    cross = [(a @ p.T)[positive_ok & ~own], (a @ o.T)[others_ok]]
    if len(o) > 1:
        among = o @ o.T
        cross.append(among[~torch.eye(len(o), dtype=torch.bool, device=o.device)])
    cross_all = torch.cat(cross)
    penalty = (cross_all**2).mean() if cross_all.numel() else retained.new_zeros(())
    loss = (1.0 - retained).mean() + decorrelation * penalty
    if coherence and same_text is not None and bool(same_text.any()):
        head = o[: same_text.shape[0]]
        loss = loss + coherence * (head @ head.T)[same_text].mean()
    return loss
