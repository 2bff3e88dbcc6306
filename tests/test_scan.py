"""Windowed detection: the null law it samples is the scores' law over keys, and its p-values
are calibrated under it."""

import numpy as np
import pytest

from ksemstamp.detection.scan import combined_test, null_law, scan
from ksemstamp.detection.spans import (
    ALL_SPANS_UP_TO,
    GLS_SHRINKAGE,
    gls_weights,
    score_covariance,
    span_spread,
    spans,
)
from ksemstamp.detection.stats import normal_sf
from ksemstamp.settings.marks import SCAN_TESTS


def _text(rng, units=12, k=6, dim=16):
    weights = np.abs(rng.standard_normal((units, k))) ** 4
    weights /= np.linalg.norm(weights, axis=1, keepdims=True)
    vectors = rng.standard_normal((units, dim)) + 0.8  # sentences on one topic point alike
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return weights, vectors


def _scores(weights, vectors, directions):
    """Scores under keys ``directions`` ``(R, K, D)``: ``s_t = sum_c a_tc n_c . u_t``."""
    return np.einsum("tk,rkd,td->rt", weights, directions, vectors)


def test_covariance_is_the_scores_law_over_random_keys():
    rng = np.random.default_rng(0)
    weights, vectors = _text(rng)
    keys = rng.standard_normal((40_000, weights.shape[1], vectors.shape[1]))
    empirical = np.cov(_scores(weights, vectors, keys), rowvar=False)
    # 40,000 draws: each entry's sampling error is about sqrt(2 / 40,000) ~ 0.007
    assert np.abs(empirical - score_covariance(weights, vectors).numpy()).max() < 0.05


def test_spans():
    small = spans(6, min_units=3)
    assert {tuple(s) for s in small} == {(i, j) for i in range(6) for j in range(i + 3, 7)}
    assert len(spans(2, min_units=3)) == 0
    big = spans(500, min_units=3)
    assert (0, 500) in {tuple(s) for s in big}
    assert (big[:, 1] - big[:, 0] >= 3).all() and (big[:, 1] <= 500).all()
    assert len(big) < 500 * 40  # a grid, not all ~125,000 spans
    assert len(spans(ALL_SPANS_UP_TO + 1)) < len(spans(ALL_SPANS_UP_TO))


def test_spread_is_each_span_sums_standard_deviation():
    rng = np.random.default_rng(1)
    cov = score_covariance(*_text(rng, units=9))
    windows = spans(9, 2)
    direct = [np.sqrt(cov[a:b, a:b].sum()) for a, b in windows]
    assert np.allclose(span_spread(cov, windows), direct)


def _whole_text_p(scores, cov):
    z = np.atleast_1d(np.asarray(scores).sum(axis=-1) / np.sqrt(cov.sum()))
    return np.array([normal_sf(float(v)) for v in z])


@pytest.mark.parametrize("shrinkage", [GLS_SHRINKAGE, None])
def test_p_values_are_calibrated_for_text_that_does_not_depend_on_the_key(shrinkage):
    rng = np.random.default_rng(2)
    weights, vectors = _text(rng, units=10)
    cov = score_covariance(weights, vectors)
    null = null_law(cov, b"text", draws=1999, shrinkage=shrinkage)
    keys = rng.standard_normal((3000, weights.shape[1], vectors.shape[1]))
    scores = _scores(weights, vectors, keys)
    p_text = _whole_text_p(scores, cov)
    results = [combined_test(s, cov, pt, null=null) for s, pt in zip(scores, p_text, strict=True)]
    # Each test alone, and the combined p-value, flag at most alpha of the keys.
    for p in (
        np.array([r.span.p_value for r in results]),
        np.array([r.mixture_p_value for r in results]),
        np.array([np.nan if r.weighted_p_value is None else r.weighted_p_value for r in results]),
        np.array([r.p_value for r in results]),
    ):
        if shrinkage is None and np.isnan(p).all():
            continue  # no weighted test
        for alpha in (0.01, 0.05, 0.2):
            # binomial sd over 3,000 keys at 0.05 is 0.004; the draws add a little more
            assert abs((p <= alpha).mean() - alpha) < 4 * np.sqrt(alpha / 3000) + 0.005


