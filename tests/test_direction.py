"""The ``direction`` mark: keyed directions, its exact statistic, detection and the sentence loop
(stand-in encoder and scripted sampler, no real model)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from test_watermarker import ScriptedEngine, _watermarker

from ksemstamp.detection.stats import context_sums, direction_z, normal_sf
from ksemstamp.detector import Detector
from ksemstamp.marks import build_mark
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.keyed import keyed_directions
from ksemstamp.scheme.partition import KMeansPartition, LSHPartition
from ksemstamp.settings import DirectionSettings, RegionSettings
from ksemstamp.settings.marks import SCAN_TESTS
from ksemstamp.text.splitter import get_splitter

# ---------------------------------------------------------------------- keyed directions


def test_directions_depend_on_key_context_and_shape_only():
    a = keyed_directions(8, 32, "key")
    assert a.shape == (8, 32) and a.dtype == torch.float32
    assert torch.equal(a, keyed_directions(8, 32, "key"))
    assert not torch.equal(a, keyed_directions(8, 32, "other key"))
    assert not torch.equal(a[0], a[1])
    # A different number of contexts is a different table, not a prefix of this one.
    assert not torch.equal(a[:4], keyed_directions(4, 32, "key"))
    with pytest.raises(ValueError):
        keyed_directions(8, 32, "")


def test_directions_are_pinned():
    # Platform-independent by construction (HMAC, SHAKE-256, float64 Box-Muller): these values
    # must never change, or texts watermarked before the change stop being detected.
    first = keyed_directions(2, 4, "pinned key")[0].double().numpy()
    np.testing.assert_allclose(first, [-2.42179, 0.572331, 0.221373, 0.206091], rtol=0, atol=1e-6)


def test_directions_are_standard_normal():
    # 64 x 384 = 24,576 draws: mean within 4 standard errors of 0, variance of 1, and the tails
    # of a normal (two-sided 5% within 4 binomial standard errors).
    x = keyed_directions(64, 384, "moments").double().numpy().ravel()
    n = x.size
    assert abs(x.mean()) < 4 / math.sqrt(n)
    assert abs(x.var() - 1) < 4 * math.sqrt(2 / n)
    tail = np.mean(np.abs(x) > 1.959964)
    assert abs(tail - 0.05) < 4 * math.sqrt(0.05 * 0.95 / n)


# ---------------------------------------------------------------------- the statistic


def test_direction_z_matches_its_definition():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(7, 5))
    contexts = [0, 2, 2, 1, 0, 2, 3]
    directions = rng.normal(size=(4, 5))
    total = sum(directions[c] @ v for c, v in zip(contexts, vectors, strict=True))
    sums = {
        c: sum(v for cc, v in zip(contexts, vectors, strict=True) if cc == c) for c in set(contexts)
    }
    variance = sum(float(s @ s) for s in sums.values())
    assert direction_z(vectors, contexts, directions) == pytest.approx(total / math.sqrt(variance))
    distinct, w = context_sums(vectors, contexts)
    assert list(distinct) == [0, 1, 2, 3]
    np.testing.assert_allclose(w[2], sums[2])
    with pytest.raises(ValueError):
        direction_z(np.zeros((2, 5)), [0, 1], directions)


def test_direction_p_value_is_exact_over_keys():
    # One fixed "human" text: eight strongly correlated sentence vectors (one shared topic
    # direction), mostly in two contexts. Over 2,000 keys built as real keys are, the p-value
    # is uniform: the share at or below 1%, 5% and 20% each within 4 binomial standard errors.
    rng = np.random.default_rng(1)
    topic = rng.normal(size=24)
    vectors = 2.0 * topic + rng.normal(size=(8, 24))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    contexts = [3, 3, 3, 1, 1, 3, 0, 1]
    ps = np.array(
        [
            normal_sf(direction_z(vectors, contexts, keyed_directions(4, 24, f"k{i}").numpy()))
            for i in range(2000)
        ]
    )
    for alpha in (0.01, 0.05, 0.2):
        assert abs(np.mean(ps <= alpha) - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / len(ps))


def test_soft_context_sums_and_z():
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(5, 6))
    directions = rng.normal(size=(3, 6))
    # One-hot weights are the region indices they encode, to the last bit.
    contexts = [2, 0, 2, 1, 0]
    onehot = np.eye(3)[contexts]
    assert direction_z(vectors, onehot, directions) == direction_z(vectors, contexts, directions)
    distinct, w = context_sums(vectors, onehot)
    np.testing.assert_array_equal(w, context_sums(vectors, contexts)[1])
    # Soft weights: sentence t is scored on sum_c a_tc n_c, and w_c = sum_t a_tc u_t.
    weights = np.abs(rng.normal(size=(5, 3)))
    weights[1, 1] = 0.0
    weights /= np.linalg.norm(weights, axis=1, keepdims=True)
    total = sum((a @ directions) @ v for a, v in zip(weights, vectors, strict=True))
    sums = weights.T @ vectors
    assert direction_z(vectors, weights, directions) == pytest.approx(
        total / math.sqrt(float((sums**2).sum()))
    )
    # A context no sentence weighs is left out.
    weights[:, 1] = 0.0
    assert list(context_sums(vectors, weights)[0]) == [0, 2]


def test_soft_context_p_value_is_exact_over_keys():
    # As above, with soft context weights that overlap between sentences: still uniform.
    rng = np.random.default_rng(3)
    topic = rng.normal(size=24)
    vectors = 2.0 * topic + rng.normal(size=(8, 24))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    weights = np.exp(rng.normal(size=(8, 4)))
    weights /= np.linalg.norm(weights, axis=1, keepdims=True)
    ps = np.array(
        [
            normal_sf(direction_z(vectors, weights, keyed_directions(4, 24, f"s{i}").numpy()))
            for i in range(2000)
        ]
    )
    for alpha in (0.01, 0.05, 0.2):
        assert abs(np.mean(ps <= alpha) - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / len(ps))


# ---------------------------------------------------------------------- detection


def _scheme(
    hash_encoder, key: str = "k", center: torch.Tensor | None = None, temperature: float = 0.0
) -> WatermarkScheme:
    centroids = torch.nn.functional.normalize(
        torch.randn(4, 32, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    # The chained design with hard contexts (temperature 0): the mark's tests pick theirs.
    mark = DirectionSettings(context="previous", context_temperature=temperature)
    return WatermarkScheme(
        hash_encoder,
        KMeansPartition(centroids, margin=0.0),
        key,
        get_splitter(),
        mark,
        center=center,
    )


def _pool(n: int) -> list[str]:
    return [f"Sentence number {i} is here." for i in range(n)]


def _greedy_text(scheme: WatermarkScheme, prompt: str, length: int, pool: list[str]) -> list[str]:
    """Sentences picked one by one as the best-scoring of the pool after the previous one."""
    previous = int(scheme.regions([prompt])[0][0])
    emb = scheme.embed(pool)
    vectors, regions = build_mark(scheme).vectors(emb), scheme.locate(emb)[0]
    chosen, used = [], set()
    for _ in range(length):
        scores = build_mark(scheme).scores(vectors, [previous] * len(pool))
        for i in used:
            scores[i] = -math.inf
        best = int(scores.argmax())
        used.add(best)
        chosen.append(pool[best])
        previous = int(regions[best])
    return chosen


def test_detects_a_text_written_for_the_key(hash_encoder):
    scheme = _scheme(hash_encoder)
    prompt = "A prompt sentence."
    text = " ".join(_greedy_text(scheme, prompt, 8, _pool(60)))
    result = Detector(scheme, scan=False).detect(text, prompt=prompt)
    assert result.status == "ok" and result.num_scored == 8
    assert result.watermarked and result.p_value < 1e-4
    assert result.z_score == pytest.approx(
        float(np.sum([s for s in result.scores if s is not None]))
        / math.sqrt(_variance(scheme, result)),
        rel=1e-5,
    )
    assert all(v == "valid" for v in result.verdicts)
    # Another key does not see it.
    other = Detector(_scheme(hash_encoder, key="another key"), scan=False).detect(
        text, prompt=prompt
    )
    assert not other.watermarked


def _variance(scheme, result) -> float:
    emb = scheme.embed(result.sentences)
    vectors = build_mark(scheme).vectors(emb).double().numpy()
    previous = [result.seed_region, *result.regions][: len(result.regions)]
    return float((context_sums(vectors, previous)[1] ** 2).sum())


def test_seed_repeat_and_too_short_rules(hash_encoder):
    scheme = _scheme(hash_encoder)
    detector = Detector(scheme, scan=False)
    one = detector.detect("Only one sentence here.")
    assert one.status == "too_short" and one.z_score is None and one.scores == [None]
    text = "First one here. Second one here. First one here."
    result = detector.detect(text)
    assert result.verdicts[0] == "seed" and result.verdicts[2] == "repeat"
    assert result.scores[0] is None and result.scores[2] is None
    assert result.scores[1] is not None and result.num_scored == 1
    record = result.to_record()
    assert record["scores"][1] == pytest.approx(result.scores[1], abs=1e-6)
    with pytest.raises(ValueError):
        Detector(scheme, statistic="paper")


def test_center_is_subtracted_before_scoring(hash_encoder):
    center = torch.nn.functional.normalize(torch.ones(32), dim=0) * 0.5
    scheme = _scheme(hash_encoder, center=center)
    emb = scheme.embed(["Some sentence."])
    expected = torch.nn.functional.normalize(emb - center, dim=-1)
    assert torch.allclose(build_mark(scheme).vectors(emb), expected)
    assert torch.allclose(build_mark(scheme).vectors(emb).norm(dim=-1), torch.ones(1))


def test_the_direction_mark_needs_a_key(hash_encoder):
    scheme = _scheme(hash_encoder)
    assert not hasattr(build_mark(scheme), "host_table")  # no valid table: no region mark parts
    # The direction mark has no public table: it needs a key.
    with pytest.raises(ValueError, match="key"):
        WatermarkScheme(hash_encoder, scheme.partition, None, get_splitter(), DirectionSettings())


# ---------------------------------------------------------------------- the sentence loop


def _scored(scheme, previous: int, texts: list[str]) -> list[float]:
    return (
        build_mark(scheme)
        .scores(build_mark(scheme).vectors(scheme.embed(texts)), [previous] * len(texts))
        .tolist()
    )


def _scored_pool(hash_encoder, size: int) -> tuple[WatermarkScheme, str, list[str], list[float]]:
    """A scheme, a prompt, ``size`` candidate sentences and their scores after the prompt."""
    scheme = _scheme(hash_encoder)
    prompt = "A prompt sentence."
    pool = _pool(size)
    return scheme, prompt, pool, _scored(scheme, int(scheme.regions([prompt])[0][0]), pool)


def test_accepts_the_first_candidate_reaching_the_threshold(hash_encoder):
    scheme, prompt, pool, scores = _scored_pool(hash_encoder, 80)
    low = [t for t, s in zip(pool, scores, strict=True) if s < 0.5][:3]
    high = next(t for t, s in zip(pool, scores, strict=True) if s >= 1.0)
    sampler = ScriptedEngine([[low[0], high, low[1]]])
    wm = _watermarker(
        scheme,
        sampler,
        max_candidates=8,
        candidate_batch=3,
        adaptive_batch=False,
        max_new_tokens=5,
        threshold=1.0,
    )
    res = wm.generate([prompt])[0]
    record = res.sentences[0]
    assert record.text == high and record.candidates == 2 and not record.fallback
    assert record.score == pytest.approx(scores[pool.index(high)], abs=1e-5)
    assert record.rejected == {"score": 1, "repeat": 0}
    assert res.to_record()["scores"] == [pytest.approx(record.score, abs=1e-6)]


def test_keeps_the_best_candidate_after_max_candidates(hash_encoder):
    # No candidate reaches the threshold: after max_candidates draws, over two rounds, the
    # best-scoring one is kept, even though it came in the first round.
    scheme, prompt, pool, scores = _scored_pool(hash_encoder, 12)
    order = np.argsort(scores)
    best = pool[int(order[-1])]
    rest = [pool[int(i)] for i in order[:3]]
    sampler = ScriptedEngine([[rest[0], best], [rest[1], rest[2]]])
    wm = _watermarker(
        scheme,
        sampler,
        max_candidates=4,
        candidate_batch=2,
        adaptive_batch=False,
        max_new_tokens=5,
        threshold=10.0,
    )
    record = wm.generate([prompt])[0].sentences[0]
    assert record.text == best and record.fallback and record.candidates == 4
    assert record.score == pytest.approx(max(scores), abs=1e-5)


def test_best_of_max_candidates_without_threshold_is_no_fallback(hash_encoder):
    # threshold=None: every sentence is the best of its max_candidates draws, drawn in one
    # round; nothing was turned down by a rule, so nothing is counted as rejected or fallback.
    scheme, prompt, pool, scores = _scored_pool(hash_encoder, 6)
    sampler = ScriptedEngine([pool])
    wm = _watermarker(
        scheme, sampler, max_candidates=6, candidate_batch=32, max_new_tokens=5, threshold=None
    )
    record = wm.generate([prompt])[0].sentences[0]
    assert sampler.rounds == [[6]]
    assert record.text == pool[int(np.argmax(scores))] and record.candidates == 6
    assert not record.fallback and record.rejected == {"score": 0, "repeat": 0}


def test_a_repeat_is_never_kept_for_its_score(hash_encoder):
    # Detection does not score a sentence that repeats an earlier one of the text (case and
    # whitespace ignored), so the loop must not keep one for its score: under own contexts the
    # best sentence of the first round would otherwise win every later round too.
    scheme = _scheme(hash_encoder)
    scheme.settings = dataclasses.replace(scheme.settings, context="own")
    pool = _pool(6)
    own = build_mark(scheme).context_weights(scheme.embed(pool))
    scores = build_mark(scheme).scores(build_mark(scheme).vectors(scheme.embed(pool)), own).tolist()
    order = [pool[int(i)] for i in np.argsort(scores)[::-1]]
    best, second = order[0], order[1]
    again = "  " + best.upper().replace(" ", "  ")
    sampler = ScriptedEngine([order[:3], [again, second, order[2]]])
    wm = _watermarker(
        scheme, sampler, max_candidates=3, candidate_batch=32, max_new_tokens=10, threshold=None
    )
    result = wm.generate(["A prompt sentence."])[0]
    assert [s.text for s in result.sentences] == [best, second]
    verdict = Detector(scheme, scan=False).detect(result.text, "A prompt sentence.")
    assert "repeat" not in verdict.verdicts


def test_a_candidate_that_repeats_itself_is_never_kept_for_its_score(hash_encoder):
    # A run-away list scores like any text, often high; the loop keeps a fluent candidate.
    scheme = _scheme(hash_encoder)
    pool = _pool(6)
    runaway = "Lions, Frogs, Frogs, Lions, Lions, Kings and Frogs again."
    own = build_mark(scheme).context_weights(scheme.embed([runaway, *pool]))
    mark = build_mark(scheme)
    scores = mark.scores(mark.vectors(scheme.embed([runaway, *pool])), own).tolist()
    sampler = ScriptedEngine([[runaway, *pool[:2]]])
    wm = _watermarker(
        scheme, sampler, max_candidates=3, candidate_batch=32, max_new_tokens=5, threshold=None
    )
    result = wm.generate(["A prompt sentence."])[0]
    assert result.sentences[0].text != runaway
    assert result.sentences[0].text == max(pool[:2], key=lambda t: scores[1 + pool.index(t)])
    # search.skip_repeating false: only repeats of earlier units are skipped.
    from ksemstamp.marks.base import Drawn
    from ksemstamp.settings import DirectionSearch

    for skip, novel in ((False, True), (True, False)):
        mark = build_mark(scheme, DirectionSearch(skip_repeating=skip))
        fields = {"completing": False, "state": mark.new_state(), "seen": set(), "previous": 0}
        doc = type("Doc", (), {**fields, "drawn": 0, "last_sentence": ""})()
        emb = scheme.embed([runaway])
        drawn = Drawn([doc], [(0, 0)], emb, torch.tensor([0]), torch.tensor([True]), [runaway])
        assert mark.judge(drawn)[0][1].novel is novel


def test_a_third_unit_in_a_row_on_one_template_is_never_kept_for_its_score(hash_encoder):
    # "He is not King John. He is not King Paul. He is not ...": the loop hands the mark the
    # two units before each candidate, and the third on the template loses to a fresh one.
    scheme = _scheme(hash_encoder)
    fresh = "The crowd went home after the speech."
    template = [f"He is not King {name}." for name in ("John", "Paul", "Harry", "Louis", "Fiona")]
    kept = {}
    for skip in (False, True):
        rounds = [[template[0]], [template[1]], [*template[2:], fresh]]
        wm = _watermarker(
            scheme, ScriptedEngine(rounds), max_candidates=4, candidate_batch=4,
            max_new_tokens=15, threshold=None, skip_repeating=skip,
        )  # fmt: skip
        kept[skip] = [s.text for s in wm.generate(["A prompt sentence."])[0].sentences]
    assert kept[False][:2] == kept[True][:2] == template[:2]
    assert kept[False][2] in template[2:]  # the best-scoring is on the template: not by chance
    assert kept[True][2] == fresh


def test_a_unit_is_kept_from_the_more_fluent_candidates(hash_encoder):
    # The best-scoring candidate is the least fluent: with fluent_share 0.5 the best-scoring of
    # the three most fluent is kept; with 1, the best-scoring of all six.
    scheme, prompt, pool, scores = _scored_pool(hash_encoder, 6)
    order = [int(i) for i in np.argsort(scores)[::-1]]  # best-scoring first
    fluency = dict(zip(order, [-4.0, -3.5, -1.0, -3.0, -2.0, -1.5], strict=True))
    fluent = sorted(range(6), key=lambda i: -fluency[i])[:3]
    kept = {}
    for share in (0.5, 1.0):
        sampler = ScriptedEngine([[(pool[i], fluency[i]) for i in range(6)]])
        wm = _watermarker(
            scheme, sampler, max_candidates=6, candidate_batch=32, max_new_tokens=5,
            threshold=None, selection="sentence", fluent_share=share,
        )  # fmt: skip
        kept[share] = wm.generate([prompt])[0].sentences[0].text
    assert kept[1.0] == pool[order[0]]
    assert kept[0.5] == pool[max(fluent, key=lambda i: scores[i])] != kept[1.0]


def test_fluent_candidates_keep_a_share_rounded_up_or_all_when_fluency_is_unknown():
    from ksemstamp.generation.engine import Candidate
    from ksemstamp.marks.direction import fluent_candidates

    cands = [Candidate(f"c{i}", 3, False, fluency=f) for i, f in enumerate([-2, -1, -3, -0.5, -4])]
    assert [c.text for c in fluent_candidates(cands, 0.5)] == ["c0", "c1", "c3"]  # 3 of 5, in order
    assert [c.text for c in fluent_candidates(cands, 0.01)] == ["c3"]  # at least one
    assert fluent_candidates(cands, 1.0) == cands
    cands[2] = Candidate("c2", 3, False)  # an engine that gives no log-probabilities
    assert fluent_candidates(cands, 0.5) == cands


def test_cli_report_shows_scores_and_the_exact_z(hash_encoder):
    from ksemstamp.cli.console import format_detection
    from ksemstamp.detector import DetectionResult

    direction = build_mark(_scheme(hash_encoder))
    result = DetectionResult(
        status="ok",
        z_score=3.1,
        p_value=0.001,
        num_scored=2,
        num_valid=2,
        watermarked=True,
        sentences=["One.", "Two.", "Three."],
        regions=[4, 5, 6],
        verdicts=["repeat", "valid", "invalid"],
        scores=[None, 1.25, -0.5],
    )
    text = format_detection(result, direction)
    assert "+1.25" in text and "-0.50" in text and "(exact)" in text and "positive 2" in text
    assert "span" not in text and "normalised" not in text
    # The verdicts are named as the web page names them, under a header, with a legend.
    rows = text.splitlines()
    assert rows[0].split() == ["#", "region", "score", "verdict", "sentence"]
    assert rows[3].split()[:4] == ["3", "6", "-0.50", "blocked"] and "invalid" not in text
    assert "blocked: scored, does not carry it" in text and "repeat: repeats" in text
    # The scan's span and what normalisation changed are reported when there are any.
    result.details = {
        "span": [1, 3],
        "span_z": 2.9,
        "span_p_value": 0.002,
        "text_p_value": 0.01,
        "mixture_p_value": 0.04,
    }
    result.normalized = {"look_alike": 3}
    text = format_detection(result, direction)
    assert "most marked span (sentences 2-3, z = 2.90) p = 0.002" in text
    assert "marked sentences scattered among others p = 0.04" in text
    assert "(exact, the 3 tests above combined)" in text
    text = format_detection(result, direction, "clause")  # the default's units as they are
    assert "most marked span (clauses 2-3" in text and "marked clauses scattered" in text
    result.details["weighted_p_value"] = 0.005
    text = format_detection(result, direction)
    assert "sentences that move together counted once p = 0.005" in text
    assert "the 4 tests above combined" in text and "p below" not in text
    assert "3 look-alike" in text
    # the region mark: the paper's z, no score column
    region = build_mark(
        WatermarkScheme(hash_encoder, LSHPartition(32), "k", get_splitter(), RegionSettings())
    )
    result.scores, result.details = None, {}
    shown = format_detection(result, region)
    assert "(paper)" in shown and "+1.25" not in shown and "valid 2" in shown


def test_a_time_budget_keeps_the_best_candidate_so_far(hash_encoder, ten_second_clock):
    scheme, prompt, pool, scores = _scored_pool(hash_encoder, 12)
    order = np.argsort(scores)
    best, worse = pool[int(order[-1])], pool[int(order[0])]
    sampler = ScriptedEngine([[best, worse]] * 10)
    wm = _watermarker(
        scheme,
        sampler,
        max_candidates=12,
        candidate_batch=2,
        adaptive_batch=False,
        max_new_tokens=5,
        sentence_time_budget=5.0,
    )
    record = wm.generate([prompt])[0].sentences[0]
    # One round of 2 draws, then the budget is spent: the better of the two is kept, and it is
    # the rule's choice (best so far), not a fallback.
    assert record.text == best and record.candidates == 2
    assert record.timed_out and not record.fallback
    assert len(sampler.rounds) == 1


# ---------------------------------------------------------------------- soft contexts


def test_context_weights_hard_and_soft(hash_encoder):
    emb = _scheme(hash_encoder).embed(_pool(20))
    hard = build_mark(_scheme(hash_encoder)).context_weights(emb)
    regions = _scheme(hash_encoder).locate(emb)[0]
    assert torch.equal(hard, torch.nn.functional.one_hot(regions, 4).double())
    soft = build_mark(_scheme(hash_encoder, temperature=0.05)).context_weights(emb)
    assert torch.allclose(soft.norm(dim=-1), torch.ones(20, dtype=torch.float64))
    assert (soft >= 0).all() and torch.equal(soft.argmax(dim=-1), regions)
    # Weights under 1% of the largest are dropped; a large temperature spreads them evenly.
    top = soft.max(dim=-1, keepdim=True).values
    assert ((soft == 0) | (soft >= 0.01 * top)).all()
    flat = build_mark(_scheme(hash_encoder, temperature=1e6)).context_weights(emb)
    assert torch.allclose(flat, torch.full_like(flat, 0.5))
    with pytest.raises(ValueError):
        _scheme(hash_encoder, temperature=-1.0)


def test_soft_contexts_generate_and_detect(hash_encoder):
    # The watermarker scores each candidate on the context the previous sentence gives, and
    # the detector finds the same scores and an exact z over the soft context sums.
    scheme = _scheme(hash_encoder, temperature=0.05)
    prompt = "A prompt sentence."
    pool = _pool(60)
    rounds = [pool[i : i + 6] for i in range(0, 48, 6)]
    wm = _watermarker(
        scheme,
        ScriptedEngine(rounds),
        max_candidates=6,
        candidate_batch=6,
        adaptive_batch=False,
        max_new_tokens=40,
        threshold=None,
    )
    res = wm.generate([prompt])[0]
    assert res.num_sentences >= 5
    result = Detector(scheme, scan=False).detect(res.text, prompt=prompt)
    assert result.status == "ok" and result.watermarked
    kept = [r.score for r in res.sentences]
    assert [s for s in result.scores if s is not None] == pytest.approx(kept, abs=1e-5)
    emb = scheme.embed([prompt, *result.sentences])
    weights = build_mark(scheme).context_weights(emb)[:-1].numpy()
    vectors = build_mark(scheme).vectors(emb[1:]).double().numpy()
    z = direction_z(vectors, weights, build_mark(scheme).directions.double().numpy())
    assert result.z_score == pytest.approx(z, rel=1e-6)
    # The same text under hard contexts is scored on other directions.
    hard = Detector(_scheme(hash_encoder), scan=False).detect(res.text, prompt=prompt)
    assert hard.z_score != pytest.approx(result.z_score, rel=1e-3)


def test_text_gains_rank_candidates_by_what_they_add_to_the_text():
    from ksemstamp.marks.direction import text_gains

    kept = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0, 0.0]]), dim=-1)
    context = torch.tensor([[1.0]], dtype=torch.float64)
    evidence = torch.outer(context[0], kept[0].double())
    # A restatement of the kept sentence (score 2.4) and a new sentence (score 1.5).
    vectors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    scores = torch.tensor([2.4, 1.5])
    contexts = context.expand(2, 1)
    gains = text_gains(scores, contexts, vectors, [(evidence, 2.5)] * 2)
    assert gains.tolist() == pytest.approx([2.4 - 2.5, 1.5])
    # ... which is the one that raises the text's z: (2.5 + 2.4) / 2 < (2.5 + 1.5) / sqrt(2).
    assert gains.argmax() == 1
    # Nothing kept yet, or no evidence so far: the score itself.
    assert text_gains(scores, contexts, vectors, [(None, 0.0)] * 2).tolist() == pytest.approx(
        scores.tolist()
    )


def test_text_gains_pick_the_candidate_with_the_largest_text_z():
    from ksemstamp.marks.direction import text_gains

    rng = torch.Generator().manual_seed(0)
    agree, trials = 0, 200
    for _ in range(trials):
        k, d, kept, cands = 4, 16, 6, 8
        vec = torch.nn.functional.normalize(
            torch.randn(kept + cands, d, generator=rng) + 0.5, dim=-1
        )
        ctx = torch.nn.functional.normalize(torch.rand(kept + cands, k, generator=rng) ** 4, dim=-1)
        directions = torch.randn(k, d, generator=rng)
        scores = ((ctx.float() @ directions) * vec).sum(-1)
        evidence = (ctx[:kept, :, None].double() * vec[:kept, None, :].double()).sum(0)
        total = float(scores[:kept].sum())
        gains = text_gains(scores[kept:], ctx[kept:], vec[kept:], [(evidence, total)] * cands)
        z_new = []
        for c in range(kept, kept + cands):
            e = evidence + torch.outer(ctx[c].double(), vec[c].double())
            z_new.append((total + float(scores[c])) / float((e**2).sum().sqrt()))
        agree += int(gains.argmax()) == int(torch.tensor(z_new).argmax())
    # A first-order rule: it picks the largest z in nearly every round.
    assert agree / trials > 0.9


# ---------------------------------------------------------------------- far past any threshold


class _AlignedEncoder:
    """Sentence ``i`` (``"Point number i is made."``) embeds as the key's direction ``i``."""

    def __init__(self, directions: torch.Tensor) -> None:
        self.rows = torch.nn.functional.normalize(directions.float(), dim=-1)

    def get_embedding_dimension(self) -> int:
        return int(self.rows.shape[1])

    def encode(self, sentences, batch_size=32, convert_to_tensor=True, show_progress_bar=False):
        return torch.stack([self.rows[int(s.split()[2])] for s in sentences])


