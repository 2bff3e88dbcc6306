"""Ingredient: candidate next sentences sampled by the generator at real contexts.

For held-out news prompts (``val`` split: the study tunes the design, so it must not look at the
``test`` split that evaluations report), a plain continuation is sampled sentence by sentence with
the generator's own settings. At each of its first ``contexts_per_doc`` positions,
``candidates`` next sentences are sampled from the same prefix, exactly as the watermarking
sampler would draw them (same splitter, same sentence-end rule, same length cut). The pool
keeps text and token counts only; ``pool_embeddings`` derives the embeddings per encoder.

One JSONL line per document, appended as each finishes, so a long run resumes where it stopped::

    {"id": article id, "prompt": str, "seed": last prompt sentence,
     "contexts": [{"previous": sentence before, "candidates": [[text, tokens], ...],
                   "chosen": index continued from}, ...]}

An empty candidate text is a draw that can never become a sentence (no sentence end within
``max_sentence_tokens``, or a continuation that merges into the previous sentence).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ksemstamp.io import ResumableWriter
from ksemstamp.jsonl import read_jsonl


@dataclass
class PoolSettings:
    """How the candidate pool is drawn."""

    documents: int = 30
    """Held-out prompts (``val`` split articles with enough text)."""
    contexts_per_doc: int = 14
    """Sentence positions per document at which candidates are drawn."""
    candidates: int = 32
    """Candidates drawn per context."""
    prompt_words: int = 32
    """Prompt length in words, cut back to a sentence end (paper: ~32)."""
    lm: str = "smollm2-135m-instruct"
    seed: int = 0
    split: str = "val"

    def __post_init__(self) -> None:
        for name in ("documents", "contexts_per_doc", "candidates", "prompt_words"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def study_prompts(split: str, count: int, words: int, min_rest: int = 5) -> list[dict]:
    """The first ``count`` articles of ``split`` with at least ``min_rest`` sentences after a
    prompt of about ``words`` words: ``{"id", "prompt", "human"}`` (``human`` = the rest)."""
    from ksemstamp.evaluation.run import split_article
    from ksemstamp.text.corpora import news_articles
    from ksemstamp.text.splitter import get_splitter

    splitter = get_splitter()
    out = []
    for article in news_articles(split):
        prompt, rest = split_article(splitter.split(article.text), words)
        if len(rest) >= min_rest:
            out.append({"id": article.article_id, "prompt": " ".join(prompt), "human": rest})
        if len(out) == count:
            break
    return out


def _generator(seed: int, doc_id: str) -> torch.Generator:
    digest = hashlib.sha256(f"pool|{seed}|{doc_id}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def build_pool(settings: PoolSettings, path: str | Path, progress: bool = True) -> Path:
    """Draw the pool into ``path`` (JSONL), resuming a partial file."""
    from ksemstamp.assets import load_lm
    from ksemstamp.generation.sampler import CandidateSampler
    from ksemstamp.settings import SamplingSettings
    from ksemstamp.text.splitter import get_splitter

    path = Path(path)
    prompts = study_prompts(settings.split, settings.documents, settings.prompt_words)
    model, tokenizer = load_lm(settings.lm)
    splitter = get_splitter()
    sampler = CandidateSampler(model, tokenizer, splitter, SamplingSettings())
    never = lambda rows, texts: [(False, None)] * len(texts)  # noqa: E731
    with ResumableWriter(path) as out:
        done = set(out.done_ids)
        todo = [p for p in prompts if json.dumps(p["id"]) not in done]
        bar = tqdm(
            total=len(todo) * settings.contexts_per_doc,
            unit="context",
            desc="pool",
            disable=not progress,
        )
        for prompt in todo:
            gen = _generator(settings.seed, prompt["id"])
            prefix = prompt["prompt"]
            previous = splitter.split(prefix)[-1]
            contexts = []
            for _ in range(settings.contexts_per_doc):
                (res,) = sampler.sample_round(
                    [prefix], [settings.candidates], never, [gen], [previous]
                )
                cands = [[c.text, c.num_tokens] for c in res.candidates]
                usable = [i for i, c in enumerate(res.candidates) if c.text]
                chosen = usable[0] if usable else None
                contexts.append({"previous": previous, "candidates": cands, "chosen": chosen})
                bar.update()
                if chosen is None:
                    break
                pick = res.candidates[chosen]
                prefix += pick.separator + pick.text
                previous = pick.text
            out.write(
                {
                    "id": prompt["id"],
                    "prompt": prompt["prompt"],
                    "seed": splitter.split(prompt["prompt"])[-1],
                    "contexts": contexts,
                }
            )
        bar.close()
    return path


def read_pool(path: str | Path) -> list[dict]:
    """The documents of a pool file, in file order."""
    return [r.data for r in read_jsonl(path) if r.data is not None]


def pool_sentences(pool: Sequence[dict]) -> list[str]:
    """Every distinct non-empty sentence of a pool (seeds, previous sentences, candidates)."""
    seen: dict[str, None] = {}
    for doc in pool:
        seen[doc["seed"]] = None
        for ctx in doc["contexts"]:
            for text, _ in ctx["candidates"]:
                if text:
                    seen[text] = None
    return list(seen)
