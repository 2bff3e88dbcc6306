"""The batched engine on the real offline LM (SmolLM2-135M)."""

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from ksemstamp.generation.batched import BatchedEngine
from ksemstamp.generation.draw import draw_round
from ksemstamp.generation.engine import RoundRequest
from ksemstamp.settings import SamplingSettings
from ksemstamp.text.splitter import get_splitter

pytestmark = pytest.mark.e2e

PROMPT = (
    "The city council approved a new budget on Monday after months of debate. "
    "The plan raises spending on schools and roads."
)
SHORT = "Scientists found water on the moon."


def draw(engine, prefixes, rows, judge, generator=None, last_units=None, heads=None, pruner=None):
    """One round of ``engine`` through ``draw.draw_round``."""
    request = RoundRequest.of(prefixes, rows, generator, last_units, heads)
    return draw_round(engine, request, judge, pruner)


@pytest.fixture(scope="module")
def engine(lm):
    model, tokenizer = lm
    return BatchedEngine(model, tokenizer, get_splitter(), SamplingSettings())


def test_logit_processing_matches_transformers(engine):
    """The engine's draw at the real vocabulary is transformers' processed distribution
    sampled by ``sample_rows``: draw for draw under one seed. (test_decoding checks
    ``warp_logits`` against every transformers processor and ``sample_rows`` against its
    distributions; this checks that ``next_tokens`` wires the engine's settings through them.)
    """
    from ksemstamp.generation.decoding import sample_rows

    gen = torch.Generator().manual_seed(0)
    vocab = engine.vocab_size
    rows = 256
    logits = torch.randn(rows, vocab, generator=gen) * 3
    history = torch.randint(0, vocab, (rows, 40), generator=gen)
    seen = torch.zeros(rows, vocab, dtype=torch.bool)
    seen.scatter_(1, history, True)
    config = engine.config
    assert (config.repetition_penalty, config.temperature) == (1.05, 0.7)  # the defaults
    want = RepetitionPenaltyLogitsProcessor(1.05)(history, logits.clone())
    want = TemperatureLogitsWarper(0.7)(history, want).softmax(-1)
    suppress = engine.suppress_eos
    engine.suppress_eos = False
    try:
        got = engine.next_tokens(logits, seen, torch.Generator().manual_seed(5))
    finally:
        engine.suppress_eos = suppress
    assert torch.equal(got, sample_rows(want, torch.Generator().manual_seed(5)))
    # and the draws differ between rows (each row's own distribution, not one shared draw)
    assert len(set(got.tolist())) > rows // 2


def test_candidates_are_single_sentences_and_rows_stop_independently(engine):
    gen = torch.Generator().manual_seed(1)
    result = draw(
        engine,
        [PROMPT],
        [6],
        lambda g, t: [(False, None)] * len(t),
        gen,
        [get_splitter().split(PROMPT)[-1]],
    )[0]
    assert len(result.candidates) == 6 and result.accepted_index is None
    splitter = get_splitter()
    for cand in result.candidates:
        assert cand.text and splitter.split(cand.text) == [cand.text]
        assert splitter.ends_sentence(cand.text)  # a next sentence can follow it
        # and it stays its own sentence after the prompt's last sentence
        assert (
            splitter.split("The plan raises spending on schools and roads. " + cand.text)[-1]
            == cand.text
        )
    lengths = {c.num_tokens for c in result.candidates}
    assert len(lengths) > 1  # rows ended at their own sentence ends
    for cand in result.candidates:
        # a candidate counts the tokens of its sentence and the whitespace before it, not the
        # token that showed where it ends
        written = len(engine.tokenizer(cand.separator + cand.text)["input_ids"])
        assert abs(cand.num_tokens - written) <= 1
    # each row decoded its sentence and the one token that showed where it ends
    assert result.decoded_tokens <= sum(c.num_tokens + 1 for c in result.candidates)


def test_ordered_acceptance_and_early_stop(engine):
    # Rows 2..7 are acceptable, rows 0 and 1 are not. Whichever row finishes first, the round
    # must keep the first acceptable row *in row order* (row 2 unless its sentence came out
    # empty) and drop every row after it.
    gen = torch.Generator().manual_seed(2)
    judge = lambda rows, texts: [(i >= 2, None) for _, i in rows]  # noqa: E731
    result = draw(engine, [PROMPT], [8], judge, gen, [get_splitter().split(PROMPT)[-1]])[0]
    assert result.accepted_index is not None and result.accepted_index >= 2
    cands = result.candidates
    assert len(cands) == result.accepted_index + 1
    assert cands[-1].accepted and cands[-1].text
    assert not any(c.accepted for c in cands[:-1])
    assert all(not c.text for c in cands[2:-1])  # skipped only if it gave no sentence