def test_a_text_far_past_any_threshold_gets_a_positive_p_value_everywhere():
    from ksemstamp.cli.console import format_detection
    from ksemstamp.serve.present import detection_view

    key, regions, dim = "far-key", 16, 256
    directions = keyed_directions(regions, dim, key)
    encoder = _AlignedEncoder(directions)
    mark = DirectionSettings(context="own", context_temperature=0.0)
    scheme = WatermarkScheme(
        encoder, KMeansPartition(encoder.rows, margin=0.0), key, get_splitter(), mark
    )
    text = " ".join(f"Point number {i} is made." for i in range(12))
    for scan in (False, True):
        result = Detector(scheme, scan=scan).detect(text)
        assert result.z_score > 40 and normal_sf(result.z_score) == 0.0  # underflows
        assert 0 < result.p_value <= 1e-300 and result.watermarked
        assert result.log10_p_value < -300 and math.isfinite(result.log10_p_value)
        record = result.to_record()
        assert record["p_value"] > 0 and record["log10_p_value"] == result.log10_p_value
        shown = format_detection(result, Detector(scheme).mark, "sentence")
        assert f"p = < 1e-300 (log10 p = {result.log10_p_value:.1f})" in shown
        view = detection_view(result, text, Detector(scheme).mark, alpha=0.01)
        assert view["p_value"] > 0 and view["log10_p_value"] == result.log10_p_value
        assert "probability 0 " not in view["explanation"]


