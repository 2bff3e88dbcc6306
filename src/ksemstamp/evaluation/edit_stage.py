"""The evaluation's edit stage: every edit of ``edits`` applied to each watermarked text.

Each text gets each edit named by the run's ``edits`` setting, with a random stream seeded by
the run's ``seed`` and the prompt id, so every algorithm's text of one prompt is edited the same
way (the same shuffle, the same sentences dropped). The interleavings paste human sentences
between the text's own: ``needs_human(edit)`` per sentence of the text, taken from the held-out
human text of the run's *other* prompts (each one's human continuation, then the rest of its
article in the news test split), from the prompt before the text's own backwards and wrapping
round, each article once and never the text's own. A prompt's pool then does not change when
a run is extended with more prompts (except for the first prompts, which wrap).

Edited texts are stored per algorithm and edit (``edits/<algorithm>.<edit>.jsonl``, one record
per prompt id: ``text`` and ``human_sentences``), so a rerun edits only what is missing; they
are detected with the clean text's prompt like the attacked texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..io import ResumableWriter
from ..text.edits import apply_edit, needs_human

SentencesOf = Callable[[dict], list[str]]
"""The human sentences a prompt's article offers (given its prompt record)."""


def human_pool(
    prompts: Sequence[dict], index: int, needed: int, sentences_of: SentencesOf
) -> list[str]:
    """``needed`` human sentences for the text of ``prompts[index]``: the sentences of the other
    prompts' articles, from ``prompts[index - 1]`` backwards (wrapping round), each article
    once and never the text's own. Raises ``ValueError`` when the run's articles hold too few."""
    if needed <= 0:
        return []
    used = {prompts[index].get("article_id", prompts[index]["id"])}
    pool: list[str] = []
    for step in range(1, len(prompts)):
        other = prompts[(index - step) % len(prompts)]
        article = other.get("article_id", other["id"])
        if article in used:
            continue
        used.add(article)
        pool += sentences_of(other)
        if len(pool) >= needed:
            return pool[:needed]
    raise ValueError(
        f"the other prompts' articles hold {len(pool)} sentences; prompt "
        f"{prompts[index]['id']!r} needs {needed} to interleave: run more prompts"
    )


def edit_text(
    name: str,
    text: str,
    prompt_id: Any,
    prompts: Sequence[dict],
    index_of: dict[Any, int],
    seed: int,
    splitter,
    sentences_of: SentencesOf,
) -> dict:
    """The record of ``text`` (the generation for ``prompt_id``) after the edit ``name``."""
    per = needs_human(name)
    human = (
        human_pool(prompts, index_of[prompt_id], per * len(splitter.split(text)), sentences_of)
        if per
        else []
    )
    edited = apply_edit(name, text, seed=f"{seed}|{prompt_id}", human=human, splitter=splitter)
    # A text that completes its prompt's open sentence starts with the space (or none, inside
    # a word) that joins it to the prompt; sentence edits rejoin without it.
    lead = text[: len(text) - len(text.lstrip())]
    if lead and not edited.startswith(lead):
        edited = lead + edited
    return {"id": prompt_id, "text": edited, "human_sentences": len(human)}


class ArticleSentences:
    """The held-out human text of a prompt's article: its human continuation (the run's
    negative) and the rest of the article after it, as sentences (news test split, read once on
    first use)."""

    def __init__(self, splitter) -> None:
        self.splitter = splitter
        self._texts: dict[str, str] | None = None
        self._cache: dict[str, list[str]] = {}

    def __call__(self, prompt: dict) -> list[str]:
        from ..text.corpora import news_articles

        if self._texts is None:
            self._texts = {a.article_id: a.text for a in news_articles("test")}
        key = prompt["article_id"]
        if key not in self._cache:
            article = self.splitter.split(self._texts[key])
            human = self.splitter.split(prompt["human"])
            self._cache[key] = human
            # The continuation's first whole sentence (its first may end the prompt's own).
            for sentence in human[:2]:
                if sentence in article:
                    self._cache[key] = article[article.index(sentence) :]
                    break
        return self._cache[key]


def edit_stage(
    run,
    algorithm: str,
    texts: dict[Any, str],
    prompts: Sequence[dict],
    sentences_of: SentencesOf | None = None,
) -> dict[str, dict[Any, dict]]:
    """Every edit of ``run.settings.edits`` applied to ``texts`` (prompt id -> clean text of
    ``algorithm``), stored and resumed per edit; returns edit -> prompt id -> record.

    ``sentences_of`` gives the human sentences of a prompt's article (default: the news test
    split, ``ArticleSentences``)."""
    from ..text.splitter import get_splitter
    from .predict import read_records

    splitter = get_splitter()
    sentences_of = sentences_of or ArticleSentences(splitter)
    index_of = {p["id"]: k for k, p in enumerate(prompts)}
    out: dict[str, dict[Any, dict]] = {}
    for name in run.settings.edits:
        path = run.root / "edits" / f"{algorithm}.{name}.jsonl"
        with ResumableWriter(path) as writer:
            for i, text in texts.items():
                if not writer.has_id(i):
                    writer.write(
                        edit_text(
                            name,
                            text,
                            i,
                            prompts,
                            index_of,
                            run.settings.seed,
                            splitter,
                            sentences_of,
                        )
                    )
        out[name] = {r["id"]: r for r in read_records(path) if r["id"] in texts}
    return out
