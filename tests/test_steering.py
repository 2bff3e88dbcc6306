"""Steering: the key's logit bias, the key-free token table behind it, and where it acts."""

from __future__ import annotations

import pytest
import torch
from test_direction import _scheme

from ksemstamp.generation import steering as steering_module
from ksemstamp.generation.steering import Steering, TokenTable, token_table, word_tokens
from ksemstamp.marks import build_mark
from ksemstamp.settings import DirectionSearch

PIECES = [" council", " met", ".", " ", "\n", " budget", "42", " Monday", ",", " water"]
WORDS = [i for i, p in enumerate(PIECES) if any(c.isalpha() for c in p)]


class PieceTokenizer:
    """A tokenizer of ``PIECES``: entry ``i`` decodes to ``PIECES[i]``."""

    def __len__(self) -> int:
        return len(PIECES)

    def batch_decode(self, rows):
        return [PIECES[i] for (i,) in rows]


def _steering(strength=0.5, vocab=12, dim=6, regions=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    vectors = torch.nn.functional.normalize(torch.randn(vocab, dim, generator=gen), dim=-1)
    vectors[3] = 0.0  # an entry with no vector (whitespace)
    vectors = vectors.half().float()  # as a table holds them
    directions = torch.randn(regions, dim, generator=gen)
    words = torch.ones(vocab, dtype=torch.bool)
    words[2] = False  # a mark
    steering = Steering(TokenTable.fixed(vectors), directions, strength, words)
    return steering, vectors, directions


def test_the_bias_is_the_standardised_projection_on_the_context_s_direction():
    steering, vectors, directions = _steering(strength=0.5)
    weights = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    bias = steering.bias(weights).dense()
    assert bias.shape == (2, 12) and bias.dtype == torch.float32
    active = steering.active
    assert active.tolist() == [i not in (2, 3) for i in range(12)]
    assert bias[:, ~active].abs().max() == 0  # a mark and an empty entry: never biased
    for row, w in zip(bias, weights, strict=True):
        raw = (vectors @ (w @ directions)).float()[active]
        want = 0.5 * (raw - raw.mean()) / raw.std()
        assert torch.allclose(row[active], want, atol=1e-5)
        assert row[active].std().item() == pytest.approx(0.5, rel=1e-4)  # strength in sd
        # the entry that points most along the context's direction gains the most
        assert int(row.argmax()) == int(
            torch.where(active, vectors @ (w @ directions), -9).argmax()
        )


def test_the_bias_among_plausible_entries_is_the_dense_one_there_and_zero_elsewhere():
    steering, _, _ = _steering(strength=0.7)
    bias = steering.bias(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    inside = torch.zeros(2, 12, dtype=torch.bool)
    inside[0, [0, 5]] = True
    inside[1, [7]] = True
    among = bias.among(inside)
    asked = inside.any(dim=0)
    torch.testing.assert_close(among[:, asked], bias.dense()[:, asked])
    assert among[:, ~asked].abs().max() == 0
    # Rows picked, repeated and replaced keep their own weights.
    picked = bias.rows([1, 1, 0])
    torch.testing.assert_close(picked.dense(), bias.dense()[[1, 1, 0]])
    put = bias.put([0], bias.rows([1]))
    torch.testing.assert_close(put.dense(), bias.dense()[[1, 1]])


def test_the_standardisation_comes_from_an_even_sample_of_the_vocabulary(monkeypatch):
    """A large vocabulary is standardised by a sample of its entries: close to the whole
    vocabulary's mean and spread, with no need to embed it."""
    monkeypatch.setattr(steering_module, "SAMPLE", 500)
    gen = torch.Generator().manual_seed(1)
    vectors = torch.nn.functional.normalize(torch.randn(5000, 8, generator=gen), dim=-1)
    directions = torch.randn(4, 8, generator=gen)
    steering = Steering(TokenTable.fixed(vectors), directions, 1.0)
    w = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    bias = steering.bias(w).dense()[0]
    assert abs(bias.mean().item()) < 0.1 and bias.std().item() == pytest.approx(1.0, abs=0.1)
    raw = vectors.half().float() @ (w[0] @ directions)
    assert torch.corrcoef(torch.stack([bias, raw]))[0, 1] > 0.9999  # the same order


def test_no_context_or_no_strength_gives_no_bias():
    steering, _, _ = _steering(strength=0.5)
    assert steering.bias(torch.zeros(1, 3)).dense().abs().max() == 0
    assert _steering(strength=0.0)[0].bias(torch.eye(3)).dense().abs().max() == 0
    with pytest.raises(ValueError, match="strength"):
        _steering(strength=-1.0)


def test_word_tokens_are_the_entries_with_a_letter():
    flags = word_tokens(PieceTokenizer(), 12).tolist()  # two padded entries past the tokenizer
    assert flags == [True, True, False, False, False, True, False, True, False, True, False, False]


def _counting(scheme, monkeypatch):
    """``scheme.embed`` counting the texts it is given (the probes included)."""
    seen: list[str] = []
    embed = scheme.embed
    monkeypatch.setattr(scheme, "embed", lambda texts: seen.extend(texts) or embed(texts))
    return seen


def test_token_vectors_are_embedded_when_first_asked_and_cached_key_free(
    hash_encoder, tmp_path, monkeypatch
):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    seen = _counting(scheme, monkeypatch)
    table = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)
    assert not table.known.any() and len(seen) == 3  # the probes only
    assert table.ensure(torch.tensor([0, 5, 0])).tolist() == [0, 5]
    assert table.known.nonzero().squeeze(-1).tolist() == [0, 5]
    assert table.ensure(torch.tensor([5])).tolist() == []  # known: not embedded again
    assert torch.equal(table.vectors[0], mark.vectors(scheme.embed([" council"]))[0].half())
    table.save()
    assert len(list(tmp_path.glob("*.pt"))) == 1
    # The same vocabulary and encoder under another key: the vectors come from the cache.
    other = _scheme(hash_encoder, key="two")
    seen_other = _counting(other, monkeypatch)
    again = token_table(PieceTokenizer(), 12, other, build_mark(other), tmp_path)
    assert again.known.nonzero().squeeze(-1).tolist() == [0, 5] and len(seen_other) == 3
    assert torch.equal(again.vectors, table.vectors)


def test_steering_embeds_only_its_sample_and_the_entries_asked(hash_encoder, monkeypatch):
    monkeypatch.setattr(steering_module, "SAMPLE", 2)
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    table = token_table(PieceTokenizer(), 12, scheme, mark, None)
    words = word_tokens(PieceTokenizer(), 12)
    steering = Steering(table, mark.directions, 0.5, words)
    assert table.known.nonzero().squeeze(-1).tolist() == [0, 9]  # the ends of the words
    inside = torch.zeros(1, 12, dtype=torch.bool)
    inside[0, [2, 7]] = True  # a mark (never embedded) and a word
    steering.bias(torch.ones(1, scheme.num_regions)).among(inside)
    assert table.known.nonzero().squeeze(-1).tolist() == [0, 7, 9]


def test_an_entry_s_vector_does_not_depend_on_the_entries_embedded_with_it(default_scheme):
    """Batches of one token length and exactly ``MAX_BATCH`` rows: the same bits for an
    entry embedded alone, with a few others or with many, so a cold cache and a warm one
    steer alike."""
    mark = build_mark(default_scheme)
    pieces = [" council", " met", " budget", " Monday", " water", " planet", "ing", " the"]
    pieces += [f" word{i}" for i in range(70)]
    whole = token_table(None, len(pieces), default_scheme, mark, None, pieces)
    whole.ensure(torch.arange(len(pieces)))
    for ids in ([0], [3, 1], list(range(0, 78, 5))):
        part = token_table(None, len(pieces), default_scheme, mark, None, pieces)
        part.ensure(torch.tensor(ids))
        assert torch.equal(part.vectors[ids], whole.vectors[ids]), ids


def test_the_cache_grows_across_runs_and_merges_what_another_process_wrote(hash_encoder, tmp_path):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    first = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)
    second = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)  # another process
    first.ensure(torch.tensor([0]))
    second.ensure(torch.tensor([5]))
    first.save()
    second.save()  # reads the first's entry before writing
    assert second.known.nonzero().squeeze(-1).tolist() == [0, 5]
    third = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)
    assert third.known.nonzero().squeeze(-1).tolist() == [0, 5]


