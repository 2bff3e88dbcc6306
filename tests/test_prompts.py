"""How generation starts after each kind of prompt, on a stand-in tokenizer (no model)."""

import re

import pytest

from ksemstamp.generation.hf import context_length
from ksemstamp.generation.prompts import (
    CHAT,
    COMPLETE,
    CONTINUE,
    EMPTY,
    chat_prefix,
    keep_right,
    plan_prompt,
    prompt_budget,
    start_text,
)
from ksemstamp.text.splitter import get_splitter


class WordTokenizer:
    """One token per word (with the space before it), a chat template, a BOS it does not add."""

    bos_token, eos_token, bos_token_id = "<s>", "</s>", 1
    chat_template = "user: {content}\nassistant:"

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        spans = [m.span() for m in re.finditer(r"\s*\S+", text)]
        out = {"input_ids": [7] * len(spans)}
        if return_offsets_mapping:
            out["offset_mapping"] = spans
        return out

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return self.bos_token + self.chat_template.format(content=messages[0]["content"])


@pytest.fixture
def splitter():
    return get_splitter()


def test_a_prompt_that_ends_a_sentence_is_continued_and_seeds(splitter):
    start = plan_prompt("  It rained. The council met on Monday. ", splitter, WordTokenizer())
    assert start.kind == CONTINUE and start.error is None
    assert start.prefix == "It rained. The council met on Monday."
    assert start.last_sentence == start.seed_sentence == "The council met on Monday."


def test_a_prompt_that_ends_mid_sentence_is_to_be_completed(splitter):
    start = plan_prompt("It rained.\n\nThe council met on", splitter, WordTokenizer())
    assert start.kind == COMPLETE and start.seed_sentence is None
    assert start.last_sentence == "It rained." and start.open_sentence == "The council met on"
    assert start.head == "\n\nThe council met on"  # as it follows the context in the prompt
    alone = plan_prompt("The council met on", splitter, WordTokenizer())
    assert alone.last_sentence == "" and alone.head == "The council met on"


def test_empty_prompt_and_chat(splitter):
    tok = WordTokenizer()
    assert plan_prompt(" \n", splitter, tok).kind == EMPTY
    assert plan_prompt("", splitter, tok).prefix == "<s>" == start_text(tok)
    chat = plan_prompt("Write a story. About a", splitter, tok, chat=True)
    assert chat.kind == CHAT and chat.prefix == "<s>user: Write a story. About a\nassistant:"
    assert chat.seed_sentence is None and chat.open_sentence == "" and chat.last_sentence == ""
    with pytest.raises(ValueError, match="no chat template"):
        chat_prefix(None, "x")


def test_a_long_prompt_loses_its_left_part_at_a_word(splitter):
    tok = WordTokenizer()
    words = [f"w{i}" for i in range(1000)]
    prompt = " ".join(words) + ". The council met on Monday."
    start = plan_prompt("\n  " + prompt, splitter, tok, budget=100)
    assert start.kind == CONTINUE and start.dropped_chars > 0
    assert start.prefix == ("\n  " + prompt)[start.dropped_chars :]
    assert len(tok(start.prefix)["input_ids"]) <= 100 and start.prefix.startswith("w")
    # the seed is still the prompt's own last sentence, whatever the LM sees
    assert start.seed_sentence == "The council met on Monday."
    # a chat instruction is cut the same way, the template kept whole
    chat = plan_prompt(prompt, splitter, tok, chat=True, budget=100)
    assert chat.dropped_chars > 0 and chat.prefix.startswith("<s>user: w")
    assert len(tok(chat.prefix)["input_ids"]) <= 100
    assert keep_right(tok, "short one", 5) == ("short one", 0)
    assert keep_right(None, "no tokenizer", 1) == ("no tokenizer", 0)


def test_refusals_cost_nothing(splitter):
    tok = WordTokenizer()
    assert "must be a string" in plan_prompt(None, splitter, tok).error
    assert "limit is 10" in plan_prompt("x" * 11, splitter, tok, max_chars=10).error
    assert "not text" in plan_prompt("\x00\x01\x02 ok", splitter, tok).error
    assert "template alone" in plan_prompt("Hi.", splitter, tok, chat=True, budget=2).error


def test_the_budget_fits_the_context():
    class Config:
        max_position_embeddings = 1000

    class Model:
        config = Config()

    assert context_length(Model()) == 1000 and context_length(None) is None
    assert prompt_budget(512, 1000, 200, 64) == 512
    assert prompt_budget(None, 1000, 200, 64) == 736
    assert prompt_budget(None, None, 200, 64) is None
    with pytest.raises(ValueError, match="no room for a prompt"):
        prompt_budget(512, 1000, 990, 64)
