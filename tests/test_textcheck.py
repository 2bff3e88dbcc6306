"""Text no model can read, whatever its characters: cleaned or refused per text, never raised on.

Property-based (Hypothesis) over arbitrary Unicode strings, on the stand-in encoder: the
sentence splitter, the detector and the generator's prompt planning never raise.
"""

from __future__ import annotations

import pytest
from conftest import HashEncoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ksemstamp.detector import Detector
from ksemstamp.generation.prompts import plan_prompt
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import RegionSettings
from ksemstamp.text.normalize import normalize_text
from ksemstamp.text.splitter import get_splitter
from ksemstamp.text.textcheck import printable, readable

# Every code point, lone surrogates included (Hypothesis leaves category Cs out by default).
ANY_CHAR = st.characters(codec=None, categories=None)
ANY_TEXT = st.text(ANY_CHAR, max_size=80)
# Text with sentences in it, so the splitter and the encoder get real work.
WORDS = st.sampled_from(["The", "council", "met.", "It", "voted", "Mr.", "no!", "\n", "é", "?"])
SENTENCES = st.lists(st.one_of(WORDS, ANY_TEXT), max_size=12).map(" ".join)
PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _detector() -> Detector:
    scheme = WatermarkScheme(
        HashEncoder(), LSHPartition(32, bits=3), "k", get_splitter(), RegionSettings()
    )
    return Detector(scheme, max_chars=10_000)


DETECTOR = _detector()


def test_readable_drops_lone_surrogates_and_noncharacters_only():
    assert readable("a\ud800b\udfffc") == ("abc", 2)
    assert readable("x\ufffe\uffff\ufdd0\U0001fffe\U0010ffffy") == ("xy", 5)
    # a surrogate pair held as two code points is the character it stands for
    assert readable("smile \ud83d\ude00.") == ("smile \U0001f600.", 0)
    kept = "caf\u00e9 \u4e2d \x00\x1b \ufffd \u200b \U000e0001 \U0001f600"
    assert readable(kept) == (kept, 0)
    assert readable("plain ASCII.") == ("plain ASCII.", 0)


def test_printable_shows_control_characters_instead_of_running_them():
    assert printable("red \x1b[31mX\x1b[0m\r\x08\x9b!") == "red \\x1b[31mX\\x1b[0m\\x0d\\x08\\x9b!"
    assert printable("two\nlines\tand a tab") == "two\nlines\tand a tab"


@PROPERTY
@given(ANY_TEXT)
def test_readable_output_always_encodes_as_utf8(text):
    cleaned, removed = readable(text)
    cleaned.encode("utf-8")  # what a tokenizer needs
    assert readable(cleaned) == (cleaned, 0)
    assert len(cleaned) + removed <= len(text)


@PROPERTY
@given(SENTENCES)
def test_splitter_never_raises_and_keeps_sentences_inside_the_text(text):
    # offsets are into the text as the splitter reads it, normalised
    splitter = get_splitter()
    read = normalize_text(text).text
    for at, sentence in splitter.spans(text):
        assert sentence and sentence == sentence.strip()
        assert read[at : at + len(sentence)] == sentence


@PROPERTY
@given(SENTENCES, st.one_of(st.none(), SENTENCES))
def test_detect_answers_every_text_with_a_status(text, prompt):
    result = DETECTOR.detect(text, prompt)
    assert result.status in ("ok", "too_short", "unsupported", "error")
    if result.status in ("error", "unsupported"):
        assert result.error and "\n" not in result.error
    for sentence in result.sentences:
        sentence.encode("utf-8")


@pytest.mark.parametrize("text", ["One sentence \ud800here. Another one\udfff there.", "\ud800"])
def test_detect_cleans_a_lone_surrogate_or_refuses_the_text(text):
    results = DETECTOR.detect_batch([text, "Fine text. Still fine."])
    assert results[1].status == "ok"
    if text == "\ud800":
        assert results[0].status == "error" and "not text" in results[0].error
    else:
        assert results[0].status == "ok"
        assert results[0].sentences == ["One sentence here.", "Another one there."]


@PROPERTY
@given(SENTENCES)
def test_prompt_planning_never_raises(prompt):
    start = plan_prompt(prompt, get_splitter(), None)
    assert start.kind or start.error
    start.prefix.encode("utf-8")
