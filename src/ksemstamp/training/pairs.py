"""Build paraphrase pairs from news sentences or your corpus, offline and resumably.

    ksemstamp pairs --split fit --num 4000 --output data/pairs/news-train.jsonl
    ksemstamp pairs --split val --num 500 --output data/pairs/news-val.jsonl
    ksemstamp pairs --corpus data/domain.txt --num 2000 --output data/pairs/domain-train.jsonl

Sources are sentences of the ``fit`` split (training) or ``val`` split (held-out pairs) of the
news corpus or of a corpus file (``--corpus``, see ``ksemstamp.text.corpusfile``), shuffled with a
seed. Each source gets a paraphrase from the small chat LM (a share
``--lm_share`` of sources, chosen by a hash of their id) or from WordNet substitution, and a
paraphrase is kept only when it is semantically close to its source (cosine under
``--filter_encoder`` of at least ``--min_similarity``) and different enough (word-set overlap of
at most ``--max_overlap``). An LM source whose candidates all fail falls back to WordNet.

Every kept pair is appended and flushed at once; a rerun skips the ids already in the file, so
an interrupted build resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from ..assets import DEFAULT_ENCODER, DEFAULT_LM
from ..io import drop_cut_last_line
from ..jsonl import read_jsonl_objects
from ..settings.checks import SEED, Range

if TYPE_CHECKING:
    from ..paraphrase import LMParaphraser
    from .wordnet import WordNetParaphraser

logger = logging.getLogger(__name__)

_WORD = re.compile(r"[a-z0-9]+")


def word_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the lower-cased word sets of ``a`` and ``b`` (1.0: same words)."""
    wa, wb = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
    if not wa and not wb:
        return 1.0
    return len(wa & wb) / len(wa | wb)


