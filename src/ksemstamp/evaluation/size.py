"""The *size* of a watermark, as MarkMyWords reports it: how much generated text detection needs.

For each clean watermarked text, the prefixes that end at each of its sentence ends (the
sentences detection cuts, with the text's prompt) are detected in turn; the text's size is the
number of generated tokens (counted with the generator's tokenizer) of the shortest prefix whose
p-value is at most ``alpha`` (0.01). A text that never gets there, not even whole, has an
infinite size. An algorithm's size is the median over its texts, infinite sizes included (so
the median is itself infinite when more than half never reach ``alpha``), with the count of
texts that never do.

The prefixes' p-values and token counts are stored per algorithm (``sizes/<algorithm>.jsonl``,
one record per prompt id), so a rerun detects only the texts not yet measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..text.normalize import normalize_text

SIZE_ALPHA = 0.01


def sentence_ends(splitter, prompt: str | None, text: str) -> list[int]:
    """Offsets in the normalised ``text`` where each of its sentences ends, the sentences being
    those detection cuts from ``text`` after ``prompt`` (``splitter.continuation_sentences``):
    when the prompt ends mid-sentence, the completion of that sentence is not one of them."""
    text = normalize_text(text).text
    prompt = normalize_text(prompt).text if prompt else prompt
    prompt_sentences = splitter.split(prompt) if prompt else []
    if not prompt_sentences or splitter.ends_sentence(prompt_sentences[-1]):
        return [at + len(s) for at, s in splitter.spans(text)]
    head = prompt.rstrip()
    return [at + len(s) - len(head) for at, s in splitter.spans(head + text) if at >= len(head)]


def first_reaching(
    p_values: Sequence[float | None], tokens: Sequence[int], alpha: float = SIZE_ALPHA
) -> int | None:
    """Tokens of the shortest prefix with ``p <= alpha`` (prefixes in order of length), or
    ``None`` when none reaches it (a prefix without a p-value never does)."""
    for p, n in zip(p_values, tokens, strict=True):
        if p is not None and p <= alpha:
            return n
    return None


def median_size(sizes: Sequence[int | None]) -> dict:
    """The median of per-text sizes with ``None`` read as infinite, and how many are.

    ``median_tokens`` is ``None`` when there is no text or when the median is infinite."""
    values = sorted(math.inf if s is None else float(s) for s in sizes)
    never = sum(s is None for s in sizes)
    median: float | None = None
    if values:
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        median = None if math.isinf(median) else median
    return {"texts": len(values), "never": never, "median_tokens": median, "alpha": SIZE_ALPHA}


def measure(
    texts: Sequence[str],
    prompts: Sequence[str | None],
    detect: Callable[[list[str], list[str | None]], list[dict]],
    count_tokens: Callable[[str], int],
    splitter,
    alpha: float = SIZE_ALPHA,
) -> list[dict]:
    """For each text: the tokens and p-value of each sentence-end prefix, and its size.

    ``detect(texts, prompts)`` gives a record with ``p_value`` per text (as ``Run._detector``);
    all prefixes of all texts go to it in one call."""
    prefixes: list[list[str]] = []
    for text, prompt in zip(texts, prompts, strict=True):
        norm = normalize_text(text).text
        prefixes.append([norm[:end] for end in sentence_ends(splitter, prompt, text)])
    flat = [p for group in prefixes for p in group]
    flat_prompts = [prompt for prompt, group in zip(prompts, prefixes, strict=True) for _ in group]
    found = detect(flat, flat_prompts) if flat else []
    out, pos = [], 0
    for group in prefixes:
        p_values = [found[pos + k].get("p_value") for k in range(len(group))]
        tokens = [count_tokens(p) for p in group]
        pos += len(group)
        out.append(
            {
                "prefix_tokens": tokens,
                "p_values": p_values,
                "tokens": first_reaching(p_values, tokens, alpha),
            }
        )
    return out


def generator_token_counter(lm: str) -> Callable[[str], int]:
    """Counts a text's tokens with the tokenizer of the generator ``lm`` (no special tokens)."""
    from transformers import AutoTokenizer

    from ..assets import resolve_lm_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_lm_path(lm))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def size_stage(
    run,
    algorithm: str,
    texts: dict[Any, str],
    prompts: dict[Any, str],
    count_tokens: Callable[[str], int] | None = None,
    batch: int = 16,
) -> dict:
    """The size of ``algorithm``'s mark over its clean ``texts`` (prompt id -> text), each
    detected under its evaluation key with its prompt; stored and resumed per prompt id.
    ``count_tokens`` defaults to the generator's tokenizer."""
    from ..io import ResumableWriter
    from ..text.splitter import get_splitter
    from .predict import read_records

    path = run.root / "sizes" / f"{algorithm}.jsonl"
    with ResumableWriter(path) as out:
        pending = [i for i in texts if not out.has_id(i)]
        if pending and count_tokens is None:
            count_tokens = generator_token_counter(
                run.settings.watermark_config(algorithm).model.lm
            )
        splitter = get_splitter()
        for key_index in range(run.settings.num_keys):
            group = [i for i in pending if run.key_index.get(i, 0) == key_index]
            if not group:
                continue
            detect = run._detector(algorithm, key_index)
            for start in range(0, len(group), batch):
                chunk = group[start : start + batch]
                measured = measure(
                    [texts[i] for i in chunk],
                    [prompts[i] for i in chunk],
                    detect,
                    count_tokens,
                    splitter,
                )
                for i, record in zip(chunk, measured, strict=True):
                    out.write({"id": i, "key_index": key_index, **record})
    records = [r for r in read_records(path) if r["id"] in texts]
    return median_size([r["tokens"] for r in records])
