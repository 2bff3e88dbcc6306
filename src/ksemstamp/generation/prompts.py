"""Prompts as users write them: how generation starts after each kind of prompt.

* **Ends a sentence** ("... It approved the budget."): the LM continues it; the prompt's last
  sentence seeds the first watermarked sentence (the paper's setting).
* **Ends mid-sentence** (the paper's 32-token prompts, a cut article): the open sentence is
  completed first, sampled as usual but not watermarked, stopping at its sentence end; the
  completed (straddling) sentence seeds the first watermarked sentence. Detection with the
  prompt cuts the same sentences (``splitter.continuation_sentences``).
* **Empty**: the LM starts from its start-of-text token; a keyed start value seeds the first
  sentence (``WatermarkScheme.start_region``).
* **Instruction** (``chat``): the prompt is wrapped in the LM's chat template and the answer
  starts fresh, seeded by the keyed start value as for an empty prompt.

The LM sees at most ``budget`` prompt tokens: the left part of a longer prompt is dropped (at a
word boundary) and the record says how many characters went. Sentence decisions (what seeds,
what is completed) are always taken on the whole prompt, as detection takes them, so cutting
what the LM sees never makes generation and detection disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text.normalize import normalize_text
from ..text.splitter import PunktSplitter
from ..text.textcheck import not_text, readable

CONTINUE, COMPLETE, EMPTY, CHAT = "continue", "complete", "empty", "chat"


@dataclass
class PromptStart:
    """Where generation starts after one prompt.

    Attributes:
        kind: ``continue``, ``complete``, ``empty`` or ``chat`` (see the module docstring), or
            ``""`` with ``error`` set.
        prefix: the text the LM sees before the first new token (cut to the budget).
        last_sentence: the sentence before the first candidate (``continue``), or before the open
            sentence (``complete``); ``""`` when there is none.
        seed_sentence: for ``continue``, the sentence whose region seeds the first
            watermarked one.
        open_sentence: for ``complete``, the prompt's unfinished last sentence.
        head: for ``complete``, the open sentence with the whitespace before it, as it follows
            ``last_sentence`` in the prompt (what the sampler puts before each row's text).
        dropped_chars: characters cut from the left of what the LM sees.
        error: why generation cannot start after this prompt.
    """

    kind: str = ""
    prefix: str = ""
    last_sentence: str = ""
    seed_sentence: str | None = None
    open_sentence: str = ""
    head: str = ""
    dropped_chars: int = 0
    error: str | None = None


def prompt_budget(
    max_prompt_tokens: int | None, context: int | None, max_new_tokens: int, sentence_tokens: int
) -> int | None:
    """Most prompt tokens the LM may see: ``max_prompt_tokens``, and never more than the
    context less the continuation and one sentence of slack; ``None`` when unbounded."""
    bounds = [b for b in (max_prompt_tokens,) if b is not None]
    if context is not None:
        room = context - max_new_tokens - sentence_tokens
        if room < 1:
            raise ValueError(
                f"max_new_tokens ({max_new_tokens}) and max_sentence_tokens ({sentence_tokens}) "
                f"leave no room for a prompt in the LM's context of {context} tokens"
            )
        bounds.append(room)
    return min(bounds) if bounds else None


def keep_right(tokenizer, text: str, budget: int | None) -> tuple[str, int]:
    """The right part of ``text`` that fits in ``budget`` tokens, cut at a word start when one
    is near, and how many characters were dropped from the left."""
    if budget is None or tokenizer is None or not text:
        return text, 0
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= budget:
        return text, 0
    cut = offsets[len(offsets) - budget][0]
    # Start on a whole word: skip the rest of a word cut in two (tokens only shrink by this).
    space = next((i for i in range(cut, len(text)) if text[i].isspace()), None)
    if space is not None and space - cut < 64:
        word = next((i for i in range(space, len(text)) if not text[i].isspace()), len(text))
        cut = word if word < len(text) else cut
    return text[cut:], cut


def chat_prefix(tokenizer, instruction: str) -> str:
    """``instruction`` as the user's turn in the LM's chat template, ready for the answer."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat: the language model has no chat template; use an instruction-tuned model "
            "(the default smollm2-135m-instruct has one) or turn chat off"
        )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True
    )
    # A tokenizer that adds its own BOS would double the template's.
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


def start_text(tokenizer) -> str:
    """What the LM sees for an empty prompt: its start-of-text token (``""`` when the tokenizer
    adds one by itself)."""
    if tokenizer is None or _adds_bos(tokenizer):
        return ""
    return tokenizer.bos_token or tokenizer.eos_token or ""


def _adds_bos(tokenizer) -> bool:
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def plan_prompt(
    prompt: object,
    splitter: PunktSplitter,
    tokenizer=None,
    *,
    chat: bool = False,
    budget: int | None = None,
    max_chars: int | None = None,
) -> PromptStart:
    """How generation starts after ``prompt`` (see the module docstring); bad input gets a
    ``PromptStart`` with ``error`` and costs nothing more."""
    if not isinstance(prompt, str):
        return PromptStart(error=f"prompt must be a string, got {type(prompt).__name__}")
    prompt = readable(prompt)[0]  # a lone surrogate would make the tokenizer raise
    if max_chars is not None and len(prompt) > max_chars:
        return PromptStart(
            error=f"the prompt has {len(prompt):,} characters; the limit is {max_chars:,} "
            "(limits.max_text_chars)"
        )
    problem = not_text(prompt, "prompt")
    if problem:
        return PromptStart(error=problem)
    # Dropped characters are counted in the prompt as given (in its normalised form when it
    # needed normalising): prompt[dropped:] is what is kept.
    lead = len(prompt) - len(prompt.lstrip())
    if chat:
        overhead = len(tokenizer(chat_prefix(tokenizer, ""), add_special_tokens=False)["input_ids"])
        room = None if budget is None else budget - overhead
        if room is not None and room < 1:
            return PromptStart(error=f"the chat template alone needs {overhead} tokens")
        kept, dropped = keep_right(tokenizer, prompt.strip(), room)
        dropped += lead if dropped else 0
        return PromptStart(CHAT, chat_prefix(tokenizer, kept), dropped_chars=dropped)
    # Read as detection reads it (``normalize``); the LM sees the normalised prompt too.
    text = normalize_text(prompt).text.strip()
    if not text:
        return PromptStart(EMPTY, start_text(tokenizer))
    prefix, dropped = keep_right(tokenizer, text, budget)
    dropped += lead if dropped else 0
    spans = splitter.spans(text)
    last_at, last = spans[-1]
    context = spans[-2][1] if len(spans) > 1 else ""
    if splitter.ends_sentence(last):
        return PromptStart(
            CONTINUE, prefix, last_sentence=last, seed_sentence=last, dropped_chars=dropped
        )
    gap_from = spans[-2][0] + len(context) if len(spans) > 1 else last_at
    return PromptStart(
        COMPLETE,
        prefix,
        last_sentence=context,
        open_sentence=last,
        head=text[gap_from:last_at] + last,
        dropped_chars=dropped,
    )
