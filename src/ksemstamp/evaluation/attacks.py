"""Sentence-by-sentence paraphrase attacks, as in the paper's evaluation.

A *paraphraser* turns a list of sentences into a list of candidate lists (several candidates per
sentence, all sentences of all texts in one batch). An ``Attack`` splits each text into
sentences, asks the paraphraser for candidates, keeps one candidate per sentence and joins them:

* ``select="best"``: the plain paraphrase attack. The candidate most similar to the original
  among those that differ from it (a stand-in for a paraphraser's top beam; small LMs drift, so
  the most faithful candidate is the fair choice).
* ``select="bigram"``: the bigram attack. Among candidates whose similarity to the original is
  at least ``similarity_bound``, the one sharing the fewest token bigrams with it; when none
  meets the bound, the most similar candidate.

The paraphrasers: a seq2seq model, the causal LM of ``ksemstamp.paraphrase`` (few-shot
prompts with cached examples) and WordNet substitution (``training.wordnet``).

Similarity is the cosine of sentence-encoder embeddings (``similarity_encoder``), an
embedding-based stand-in for BERTScore, from an encoder other than the watermark's (offline
default all-mpnet-base-v2; the watermark reads all-MiniLM-L6-v2), so that the attacker does not
choose its candidates with the detector's own eyes.

The document-level rewrite (windows of several sentences rewritten at once) is in ``rewrite``.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..assets import AssetError
from ..paraphrase import LMParaphraser
from ..settings.attacks import AttackSettings
from .metrics import words


class Paraphraser(Protocol):
    """Anything that proposes paraphrase candidates for sentences."""

    def candidates(self, sentences: list[str]) -> list[list[str]]:
        """For each sentence, a list of candidate paraphrases (possibly empty)."""
        ...


# ---------------------------------------------------------------------- paraphrasers


class Seq2SeqParaphraser:
    """A sequence-to-sequence paraphraser (Pegasus, Parrot/T5, ...) by Hub id or local folder.

    No such weights ship offline; this is for users with Hub access or a local copy. The model
    loads on first use. Candidates come from beam search (``num_candidates`` returned beams),
    as the paper's Pegasus setting.
    """

    def __init__(
        self,
        model: str,
        num_candidates: int = 4,
        num_beams: int | None = None,
        max_new_tokens: int = 64,
        prefix: str = "",
        device: str = "cpu",
    ) -> None:
        self.model_name = model
        self.num_candidates = num_candidates
        self.num_beams = max(num_beams or num_candidates, num_candidates)
        self.max_new_tokens = max_new_tokens
        self.prefix = prefix  # e.g. "paraphrase: " for T5-style models
        self.device = device
        self._loaded = None

    def _load(self):
        if self._loaded is None:
            from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(self.model_name)
                model = AutoModelForSeq2SeqLM.from_pretrained(self.model_name)
            except (OSError, ValueError) as err:
                raise AssetError(
                    f"could not load the seq2seq paraphraser '{self.model_name}': {err}. "
                    "No Pegasus/Parrot weights ship offline: give a local folder or a Hub id "
                    "with Hub access, or use the `lm` or `wordnet` paraphraser."
                ) from err
            self._loaded = (model.to(self.device).eval(), tokenizer)
        return self._loaded

    @torch.no_grad()
    def candidates(self, sentences: list[str]) -> list[list[str]]:
        if not sentences:
            return []
        model, tokenizer = self._load()
        enc = tokenizer(
            [self.prefix + s for s in sentences], return_tensors="pt", padding=True, truncation=True
        ).to(self.device)
        out = model.generate(
            **enc,
            num_beams=self.num_beams,
            num_return_sequences=self.num_candidates,
            max_new_tokens=self.max_new_tokens,
        )
        texts = [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
        n = self.num_candidates
        return [texts[i * n : (i + 1) * n] for i in range(len(sentences))]


class WordNetCandidates:
    """Lexical substitution: several independent draws of the project's WordNet paraphraser."""

    def __init__(self, num_candidates: int = 4, rate: float = 0.4, seed: int = 0) -> None:
        from ..training.wordnet import WordNetParaphraser

        self.paraphraser = WordNetParaphraser(rate=rate)
        self.num_candidates = num_candidates
        self.seed = seed

    def candidates(self, sentences: list[str]) -> list[list[str]]:
        out = []
        for sentence in sentences:
            # Seeded by the sentence so its candidates do not depend on the batch around it.
            rng = random.Random(f"{self.seed}|{sentence}")
            draws = [self.paraphraser.paraphrase(sentence, rng) for _ in range(self.num_candidates)]
            out.append(list(dict.fromkeys(d for d in draws if d)))
        return out


