"""The size of the mark (MarkMyWords): shortest sentence-end prefix detected at p <= 0.01."""

import math

import pytest

from ksemstamp.evaluation.predict import read_records
from ksemstamp.evaluation.size import (
    first_reaching,
    measure,
    median_size,
    sentence_ends,
    size_stage,
)
from ksemstamp.evaluation.stages import Run
from ksemstamp.settings.evaluation import EvalSettings
from ksemstamp.text.splitter import get_splitter

TEXT = "Stocks rose on Monday. Bonds fell. Oil was flat all day."


def test_sentence_ends_follow_detection_cuts():
    splitter = get_splitter()
    ends = sentence_ends(splitter, "The markets opened.", TEXT)
    assert [TEXT[:e] for e in ends] == [
        "Stocks rose on Monday.",
        "Stocks rose on Monday. Bonds fell.",
        TEXT,
    ]
    assert sentence_ends(splitter, None, TEXT) == ends
    # A prompt that ends mid-sentence: the text first completes it, which is not a sentence of
    # its own (detection seeds with it), so the first prefix ends one sentence later.
    completing = " on Monday. Bonds fell. Oil was flat."
    cut = sentence_ends(splitter, "Stocks rose", completing)
    assert [completing[:e] for e in cut] == [" on Monday. Bonds fell.", completing]


def test_first_reaching_and_median_with_infinite_sizes():
    assert first_reaching([0.2, 0.009, 0.001], [10, 20, 30]) == 20
    assert first_reaching([None, 0.01], [10, 20]) == 20  # p <= alpha, inclusive
    assert first_reaching([0.5, None, 0.02], [10, 20, 30]) is None
    assert median_size([30, None, 10]) == {
        "texts": 3, "never": 1, "median_tokens": 30.0, "alpha": 0.01
    }  # fmt: skip
    assert median_size([30, 10, None, 50])["median_tokens"] == 40.0
    # Half or more never reach it: the median is infinite (None), the count says how many.
    infinite = median_size([10, None, None, 20])
    assert infinite["median_tokens"] is None and infinite["never"] == 2
    assert median_size([])["median_tokens"] is None and median_size([])["texts"] == 0
    assert not math.isinf(median_size([10, None, 20])["median_tokens"])


def fake_detect(texts, prompts):
    """p = 0.05 ** (sentences in the text): p <= 0.01 from two sentences on."""
    splitter = get_splitter()
    return [{"p_value": 0.05 ** len(splitter.split(t))} for t in texts]


def words(text):
    return len(text.split())


def test_measure_detects_every_prefix_and_counts_tokens():
    splitter = get_splitter()
    one = "Only one sentence here."
    out = measure([TEXT, one], ["Intro.", "Intro."], fake_detect, words, splitter)
    assert out[0]["prefix_tokens"] == [4, 6, 11]
    assert out[0]["p_values"] == pytest.approx([0.05, 0.0025, 0.000125])
    assert out[0]["tokens"] == 6
    assert out[1] == {"prefix_tokens": [4], "p_values": [pytest.approx(0.05)], "tokens": None}


def test_size_stage_detects_under_each_key_and_resumes(tmp_path):
    run = Run(EvalSettings(output_dir=str(tmp_path), num_keys=2))
    run.key_index = {"a": 0, "b": 1, "c": 0}
    asked = []

    def detector(algorithm, key_index):
        def detect(texts, prompts):
            asked.append((key_index, len(texts)))
            return fake_detect(texts, prompts)

        return detect

    run._detector = detector
    texts = {"a": TEXT, "b": "Short one.", "c": "First of two. Second of two."}
    prompts = dict.fromkeys(texts, "Intro.")
    size = size_stage(run, "ksemstamp", texts, prompts, count_tokens=words)
    assert size == {"texts": 3, "never": 1, "median_tokens": 6.0, "alpha": 0.01}
    assert sorted(asked) == [(0, 5), (1, 1)]  # a's 3 prefixes and c's 2 under key 0
    records = {r["id"]: r for r in read_records(tmp_path / "sizes" / "ksemstamp.jsonl")}
    assert records["c"]["tokens"] == 6 and records["b"]["key_index"] == 1
    # Resumed: nothing detected again.
    asked.clear()
    assert size_stage(run, "ksemstamp", texts, prompts, count_tokens=words) == size
    assert asked == []
