"""Order-free evidence: simulate designs of the direction mark on the candidate pool, then edit.

A *design* says which sentence's soft context a sentence is scored on:

* ``chain``: the previous sentence's (today's default);
* ``self``: its own (the score is a function of the sentence alone, so order, position and
  neighbours do not matter);
* ``both``: the sum of the two context weight vectors, renormalised.

For each design, key and pool document, generation is replayed on the pool: at each context the
best-scoring of ``n`` candidates (drawn without replacement from the 32 measured) is kept. The
texts are then edited (``ksemstamp.evaluation.edits``), re-split and re-embedded with the real
splitter and encoder, and scored with the design's exact statistic. Human texts under the same
keys give the false-positive rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ksemstamp.scheme import soft_context_weights

TEMPERATURE = 0.05


@dataclass
class Space:
    """Embeddings and what the direction mark derives from them, for a list of sentences."""

    sentences: list[str]
    emb: torch.Tensor  # (U, D) unit
    vec: np.ndarray  # (U, D) centred, unit
    weights: np.ndarray  # (U, K) soft context weights


def make_space(
    sentences,
    emb: torch.Tensor,
    centroids: torch.Tensor,
    mean: torch.Tensor,
    tau: float = TEMPERATURE,
    project: torch.Tensor | None = None,
) -> Space:
    """``project``: optional ``(D, D)`` map applied to centred embeddings before normalising."""
    centred = emb.float() - mean.float()
    if project is not None:
        centred = centred @ project
    vec = F.normalize(centred, dim=-1).double().numpy()
    weights = soft_context_weights(emb, centroids, tau).numpy()
    return Space(list(sentences), emb, vec, weights)


def contexts(design: str, own: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """``(T, K)`` context weights of sentences from their own and their previous sentence's
    weights (rows of zeros where there is no previous sentence)."""
    if design == "chain":
        return previous
    if design == "self":
        return own
    if design == "both":
        mix = own + previous
        return mix / np.maximum(np.linalg.norm(mix, axis=1, keepdims=True), 1e-12)
    raise ValueError(design)


def generate(
    design: str,
    space: Space,
    cand: np.ndarray,
    tokens: np.ndarray,
    doc_contexts: np.ndarray,
    seed: int,
    directions: np.ndarray,
    rng: np.random.Generator,
    n: int = 32,
    max_tokens: int = 200,
    max_sentence_tokens: int = 64,
) -> list[int]:
    """Sentence indices of one simulated watermarked text (best of ``n`` per context)."""
    out: list[int] = []
    prev, total = seed, 0
    width = cand.shape[1]
    for ctx in doc_contexts:
        if total >= max_tokens:
            break
        draws = rng.choice(width, size=min(n, width), replace=False)
        sid, ntok = cand[ctx, draws], tokens[ctx, draws]
        usable = (sid >= 0) & (ntok <= max_sentence_tokens)
        if not usable.any():
            break
        safe = np.where(usable, sid, 0)
        own = space.weights[safe]
        before = np.repeat(space.weights[prev][None], len(safe), axis=0)
        direction = contexts(design, own, before) @ directions
        score = np.where(usable, (space.vec[safe] * direction).sum(axis=1), -np.inf)
        i = int(np.argmax(score))
        out.append(int(sid[i]))
        total += int(ntok[i])
        prev = int(sid[i])
    return out


def text_rows(
    design: str, weights: np.ndarray, vec: np.ndarray, seed_weights: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Context weights and vectors of the scored sentences of a text (the detector's rules:
    without a seed the first sentence of a chained text only seeds)."""
    first = np.zeros_like(weights[:1]) if seed_weights is None else seed_weights[None]
    previous = np.concatenate([first, weights[:-1]])
    ctx = contexts(design, weights, previous)
    scored = np.linalg.norm(ctx, axis=1) > 0
    return ctx[scored], vec[scored]


def direction_z_many(ctx: np.ndarray, vec: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """The exact z of one text under each of many keys: ``directions`` ``(R, K, D)``."""
    w = ctx.T @ vec  # (K, D)
    var = float((w**2).sum())
    if var <= 0:
        return np.zeros(len(directions))
    return np.einsum("rkd,kd->r", directions, w) / np.sqrt(var)


def dedupe(sentences: list[str]) -> list[str]:
    """Sentences with repeats (case and spacing ignored) left out, as the detector scores."""
    seen, out = set(), []
    for s in sentences:
        key = " ".join(s.lower().split())
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def statistic(
    name: str, design: str, space: Space, seed_weights: np.ndarray | None, directions: np.ndarray
) -> float:
    """The z of a text (its sentences' ``space``) under one key's ``directions``."""
    ctx, vec = text_rows(design, space.weights, space.vec, seed_weights)
    if not len(ctx):
        return 0.0
    if name == "sum":
        return float(direction_z_many(ctx, vec, directions[None])[0])
    raise ValueError(name)