def test_the_direction_mark_steers_a_round_toward_each_document_s_context(hash_encoder):
    scheme = _scheme(hash_encoder)
    steering, _, _ = _steering(regions=scheme.num_regions, dim=32)
    mark = build_mark(scheme, DirectionSearch(steer=0.5), steering)
    state = mark.new_state()
    weights = torch.zeros(scheme.num_regions, dtype=torch.float64)
    weights[1] = 1.0
    steered = type("Doc", (), {"completing": False, "state": state})()
    state.weights = weights
    completing = type("Doc", (), {"completing": True, "state": state})()
    bias = mark.round_bias([steered, completing]).dense()
    assert torch.allclose(bias[0], steering.bias(weights[None].float()).dense()[0])
    assert bias[1].abs().max() == 0  # completing the prompt's sentence: not steered
    assert build_mark(scheme, DirectionSearch()).round_bias([steered]) is None


def test_the_sentence_loop_hands_each_round_the_mark_s_bias(hash_encoder):
    from test_direction import _pool
    from test_watermarker import ScriptedEngine, _watermarker

    scheme = _scheme(hash_encoder)
    steering, _, _ = _steering(regions=scheme.num_regions, dim=32)
    search = DirectionSearch(max_candidates=4, candidate_batch=4, prune_tokens=None, steer=0.5)
    mark = build_mark(scheme, search, steering)
    pool = _pool(8)
    engine = ScriptedEngine([pool[:4], pool[4:]])
    wm = _watermarker(
        scheme, engine, mark=mark, max_candidates=4, candidate_batch=4, max_sentences=2
    )
    result = wm.generate(["A prompt sentence."])[0]
    assert result.status == "ok" and len(engine.calls) == 2
    # Each round is steered toward the context the document's last unit handed on: the
    # prompt's sentence for the first, the kept unit's for the second.
    prompt_weights = mark.context_weights(scheme.embed(["A prompt sentence."]))[0]
    first = engine.calls[0]["bias"].dense()
    assert first.shape == (1, steering.vocab)
    want = steering.bias(prompt_weights[None].float()).dense()[0]
    assert torch.allclose(first[0], want, atol=1e-6)
    kept = mark.context_weights(scheme.embed([result.sentences[0].text]))[0]
    second = engine.calls[1]["bias"].dense()[0]
    assert torch.allclose(second, steering.bias(kept[None].float()).dense()[0], atol=1e-6)


