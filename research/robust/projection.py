"""A closed-form alternative to training: a linear map that keeps what paraphrase leaves alone.

The trained adapters raise retention and make the sentences of a text more alike by as much.
This asks whether a key-free *linear* projection chosen in closed form does better: the
directions ``w`` that maximise ``w' S w / w' (Q + eps I) w``, with ``Q`` the covariance of the
embedding moved by a paraphrase (differences of the training pairs of ``trainpairs``: SmolLM2
rewrites, merges and splits, never the evaluation's Gemma) and ``S`` either the covariance of
sentences around their own article's mean (``within``: sentences of one text should differ) or
around the domain mean (``total``). ``pcs`` first projects out the default's top domain
components, as the shipped vectors do. The features are the unit projection with the default's
soft contexts, so the null stays exact; ``bounds --features proj:...`` measures them beside the
others.

Spec: ``proj:SIGNAL:d=D:eps=E[:pcs=M]`` (``eps`` in units of ``Q``'s mean eigenvalue).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ksemstamp.text.corpora import domain_sentences

from .common import RUNS, BaseFeatures, EmbeddingCache, read_jsonl

DOMAIN_SENTENCES = 8000
"""Fit-split sentences the signal covariance is estimated on (grouped by article)."""


def paraphrase_covariance(emb: EmbeddingCache) -> torch.Tensor:
    """Covariance of ``e(b) - e(a)`` over the one-sentence training pairs (WordNet left out:
    it moves an embedding too little to say where a rewrite moves it)."""
    pairs = [
        (u["a"][0], u["b"][0])
        for row in read_jsonl(RUNS / "train-units.jsonl")
        for u in row["units"]
        if len(u["a"]) == 1 and len(u["b"]) == 1 and u["method"] != "wordnet"
    ]
    d = (emb([a for a, _ in pairs]) - emb([b for _, b in pairs])).double()
    return d.T @ d / len(d)


def signal_covariance(emb: EmbeddingCache, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, S)`` of fit-split news sentences: ``within`` centres each article on its own
    mean, ``total`` on the domain's."""
    docs = [d for d in domain_sentences(DOMAIN_SENTENCES, split="fit") if len(d) >= 3]
    blocks = emb([s for d in docs for s in d]).double().split([len(d) for d in docs])
    mean = torch.cat(blocks).mean(0)
    if kind == "within":
        centred = torch.cat([b - b.mean(0) for b in blocks])
    elif kind == "total":
        centred = torch.cat(blocks) - mean
    else:
        raise ValueError(f"signal must be within or total, not {kind!r}")
    return mean, centred.T @ centred / len(centred)


def whitened_basis(signal: torch.Tensor, noise: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """``(n, dim)``: the top ``dim`` generalised eigenvectors of ``(signal, noise + eps tr I)``,
    scaled so that ``W' (noise + eps tr I) W = I`` (``tr`` the noise's mean eigenvalue)."""
    n = len(noise)
    q = noise + eps * torch.trace(noise) / n * torch.eye(n, dtype=noise.dtype)
    inv_l = torch.linalg.inv(torch.linalg.cholesky(q))
    _, vecs = torch.linalg.eigh(inv_l @ signal @ inv_l.T)
    return inv_l.T @ vecs.flip(1)[:, :dim]


class ProjectionFeatures:
    """``u = normalise(W' P (e - mean))`` with the default's soft contexts, ``W`` the top ``dim``
    generalised eigenvectors of ``(P S P, P Q P + eps I)`` and ``P`` the projection that removes
    the top ``pcs`` domain components."""

    def __init__(self, signal: str, dim: int, eps: float, pcs: int = 0) -> None:
        emb = EmbeddingCache()
        self.base = BaseFeatures()
        self.mean, s = signal_covariance(emb, signal)
        q = paraphrase_covariance(emb)
        self.project = torch.eye(len(q), dtype=torch.float64)
        if pcs:
            comp = BaseFeatures(whiten=pcs).comp.double()
            self.project = self.project - comp.T @ comp
        self.W = whitened_basis(
            self.project @ s @ self.project, self.project @ q @ self.project, dim, eps
        )

    def __call__(self, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = (emb.double() - self.mean) @ self.project @ self.W
        return F.normalize(v, dim=-1), self.base.contexts(emb).double()


def parse(spec: str) -> ProjectionFeatures:
    """``proj:within:d=128:eps=3:pcs=64`` -> its features."""
    _, signal, *opts = spec.split(":")
    kw = dict(o.split("=") for o in opts)
    return ProjectionFeatures(
        signal, int(kw.get("d", 128)), float(kw.get("eps", 1.0)), int(kw.get("pcs", 0))
    )