def _unit_hash(text: str) -> float:
    """A number in [0, 1) fixed by ``text``."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / float(1 << 48)


def source_sentences(
    split: str, seed: int = 0, min_words: int = 8, max_words: int = 40, corpus: str | None = None
) -> list[tuple[str, str]]:
    """Shuffled ``(id, sentence)`` of a split of the news corpus, ids
    ``<article_id>:<sentence index>``, or of a corpus file, ids ``<split>-<document index>:<sentence
    index>`` (documents counted within the split)."""
    from ..text.corpora import article_sentences

    if corpus is None:
        out = [
            (f"{article.article_id}:{index}", sentence)
            for article, index, sentence in article_sentences(split, min_words, max_words)
        ]
    else:
        from ..text.corpusfile import read_documents, split_documents
        from ..text.splitter import get_splitter

        splitter = get_splitter()
        out = [
            (f"{split}-{d}:{index}", sentence)
            for d, document in enumerate(split_documents(read_documents(corpus), split))
            for index, sentence in enumerate(splitter.split(document))
            if min_words <= len(sentence.split()) <= max_words
        ]
    random.Random(seed).shuffle(out)
    return out


def done_ids(path: Path) -> set[str]:
    """Ids already written to ``path``; a half-written last line is cut off first."""
    drop_cut_last_line(path)
    return {row["id"] for row in read_jsonl_objects(path, missing_ok=True)}


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def build_pairs(
    output: str | Path,
    num: int,
    split: str = "fit",
    seed: int = 0,
    lm_share: float = 0.0,
    lm: str = DEFAULT_LM,
    lm_candidates: int = 4,
    filter_encoder: str = DEFAULT_ENCODER,
    min_similarity: float = 0.75,
    max_similarity: float = 0.99,
    max_overlap: float = 0.85,
    wordnet_rate: float = 0.5,
    chunk_size: int = 16,
    min_words: int = 8,
    max_words: int = 40,
    progress: bool = True,
    corpus: str | None = None,
) -> int:
    """Append pairs to ``output`` until it holds ``num``; returns the number written now.
    Sources come from ``split`` of ``corpus`` (a corpus file) or of the news corpus."""
    from ..assets import load_encoder
    from ..plots import progress_bar
    from .wordnet import WordNetParaphraser

    if not 0.0 <= lm_share <= 1.0:
        raise ValueError(f"lm_share must be in [0, 1], got {lm_share}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = done_ids(output)
    if len(done) >= num:
        return 0
    sources = [
        (i, s)
        for i, s in source_sentences(split, seed, min_words, max_words, corpus)
        if i not in done
    ]
    wordnet = WordNetParaphraser(rate=wordnet_rate)
    lm_model = _lm_paraphraser(lm, lm_candidates) if lm_share > 0 else None
    encoder = load_encoder(filter_encoder)
    close = _Closeness(min_similarity, max_similarity, max_overlap)
    written = 0
    bar = progress_bar(
        total=num, initial=len(done), desc=f"pairs {split}", unit="pair", disable=not progress
    )
    with output.open("a", encoding="utf-8") as sink:
        for chunk in _chunks(sources, chunk_size):
            if len(done) + written >= num:
                break
            use_lm = [
                lm_model is not None and _unit_hash(f"{seed}:{i}") < lm_share for i, _ in chunk
            ]
            options = _candidates(chunk, use_lm, lm_model, wordnet, seed)
            for record in _kept_pairs(chunk, options, encoder, close)[: num - len(done) - written]:
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                sink.flush()
                written += 1
                bar.update(1)
    bar.close()
    if len(done) + written < num:
        logger.warning("ran out of %s sentences at %d of %d pairs", split, len(done) + written, num)
    return written


def _lm_paraphraser(lm: str, lm_candidates: int) -> LMParaphraser:
    """The chat LM that paraphrases: chat prompts, one unseeded generate per chunk (how the
    recorded pairs were made)."""
    from ..paraphrase import CHAT, LMParaphraser

    return LMParaphraser(
        lm,
        num_candidates=lm_candidates,
        max_new_tokens=64,
        batch_size=None,
        seed=None,
        prompts=CHAT,
    )


def _candidates(
    chunk: Sequence[tuple[str, str]],
    use_lm: list[bool],
    lm_model: LMParaphraser | None,
    wordnet: WordNetParaphraser,
    seed: int,
) -> list[list[tuple[str, str]]]:
    """Per source of ``chunk``, its candidate paraphrases and their method: the LM's samples
    first (where ``use_lm``), then WordNet's substitution as the fallback."""
    lm_out = iter(
        lm_model.candidates([s for (_, s), u in zip(chunk, use_lm, strict=True) if u])
        if any(use_lm)
        else []
    )
    options: list[list[tuple[str, str]]] = []
    for (sid, sentence), lm_used in zip(chunk, use_lm, strict=True):
        cands = [(c, "lm") for c in next(lm_out)] if lm_used else []
        rng = random.Random(f"{seed}:{sid}")
        lexical = wordnet.paraphrase(sentence, rng)
        if lexical is not None:
            cands.append((lexical, "wordnet"))
        options.append(cands)
    return options


@dataclass(frozen=True)
class _Closeness:
    """What a kept paraphrase must be: as close to its source as ``min_similarity`` to
    ``max_similarity`` (cosine under the filter encoder), sharing at most ``max_overlap`` of its
    words."""

    min_similarity: float
    max_similarity: float
    max_overlap: float

    def best(self, sentence: str, cands: list[tuple[str, str]], sims: list[float]) -> tuple | None:
        """``(key, text, method, similarity, overlap)`` of the best candidate that passes, or
        ``None``: LM rewrites first, then the one sharing the fewest words with the source."""
        best = None
        for (text, method), sim in zip(cands, sims, strict=True):
            overlap = word_overlap(sentence, text)
            if not (
                self.min_similarity <= sim <= self.max_similarity and overlap <= self.max_overlap
            ):
                continue
            # Prefer LM rewrites, then the one sharing the fewest words with the source.
            key = (method != "lm", overlap)
            if best is None or key < best[0]:
                best = (key, text, method, sim, overlap)
        return best


