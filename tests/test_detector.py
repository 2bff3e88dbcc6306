"""Detector behaviour on a stand-in encoder (fast, exact control over regions)."""

import textwrap

import pytest
import torch

from ksemstamp.detector import Detector
from ksemstamp.marks import build_mark
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import RegionSettings
from ksemstamp.text.splitter import get_splitter


@pytest.fixture
def scheme(hash_encoder):
    return WatermarkScheme(
        hash_encoder, LSHPartition(32, bits=3), "k", get_splitter(), RegionSettings()
    )


@pytest.fixture
def detector(scheme):
    return Detector(scheme, statistic="exact", alpha=0.01)


SENTENCES = [f"Sentence number {i} talks about topic {i * 7 % 13}." for i in range(40)]


def _valid_chain(scheme, length, start=0):
    """Pick sentences so that every consecutive pair is valid under the scheme's table."""
    from ksemstamp.marks import build_mark

    table = build_mark(scheme).host_table
    regions = scheme.regions(SENTENCES)[0].tolist()
    chain = [SENTENCES[start]]
    prev = regions[start]
    for _ in range(length - 1):
        nxt = next(
            (
                s
                for s, r in zip(SENTENCES, regions, strict=True)
                if table[prev, r] and s not in chain
            ),
            None,
        )
        if nxt is None:
            break
        chain.append(nxt)
        prev = regions[SENTENCES.index(nxt)]
    return chain


@pytest.mark.parametrize("text", ["", "   \n\t ", "Only one sentence here."])
def test_too_short_texts_have_no_score(detector, text):
    res = detector.detect(text)
    assert res.status == "too_short"
    assert res.z_score is None and res.p_value is None and res.watermarked is None
    assert res.num_scored == 0


def test_one_sentence_with_prompt_is_scored(detector):
    res = detector.detect("Only one sentence here.", prompt="A prompt. Its last sentence.")
    assert res.status == "ok" and res.num_scored == 1
    assert res.verdicts[0] in ("valid", "invalid")
    assert res.sentences == ["Only one sentence here."]
    assert res.seed_region == int(detector.scheme.regions(["Its last sentence."])[0][0])
    assert detector.detect("One. Two.").seed_region is None


def test_counts_and_z_match_the_table(detector, scheme):
    text = " ".join(SENTENCES[:12])
    res = detector.detect(text)
    regions = scheme.regions(SENTENCES[:12])[0].tolist()
    valid = sum(
        bool(build_mark(scheme).host_table[a, b])
        for a, b in zip(regions[:-1], regions[1:], strict=True)
    )
    assert res.regions == regions
    assert res.num_scored == 11 and res.num_valid == valid
    assert res.z_score == pytest.approx((valid - 0.25 * 11) / (0.25 * 0.75 * 11) ** 0.5)
    assert res.verdicts[0] == "seed"


def test_valid_chain_is_detected(detector, scheme):
    chain = _valid_chain(scheme, 14)
    assert len(chain) >= 10
    res = detector.detect(" ".join(chain))
    assert res.num_valid == res.num_scored == len(chain) - 1
    assert res.watermarked and res.p_value < 0.01


def test_repeating_a_valid_sentence_does_not_raise_the_count(detector, scheme):
    chain = _valid_chain(scheme, 2)
    text = " ".join([chain[0]] + [chain[1]] * 30)
    res = detector.detect(text)
    assert res.num_scored == 1 and res.verdicts.count("repeat") == 29
    assert not res.watermarked


def test_batch_matches_single_and_uses_one_encoder_pass(hash_encoder, detector):
    texts = [" ".join(SENTENCES[i : i + 5]) for i in range(0, 30, 5)] + ["", "x"]
    before = hash_encoder.calls
    batch = detector.detect_batch(texts)
    assert hash_encoder.calls == before + 1
    for text, res in zip(texts, batch, strict=True):
        single = detector.detect(text)
        assert (single.status, single.z_score, single.p_value) == (
            res.status,
            res.z_score,
            res.p_value,
        )


def test_bad_inputs_do_not_break_the_batch(detector):
    weird = "Binary \x00\x01 junk \ufffd. Texte en français. 日本語の文です。 no punctuation at all"
    long = " ".join(SENTENCES * 50)
    results = detector.detect_batch(
        [None, 42, weird, long, "fine. text."], [None, None, None, None, 7]
    )
    assert [r.status for r in results[:2]] == ["error", "error"]
    assert results[2].status in ("ok", "too_short")
    assert results[3].status == "ok" and results[3].num_scored == 39  # repeats not scored
    assert results[4].status == "error" and "prompt" in results[4].error


