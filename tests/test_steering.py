"""Steering: the key's logit bias, the key-free token table behind it, and where it acts."""

from __future__ import annotations

import pytest
import torch
from test_direction import _scheme

from ksemstamp.generation.steering import Steering, token_vectors, word_tokens
from ksemstamp.marks import build_mark
from ksemstamp.settings import DirectionSearch

PIECES = [" council", " met", ".", " ", "\n", " budget", "42", " Monday", ",", " water"]


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
    directions = torch.randn(regions, dim, generator=gen)
    words = torch.ones(vocab, dtype=torch.bool)
    words[2] = False  # a mark
    return Steering(vectors, directions, strength, words), vectors, directions


def test_the_bias_is_the_standardised_projection_on_the_context_s_direction():
    steering, vectors, directions = _steering(strength=0.5)
    weights = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    bias = steering.bias(weights)
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


def test_no_context_or_no_strength_gives_no_bias():
    steering, _, _ = _steering(strength=0.5)
    assert steering.bias(torch.zeros(1, 3)).abs().max() == 0
    assert _steering(strength=0.0)[0].bias(torch.eye(3)).abs().max() == 0
    with pytest.raises(ValueError, match="strength"):
        _steering(strength=-1.0)


def test_word_tokens_are_the_entries_with_a_letter():
    flags = word_tokens(PieceTokenizer(), 12).tolist()  # two padded entries past the tokenizer
    assert flags == [True, True, False, False, False, True, False, True, False, True, False, False]


def test_token_vectors_are_key_free_cached_and_blank_for_whitespace(hash_encoder, tmp_path):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    table = token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path)
    assert table.shape == (12, 32)
    blank = [i for i, p in enumerate(PIECES + ["", ""]) if not p.strip()]
    assert table[blank].abs().max() == 0 and table[0].abs().max() > 0
    assert len(list(tmp_path.glob("*.pt"))) == 1
    # The same vocabulary and encoder under another key: the same table, read from the cache.
    other = _scheme(hash_encoder, key="two")
    again = token_vectors(PieceTokenizer(), 12, other, build_mark(other), tmp_path)
    assert torch.equal(again, table) and len(list(tmp_path.glob("*.pt"))) == 1
    assert torch.allclose(table[0], mark.vectors(scheme.embed([" council"]))[0].half().float())


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
    bias = mark.round_bias([steered, completing])
    assert torch.allclose(bias[0], steering.bias(weights[None].float())[0])
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
    first = engine.calls[0]["bias"]
    assert first.shape == (1, steering.vocab)
    assert torch.allclose(first[0], steering.bias(prompt_weights[None].float())[0], atol=1e-6)
    kept = mark.context_weights(scheme.embed([result.sentences[0].text]))[0]
    second = engine.calls[1]["bias"][0]
    assert torch.allclose(second, steering.bias(kept[None].float())[0], atol=1e-6)


def _damage(path, how):
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random":
        path.write_bytes(bytes(range(256)) * 8)
    elif how == "shape":
        torch.save({"table": torch.zeros(10, 32).half(), "sha256": "x"}, path)
    elif how == "bare tensor":
        torch.save(torch.zeros(12, 32).half(), path)
    elif how in ("nan", "tampered"):
        saved = torch.load(path, weights_only=True)
        table = saved["table"].clone()
        table[0, 0] = float("nan") if how == "nan" else table[0, 0] + 1
        torch.save({"table": table, "sha256": saved["sha256"]}, path)


@pytest.mark.parametrize(
    "how", ["truncated", "empty", "random", "shape", "bare tensor", "nan", "tampered"]
)
def test_a_damaged_cached_table_is_rebuilt_with_one_warning(hash_encoder, tmp_path, caplog, how):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)
    table = token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path)
    (path,) = tmp_path.glob("*.pt")
    _damage(path, how)
    with caplog.at_level("WARNING", logger="ksemstamp.generation.steering"):
        again = token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path)
    assert torch.equal(again, table)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and str(path) in warned[0] and "rebuilding it" in warned[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ksemstamp.generation.steering"):
        token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path)  # rebuilt: read quietly
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_an_unwritable_cache_warns_once_and_the_table_is_used_from_memory(
    hash_encoder, tmp_path, caplog, monkeypatch
):
    scheme = _scheme(hash_encoder, key="one")
    mark = build_mark(scheme)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Operation not permitted")

    monkeypatch.setattr(torch, "save", refuse)
    with caplog.at_level("WARNING", logger="ksemstamp.generation.steering"):
        first = token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path / "ro")
        second = token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path / "ro")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "cannot write the steering table" in warned[0]
    assert torch.equal(first, second) and first.shape == (12, 32)


def test_the_table_is_built_on_one_thread_whatever_the_process_runs_with(
    hash_encoder, tmp_path, monkeypatch
):
    """Float sums split over threads round differently, so a table built with other threads
    can differ by an fp16 step: the table is always built on one thread, so every machine
    steers alike, and the process's threads are restored."""
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
        token_vectors(PieceTokenizer(), 12, scheme, mark, tmp_path)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert seen[0] == 2 and set(seen[1:]) == {1}  # the probes, then the table's batches


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


@pytest.mark.parametrize(
    ("unit", "before", "degenerate"),
    [
        ("government labor LaborLabLabLabil GoReaders.com", "", True),
        ("Pet Thermal Energy, China Pet Thermal Energy, China Fuel,", "", True),
        ("which are Dragon, Lions, Kings, Lions, Frogs, Lions,", "", True),
        ("What's the message?", "What's the impact?", True),
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
