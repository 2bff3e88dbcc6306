"""The LM paraphraser's prompt styles and reply reading (no model)."""

import pytest

from ksemstamp.paraphrase import CHAT, FEW_SHOT, LMParaphraser


class ChatTokenizer:
    """Renders a chat as ``role: content`` lines, so the messages can be read back."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert not tokenize and add_generation_prompt
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def test_few_shot_prompt_is_the_shared_examples_then_the_sentence():
    shared, query = FEW_SHOT.shared(), FEW_SHOT.query("  The vote was close. ")
    assert shared.count("Original: ") == 3 and shared.count("Paraphrase: ") == 3
    assert not shared.endswith("\n") and query == "\n\nOriginal: The vote was close.\nParaphrase:"
    assert FEW_SHOT.read("  It was a close vote.\nOriginal: next") == "It was a close vote."
    assert FEW_SHOT.read('"Quoted."') == '"Quoted."'  # few-shot replies keep their quotes


def test_chat_prompt_is_a_system_instruction_example_turns_then_the_sentence():
    assert CHAT.shared() == ""  # rendered whole: nothing to cache
    lines = CHAT.query("The vote was close.", ChatTokenizer()).splitlines()
    roles = [line.split(":")[0] for line in lines]
    assert roles == ["system"] + ["user", "assistant"] * 3 + ["user", "assistant"]
    assert lines[-2] == "user: The vote was close."
    assert CHAT.read(' "It was a close vote." \nmore') == "It was a close vote."


def test_prompt_styles_by_name():
    paraphraser = LMParaphraser(lm=(None, ChatTokenizer()), prompts="chat")
    assert paraphraser.prompts is CHAT and paraphraser.shots() == ""
    assert paraphraser.prompt("x") == CHAT.query("x", paraphraser.tokenizer)
    assert LMParaphraser(lm=(None, None)).prompts is FEW_SHOT
    with pytest.raises(ValueError, match="prompts must be one of"):
        LMParaphraser(lm=(None, None), prompts="dialogue")


def test_reword_and_rewrite_prompts_share_the_few_shot_form():
    from ksemstamp.paraphrase import REWORD, REWRITE

    assert REWORD.shared().startswith(FEW_SHOT.shared())  # the three examples, then two more
    assert REWORD.shared().count("Paraphrase: ") == 5
    assert REWORD.query("A b.") == FEW_SHOT.query("A b.")
    shared = REWRITE.shared()
    assert shared.count("Original: ") == 3 and shared.count("Rewrite: ") == 3
    # Each example is one passage of several sentences on one line, and so is its rewrite.
    for block in shared.split("\n\n"):
        original, rewrite = block.split("\n")
        assert original.count(". ") >= 1 and rewrite.startswith("Rewrite: ")
    assert REWRITE.query(" One. Two. ") == "\n\nOriginal: One. Two.\nRewrite:"
    assert LMParaphraser(lm=(None, None), prompts="rewrite").prompts is REWRITE