def test_statistic_choice(scheme):
    text = " ".join(SENTENCES[:10])
    exact = Detector(scheme, "exact").detect(text)
    paper = Detector(scheme, "paper").detect(text)
    assert exact.z_score == paper.z_score  # z is always the paper's
    assert exact.statistic == "exact" and paper.statistic == "paper"
    with pytest.raises(ValueError):
        Detector(scheme, "nope")
    with pytest.raises(ValueError):
        Detector(scheme, alpha=0)


def test_scheme_repr_hides_key(scheme):
    assert "'k'" not in repr(scheme) and "key_fingerprint" in repr(scheme)
    assert torch.equal(build_mark(scheme).host_table.sum(1), torch.full((8,), 2))


def test_scoring_plan_is_key_free_and_matches_detection(hash_encoder):
    texts = [" ".join(SENTENCES[:6]), SENTENCES[1] + " " + SENTENCES[1] + " " + SENTENCES[2], "x"]
    prompts = [SENTENCES[10], None, SENTENCES[3]]
    detectors = [
        Detector(
            WatermarkScheme(
                hash_encoder, LSHPartition(32, bits=3), key, get_splitter(), RegionSettings()
            )
        )
        for key in ("one key", "another key")
    ]
    plans = [d.plan_batch(texts, prompts) for d in detectors]
    assert plans[0] == plans[1]
    seeded, repeated, short = plans[0]
    assert seeded.seed_region is not None and seeded.roles == ["scored"] * 6
    assert repeated.seed_region is None and repeated.roles == ["seed", "repeat", "scored"]
    assert short.roles == ["scored"] and short.num_scored == 1
    for detector in detectors:
        for plan, result in zip(plans[0], detector.detect_batch(texts, prompts), strict=True):
            assert result.regions == plan.regions and result.num_scored == plan.num_scored
            assert int(plan.transition_counts(8).sum()) == plan.num_scored
            valid = plan.transition_counts(8)[detector.mark.host_table.numpy()].sum()
            assert result.num_valid == valid
    empty = detectors[0].plan_batch([""], [SENTENCES[0]])[0]
    assert empty.sentences == [] and empty.previous == [] and empty.num_scored == 0


# ---------------------------------------------------------------------- prompts and bad input


@pytest.mark.parametrize(
    "prompt,text,expected",
    [
        (None, "One here. Two here.", (None, ["One here.", "Two here."], None)),
        ("   ", "One here. Two here.", (None, ["One here.", "Two here."], None)),
        ("It rained. It poured.", "One here.", ("It poured.", ["One here."], None)),
        # mid-sentence: the straddling sentence seeds, its tail is the completion
        (
            "It rained. The council met on",
            " Monday. It approved the budget. Then it left.",
            (
                "The council met on Monday.",
                ["It approved the budget.", "Then it left."],
                " Monday.",
            ),
        ),
        # mid-word, and a trailing space on the prompt
        (
            "The council me ",
            "t on Monday. It voted.",
            ("The council met on Monday.", ["It voted."], "t on Monday."),
        ),
        # a paragraph break ends the open sentence: nothing completed
        (
            "Breaking news",
            "\n\nThe council met. It voted.",
            ("Breaking news", ["The council met.", "It voted."], ""),
        ),
        # the text never ends the prompt's sentence: it all belongs to the seed
        (
            "The council met on",
            " Monday and Tuesday",
            ("The council met on Monday and Tuesday", [], " Monday and Tuesday"),
        ),
    ],
)
def test_continuation_sentences(prompt, text, expected):
    from ksemstamp.text.splitter import continuation_sentences

    assert continuation_sentences(get_splitter(), prompt, text) == expected


def test_a_text_that_completes_its_prompt_is_scored_after_the_straddling_sentence(detector):
    prompt = "The storm hit the coast. The council met on"
    text = " Monday. " + " ".join(SENTENCES[:3])
    res = detector.detect(text, prompt)
    assert res.status == "ok" and res.sentences == SENTENCES[:3] and res.num_scored == 3
    assert res.seed_sentence == "The council met on Monday." and res.completion == " Monday."
    assert res.seed_region == int(detector.scheme.regions([res.seed_sentence])[0][0])
    # a prompt that ends its sentence keeps its record: no completion field
    plain = detector.detect(" ".join(SENTENCES[:3]), "The council met on Monday.")
    assert plain.completion is None and "completion" not in plain.to_record()
    assert plain.regions == res.regions and plain.seed_region == res.seed_region


@pytest.mark.parametrize(
    "text,status,words",
    [
        ("北京今天下雨。明天是晴天。上海也下雨了。", "unsupported", "CJK"),
        ("😀😀😀 🎉🎉 👍", "unsupported", "no letters"),
        ("Привет мир. Как дела? Всё хорошо.", "unsupported", "Cyrillic"),
    ],
)
def test_unsupported_scripts_say_so_instead_of_too_short(detector, text, status, words):
    res = detector.detect(text)
    assert res.status == status and words in res.error and res.z_score is None
    assert res.to_record()["status"] == status and res.to_record()["error"] == res.error


