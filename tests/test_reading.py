"""What the encoder reads of a sentence: web markup left out, everything else as it is."""

import pytest

from ksemstamp.calibration.embeddings import CachedEncoder
from ksemstamp.scheme.encoding import embed
from ksemstamp.text.reading import reading_form


@pytest.mark.parametrize(
    ("sentence", "read"),
    [
        (
            "Los Angeles closes 500 marijuana shops http://reut.rs/1CvkXmm",
            "Los Angeles closes 500 marijuana shops",
        ),
        ("Read more at https://example.org/a?b=c, then go.", "Read more at then go."),
        ("See www.example.com for details.", "See for details."),
        ("Hospital IT is a mess bit.ly/1pwhKO5 #NHS", "Hospital IT is a mess NHS"),
        ("A truncated link http://t\u2026", "A truncated link"),
        (
            "As @AngelaHaupt told @Reuters, it came last.",
            "As AngelaHaupt told Reuters, it came last.",
        ),
        (
            "Rates &gt; 3% &amp; rising, she said &quot;no&quot;.",
            'Rates > 3% & rising, she said "no".',
        ),
    ],
)
def test_web_markup_is_left_out(sentence, read):
    assert reading_form(sentence) == read


@pytest.mark.parametrize(
    "sentence",
    [
        "The U.S. economy grew 3.5% in the second quarter.",
        "Write to press@example.com today.",  # an address, not a handle
        "It was the #1 film of 2016.",  # a number sign, not a hashtag
        "See pages 3/4 and the 2016/17 season.",
        "C# and F# are languages; AT&T is a company.",
        "# A heading",
    ],
)
def test_ordinary_text_is_read_as_it_is(sentence):
    assert reading_form(sentence) == sentence


def test_a_sentence_that_is_only_markup_is_read_as_it_is():
    # else every bare link would read as the same empty string, and score alike
    assert reading_form("http://t.co/x") == "http://t.co/x"


def test_reading_is_idempotent():
    for sentence in ("New study http://bit.ly/x #health &amp; more @who", "Plain text."):
        once = reading_form(sentence)
        assert reading_form(once) == once


def test_every_encoder_pass_reads_the_reading_form(hash_encoder):
    with_link = "Liberia says some Ebola funds are unaccounted for http://reut.rs/1Dp1vfF"
    without = "Liberia says some Ebola funds are unaccounted for"
    first, second = embed(hash_encoder, [with_link, without])
    assert (first == second).all()
    cached = CachedEncoder(hash_encoder)
    assert (cached.encode([with_link])[0] == second).all()


def test_the_training_forward_pass_reads_the_reading_form():
    # Training must embed sentences as generation and detection read them, or it would learn
    # vectors the mark never sees for sentences with links.
    from types import SimpleNamespace

    import torch

    from ksemstamp.training.module import EncoderModule

    seen: list[str] = []

    class Encoder:
        def preprocess(self, texts):
            seen.extend(texts)
            return {"n": torch.tensor(len(texts))}

        def __call__(self, features):
            return {"sentence_embedding": torch.zeros(int(features["n"]), 4)}

    module = SimpleNamespace(encoder=Encoder(), device=torch.device("cpu"))
    out = EncoderModule.forward(module, ["Flu season peaks http://bit.ly/x #flu", "Plain."])
    assert out.shape == (2, 4)
    assert seen == ["Flu season peaks flu", "Plain."]
