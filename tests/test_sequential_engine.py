"""The sequential (one ``generate`` call per candidate) engine: the benchmark baseline."""

import pytest
import torch
from test_batched_engine import draw

from ksemstamp.generation.batched import BatchedEngine
from ksemstamp.generation.engine import Engine, Round, RoundRequest
from ksemstamp.generation.sequential import SequentialEngine
from ksemstamp.settings import SamplingSettings, WatermarkSettings
from ksemstamp.text.splitter import get_splitter

PROMPT = (
    "The city council approved a new budget on Monday after months of debate. "
    "The plan raises spending on schools and roads."
)
CONTEXT = "The plan raises spending on schools and roads."


def test_the_engine_setting_is_checked_and_the_old_name_points_to_it():
    assert WatermarkSettings().sampling.engine == "batched"
    WatermarkSettings.from_dict({"sampling": {"engine": "sequential"}})
    with pytest.raises(ValueError, match="sampling.engine must be one of"):
        WatermarkSettings.from_dict({"sampling": {"engine": "parallel"}})
    with pytest.raises(ValueError, match="search.strategy is now sampling.engine"):
        WatermarkSettings.from_dict({"search": {"strategy": "sequential"}})


@pytest.mark.e2e
@pytest.mark.parametrize("kind", [BatchedEngine, SequentialEngine])
def test_both_engines_are_engines_and_leave_the_callers_model_and_tokenizer_alone(lm, kind):
    model, tokenizer = lm
    before = (
        tokenizer.padding_side,
        tokenizer.pad_token,
        model.config._attn_implementation,
        model.training,
    )
    engine = kind(model, tokenizer, get_splitter(), SamplingSettings(max_sentence_tokens=8))
    assert isinstance(engine, Engine)
    round_ = engine.open(RoundRequest.of([PROMPT], [2], torch.Generator().manual_seed(0)))
    try:
        assert isinstance(round_, Round) and round_.live == [(0, 0), (0, 1)]
        round_.advance(None)
    finally:
        round_.close()
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    assert len(draw(engine, [PROMPT], [2], none, None, [CONTEXT])[0].candidates) == 2
    after = (
        tokenizer.padding_side,
        tokenizer.pad_token,
        model.config._attn_implementation,
        model.training,
    )
    assert after == before


@pytest.fixture(scope="module")
def sequential(lm):
    model, tokenizer = lm
    return SequentialEngine(model, tokenizer, get_splitter(), SamplingSettings())


@pytest.mark.e2e
def test_candidates_are_single_sentences(sequential):
    gen = torch.Generator().manual_seed(1)
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    result = draw(sequential, [PROMPT], [2], none, gen, [CONTEXT])[0]
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
    results = draw(sequential, [PROMPT, PROMPT], [5, 1], judge, gens, [CONTEXT, CONTEXT])
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
            c.text for c in draw(sequential, [PROMPT], [1], none, [gen], [CONTEXT])[0].candidates
        ]

    before = torch.random.get_rng_state()
    assert texts(7) == texts(7)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is left alone


@pytest.mark.e2e
@pytest.mark.parametrize("limit", [64, 4])
def test_near_greedy_sentence_matches_the_batched_engine(lm, limit):
    # With (almost) no randomness both engines must cut the same first sentence (limit 4: a
    # row truncated before its sentence ends, an empty candidate either way).
    model, tokenizer = lm
    cfg = SamplingSettings(temperature=1e-4, max_sentence_tokens=limit)
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    batched = BatchedEngine(model, tokenizer, get_splitter(), cfg)
    sequential = SequentialEngine(model, tokenizer, get_splitter(), cfg)
    want_round = draw(batched, [PROMPT], [1], none, None, [CONTEXT])[0]
    got_round = draw(sequential, [PROMPT], [1], none, None, [CONTEXT])[0]
    want, got = want_round.candidates[0], got_round.candidates[0]
    assert got.text == want.text and got.separator == want.separator
    # "Decoded tokens" means one thing for both: every token the LM produced for the row.
    assert got_round.decoded_tokens == want_round.decoded_tokens


@pytest.mark.e2e
def test_bad_arguments(sequential):
    with pytest.raises(ValueError):
        draw(sequential, [PROMPT], [0], lambda g, t: [], None)
    with pytest.raises(ValueError):
        draw(sequential, [PROMPT, PROMPT], [1], lambda g, t: [], None)
    with pytest.raises(ValueError):
        draw(sequential, [PROMPT], [1], lambda g, t: [], [None, None])


@pytest.mark.e2e
def test_build_watermarker_selects_the_engine(lm, default_scheme):
    from ksemstamp.builders import build_watermarker

    cfg = WatermarkSettings.from_dict(
        {"sampling": {"engine": "sequential", "seed": 0}, "key": "test-suite-key"}
    )
    wm = build_watermarker(cfg, default_scheme, lm)
    assert isinstance(wm.engine, SequentialEngine)
    # One unwatermarked sentence keeps this cheap (one candidate) and still runs the loop.
    wm.max_sentences = 1
    result = wm.generate([PROMPT], watermark=False)[0]
    assert result.status == "ok" and result.num_sentences == 1 and result.candidates == 1
    assert result.wasted_tokens == 0 and result.decoded_tokens == result.num_tokens