def _paraphraser(settings: AttackSettings, lm=None) -> Paraphraser:
    """The candidates of a sentence attack's ``paraphraser`` (``lm``, ``wordnet``, ``seq2seq``)."""
    if settings.paraphraser == "wordnet":
        return WordNetCandidates(settings.num_candidates, settings.rate, **settings.given("seed"))
    if settings.paraphraser == "seq2seq":
        return Seq2SeqParaphraser(
            settings.model,
            settings.num_candidates,
            prefix=settings.prefix,
            **settings.given("num_beams", "max_new_tokens"),
        )
    options = ("prompts", "temperature", "top_p", "max_new_tokens", "batch_size", "seed")
    return LMParaphraser(
        lm=lm,
        model=settings.model,
        num_candidates=settings.num_candidates,
        **settings.given(*options),
    )


def sentence_attack(settings: AttackSettings, lm, encoder, splitter) -> Attack | Recursive:
    """The sentence-by-sentence attack an attack's settings describe (the ``ATTACK_KINDS``
    builder of ``lm``, ``wordnet`` and ``seq2seq``), ``passes`` times over."""
    bound = 0.8 if settings.similarity_bound is None else settings.similarity_bound
    attack = Attack(_paraphraser(settings, lm), encoder, splitter, settings.select, bound)
    return attack if settings.passes == 1 else Recursive(attack, settings.passes)


def build_attack(settings: AttackSettings | dict, lm, encoder, splitter):
    """The attack an entry of ``attacks`` describes, built by its kind's registered builder
    (``settings.attacks.ATTACK_KINDS``); ``lm``: the loaded LM of ``model`` when the kind
    uses one."""
    if isinstance(settings, dict):
        settings = AttackSettings(**settings)
    module, _, name = settings.kind.builder.partition(":")
    return getattr(importlib.import_module(module), name)(settings, lm, encoder, splitter)


# ---------------------------------------------------------------------- selection


def bigrams(text: str) -> list[tuple[str, str]]:
    tokens = words(text)
    return list(zip(tokens, tokens[1:], strict=False))


def bigram_overlap(original: str, candidate: str) -> float:
    """Share of the original's token bigrams that also occur in the candidate (0 = none)."""
    source = bigrams(original)
    if not source:
        return 0.0
    target = set(bigrams(candidate))
    return sum(b in target for b in source) / len(source)


def select_best(
    original: str, candidates: Sequence[str], similarities: Sequence[float]
) -> int | None:
    """Index of the most similar candidate that differs from ``original``; ``None`` if none."""
    best = None
    for i, (cand, sim) in enumerate(zip(candidates, similarities, strict=True)):
        if cand.strip() != original.strip() and (best is None or sim > similarities[best]):
            best = i
    return best


def select_bigram(
    original: str, candidates: Sequence[str], similarities: Sequence[float], bound: float
) -> int | None:
    """Index of the least-bigram-overlap candidate with similarity ``>= bound``.

    Ties in overlap go to the more similar candidate. When no candidate meets the bound the
    most similar one is kept (the attacker will not submit a sentence it knows drifted).
    """
    within = [i for i, s in enumerate(similarities) if s >= bound]
    if not within:
        return max(range(len(candidates)), key=lambda i: similarities[i]) if candidates else None
    return min(within, key=lambda i: (bigram_overlap(original, candidates[i]), -similarities[i]))


def embed_unit(encoder, texts: list[str]) -> torch.Tensor:
    """``(len(texts), D)`` unit embeddings of ``texts`` on the CPU (``(0, 1)`` for none)."""
    if not texts:
        return torch.zeros(0, 1)
    emb = encoder.encode(texts, convert_to_tensor=True, show_progress_bar=False)
    return torch.nn.functional.normalize(emb.float().cpu(), dim=-1)