def _damage(path, how):
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random":
        path.write_bytes(bytes(range(256)) * 8)
    elif how == "shape":
        saved = torch.load(path, weights_only=True)
        torch.save({**saved, "vectors": saved["vectors"][:, :10]}, path)
    elif how == "outside":
        saved = torch.load(path, weights_only=True)
        torch.save({**saved, "ids": saved["ids"] + 100}, path)
    elif how == "bare tensor":
        torch.save(torch.zeros(12, 32).half(), path)
    elif how in ("nan", "tampered"):
        saved = torch.load(path, weights_only=True)
        vectors = saved["vectors"].clone()
        vectors[0, 0] = float("nan") if how == "nan" else vectors[0, 0] + 1
        torch.save({**saved, "vectors": vectors}, path)


@pytest.mark.parametrize(
    "how", ["truncated", "empty", "random", "shape", "outside", "bare tensor", "nan", "tampered"]
)
def test_a_damaged_cached_table_is_built_again_with_one_warning(
    hash_encoder, tmp_path, caplog, how
):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    table = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)
    table.ensure(torch.tensor(WORDS))
    table.save()
    (path,) = tmp_path.glob("*.pt")
    _damage(path, how)
    with caplog.at_level("WARNING", logger="ksemstamp.generation.steering"):
        again = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)
    assert not again.known.any()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and str(path) in warned[0] and "building it again" in warned[0]
    again.ensure(torch.tensor(WORDS))
    assert torch.equal(again.vectors, table.vectors)
    caplog.clear()
    again.save()  # the damaged file replaced
    with caplog.at_level("WARNING", logger="ksemstamp.generation.steering"):
        third = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert third.known.nonzero().squeeze(-1).tolist() == WORDS


def test_an_unwritable_cache_warns_once_and_the_table_is_used_from_memory(
    hash_encoder, tmp_path, caplog, monkeypatch
):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Operation not permitted")

    monkeypatch.setattr(torch, "save", refuse)
    table = token_table(PieceTokenizer(), 12, scheme, mark, tmp_path / "ro")
    with caplog.at_level("WARNING", logger="ksemstamp.generation.steering"):
        for ids in ([0], [5]):
            table.ensure(torch.tensor(ids))
            table.save()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "cannot write the steering table" in warned[0]
    assert table.known.nonzero().squeeze(-1).tolist() == [0, 5]


