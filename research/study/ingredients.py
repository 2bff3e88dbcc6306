"""The measured ingredients as arrays: one embedding per distinct sentence, and indices into it.

``load_ingredients`` reads a candidate pool and its attack pairs, embeds every distinct sentence
once with an encoder (kept on disk per encoder, as calibration keeps them), and returns:

* the pool as ``(C, M)`` arrays over its ``C`` contexts and ``M`` candidates per context
  (sentence index, ``-1`` for a draw that is no sentence; token count), the contexts of each
  document in order, and each document's seed sentence (the prompt's last sentence);
* for every attack, an *attacked embedding* of every sentence: the embedding of its actual
  paraphrase where the sentence was attacked, else the sentence's embedding moved by the
  displacement (paraphrase minus original) of the nearest attacked sentence, scaled so that
  the modelled paraphrases are as far from their originals as the actual ones (the unscaled
  move, added to another sentence, keeps it closer to itself than real paraphrases do: mean
  cosine 0.88 against 0.84 for the LM paraphrase on the committed pairs; see
  ``displacement_scale``). Paraphrases are costly to draw, so only a sample of sentences is
  attacked; ``displacement_check`` measures how well the model predicts the regions of
  held-out actual paraphrases;
* human continuations of the same documents as sentence indices, for transition statistics and
  null checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .pairs import ATTACKS, read_pairs
from .pool import read_pool, study_prompts


@dataclass
class Ingredients:
    """Arrays for the simulator; every sentence is a row of ``embeddings``."""

    encoder: str
    sentences: list[str]
    embeddings: torch.Tensor
    """``(U, D)`` unit vectors."""
    cand: np.ndarray
    """``(C, M)`` sentence index of each candidate, ``-1`` when the draw gave no sentence."""
    tokens: np.ndarray
    """``(C, M)`` tokens each candidate took to draw."""
    doc_contexts: list[np.ndarray]
    """Context indices (rows of ``cand``) of each document, in order."""
    seeds: np.ndarray
    """``(D,)`` sentence index of each document's seed (the prompt's last sentence)."""
    attacked: dict[str, torch.Tensor]
    """Per attack, ``(U, D)`` attacked embeddings (actual or displacement-modelled)."""
    actual: dict[str, np.ndarray]
    """Per attack, the sentence indices whose attacked embedding is an actual paraphrase."""
    para_index: dict[str, np.ndarray]
    """Per attack, ``(U,)`` the sentence index of the actual paraphrase, ``-1`` if none."""
    human: list[np.ndarray]
    """Per document, sentence indices of its human continuation (prompt's last sentence first)."""
    scale: dict[str, float] = field(default_factory=dict)
    """Per attack, the factor applied to modelled displacements (``displacement_scale``)."""

    @property
    def num_docs(self) -> int:
        return len(self.doc_contexts)


def _embed_all(encoder_spec: str, sentences: Sequence[str]) -> torch.Tensor:
    from ksemstamp.assets import load_encoder
    from ksemstamp.calibration import CachedEncoder, embedding_store

    encoder = load_encoder(encoder_spec)
    cached = CachedEncoder(encoder, store=embedding_store(encoder))
    cached.prefill(sentences, progress=True)
    return F.normalize(cached.encode(list(sentences)).float(), dim=-1)


def displaced(
    emb: torch.Tensor, sources: torch.Tensor, moves: torch.Tensor, exclude_self: bool = False
) -> torch.Tensor:
    """Each row of ``emb`` moved by the move of its nearest source (cosine), renormalised.

    ``sources`` ``(P, D)`` are attacked sentences, ``moves`` ``(P, D)`` their paraphrase minus
    original. With ``exclude_self`` a row identical to a source uses its next-nearest source
    (leave-one-out, for checking the model on the sources themselves).
    """
    out = torch.empty_like(emb)
    for start in range(0, len(emb), 4096):
        part = emb[start : start + 4096]
        sim = part @ sources.T
        if exclude_self:
            sim = sim.masked_fill(sim > 1 - 1e-6, -2.0)
        nearest = sim.argmax(dim=1)
        out[start : start + 4096] = F.normalize(part + moves[nearest], dim=-1)
    return out


def displacement_scale(
    emb: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, steps: int = 30
) -> float:
    """The factor ``f`` by which to scale modelled displacements so that, leaving each attacked
    sentence out and moving it by ``f`` times its nearest other source's move, the mean cosine
    between sentence and modelled paraphrase equals that of the actual paraphrases (bisection
    on ``[0.5, 3]``; the cosine falls as ``f`` grows)."""
    if len(src) < 2:
        return 1.0
    target = float((emb[src] * emb[dst]).sum(dim=1).mean())
    moves = emb[dst] - emb[src]
    lo, hi = 0.5, 3.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        moved = displaced(emb[src], emb[src], mid * moves, exclude_self=True)
        if float((emb[src] * moved).sum(dim=1).mean()) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def load_ingredients(
    pool_path: str | Path,
    pairs_path: str | Path,
    encoder: str = "all-minilm-l6-v2",
    human_split: str = "val",
    calibrate: bool = True,
) -> Ingredients:
    """Embed and index a pool, its attack pairs and the human continuations of its documents.

    ``calibrate=False`` leaves modelled displacements unscaled (the model before calibration)."""
    pool = read_pool(pool_path)
    pairs = read_pairs(pairs_path)
    prompts = {p["id"]: p for p in study_prompts(human_split, 10**9, 32)}
    index: dict[str, int] = {}

    def idx(text: str) -> int:
        if text not in index:
            index[text] = len(index)
        return index[text]

    width = max(len(c["candidates"]) for d in pool for c in d["contexts"])
    cand_rows, token_rows, doc_contexts, seeds, human = [], [], [], [], []
    for doc in pool:
        first = len(cand_rows)
        for ctx in doc["contexts"]:
            row = [idx(t) if t else -1 for t, _ in ctx["candidates"]]
            toks = [n for _, n in ctx["candidates"]]
            # Pad short rows by repeating draws (only a cut-off context can be short).
            cand_rows.append((row * width)[:width])
            token_rows.append((toks * width)[:width])
        doc_contexts.append(np.arange(first, len(cand_rows)))
        seeds.append(idx(doc["seed"]))
        rest = prompts[doc["id"]]["human"] if doc["id"] in prompts else []
        human.append(np.array([idx(doc["seed"]), *(idx(s) for s in rest)]))
    for pair in pairs:
        idx(pair["text"])
        for att in pair["attacks"].values():
            if att:
                idx(att[0])
    sentences = list(index)
    emb = _embed_all(encoder, sentences)

    attacked, actual, para_index, scales = {}, {}, {}, {}
    for name in ATTACKS:
        src = [index[p["text"]] for p in pairs if p["attacks"].get(name)]
        dst = [index[p["attacks"][name][0]] for p in pairs if p["attacks"].get(name)]
        src_t, dst_t = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)
        scales[name] = displacement_scale(emb, src_t, dst_t) if calibrate else 1.0
        if len(src) == 0:
            attacked[name] = emb.clone()
        else:
            moves = scales[name] * (emb[dst_t] - emb[src_t])
            attacked[name] = displaced(emb, emb[src_t], moves)
            attacked[name][src_t] = emb[dst_t]
        actual[name] = np.array(src, dtype=np.int64)
        pi = np.full(len(sentences), -1, dtype=np.int64)
        pi[src] = dst
        para_index[name] = pi
    return Ingredients(
        encoder=encoder,
        sentences=sentences,
        embeddings=emb,
        cand=np.array(cand_rows, dtype=np.int64),
        tokens=np.array(token_rows, dtype=np.int64),
        doc_contexts=doc_contexts,
        seeds=np.array(seeds, dtype=np.int64),
        attacked=attacked,
        actual=actual,
        para_index=para_index,
        scale=scales,
        human=human,
    )


def partial_texts(sentences: Sequence[str], tokens: int, lm: str | None = None) -> list[str]:
    """Each sentence's first ``tokens`` generator tokens, as a candidate row holds them after
    that many decoding steps (a sentence that is not longer stays whole). The generator's
    tokenizer reads the sentence after a space, as the sampler decodes a row."""
    from transformers import AutoTokenizer

    from ksemstamp.assets import DEFAULT_LM, resolve_lm_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_lm_path(lm or DEFAULT_LM))
    out = []
    for sentence in sentences:
        ids = tokenizer(" " + sentence, add_special_tokens=False).input_ids
        out.append(sentence if len(ids) <= tokens else tokenizer.decode(ids[:tokens]).strip())
    return out


def partial_embeddings(ing: Ingredients, checkpoints: Sequence[int]) -> dict[int, torch.Tensor]:
    """``{n: (U, D)}`` unit embeddings of every sentence's first ``n`` generator tokens
    (``partial_texts``), for simulating pruned rounds; kept on disk as the others."""
    return {n: _embed_all(ing.encoder, partial_texts(ing.sentences, n)) for n in checkpoints}
