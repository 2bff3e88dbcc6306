"""The document-level rewrite attack: an LM rewrites windows of several sentences at once.

The sentence attacks (``attacks``) keep every sentence boundary and the order. People who
rewrite with an LLM hand it whole paragraphs, and the rewrite merges, splits and reorders
sentences. Here each text is cut into consecutive windows of ``window`` (2 to 4) sentences
(sizes drawn with a random stream seeded by the text, so a rerun cuts the same windows), and
the LM paraphraser of ``ksemstamp.paraphrase`` (the ``rewrite`` few-shot prompt, whose examples
merge, split and reorder sentences) proposes ``num_candidates`` sampled rewrites of each window.
A window keeps the most similar candidate that

* is complete (its last sentence ends a sentence: a reply cut by the token limit is dropped),
* differs enough from the original (at most ``max_overlap`` of the original's word bigrams),
* is not much longer (at most ``max_length_ratio`` times the original's words: new material
  would be an attack of another kind), and
* stays close in meaning (cosine similarity at least ``similarity_bound``, from an encoder other
  than the watermark's).

When no candidate qualifies the window stays as it was (a *fallback*; counted). With
``every_window`` a window that keeps its original is no attack: when no candidate qualifies,
the most similar complete candidate that differs from the original is taken whatever its
similarity and overlap, and the original stays only when the LM wrote nothing complete and new
(still counted as a fallback). Each text records its mean window similarity (a kept original
counts 1.0, as the sentence attack counts an unchanged sentence), the mean over the rewritten
windows only, and its fallbacks.

``Recursive`` applies a sentence attack again to its own output (``passes``: a paraphrase of
a paraphrase), with similarities measured against the original text.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..paraphrase import LMParaphraser
from ..settings.attacks import AttackSettings
from .attacks import Paraphraser, bigram_overlap, embed_unit
from .metrics import words


def windows(count: int, rng: random.Random, low: int = 2, high: int = 4) -> list[tuple[int, int]]:
    """``(start, end)`` of consecutive windows covering ``count`` sentences, each of ``low`` to
    ``high`` sentences (sizes drawn from ``rng``); a text shorter than ``low`` is one window."""
    if not 1 <= low <= high:
        raise ValueError(f"window sizes need 1 <= low <= high, got {low}, {high}")
    out: list[tuple[int, int]] = []
    start = 0
    while start < count:
        rest = count - start
        size = rng.randint(low, high)
        if rest - size < low:
            # What would be left is too short for a window: take it all, or leave ``low``.
            size = rest if rest <= high else rest - low
        out.append((start, start + size))
        start += size
    return out


def select_window(
    original: str,
    candidates: Sequence[str],
    similarities: Sequence[float],
    complete: Sequence[bool],
    similarity_bound: float = 0.75,
    max_overlap: float = 0.8,
    max_length_ratio: float = 1.5,
) -> int | None:
    """Index of the most similar candidate that qualifies (see the module), or ``None``."""
    length = max(1, len(words(original)))
    best = None
    for i, (cand, sim, done) in enumerate(zip(candidates, similarities, complete, strict=True)):
        if (
            done
            and " ".join(cand.split()) != " ".join(original.split())
            and bigram_overlap(original, cand) <= max_overlap
            and len(words(cand)) <= max_length_ratio * length
            and sim >= similarity_bound
            and (best is None or sim > similarities[best])
        ):
            best = i
    return best


@dataclass
class RewrittenText:
    """A text after the rewrite, with how far it moved."""

    text: str
    similarity: float
    """Cosine of the embeddings of the whole original and rewritten texts."""
    window_similarity: float
    """Mean over windows of the kept window's similarity to its original (a kept original
    counts 1.0)."""
    rewritten_similarity: float | None
    """Mean similarity over the windows that were rewritten (``None`` when none was)."""
    windows: int
    rewritten: int
    fallbacks: int
    """Windows left as they were because no candidate qualified."""
    sentences: int
    """Sentences of the original text."""


class Rewrite:
    """Rewrite windows of consecutive sentences of each text (see the module).

    Args:
        paraphraser: proposes candidates for each window's text (``Paraphraser``).
        encoder: the similarity encoder (``encode(list[str], convert_to_tensor=True)``).
        splitter: sentence splitter with ``split(text)`` and ``ends_sentence(sentence)``.
        window: smallest and largest window, in sentences.
        similarity_bound, max_overlap, max_length_ratio: what a candidate must meet.
        every_window: rewrite every window (see the module): a candidate that meets none of the
            bounds but is complete and new replaces the window rather than nothing.
    """

    def __init__(
        self,
        paraphraser: Paraphraser,
        encoder,
        splitter,
        window: Sequence[int] = (2, 4),
        similarity_bound: float = 0.75,
        max_overlap: float = 0.8,
        max_length_ratio: float = 1.5,
        every_window: bool = False,
    ) -> None:
        low, high = window
        windows(0, random.Random(0), low, high)  # checks the sizes
        self.paraphraser = paraphraser
        self.encoder = encoder
        self.splitter = splitter
        self.window = (low, high)
        self.similarity_bound = similarity_bound
        self.max_overlap = max_overlap
        self.max_length_ratio = max_length_ratio
        self.every_window = every_window

    def _complete(self, candidate: str) -> bool:
        sentences = self.splitter.split(candidate)
        return bool(sentences) and self.splitter.ends_sentence(sentences[-1])

    def __call__(self, texts: Sequence[str]) -> list[RewrittenText]:
        split = [self.splitter.split(t) for t in texts]
        plans = [
            windows(len(s), random.Random(f"rewrite|{t}"), *self.window)
            for t, s in zip(texts, split, strict=True)
        ]
        originals = [
            " ".join(s[a:b]) for s, plan in zip(split, plans, strict=True) for a, b in plan
        ]
        proposals = self.paraphraser.candidates(originals)
        emb = embed_unit(self.encoder, originals + [c for cands in proposals for c in cands])
        kept: list[tuple[str, float | None]] = []  # (text, similarity; None: the original)
        offset = len(originals)
        for i, (original, cands) in enumerate(zip(originals, proposals, strict=True)):
            sims = (emb[offset : offset + len(cands)] @ emb[i]).tolist() if cands else []
            offset += len(cands)
            complete = [self._complete(c) for c in cands]
            choice = select_window(
                original,
                cands,
                sims,
                complete,
                self.similarity_bound,
                self.max_overlap,
                self.max_length_ratio,
            )
            if choice is None and self.every_window:
                choice = select_window(original, cands, sims, complete, -1.0, 1.0, math.inf)
            kept.append((original, None) if choice is None else (cands[choice], sims[choice]))
        results, pos = [], 0
        for text, sentences, plan in zip(texts, split, plans, strict=True):
            mine = kept[pos : pos + len(plan)]
            pos += len(plan)
            moved = [sim for _, sim in mine if sim is not None]
            # The space (or none) that joins a text to its prompt is kept, as the sentence
            # attack keeps it.
            lead = text[: len(text) - len(text.lstrip())]
            results.append(
                RewrittenText(
                    text=lead + " ".join(w for w, _ in mine),
                    similarity=0.0,
                    window_similarity=(
                        float(np.mean([1.0 if s is None else s for _, s in mine])) if mine else 1.0
                    ),
                    rewritten_similarity=float(np.mean(moved)) if moved else None,
                    windows=len(plan),
                    rewritten=len(moved),
                    fallbacks=len(plan) - len(moved),
                    sentences=len(sentences),
                )
            )
        whole = embed_unit(self.encoder, [*texts, *(r.text for r in results)])
        for i, res in enumerate(results):
            res.similarity = float(whole[i] @ whole[len(texts) + i])
        return results


def rewrite_attack(settings: AttackSettings, lm, encoder, splitter) -> Rewrite:
    """The document-level rewrite an attack's settings describe (``paraphraser: lm-rewrite``;
    the ``ATTACK_KINDS`` builder): ``lm`` rewrites windows of sentences with the ``rewrite``
    prompt unless another is given."""
    paraphraser = LMParaphraser(
        lm=lm,
        model=settings.model,
        num_candidates=settings.num_candidates,
        prompts=settings.prompts or "rewrite",
        max_new_tokens=settings.max_new_tokens or 200,
        **settings.given("temperature", "top_p", "batch_size", "seed"),
    )
    bound = 0.75 if settings.similarity_bound is None else settings.similarity_bound
    return Rewrite(
        paraphraser,
        encoder,
        splitter,
        window=settings.window,
        similarity_bound=bound,
        max_overlap=settings.max_overlap,
        max_length_ratio=settings.max_length_ratio,
        every_window=settings.every_window,
    )


def attack_summary(records: Sequence[dict]) -> dict:
    """What the results report about an attack's stored records: mean text similarity, and per
    sentence (sentence attacks) or per window (the rewrite) how much changed."""
    records = list(records)
    if not records:
        return {}
    out = {"similarity": float(np.mean([r["similarity"] for r in records]))}
    if "window_similarity" in records[0]:
        windows_total = sum(r["windows"] for r in records)
        rewritten = sum(r["rewritten"] for r in records)
        out["window_similarity"] = float(np.mean([r["window_similarity"] for r in records]))
        out["rewritten_window_similarity"] = (
            sum(r["rewritten_similarity"] * r["rewritten"] for r in records if r["rewritten"])
            / rewritten
            if rewritten
            else None
        )
        out["fallbacks"] = sum(r["fallbacks"] for r in records)
        out["fallback_share"] = out["fallbacks"] / max(1, windows_total)
        return out
    out["sentence_similarity"] = float(np.mean([r["sentence_similarity"] for r in records]))
    out["changed_sentence_share"] = sum(r["changed"] for r in records) / max(
        1, sum(r["sentences"] for r in records)
    )
    return out