def test_p_values_between_the_float_tails_and_the_floor_are_exact():
    """A text at z 8-40 is reported with its own p-value, not the 1e-300 floor: the weighted
    test's normal tail is computed through its logarithm (torch's ``ndtr(-z)`` is 0 from z = 8.3
    in float64), so the combined p-value stays 4 times the smallest of the four tests."""
    key, regions, dim = "far-key", 16, 256
    directions = keyed_directions(regions, dim, key)
    noise = torch.nn.functional.normalize(
        torch.randn(40, dim, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    encoder = _AlignedEncoder(torch.cat([directions, noise]))
    mark = DirectionSettings(context="own", context_temperature=0.0)
    scheme = WatermarkScheme(
        encoder, KMeansPartition(encoder.rows[:regions], margin=0.0), key, get_splitter(), mark
    )
    aligned = [f"Point number {i} is made." for i in range(4)]
    others = [f"Point number {regions + i} is made." for i in range(14)]
    result = Detector(scheme, scan=True).detect(" ".join(aligned + others))
    details = result.details
    assert 8.3 < result.z_score < 37
    assert result.log10_p_value is None and 1e-300 < result.p_value < 1e-10
    weighted = details["weighted_p_value"]
    assert weighted > 1e-300
    text_p = details["text_p_value"]
    assert text_p == pytest.approx(normal_sf(result.z_score), rel=1e-9)
    smallest = min(text_p, details["span_p_value"], details["mixture_p_value"], weighted)
    assert result.p_value == pytest.approx(len(SCAN_TESTS) * smallest, rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_normal_tail_never_underflows_before_float64_does(dtype):
    from ksemstamp.detection.scan import normal_tail

    z = torch.linspace(0, 37, 149, dtype=dtype)
    got = normal_tail(z)
    assert got.dtype == torch.float64
    for value, tail in zip(z.tolist(), got.tolist(), strict=True):
        assert tail == pytest.approx(0.5 * math.erfc(value / math.sqrt(2.0)), rel=1e-12)


def test_the_region_mark_reports_a_paper_p_value_past_the_normal_tail_s_underflow():
    """600 units, every transition valid: the paper's z is about 42, where ``normal_sf`` is 0;
    the p-value is the floor with its exact log10, as for every mark."""
    from ksemstamp.detection.stats import log_normal_sf

    regions, dim = 8, 32
    rows = torch.nn.functional.normalize(
        torch.randn(regions, dim, generator=torch.Generator().manual_seed(3)), dim=-1
    )
    encoder = _AlignedEncoder(rows)
    scheme = WatermarkScheme(
        encoder, KMeansPartition(rows, margin=0.0), "far-key", get_splitter(), RegionSettings()
    )
    table = np.asarray(build_mark(scheme).host_table, dtype=bool)
    walk = [0]
    for _ in range(600):
        walk.append(int(np.flatnonzero(table[walk[-1]])[len(walk) % table[0].sum()]))
    text = " ".join(f"Point number {r} is made {n} times." for n, r in enumerate(walk))
    result = Detector(scheme, statistic="paper", scan=False).detect(text)
    assert result.num_scored == 600 and result.num_valid == 600
    assert result.z_score > 38.5 and normal_sf(result.z_score) == 0.0
    assert result.p_value == 1e-300 and result.watermarked
    assert result.log10_p_value == pytest.approx(log_normal_sf(result.z_score) / math.log(10))
