"""Evaluation metrics against values worked out by hand."""

import math

import numpy as np
import pytest

from ksemstamp.evaluation.metrics import (
    auroc,
    auroc_interval,
    detection_metrics,
    ngram_entropy,
    pairwise_auroc,
    roc_curve,
    semantic_entropy,
    tpr_at_fpr,
)


def test_auroc_of_a_known_ranking_with_z_scores_outside_unit_interval():
    # Positives 5, 3, -1; negatives 4, -2, -3. Pairs (pos > neg): 5 beats 3 negatives, 3 beats
    # 2, -1 beats 2: 7 of 9.
    scores = [5.0, 3.0, -1.0, 4.0, -2.0, -3.0]
    labels = [1, 1, 1, 0, 0, 0]
    assert auroc(scores, labels) == pytest.approx(7 / 9)


def test_auroc_counts_a_tie_as_one_half():
    assert auroc([1.0, 1.0], [1, 0]) == pytest.approx(0.5)
    assert auroc([2.0, 1.0, 1.0], [1, 1, 0]) == pytest.approx(0.75)


def test_no_sigmoid_is_applied_to_large_scores():
    # Through a sigmoid both scores would round to 1.0 and tie (AUROC 0.5, checked by hand).
    assert auroc([40.0, 38.0], [1, 0]) == pytest.approx(1.0)


def test_pairwise_form_matches_torchmetrics_with_ties():
    rng = np.random.default_rng(3)
    scores = rng.integers(-3, 4, size=60).astype(float).tolist()  # many ties
    labels = [1] * 25 + [0] * 35
    assert pairwise_auroc(scores, labels).shape == (25, 35)
    assert pairwise_auroc(scores, labels).mean() == pytest.approx(auroc(scores, labels))


def test_auroc_interval_brackets_the_truth_and_narrows_with_more_texts():
    # Positives N(1, 1), negatives N(0, 1): the true AUROC is Phi(1 / sqrt 2) = 0.760.
    true_auc = 0.5 * (1 + math.erf(0.5))
    rng = np.random.default_rng(0)
    widths = []
    for n in (40, 400):
        scores = np.concatenate([rng.normal(1, 1, n), rng.normal(0, 1, n)]).tolist()
        labels = [1] * n + [0] * n
        low, high = auroc_interval(scores, labels, resamples=1000)
        assert low <= auroc(scores, labels) <= high
        assert low <= true_auc <= high
        widths.append(high - low)
    # The standard error falls like 1 / sqrt(n): ten times the texts, about a third the width.
    assert 0.2 < widths[1] / widths[0] < 0.5
    # Perfect separation leaves nothing to resample.
    assert auroc_interval([3.0, 2.0, 1.0, 0.0], [1, 1, 0, 0]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="level"):
        auroc_interval([1.0, 0.0], [1, 0], level=1.0)


def test_tpr_at_fpr_on_a_constructed_case():
    # 20 negatives: one scores 10 (above every positive), one 2.5; the rest below 0.
    # 10 positives: 9 .. 0 step 1.
    negatives = [10.0, 2.5] + [-1.0 - i for i in range(18)]
    positives = [float(i) for i in range(9, -1, -1)]
    scores, labels = positives + negatives, [1] * 10 + [0] * 20
    fpr, tpr, thresholds = roc_curve(scores, labels)
    assert np.all(np.diff(thresholds[1:]) < 0)  # descending, one point per distinct score
    # FPR <= 1%: only "nothing flagged" qualifies (one negative already gives 5%).
    assert tpr_at_fpr(fpr, tpr, 0.01) == 0.0
    # FPR <= 5%: the highest negative may be flagged, not the second: threshold 3 -> 7 of 10.
    assert tpr_at_fpr(fpr, tpr, 0.05) == pytest.approx(0.7)
    # FPR <= 10%: both flagged, all positives >= 0 above the rest of the negatives.
    assert tpr_at_fpr(fpr, tpr, 0.10) == pytest.approx(1.0)
    m = detection_metrics(scores, labels)
    assert m["tpr_at_fpr_5"] == pytest.approx(0.7) and m["positives"] == 10


def test_ent3_of_a_known_text():
    # "a b c a b c": trigrams abc, bca, cab, abc -> counts 2, 1, 1 of 4.
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert ngram_entropy(["a b c a b c"], 3) == pytest.approx(expected)
    # Pooled over texts; a text shorter than 3 tokens adds nothing.
    assert ngram_entropy(["x y z", "a b"], 3) == pytest.approx(0.0)
    assert ngram_entropy(["x y z", "u v w"], 3) == pytest.approx(math.log(2))


def test_semantic_entropy_of_separated_clusters():
    rng = np.random.default_rng(0)
    centers = np.eye(4) * 100
    points = np.concatenate([c + rng.normal(size=(5, 4)) for c in centers])
    entropy, k = semantic_entropy(points, k=4)
    assert k == 4 and entropy == pytest.approx(math.log(4))
    # at most one cluster per five texts: 20 texts never get 20 singleton clusters (log 20)
    entropy, k = semantic_entropy(points, k=50)
    assert k == 4 and entropy == pytest.approx(math.log(4))
    assert semantic_entropy(points[:9], k=50) == (0.0, 1)
    assert semantic_entropy(points[:2], k=50) == (0.0, 1)