def test_the_combined_p_value_is_never_worse_than_bonferroni_by_much_and_often_better():
    rng = np.random.default_rng(5)
    weights, vectors = _text(rng, units=16, k=8, dim=32)
    cov = score_covariance(weights, vectors)
    null = null_law(cov, b"text")
    gains = []
    for _ in range(200):
        scores = rng.multivariate_normal(np.zeros(16), cov)
        scores[::4] += 2.0  # a quarter of the sentences marked, scattered
        p_text = float(_whole_text_p(scores, cov)[0])
        result = combined_test(scores, cov, p_text, null=null)
        tests = (p_text, result.weighted_p_value, result.span.p_value, result.mixture_p_value)
        bonferroni = min(1.0, len(SCAN_TESTS) * min(tests))
        # The combination's simulation error: a few draws' worth
        assert result.p_value <= bonferroni + 5 / (null.draws + 1)
        gains.append(bonferroni / max(result.p_value, 1e-12))
    assert np.median(gains) > 1.3


def test_the_weighted_z_counts_sentences_that_move_together_about_once():
    # two identical sentences and one unlike them: the pair weighs 4/3 of the third, not 2
    cov = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    w = gls_weights(cov)
    assert w[0] == pytest.approx(w[1]) and (w[0] + w[1]) / w[2] == pytest.approx(4 / 3)
    assert float(w @ cov @ w) == pytest.approx(1.0)  # w . s is standard normal under the null
    # independent sentences: the plain sum
    assert np.allclose(gls_weights(np.eye(5)), 1 / np.sqrt(5))


def test_the_weighted_z_finds_a_passage_among_human_sentences_on_one_topic():
    rng = np.random.default_rng(7)
    topic = rng.standard_normal(32)
    human = rng.standard_normal((12, 32)) + 2.5 * topic  # sentences on one subject
    marked = rng.standard_normal((4, 32))  # kept apart by generation
    vectors = np.concatenate([human[:6], marked, human[6:]])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cov = score_covariance(np.ones((16, 1)), vectors)
    null = null_law(cov, b"text")
    wins = []
    for _ in range(200):
        scores = rng.multivariate_normal(np.zeros(16), cov)
        scores[6:10] += 1.5
        result = combined_test(scores, cov, float(_whole_text_p(scores, cov)[0]), null=null)
        wins.append(result.weighted_p_value < float(_whole_text_p(scores, cov)[0]))
    assert np.mean(wins) > 0.8


def test_a_whole_marked_text_keeps_its_small_p_value():
    rng = np.random.default_rng(6)
    weights, vectors = _text(rng, units=12, k=8, dim=32)
    cov = score_covariance(weights, vectors)
    scores = rng.multivariate_normal(np.zeros(12), cov) + 3.0
    p_text = float(_whole_text_p(scores, cov)[0])
    result = combined_test(scores, cov, p_text, b"seed")
    # Below the simulation's floor the Bonferroni bound is reported.
    smallest = min(p_text, result.weighted_p_value)
    assert p_text < 1e-6 and result.p_value == pytest.approx(
        len(SCAN_TESTS) * smallest, rel=1e-9, abs=0
    )
    # Without the weighted test (shrinkage None) the bound is over the other three.
    three = combined_test(scores, cov, p_text, b"seed", shrinkage=None)
    assert three.weighted_p_value is None and three.span == result.span
    assert three.p_value == pytest.approx(3 * p_text, rel=1e-9, abs=0)
    assert combined_test(scores[:2], cov[:2, :2], p_text, b"seed") is None


def test_a_marked_passage_in_human_text_is_found():
    rng = np.random.default_rng(3)
    weights, vectors = _text(rng, units=30, k=12, dim=32)
    cov = score_covariance(weights, vectors)
    scores = rng.multivariate_normal(np.zeros(30), cov)
    scores[10:18] += 2.0  # eight marked sentences among human ones
    result = scan(scores, cov, b"seed")
    assert (result.start, result.stop) == pytest.approx((10, 18), abs=2)
    whole = scores.sum() / np.sqrt(cov.sum())
    assert result.z > whole and result.p_value < 0.01
    assert scan(scores[:2], cov[:2, :2], b"seed") is None


def test_the_null_draws_are_seeded_by_the_plan():
    rng = np.random.default_rng(4)
    cov = score_covariance(*_text(rng))
    a, b = (null_law(cov, s, draws=99) for s in (b"one", b"one"))
    assert np.array_equal(a.span, b.span) and np.array_equal(a.mixture, b.mixture)
    assert not np.array_equal(a.span, null_law(cov, b"two", draws=99).span)