def test_binary_input_is_refused_not_scored(detector):
    import random

    noise = bytes(random.Random(0).randrange(256) for _ in range(20_000))
    res = detector.detect(noise.decode("utf-8", errors="replace"))
    assert res.status == "error" and "not text" in res.error and res.num_scored == 0
    res = detector.detect(" ".join(SENTENCES[:4]), prompt="\x00\x01\x02\x03 x")
    assert res.status == "error" and "prompt is binary, not text" in res.error


def test_size_limit_is_per_record_and_checked_before_any_work(scheme, hash_encoder):
    limited = Detector(scheme, max_chars=200)
    short, long = " ".join(SENTENCES[:3]), " ".join(SENTENCES[:20])
    before = hash_encoder.calls
    results = limited.detect_batch([long, short, short], [None, None, "p" * 150])
    assert results[0].status == "error" and "the limit is 200" in results[0].error
    assert results[1].status == "ok"
    assert results[2].status == "error" and "text and prompt have" in results[2].error
    assert hash_encoder.calls == before + 1  # one pass, for the one text that fits
    with pytest.raises(ValueError, match="max_chars"):
        Detector(scheme, max_chars=0)


def test_progress_is_shown_for_long_detections_only(detector, monkeypatch):
    import ksemstamp.detector as module

    shown = []
    embed = detector.scheme.embed
    monkeypatch.setattr(
        detector.scheme, "embed", lambda s, progress=False: shown.append(progress) or embed(s)
    )
    monkeypatch.setattr(module, "PROGRESS_SENTENCES", 10)
    detector.detect(" ".join(SENTENCES[:5]), progress=True)
    detector.detect(" ".join(SENTENCES[:20]), progress=True)
    detector.detect(" ".join(SENTENCES[:20]))
    assert shown == [False, True, False]


def test_retyped_text_scores_as_the_original_and_reports_what_was_normalised(detector):
    text = " ".join(_valid_chain(detector.scheme, 6))
    retyped = (
        text.replace("e", "\u0435", 3).replace("o", "\u043e", 2).replace("talks", "ta\u200blks", 1)
    )
    wrapped = textwrap.fill(retyped, 40)
    clean, attacked = detector.detect(text), detector.detect(wrapped, prompt="A prompt.\u200b")
    plain = detector.detect(text, prompt="A prompt.")
    assert attacked.sentences == plain.sentences == clean.sentences
    assert attacked.z_score == plain.z_score and attacked.p_value == plain.p_value
    assert clean.normalized == {} and "normalized" not in clean.to_record()
    assert attacked.normalized["look_alike"] == 5 and attacked.normalized["invisible"] == 2
    assert attacked.normalized["line_breaks"] == wrapped.count("\n")
    record = attacked.to_record()
    assert record["tampered"] is True and record["normalized"] == attacked.normalized


def test_strict_refuses_a_record_that_does_not_show_a_valid_identity():
    """Under ``--strict`` a record's identity is read, not taken on its fingerprint's word: a
    missing or mistyped identity, a faked fingerprint, and an identity edited under its original
    fingerprint are each refused; what is echoed of a record is cut short."""
    from ksemstamp.detection.inputs import identity_fields, mismatch, strict_problem
    from ksemstamp.settings import DirectionSettings, WatermarkSettings
    from ksemstamp.settings.identity import identity_of

    here = identity_of(WatermarkSettings(), "enc", "c1")
    made = identity_fields(here)
    assert strict_problem({"text": "t", **made}, here) is None
    assert "(no identity)" in strict_problem({"text": "t"}, here)
    assert "identity that is a str" in strict_problem({"text": "t", "identity": "clauses"}, here)
    faked = {**made, "identity_fingerprint": "0" * 12}
    assert "fingerprint is not its identity's" in strict_problem({"text": "t", **faked}, here)
    # Sentences claimed under the clause identity's fingerprint: read, and refused.
    sentences = identity_of(
        WatermarkSettings(mark=DirectionSettings(units="sentences")), "enc", "c1"
    )
    edited = {"identity": sentences, "identity_fingerprint": made["identity_fingerprint"]}
    assert strict_problem({"text": "t", **edited}, here) is not None
    assert mismatch({"text": "t", **edited}, here)[0] == ["mark.units"]
    # A 200,000-character value is echoed as 80 characters and its length.
    huge = {**here, "mark.units": "x" * 200_000}
    names, said = mismatch({"text": "t", **identity_fields(huge)}, here)
    assert names == ["mark.units"] and len(said) < 300 and "(200,000 characters)" in said
    assert len(strict_problem({"text": "t", **identity_fields(huge)}, here)) < 400