def _kept_pairs(
    chunk: Sequence[tuple[str, str]],
    options: list[list[tuple[str, str]]],
    encoder,
    close: _Closeness,
) -> list[dict]:
    """The pair record of each source of ``chunk`` whose best candidate passes ``close``, in
    order; every candidate and source embedded at once."""
    from ..scheme.encoding import embed

    flat = [c for cands in options for c, _ in cands]
    cand_emb = embed(encoder, flat) if flat else None
    src_emb = embed(encoder, [s for _, s in chunk])
    records = []
    row = 0
    for (sid, sentence), cands, src in zip(chunk, options, src_emb, strict=True):
        sims = [float(cand_emb[row + n] @ src) for n in range(len(cands))]
        row += len(cands)
        best = close.best(sentence, cands, sims)
        if best is None:
            continue
        _, text, method, sim, overlap = best
        records.append(
            {
                "id": sid,
                "text": sentence,
                "paraphrase": text,
                "method": method,
                "similarity": round(sim, 4),
                "overlap": round(overlap, 4),
            }
        )
    return records


def _default(name: str):
    """``build_pairs``'s default of ``name``: the command's flags default to it."""
    return inspect.signature(build_pairs).parameters[name].default


def pairs(
    output: str,
    num: Annotated[int, Range(1, 10_000_000)],
    split: Literal["fit", "val", "test"] = _default("split"),
    corpus: str | None = None,
    seed: Annotated[int, SEED] = _default("seed"),
    lm_share: float = _default("lm_share"),
    lm: str = _default("lm"),
    lm_candidates: Annotated[int, Range(1, 256)] = _default("lm_candidates"),
    filter_encoder: str = _default("filter_encoder"),
    min_similarity: float = _default("min_similarity"),
    max_similarity: float = _default("max_similarity"),
    max_overlap: float = _default("max_overlap"),
    wordnet_rate: float = _default("wordnet_rate"),
    chunk_size: Annotated[int, Range(1, 4096)] = _default("chunk_size"),
    threads: Annotated[int, Range(1, 1024)] = 1,
    quiet: bool = False,
) -> int:
    """Build paraphrase pairs for fine-tuning, offline and resumably.

    Args:
        output: JSONL file to append pairs to.
        num: pairs the file should hold.
        split: which documents give the sources: fit (training) or val (held out).
        corpus: your corpus: plain text, one document per line, or JSONL with a 'text' field
            (default: the bundled news corpus).
        seed: seed of the sources' order and of the paraphrasers.
        lm_share: share of sources paraphrased by the LM (the rest by WordNet).
        lm: the chat LM that paraphrases.
        lm_candidates: LM paraphrases sampled per source.
        filter_encoder: encoder of the similarity filter.
        min_similarity: least cosine of a kept paraphrase to its source.
        max_similarity: most cosine of a kept paraphrase to its source.
        max_overlap: most word-set overlap of a kept paraphrase with its source.
        wordnet_rate: share of content words WordNet replaces.
        chunk_size: sources paraphrased together.
        threads: torch CPU threads; one is the safe choice on a shared CPU, where a second
            thread that loses its core makes every small matrix product wait for it (0: torch's
            default).
        quiet: no progress bar.
    """
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    written = build_pairs(
        output,
        num,
        split=split,
        seed=seed,
        lm_share=lm_share,
        lm=lm,
        lm_candidates=lm_candidates,
        filter_encoder=filter_encoder,
        min_similarity=min_similarity,
        max_similarity=max_similarity,
        max_overlap=max_overlap,
        wordnet_rate=wordnet_rate,
        chunk_size=chunk_size,
        progress=not quiet,
        corpus=corpus,
    )
    print(f"wrote {written} pairs to {output}")
    return 0