def test_token_vectors_are_embedded_on_one_thread_whatever_the_process_runs_with(
    hash_encoder, monkeypatch
):
    """Float sums split over threads round differently, so vectors embedded with other
    threads can differ by an fp16 step: they are always embedded on one thread, so every
    machine steers alike, and the process's threads are restored."""
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    seen = []
    embed = scheme.embed
    monkeypatch.setattr(
        scheme, "embed", lambda texts: seen.append(torch.get_num_threads()) or embed(texts)
    )
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        table = token_table(PieceTokenizer(), 12, scheme, mark, None)
        table.ensure(torch.tensor(WORDS))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert seen[0] == 2 and set(seen[1:]) == {1}  # the probes, then the entries' batches


def _tempered(logits, temperature):
    return (logits / temperature).softmax(dim=-1)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_steering_moves_probability_only_among_the_plausible_entries(temperature):
    from ksemstamp.generation.decoding import steer_logits

    logits = torch.tensor([[4.0, 3.5, 3.0, 0.0, -1.0, -2.0], [1.0, 1.0, -5.0, -6.0, 0.9, -9.0]])
    bias = torch.tensor([[-1.0, 2.0, 0.5, 5.0, 5.0, -3.0], [0.0, 1.0, 9.0, 9.0, -1.0, 0.0]])
    before = _tempered(logits, temperature)
    after = _tempered(steer_logits(logits, bias, 0.1, temperature), temperature)
    inside = before >= 0.1 * before.max(dim=-1, keepdim=True).values
    # Every entry outside the plausible set keeps its probability, however large its bias.
    torch.testing.assert_close(after[~inside], before[~inside])
    # The plausible entries keep their total and are reweighted by exp(bias / temperature).
    torch.testing.assert_close((after * inside).sum(-1), (before * inside).sum(-1))
    ratio = (after / before)[inside]
    expected = torch.exp(bias / temperature)[inside]
    rows = inside.nonzero()[:, 0]
    for r in rows.unique():
        got, want = ratio[rows == r], expected[rows == r]
        torch.testing.assert_close(got / got[0], want / want[0])
    # The fragment the LM did not consider (entry 3 of row 0, bias 5) is not lifted.
    assert after[0, 3] == pytest.approx(float(before[0, 3]), rel=1e-5)


def test_steering_everywhere_adds_the_bias_and_never_touches_a_suppressed_entry():
    from ksemstamp.generation.decoding import steer_logits

    logits = torch.tensor([[2.0, float("-inf"), 0.0, 1.0]])
    bias = torch.tensor([[0.5, 3.0, -1.0, 0.0]])
    torch.testing.assert_close(steer_logits(logits, bias, 0.0, 0.7), logits + bias)
    steered = steer_logits(logits, bias, 0.5, 0.7)
    assert steered[0, 1] == float("-inf") and torch.isfinite(steered[0, [0, 2, 3]]).all()


def test_both_hugging_face_engines_steer_the_same_distribution():
    from ksemstamp.generation.decoding import warp_logits
    from ksemstamp.generation.sequential import _AddBias
    from ksemstamp.settings import SamplingSettings

    config = SamplingSettings(temperature=0.7, repetition_penalty=1.3, steer_plausible=0.05)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 50, generator=gen) * 3
    bias = torch.randn(3, 50, generator=gen)
    seen = torch.zeros(3, 50, dtype=torch.bool)
    seen[:, :5] = True
    batched = warp_logits(logits, seen, config, (), bias).softmax(-1)
    # transformers: the repetition penalty, then the processors given to generate, then the
    # temperature.
    penalised = warp_logits(logits, seen, SamplingSettings(temperature=1.0, repetition_penalty=1.3))
    for r in range(3):
        steered = _AddBias(bias[r], config.steer_plausible, config.temperature)(
            None, penalised[r : r + 1]
        )
        torch.testing.assert_close(batched[r : r + 1], (steered / 0.7).softmax(-1))


def test_both_hugging_face_engines_steer_alike_with_the_mark_s_bias():
    """The mark's ``SteerBias`` asked for each step's plausible entries: one row of it in the
    sequential engine's processor gives the batched engine's distribution for that row."""
    from ksemstamp.generation.decoding import warp_logits
    from ksemstamp.generation.sequential import _AddBias
    from ksemstamp.settings import SamplingSettings

    steering, _, _ = _steering(strength=2.0, vocab=50)
    config = SamplingSettings(temperature=0.7, repetition_penalty=1.3, steer_plausible=0.05)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 50, generator=gen) * 3
    bias = steering.bias(torch.rand(3, 3, generator=gen))
    seen = torch.zeros(3, 50, dtype=torch.bool)
    batched = warp_logits(logits, seen, config, (), bias).softmax(-1)
    unsteered = warp_logits(logits, seen, config).softmax(-1)
    assert not torch.allclose(batched, unsteered)  # the bias moved something
    penalised = warp_logits(logits, seen, SamplingSettings(temperature=1.0, repetition_penalty=1.3))
    for r in range(3):
        steered = _AddBias(bias.rows([r]), config.steer_plausible, config.temperature)(
            None, penalised[r : r + 1]
        )
        torch.testing.assert_close(batched[r : r + 1], (steered / 0.7).softmax(-1))


