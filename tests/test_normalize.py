"""Text normalisation: what it removes, folds and joins, and that it is stable."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ksemstamp.text.normalize import LOOK_ALIKES, fold_look_alikes, join_lines, normalize_text


def test_invisible_characters_are_removed_and_counted():
    out = normalize_text("wa\u200bter\u00admark\u2060 is\ufeff here\u202e.")
    assert out.text == "watermark is here."
    assert out.counts == {"invisible": 5}
    assert out.tampered


def test_compatibility_forms_read_as_plain_letters():
    out = normalize_text("\ufb01ne \uff37ords\u2026 and\u00a0\U0001d41bold")
    assert out.text == "fine Words... and bold"
    assert out.counts["compatibility"] == 5  # the ligature, W, the ellipsis, nbsp, bold b
    assert not out.tampered


def test_look_alike_letters_are_read_as_latin_in_latin_words():
    attacked = "Th\u0435 c\u043euncil m\u0435t \u0440ublicly \u0430nd \u0441\u043e\u0440\u0435d."
    out = normalize_text(attacked)
    assert out.text == "The council met publicly and coped."
    assert out.counts == {"look_alike": 9}
    assert out.tampered


def test_real_words_of_other_scripts_are_left_alone():
    for word in ("\u043f\u0440\u0438\u0432\u0435\u0442", "\u03bb\u03cc\u03b3\u03bf\u03c2"):
        assert fold_look_alikes(f"He said {word} twice.") == (f"He said {word} twice.", 0)


def test_look_alike_table_maps_to_ascii_letters():
    assert all(len(v) == 1 and v.isascii() and v.isalpha() for v in LOOK_ALIKES.values())
    assert not any(k.isascii() for k in LOOK_ALIKES)


@pytest.mark.parametrize(
    "text,expected,joined",
    [
        ("a long line\nwrapped here.", "a long line wrapped here.", 1),
        ("one.\n\ntwo.", "one.\n\ntwo.", 0),
        ("items:\n- one\n- two\n* three\n1. four\n2) five", None, 0),
        ("It rose by\n20. Then it fell", "It rose by 20. Then it fell", 1),  # a wrap, no item
        # after a line that does not end a sentence an item continues it, and so does the next
        # one: the joined line is what the next break is decided on (idempotence)
        ("Shopping list\n- eggs\n- milk", "Shopping list - eggs - milk", 2),
        ("# Title\nfirst line\nsecond line", "# Title\nfirst line second line", 1),
        ("trailing spaces   \n   next", "trailing spaces next", 1),
        ("ends with a break\n", "ends with a break\n", 0),
        ("no break at all", "no break at all", 0),
    ],
)
def test_single_line_breaks_inside_a_paragraph_are_joined(text, expected, joined):
    assert join_lines(text) == (text if expected is None else expected, joined)


def test_line_separators_are_unified_before_joining():
    out = normalize_text("a\r\nb\rc\x85d\u2028e\u2029f")
    assert out.text == "a b c d e\n\nf"
    assert out.counts == {"line_breaks": 4}


def test_lone_surrogates_are_removed():
    out = normalize_text("bro\ud800ken")
    assert out.text == "broken" and out.counts == {"invalid": 1}
    out.text.encode("utf-8")  # a model can read it now


def test_plain_ascii_text_is_unchanged():
    text = "The council met on Monday. It approved the budget.\n\nA new paragraph."
    assert normalize_text(text).text == text and normalize_text(text).counts == {}


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_normalisation_is_idempotent_on_any_string(text):
    once = normalize_text(text)
    twice = normalize_text(once.text)
    assert twice.text == once.text
    assert twice.counts == {}
    once.text.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab .\n-#1") + ["\u200b", "\u0430", "\r"])))
@example("1\r- \r- ")  # a list-like line joined into a paragraph: the next one joins it too
def test_normalisation_is_idempotent_on_line_structure(text):
    once = normalize_text(text).text
    assert normalize_text(once).text == once
    assert "\r" not in once and "\u200b" not in once
