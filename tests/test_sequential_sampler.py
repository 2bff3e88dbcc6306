"""The sequential (one ``generate`` call per candidate) sampler: the benchmark baseline."""

import inspect

import pytest
import torch

from ksemstamp.generation.sampler import CandidateSampler
from ksemstamp.generation.sequential import SequentialCandidateSampler
from ksemstamp.settings import SamplingSettings, WatermarkSettings
from ksemstamp.text.splitter import get_splitter

PROMPT = (
    "The city council approved a new budget on Monday after months of debate. "
    "The plan raises spending on schools and roads."
)
CONTEXT = "The plan raises spending on schools and roads."


def test_same_interface_as_the_batched_sampler():
    ours = inspect.signature(SequentialCandidateSampler.sample_round).parameters
    theirs = inspect.signature(CandidateSampler.sample_round).parameters
    assert list(ours) == list(theirs)
    assert list(inspect.signature(SequentialCandidateSampler).parameters) == list(
        inspect.signature(CandidateSampler).parameters
    )


def test_strategy_setting_is_checked():
    assert WatermarkSettings().search.strategy == "batched"
    WatermarkSettings.from_dict({"search": {"strategy": "sequential"}})
    with pytest.raises(ValueError, match="search.strategy"):
        WatermarkSettings.from_dict({"search": {"strategy": "parallel"}})


@pytest.fixture(scope="module")
def sequential(lm):
    model, tokenizer = lm
    return SequentialCandidateSampler(model, tokenizer, get_splitter(), SamplingSettings())


@pytest.mark.e2e
def test_candidates_are_single_sentences(sequential):
    gen = torch.Generator().manual_seed(1)
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    result = sequential.sample_round([PROMPT], [2], none, gen, [CONTEXT])[0]
    assert len(result.candidates) == 2 and result.accepted_index is None
    splitter = get_splitter()
    for cand in result.candidates:
        assert cand.text and splitter.split(cand.text) == [cand.text]
        assert splitter.split(CONTEXT + " " + cand.text)[-1] == cand.text
        assert not cand.accepted
    assert result.decoded_tokens == sum(c.num_tokens for c in result.candidates)
    assert result.wasted_tokens == 0


@pytest.mark.e2e
def test_judges_each_candidate_at_once_and_stops_at_the_first_accepted(sequential):
    calls = []

    def judge(rows, texts):
        # One candidate per call, in draw order; the third one is accepted.
        calls.append(list(rows))
        return [(len(calls) == 3, len(calls)) for _ in texts]

    gens = [torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)]
    results = sequential.sample_round([PROMPT, PROMPT], [5, 1], judge, gens, [CONTEXT, CONTEXT])
    assert calls == [[(0, 0)], [(0, 1)], [(0, 2)], [(1, 0)]]
    first = results[0]
    assert first.accepted_index == 2 and len(first.candidates) == 3
    assert [c.accepted for c in first.candidates] == [False, False, True]
    assert [c.info for c in first.candidates] == [1, 2, 3]
    assert results[1].accepted_index is None and len(results[1].candidates) == 1


@pytest.mark.e2e
def test_per_document_streams_are_reproducible(sequential):
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731

    def texts(seed):
        gen = torch.Generator().manual_seed(seed)
        return [
            c.text
            for c in sequential.sample_round([PROMPT], [1], none, [gen], [CONTEXT])[0].candidates
        ]

    before = torch.random.get_rng_state()
    assert texts(7) == texts(7)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is left alone


@pytest.mark.e2e
def test_near_greedy_sentence_matches_the_batched_sampler(lm):
    # With (almost) no randomness both strategies must cut the same first sentence.
    model, tokenizer = lm
    cfg = SamplingSettings(temperature=1e-4)
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    batched = CandidateSampler(model, tokenizer, get_splitter(), cfg)
    sequential = SequentialCandidateSampler(model, tokenizer, get_splitter(), cfg)
    want = batched.sample_round([PROMPT], [1], none, None, [CONTEXT])[0].candidates[0]
    got = sequential.sample_round([PROMPT], [1], none, None, [CONTEXT])[0].candidates[0]
    assert got.text == want.text and got.separator == want.separator


@pytest.mark.e2e
def test_bad_arguments(sequential):
    with pytest.raises(ValueError):
        sequential.sample_round([PROMPT], [0], lambda g, t: [], None)
    with pytest.raises(ValueError):
        sequential.sample_round([PROMPT, PROMPT], [1], lambda g, t: [], None)
    with pytest.raises(ValueError):
        sequential.sample_round([PROMPT], [1], lambda g, t: [], [None, None])


@pytest.mark.e2e
def test_build_watermarker_selects_the_strategy(lm, default_scheme):
    from ksemstamp.builders import build_watermarker

    cfg = WatermarkSettings.from_dict(
        {"search": {"strategy": "sequential"}, "sampling": {"seed": 0}, "key": "test-suite-key"}
    )
    wm = build_watermarker(cfg, default_scheme, lm)
    assert isinstance(wm.sampler, SequentialCandidateSampler)
    # One unwatermarked sentence keeps this cheap (one candidate) and still runs the loop.
    wm.max_sentences = 1
    result = wm.generate([PROMPT], watermark=False)[0]
    assert result.status == "ok" and result.num_sentences == 1 and result.candidates == 1
    assert result.wasted_tokens == 0 and result.decoded_tokens == result.num_tokens