@pytest.mark.parametrize(
    ("unit", "before", "degenerate"),
    [
        ("government labor LaborLabLabLabil GoReaders.com", "", True),
        ("Pet Thermal Energy, China Pet Thermal Energy, China Fuel,", "", True),
        ("which are Dragon, Lions, Kings, Lions, Frogs, Lions,", "", True),
        ("What's the message?", "What's the impact?", True),
        ("She is also known as Lady E.E.E.", "", True),
        ("No, no, no, he said.", "", True),
        ("China.", "It's all about China.", True),
        ("Brazil, Mexico, Spain, Mexico,", "FIFA Cup: Brazil, Brazil,", True),  # run across the cut
        ("Brazil beat Mexico,", "The final: Brazil,", False),
        ("Brazil, Mexico, Spain,", "Brazil, Brazil, they sang.", False),  # the run ended before
        ("China and India.", "It's all about China.", False),
        ("It cost $1,000,000,000 in all,", "", False),
        ("The council met on Monday and approved the budget for schools.", "", False),
        ("The United States and the United Kingdom signed it,", "", False),
        ("What happens next?", "Who pays for it?", False),
        ("What's the message?", "The award went to her.", False),
    ],
)
def test_a_candidate_that_repeats_itself_is_told_apart(unit, before, degenerate):
    from ksemstamp.text.normalize import repeats_itself

    assert repeats_itself(unit, before) is degenerate


def test_a_list_that_goes_on_is_told_apart_by_what_the_text_said_before():
    from ksemstamp.text.normalize import repeats_itself

    history = {"china oil and natural gas, china pet thermal energy,"}
    assert repeats_itself("China Pet Thermal Energy, South", "", history)
    assert not repeats_itself("China Pet Thermal Energy, South", "", ())
    # Lists of few words, and a long word again right after the unit before.
    assert repeats_itself("Frogs, Frogs, Lions, Lions,")
    assert repeats_itself("the Lions and the Frogs of Lions,", "Kings and Lions,")
    # Common short phrases said before are no list: "in the last year".
    assert not repeats_itself("In the last year,", "", {"in the last year, prices rose"})
    assert not repeats_itself("Sentence number 5 is here.", "", {"sentence number 1 is here."})


def test_the_third_unit_in_a_row_on_one_template_repeats_itself():
    from ksemstamp.text.normalize import repeats_itself

    first, second = "He is not King John.", "He is not King George III."
    assert repeats_itself("He is not King Harry Potter.", second, earlier=first)
    assert repeats_itself("he is NOT a king at all,", second, earlier=first)  # case aside
    # Two in a row, another opening before them, or two words alike only: no template.
    assert not repeats_itself("He is not King Harry Potter.", second)
    assert not repeats_itself("He is not King Harry Potter.", second, earlier="The king is dead.")
    assert not repeats_itself("He is now King Harry Potter.", second, earlier=first)
    numbered = [f"Sentence number {i} is here." for i in range(3)]
    assert not repeats_itself(numbered[2], numbered[1], earlier=numbered[0])


def test_short_units_that_differ_from_an_earlier_one_in_one_word_are_a_list_that_goes_on():
    from ksemstamp.text.normalize import repeats_itself, said_grams

    history = ["china 2 news.", "hong kong on monday."]
    assert repeats_itself("China 3 News.", "", history)
    assert repeats_itself("Hong Kong on Tuesday.", "", history)
    assert repeats_itself("Hong Kong on Tuesday.", "", said=said_grams(history))
    assert repeats_itself("China 2 News!", "", history)  # the same words count too
    # Two words changed, another length, or a unit too long to be judged whole: no list.
    assert not repeats_itself("China 3 Times, today.", "", history)
    assert not repeats_itself("Kong on Tuesday,", "", history)
    assert not repeats_itself("Hong Kong on Tuesday morning.", "", history)
    assert not repeats_itself("Hong Kong said nothing.", "", history)
