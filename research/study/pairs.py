"""Ingredient: what the evaluation's attacks do to generated sentences.

Sentences are taken from a candidate pool (``pool``): every sentence the plain continuation
kept, plus a random sample of the other usable candidates, so that the sentences a watermark
would accept (which are ordinary candidates that happened to land in a valid region) are
represented. Each is attacked sentence by sentence, as ``evaluation.attacks`` attacks a text:

* ``lm-paraphrase``: few-shot SmolLM2 paraphrase, the most similar of 4 samples;
* ``lm-bigram``: among 8 samples within similarity 0.75, the one sharing fewest token bigrams;
* ``wordnet``: WordNet substitution of 40% of replaceable words, the most similar of 4.

Similarity is measured with an encoder other than the watermark's (``similarity_encoder``,
all-mpnet-base-v2 by default): an attacker does not hold the watermark's encoder, and picking
paraphrases by that encoder's own similarity would keep regions artificially often. The two LM
attacks share their samples (the first 4 of the 8 serve the paraphrase attack); samples are
i.i.d., so this is the same attack as drawing them apart.

Output: one JSONL line per sentence ``{"id", "text", "attacks": {name: [paraphrase, sim]}}``,
appended per chunk so a long run resumes.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ksemstamp.io import ResumableWriter
from ksemstamp.jsonl import read_jsonl

from .pool import read_pool

ATTACKS = ("lm-paraphrase", "lm-bigram", "wordnet")


@dataclass
class PairSettings:
    """Which pool sentences are attacked, and how."""

    sentences: int = 1500
    """Sentences in all (the continuation's own sentences first, then a random sample)."""
    lm: str = "smollm2-135m-instruct"
    similarity_encoder: str = "all-mpnet-base-v2"
    bigram_bound: float = 0.75
    chunk: int = 16
    seed: int = 0


def sentence_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def select_sentences(pool: list[dict], count: int, seed: int = 0) -> list[str]:
    """The continuation's sentences, then a seeded sample of other usable candidates."""
    chosen: dict[str, None] = {}
    others: dict[str, None] = {}
    for doc in pool:
        for ctx in doc["contexts"]:
            for i, (text, _) in enumerate(ctx["candidates"]):
                if text:
                    (chosen if i == ctx["chosen"] else others)[text] = None
    rest = [t for t in others if t not in chosen]
    random.Random(seed).shuffle(rest)
    return (list(chosen) + rest)[:count]


def build_pairs(settings: PairSettings, pool_path: str | Path, path: str | Path) -> Path:
    """Attack the selected pool sentences into ``path`` (JSONL), resuming a partial file."""
    from ksemstamp.assets import load_encoder, load_lm
    from ksemstamp.evaluation.attacks import WordNetCandidates, select_best, select_bigram
    from ksemstamp.paraphrase import LMParaphraser

    sentences = select_sentences(read_pool(pool_path), settings.sentences, settings.seed)
    lm = LMParaphraser(lm=load_lm(settings.lm), num_candidates=8, seed=settings.seed)
    wordnet = WordNetCandidates(num_candidates=4, rate=0.4, seed=settings.seed)
    encoder = load_encoder(settings.similarity_encoder)

    def sims(original: str, cands: list[str]) -> list[float]:
        if not cands:
            return []
        emb = encoder.encode([original, *cands], convert_to_tensor=True)
        emb = torch.nn.functional.normalize(emb.float(), dim=-1)
        return (emb[1:] @ emb[0]).tolist()

    with ResumableWriter(path) as out:
        todo = [s for s in sentences if json.dumps(sentence_id(s)) not in out.done_ids]
        bar = tqdm(total=len(todo), unit="sentence", desc="pairs")
        for start in range(0, len(todo), settings.chunk):
            chunk = todo[start : start + settings.chunk]
            lm_cands = lm.candidates(chunk)
            wn_cands = wordnet.candidates(chunk)
            for text, lc, wc in zip(chunk, lm_cands, wn_cands, strict=True):
                attacks = {}
                first4 = lc[:4]
                s4 = sims(text, first4)
                pick = select_best(text, first4, s4)
                attacks["lm-paraphrase"] = None if pick is None else [first4[pick], s4[pick]]
                s8 = sims(text, lc)
                pick = select_bigram(text, lc, s8, settings.bigram_bound)
                attacks["lm-bigram"] = None if pick is None else [lc[pick], s8[pick]]
                sw = sims(text, wc)
                pick = select_best(text, wc, sw)
                attacks["wordnet"] = None if pick is None else [wc[pick], sw[pick]]
                out.write({"id": sentence_id(text), "text": text, "attacks": attacks})
            bar.update(len(chunk))
        bar.close()
    return Path(path)


def read_pairs(path: str | Path) -> list[dict]:
    return [r.data for r in read_jsonl(path) if r.data is not None]
