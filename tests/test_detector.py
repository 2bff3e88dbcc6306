"""Detector behaviour on a stand-in encoder (fast, exact control over regions)."""

import pytest
import torch

from ksemstamp.detector import Detector
from ksemstamp.partition import LSHPartition
from ksemstamp.scheme import WatermarkScheme
from ksemstamp.splitter import get_splitter


@pytest.fixture
def scheme(hash_encoder):
    return WatermarkScheme(hash_encoder, LSHPartition(32, bits=3), 0.25, "k", get_splitter())


@pytest.fixture
def detector(scheme):
    return Detector(scheme, statistic="exact", alpha=0.01)


SENTENCES = [f"Sentence number {i} talks about topic {i * 7 % 13}." for i in range(40)]


def _valid_chain(scheme, length, start=0):
    """Pick sentences so that every consecutive pair is valid under the scheme's table."""
    regions = scheme.regions(SENTENCES)[0].tolist()
    chain = [SENTENCES[start]]
    prev = regions[start]
    for _ in range(length - 1):
        nxt = next(
            (
                s
                for s, r in zip(SENTENCES, regions, strict=True)
                if scheme.table[prev, r] and s not in chain
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
    valid = sum(bool(scheme.table[a, b]) for a, b in zip(regions[:-1], regions[1:], strict=True))
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
    assert torch.equal(scheme.table.sum(1), torch.full((8,), 2))


def test_scoring_plan_is_key_free_and_matches_detection(hash_encoder):
    texts = [" ".join(SENTENCES[:6]), SENTENCES[1] + " " + SENTENCES[1] + " " + SENTENCES[2], "x"]
    prompts = [SENTENCES[10], None, SENTENCES[3]]
    detectors = [
        Detector(WatermarkScheme(hash_encoder, LSHPartition(32, bits=3), 0.25, key, get_splitter()))
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
            valid = plan.transition_counts(8)[detector.scheme.table.numpy()].sum()
            assert result.num_valid == valid
    empty = detectors[0].plan_batch([""], [SENTENCES[0]])[0]
    assert empty.sentences == [] and empty.previous == [] and empty.num_scored == 0
