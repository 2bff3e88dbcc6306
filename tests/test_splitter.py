import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ksemstamp.text.splitter import ClauseSplitter, clauses, get_splitter


@pytest.fixture
def splitter():
    return get_splitter()


def test_split_handles_abbreviations_and_paragraphs(splitter):
    text = "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday!\n\nA new paragraph"
    assert splitter.split(text) == [
        "Mr. Smith went to Washington.",
        "He arrived at 5 p.m. on Monday!",
        "A new paragraph",
    ]
    assert splitter.split("") == [] and splitter.split("  \n ") == []


@pytest.mark.parametrize(
    "context,continuation,expected",
    [
        ("Trump won.", " He said", ("He said", False)),
        ("Trump won.", " He said so. The", ("He said so.", True)),
        ("She moved to the U.S.", " to give", ("", True)),  # would merge into the context
        # a single line break reads as a space: the label and the sentence merge
        ("Ads:", "\nThe cat sat. It", ("", True)),
        ("Ads:", "\n\nThe cat sat. It", ("The cat sat.", True)),
        ("", " The cat sat. It", ("The cat sat.", True)),
        ("It rained.", " Mr. Smith met", ("Mr. Smith met", False)),  # "Mr." is not an end
        # cut only by a paragraph break, not ended: the next sentence could never follow it
        ("It rained.", " A. There is no basis\n\nB. The", ("", True)),
        ("It rained.", " Key points:\n\nThe cat", ("", True)),
        ("It rained.", " Key points:\nThe cat", ("Key points: The cat", False)),
        ("It rained.", " What now?\nThe cat", ("What now?", True)),
        # a paragraph break ends the sentence before it at once: nothing after it can change
        # the cut; a single line break at the end decides nothing yet
        ("It rained.", " He left.\n\n", ("He left.", True)),
        ("It rained.", " He left.\n", ("He left.", False)),
        ("It rained.", " He left\nat noon. The", ("He left at noon.", True)),  # hard wrap
        ("It rained.", " Key points\n\n", ("", True)),  # closed, but no sentence end
        ("It rained.", " He met Mr.\n\n", ("", True)),
        ("It rained.", " Key points:\n- one", ("", True)),  # a list item stays a break
        ("It rained.", " He won by\n2. Then", ("He won by 2.", True)),  # a wrap, not an item
        ("It rained.", "\n\nHe left.", ("He left.", False)),  # leading breaks are separators
        ("It rained.", "\n\n", ("", False)),
        ("", "He left.\n\n", ("He left.", True)),
        ("", "He le\u200bft. Sh\u0435 came", ("He left.", True)),  # read normalised
    ],
)
def test_next_sentence(splitter, context, continuation, expected):
    assert splitter.next_sentence(context, continuation) == expected


def test_a_title_may_end_at_a_paragraph_break_when_asked(splitter):
    # completing the prompt's own open sentence (a title) accepts the paragraph break
    assert splitter.next_sentence("", "Key points\n\nThe cat", require_end=False) == (
        "Key points",
        True,
    )
    assert splitter.next_sentence("", "Key points\n\nThe cat") == ("", True)
    assert splitter.next_sentence("", "Key points\n\n", require_end=False) == (
        "Key points",
        True,
    )
    # a single line break joins the title to the line after it
    assert splitter.next_sentence("", "Key points\nThe cat", require_end=False) == (
        "Key points The cat",
        False,
    )


def test_hard_wrapped_text_splits_as_the_unwrapped_text(splitter):
    text = (
        "The council met on Monday and, after a long debate, approved the budget. "
        "Its members then left for the holidays, and the mayor said nothing."
    )
    wrapped = textwrap.fill(text, 30)
    assert "\n" in wrapped
    assert splitter.split(wrapped) == splitter.split(text)
    assert [s for _, s in splitter.spans(wrapped)] == splitter.split(text)


def test_unknown_splitter():
    with pytest.raises(ValueError):
        get_splitter("nope")


def test_clauses_end_at_a_comma_once_long_enough_and_the_last_one_ends_the_sentence():
    sentence = "However, the judge, who was 64, said 1,000 people came; others: about 900, he said."
    assert clauses(sentence, 4) == [
        "However, the judge, who was 64,",  # "However," and "the judge," are too short
        "said 1,000 people came;",  # no cut inside "1,000"
        "others: about 900, he said.",  # ... nor after "others:" (one word)
    ]
    assert clauses(sentence, 1) == [
        "However,", "the judge,", "who was 64,", "said 1,000 people came;", "others:",
        "about 900,", "he said.",
    ]  # fmt: skip
    assert clauses(sentence, 100) == [sentence]
    assert clauses("No comma here.", 4) == ["No comma here."]


WORDS = st.sampled_from(["a", "the", "1,000", "court", "said", "and", "it", "(so)", "U.S."])
PIECES = st.lists(st.tuples(WORDS, st.sampled_from(["", "", ",", ";", ":"])), min_size=1)


@given(PIECES, st.integers(1, 6), st.sampled_from([" ", " ", "  "]))
def test_clauses_read_from_any_clause_start_cut_the_rest_alike(pieces, min_words, space):
    # What lets generation decide each clause's end on the clause before it alone.
    sentence = space.join(word + mark for word, mark in pieces) + "."
    units = clauses(sentence, min_words)
    assert space.join(units) == sentence  # substrings, whitespace kept
    for i in range(len(units)):
        assert clauses(space.join(units[i:]), min_words) == units[i:]


def test_the_clause_splitter_cuts_sentences_into_clauses_and_finds_the_next_one():
    splitter = get_splitter("clauses", 4)
    assert isinstance(splitter, ClauseSplitter) and "," in splitter.terminals
    text = "The court said on Monday, that it would rule soon. Mr. Smith, a lawyer, agreed."
    assert splitter.split(text) == [
        "The court said on Monday,",
        "that it would rule soon.",
        "Mr. Smith, a lawyer,",  # four words
        "agreed.",  # the last clause ends with the sentence, however short
    ]
    context = "The court said on Monday,"
    assert splitter.next_sentence(context, " that it would rule soon,") == (
        "that it would rule soon,",
        False,  # complete only once the next clause has begun
    )
    assert splitter.next_sentence(context, " that it would rule soon, and") == (
        "that it would rule soon,",
        True,
    )
    assert splitter.next_sentence(context, " that it would. The") == ("that it would.", True)
    assert (
        get_splitter("sentences").split(text)[0]
        == "The court said on Monday, that it would rule soon."
    )
    with pytest.raises(ValueError, match="at least one word"):
        get_splitter("clauses", 0)
