"""The evaluation's edits: what each does, reproducibly, and that normalisation undoes re-typing."""

import random

import pytest

from ksemstamp.text.edits import (
    CYRILLIC,
    EDITS,
    apply_edit,
    hard_wrap,
    homoglyphs,
    merge_pair,
    needs_human,
    split_sentence,
    zero_width,
)
from ksemstamp.text.normalize import normalize_text
from ksemstamp.text.splitter import get_splitter

SENTENCES = [
    f"Sentence {i} says that the council met on day {i}, and that it approved item {i}."
    for i in range(8)
]
TEXT = " ".join(SENTENCES)
HUMAN = [f"Human line {i} is about something else entirely." for i in range(30)]


@pytest.mark.parametrize("name", EDITS)
def test_every_edit_is_reproducible_and_changes_the_text(name):
    human = HUMAN[: needs_human(name) * len(SENTENCES)]
    edited = apply_edit(name, TEXT, seed=3, human=human)
    assert edited == apply_edit(name, TEXT, seed=3, human=human)
    assert edited != TEXT


def test_sentence_order_edits():
    split = get_splitter().split
    shuffled = split(apply_edit("reorder", TEXT, seed=1))
    assert sorted(shuffled) == sorted(SENTENCES) and shuffled != SENTENCES
    swapped = split(apply_edit("swap", TEXT))
    assert swapped[:4] == [SENTENCES[1], SENTENCES[0], SENTENCES[3], SENTENCES[2]]
    assert split(apply_edit("crop", TEXT)) == SENTENCES[:4]
    dropped = split(apply_edit("drop", TEXT, seed=2))
    assert len(dropped) == round(0.7 * len(SENTENCES))
    assert dropped == [s for s in SENTENCES if s in dropped]  # order kept


def test_merge_and_split():
    assert merge_pair("It rained.", "The match went on.") == "It rained, and the match went on."
    assert merge_pair("He left!", "I stayed.") == "He left, and I stayed."
    assert merge_pair("He left.", "NASA said so.") == "He left, and NASA said so."
    merged = get_splitter().split(apply_edit("merge", TEXT))
    assert len(merged) == len(SENTENCES) // 2
    long = "The council met on Monday in the old town hall, and after a long debate it approved the budget."
    first, second = split_sentence(long)
    assert first == "The council met on Monday in the old town hall." and second.startswith(
        "And after"
    )
    assert split_sentence("Short, sentence here.") == ["Short, sentence here."]
    assert len(get_splitter().split(apply_edit("split", TEXT))) == 2 * len(SENTENCES)


@pytest.mark.parametrize("name,per", [("interleave-50", 1), ("interleave-75", 3)])
def test_interleavings(name, per):
    out = get_splitter().split(apply_edit(name, TEXT, human=HUMAN))
    assert len(out) == len(SENTENCES) * (1 + per)
    assert out[:: per + 1] == SENTENCES
    assert sum(s in HUMAN for s in out) / len(out) == per / (per + 1)
    with pytest.raises(ValueError, match="needs"):
        apply_edit(name, TEXT, human=HUMAN[:3])


def test_hard_wrap_keeps_paragraphs_and_reads_back_the_same():
    text = TEXT + "\n\n" + TEXT
    wrapped = hard_wrap(text)
    assert max(len(line) for line in wrapped.split("\n")) <= 72
    assert wrapped.count("\n\n") == 1
    assert get_splitter().split(wrapped) == get_splitter().split(text)


def test_retyping_edits_are_undone_by_normalisation():
    rng = random.Random(0)
    glyphs = homoglyphs(TEXT, rng)
    swapped = sum(a != b for a, b in zip(TEXT, glyphs, strict=True))
    eligible = sum(c in CYRILLIC for c in TEXT)
    assert 0.10 * eligible < swapped < 0.20 * eligible
    assert normalize_text(glyphs).text == TEXT
    invisible = zero_width(TEXT, rng)
    assert len(invisible) > len(TEXT) and normalize_text(invisible).text == TEXT


def test_unknown_edit():
    with pytest.raises(ValueError, match="unknown edit"):
        apply_edit("nope", TEXT)


def test_kgw_reads_retyped_text_as_the_sentence_detectors_do(lm):
    from ksemstamp.evaluation.baselines import KGWDetector
    from ksemstamp.text.edits import homoglyphs

    model, tokenizer = lm
    detector = KGWDetector(model.config, tokenizer)
    retyped = zero_width(homoglyphs(TEXT, random.Random(1)), random.Random(2))
    assert detector.detect_batch([retyped]) == detector.detect_batch([TEXT])