def test_batching_does_not_change_what_is_sampled(lm):
    # Near-greedy decoding: any mistake in sharing, padding or pruning the cache would change
    # the text. One row alone, four rows of one prompt, and two prompts of different lengths
    # batched together must all give the same sentences.
    model, tokenizer = lm
    engine = BatchedEngine(model, tokenizer, get_splitter(), SamplingSettings(temperature=1e-4))
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    split = get_splitter().split
    alone_long = draw(engine, [PROMPT], [1], none, None, [split(PROMPT)[-1]])[0]
    alone_short = draw(engine, [SHORT], [1], none, None, [SHORT])[0]
    four = draw(engine, [PROMPT], [4], none, None, [split(PROMPT)[-1]])[0]
    mixed = draw(engine, [SHORT, PROMPT], [2, 3], none, None, [SHORT, split(PROMPT)[-1]])
    want_long, want_short = alone_long.candidates[0].text, alone_short.candidates[0].text
    assert want_long and want_short
    assert [c.text for c in four.candidates] == [want_long] * 4
    assert [c.text for c in mixed[0].candidates] == [want_short] * 2
    assert [c.text for c in mixed[1].candidates] == [want_long] * 3


def test_bad_arguments(engine):
    with pytest.raises(ValueError):
        draw(engine, [PROMPT], [0], lambda g, t: [], None)
    with pytest.raises(ValueError):
        draw(engine, [PROMPT, SHORT], [1], lambda g, t: [], None)
    with pytest.raises(ValueError):
        SamplingSettings(temperature=0)


def test_a_pruner_stops_rows_at_its_checks(engine):
    # The pruner sees the running rows every 4 tokens, each holding exactly that many tokens of
    # text; at the first check it lets only the rows with an even index go on. Stopped rows
    # come back pruned, with no text and 4 tokens, all wasted; the others finish as usual.
    from ksemstamp.generation.engine import Pruner

    seen = []

    def decide(tokens, rows, texts, finished):
        seen.append((tokens, [i for _, i in rows], texts, [len(f) for f in finished]))
        return [tokens > 4 or i % 2 == 0 for _, i in rows]

    gen = torch.Generator().manual_seed(3)
    split = get_splitter().split
    none = lambda g, t: [(False, None)] * len(t)  # noqa: E731
    result = draw(engine, [PROMPT], [6], none, gen, [split(PROMPT)[-1]], pruner=Pruner(4, decide))[
        0
    ]
    tokenizer = engine.tokenizer
    first_tokens, first_rows, first_texts, _ = seen[0]
    assert first_tokens == 4 and all(
        len(tokenizer(t, add_special_tokens=False).input_ids) <= 5 for t in first_texts
    )
    assert [t for t, *_ in seen] == [4 * (i + 1) for i in range(len(seen))]
    cands = result.candidates
    assert len(cands) == 6
    for i, cand in enumerate(cands):
        if i % 2 and i in first_rows:  # running at the first check, odd: stopped there
            assert cand.pruned and not cand.text and cand.num_tokens == 4
        else:
            assert not cand.pruned
    pruned = sum(c.num_tokens for c in cands if c.pruned)
    assert result.pruned == sum(c.pruned for c in cands) >= 1
    assert result.wasted_tokens >= pruned


def test_a_candidates_fluency_is_the_lms_mean_logprob_of_its_tokens(engine):
    """Each candidate carries the LM's own mean log-probability per token of its unit (raw
    logits, temperature 1): the same number a forward pass over prefix and unit gives."""
    from ksemstamp.generation.batched import token_logprobs

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([4, 0, 49])
    want = logits.log_softmax(-1)[torch.arange(3), ids]
    assert torch.allclose(token_logprobs(logits, ids), want, atol=1e-6)

    gen = torch.Generator().manual_seed(4)
    last = [get_splitter().split(PROMPT)[-1]]
    result = draw(engine, [PROMPT], [4], lambda g, t: [(False, None)] * len(t), gen, last)[0]
    tok, model = engine.tokenizer, engine.model
    prefix = tok(PROMPT)["input_ids"]
    checked = 0
    for cand in result.candidates:
        unit = tok(cand.separator + cand.text, add_special_tokens=False)["input_ids"]
        if len(unit) != cand.num_tokens:  # sampled as other pieces: not comparable this way
            continue
        with torch.inference_mode():
            out = model(torch.tensor([prefix + unit], device=engine.device)).logits[0].float()
        steps = out[len(prefix) - 1 : -1].log_softmax(-1)
        mean = steps[torch.arange(len(unit)), torch.tensor(unit, device=steps.device)].mean()
        assert cand.fluency == pytest.approx(float(mean), abs=2e-3)
        checked += 1
    assert checked >= 2
