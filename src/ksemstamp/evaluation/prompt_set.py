"""The evaluation's prompts and human negatives: held-out news articles cut into a prompt and
the article's own continuation, cut to the generation length (``build_prompts``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..settings.evaluation import EvalSettings
from ..text.corpora import leading_sentences, news_articles

# The prompt rule of every command; other modules import it under this name.
split_article = leading_sentences


def cut_to_tokens(sentences: Sequence[str], count_tokens, max_tokens: int) -> str:
    """Whole sentences from the start until they reach ``max_tokens`` tokens."""
    kept: list[str] = []
    total = 0
    for sentence in sentences:
        kept.append(sentence)
        total += count_tokens(sentence)
        if total >= max_tokens:
            break
    return " ".join(kept)


def cut_at_token(text: str, token_starts, tokens: int) -> tuple[str, str] | None:
    """``text`` cut after its first ``tokens`` tokens, as ``(prompt, rest)`` (``rest`` keeps
    the space before its first word), or ``None`` when the text is not longer than that.
    ``token_starts(text)`` gives the character offset where each token starts."""
    starts = token_starts(text)
    if len(starts) <= tokens:
        return None
    return text[: starts[tokens]], text[starts[tokens] :]


def human_continuation(
    splitter, prompt: str, rest: str, count_tokens, max_tokens: int
) -> tuple[str, int]:
    """The article after ``prompt`` (``rest``, verbatim) as a human negative, cut at a sentence
    end once it holds ``max_tokens`` tokens and at least one sentence after the prompt's own,
    and how many sentences of ``rest`` start after the prompt's end. When the prompt ends
    mid-sentence the negative starts with the rest of that sentence, as a generation starts with
    its completion (and then always has a watermarked sentence); sentences are cut as detection
    cuts prompt and text (``splitter.continuation_sentences``)."""
    head = prompt.rstrip()
    spans = splitter.spans(head + rest)
    inside = [at + len(s) for at, s in spans if at < len(head)]
    end = max([len(head), *inside[-1:]])
    total = count_tokens((head + rest)[len(head) : end])
    after = [(at, s) for at, s in spans if at >= len(head)]
    for k, (at, sentence) in enumerate(after):
        if total >= max_tokens and k:
            break
        end = at + len(sentence)
        total += count_tokens(sentence)
    return (head + rest)[len(head) : end], len(after)


def build_prompts(
    settings: EvalSettings, count_tokens, token_starts=None, split: str = "test"
) -> list[dict]:
    """The first ``num_prompts`` usable articles of the news ``split`` as prompts with human
    negatives (the evaluation reads ``test``; design checks read ``val``).

    Prompts are whole sentences of about ``prompt_words`` words, or, with ``prompt_tokens``,
    the article's first tokens cut wherever they end (``token_starts`` is then required).
    """
    from ..text.splitter import get_splitter

    splitter = get_splitter()
    out = []
    for index, article in enumerate(news_articles(split)):
        if settings.prompt_tokens is None:
            prompt_sentences, rest = split_article(
                splitter.split(article.text), settings.prompt_words
            )
            prompt = " ".join(prompt_sentences)
            human = cut_to_tokens(rest, count_tokens, settings.max_new_tokens)
            following = len(rest)
        else:
            cut = cut_at_token(article.text.strip(), token_starts, settings.prompt_tokens)
            if cut is None:
                continue
            prompt = cut[0]
            human, following = human_continuation(
                splitter, prompt, cut[1], count_tokens, settings.max_new_tokens
            )
        if following < settings.min_human_sentences:
            continue
        out.append(
            {
                "id": f"news-{split}-{index}",
                "article_id": article.article_id,
                "prompt": prompt,
                "human": human,
            }
        )
        if len(out) == settings.num_prompts:
            break
    return out
