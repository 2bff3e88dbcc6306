"""Corpus helpers: windows, source allocation, prompt cutting."""

from ksemstamp.text.corpora import allocate, leading_sentences, make_windows


def test_make_windows_cuts_by_words_and_drops_short_tails():
    units = [f"w{i} x y z." for i in range(10)]  # 4 words each
    assert make_windows(units, 12) == [" ".join(units[i : i + 3]) for i in (0, 3, 6)]
    # the tail (one unit, 4 words) is under half of 12 words: dropped
    assert make_windows(units, 12, min_units=4) == []
    assert make_windows(units[:2], 12, min_units=2) == [" ".join(units[:2])]  # 8 >= 6 words
    assert make_windows(["a b c", "d e f"], 4, min_units=1, joiner="\n") == ["a b c\nd e f"]


def test_allocate_spreads_and_redistributes():
    assert allocate({"a": 100, "b": 100, "c": 100}, 30) == {"a": 10, "b": 10, "c": 10}
    got = allocate({"a": 100, "b": 3, "c": 100}, 30)
    assert got["b"] == 3 and sum(got.values()) == 30
    assert allocate({"a": 2, "b": 1}, 10) == {"a": 2, "b": 1}


def test_make_windows_can_drop_every_tail():
    units = ["a b c.", "d e.", "f g h i."]
    assert make_windows(units, 5, min_units=1) == ["a b c. d e.", "f g h i."]
    assert make_windows(units, 5, min_units=1, keep_tail=False) == ["a b c. d e."]


def test_leading_sentences_stay_within_the_word_budget():
    sentences = ["One two three.", "Four five six seven.", "Eight."]
    assert leading_sentences(sentences, 7) == (sentences[:2], sentences[2:])
    assert leading_sentences(sentences, 1) == (sentences[:1], sentences[1:])
    assert leading_sentences([], 5) == ([], [])