@dataclass
class AttackedText:
    """A text after the attack, with its similarity to the original."""

    text: str
    similarity: float
    """Cosine of the embeddings of the whole original and attacked texts."""
    sentence_similarity: float
    """Mean over sentences of the similarity of the kept sentence to its original."""
    changed: int
    """Sentences replaced by a candidate."""
    sentences: int


@dataclass(eq=False)
class Attack:
    """Paraphrase every sentence of each text and keep one candidate per sentence.

    Args:
        paraphraser: proposes candidates (see ``Paraphraser``).
        encoder: a sentence encoder with ``encode(list[str], convert_to_tensor=True)``.
        splitter: sentence splitter with ``split(text)``.
        select: ``best`` or ``bigram``.
        similarity_bound: the bigram attack's semantic-similarity bound.
    """

    paraphraser: Paraphraser
    encoder: Any
    splitter: Any
    select: str = "best"
    similarity_bound: float = 0.8

    def __post_init__(self) -> None:
        if self.select not in ("best", "bigram"):
            raise ValueError(f"select must be 'best' or 'bigram', not {self.select!r}")

    def _embed(self, texts: list[str]) -> torch.Tensor:
        return embed_unit(self.encoder, texts)

    def __call__(self, texts: Sequence[str]) -> list[AttackedText]:
        split = [self.splitter.split(t) for t in texts]
        flat = [s for sentences in split for s in sentences]
        proposals = self.paraphraser.candidates(flat)
        pool = flat + [c for cands in proposals for c in cands]
        emb = self._embed(pool)
        kept, kept_sims = [], []
        offset = len(flat)
        for i, (original, cands) in enumerate(zip(flat, proposals, strict=True)):
            sims = (emb[offset : offset + len(cands)] @ emb[i]).tolist() if cands else []
            offset += len(cands)
            if self.select == "bigram":
                choice = select_bigram(original, cands, sims, self.similarity_bound)
            else:
                choice = select_best(original, cands, sims)
            kept.append(original if choice is None else cands[choice])
            kept_sims.append(1.0 if choice is None else sims[choice])
        results, pos = [], 0
        for text, sentences in zip(texts, split, strict=True):
            n = len(sentences)
            new = kept[pos : pos + n]
            # A text that completes its prompt's sentence starts with the space (or none, in a
            # word) that joins it to the prompt: kept, so the attacked text joins it the same way.
            lead = text[: len(text) - len(text.lstrip())]
            results.append(
                AttackedText(
                    text=lead + " ".join(new),
                    similarity=0.0,
                    sentence_similarity=sum(kept_sims[pos : pos + n]) / n if n else 1.0,
                    changed=sum(a != b for a, b in zip(sentences, new, strict=True)),
                    sentences=n,
                )
            )
            pos += n
        whole = self._embed([*texts, *(r.text for r in results)])
        for i, res in enumerate(results):
            res.similarity = float(whole[i] @ whole[len(texts) + i])
        return results


class Recursive:
    """A sentence ``Attack`` applied ``passes`` times, each pass to the previous one's output;
    similarities are the final text's to the original."""

    def __init__(self, attack: Attack, passes: int) -> None:
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        self.attack = attack
        self.passes = passes

    def __call__(self, texts: Sequence[str]) -> list[AttackedText]:
        current = list(texts)
        results: list[AttackedText] = []
        sims = None
        for _ in range(self.passes):
            results = self.attack(current)
            step = [r.sentence_similarity for r in results]
            sims = step if sims is None else [a * b for a, b in zip(sims, step, strict=True)]
            current = [r.text for r in results]
        whole = embed_unit(self.attack.encoder, [*texts, *current])
        for i, res in enumerate(results):
            res.similarity = float(whole[i] @ whole[len(texts) + i])
            # The product of the passes' similarities stands in for the sentence similarity
            # to the original (the passes may change the number of sentences).
            res.sentence_similarity = float(sims[i])
        return results
