import itertools
import math

import numpy as np
import pytest
import torch

from ksemstamp.detection.stats import (
    exact_p_value,
    normal_sf,
    null_count_pmf,
    paper_z,
    subset_sum_pmf,
    transition_matrix,
)
from ksemstamp.scheme.keyed import valid_table


def test_paper_z_by_hand():
    assert paper_z(6, 6, 0.25) == pytest.approx((6 - 1.5) / math.sqrt(0.1875 * 6))
    assert normal_sf(0.0) == pytest.approx(0.5)
    assert normal_sf(1.6448536) == pytest.approx(0.05, abs=1e-6)
    with pytest.raises(ValueError):
        paper_z(0, 0, 0.25)


@pytest.mark.parametrize(
    "values,size", [([3, 0, 1, 2, 0, 5], 2), ([1, 1, 1, 4], 3), ([0, 0, 7], 1)]
)
def test_subset_sum_pmf_matches_enumeration(values, size):
    pmf = subset_sum_pmf(np.array(values), size)
    subsets = list(itertools.combinations(range(len(values)), size))
    for s in range(len(pmf)):
        want = sum(sum(values[i] for i in sub) == s for sub in subsets) / len(subsets)
        assert pmf[s] == pytest.approx(want)


def test_exact_p_value_matches_brute_force_over_tables():
    # K = 4, gamma = 0.5: enumerate every table (6 subsets per row, 6**4 tables).
    counts = np.array([[2, 1, 0, 0], [0, 0, 3, 0], [1, 0, 0, 1], [0, 0, 0, 0]])
    observed_table = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 1, 1]], dtype=bool)
    observed = counts[observed_table].sum()
    rows = list(itertools.combinations(range(4), 2))
    hits = total = 0
    for choice in itertools.product(rows, repeat=4):
        table = np.zeros((4, 4), dtype=bool)
        for q, sub in enumerate(choice):
            table[q, list(sub)] = True
        total += 1
        hits += counts[table].sum() >= observed
    assert exact_p_value(counts, observed_table) == pytest.approx(hits / total)
    pmf = null_count_pmf(counts, 2)
    assert pmf.sum() == pytest.approx(1.0) and len(pmf) == counts.sum() + 1
    assert pmf[observed:].sum() == pytest.approx(hits / total)


def _sticky_sequences(n_texts, length, k, stay, gen):
    """Region sequences that stay in the same region with probability ``stay``."""
    out = []
    for _ in range(n_texts):
        seq = [int(torch.randint(k, (1,), generator=gen))]
        for _ in range(length - 1):
            if torch.rand(1, generator=gen).item() < stay:
                seq.append(seq[-1])
            else:
                seq.append(int(torch.randint(k, (1,), generator=gen)))
        out.append(seq)
    return out


def test_exact_test_is_calibrated_on_sticky_text_and_paper_test_is_not():
    # Human text keeps its topic: consecutive sentences share a region about half the time.
    # Under a key unrelated to the text, the exact p-value must reject at most alpha of texts;
    # the paper's normal-tail p-value rejects far more (the miscalibration it is replaced for).
    gen = torch.Generator().manual_seed(0)
    n_texts, alpha = 600, 0.05
    seqs = _sticky_sequences(n_texts, 10, 8, 0.5, gen)
    exact_hits = paper_hits = 0
    for i, seq in enumerate(seqs):
        table = valid_table(8, 0.25, f"null-key-{i}")
        scored = [False] + [True] * (len(seq) - 1)
        counts = transition_matrix(seq, scored, 8)
        valid = int(counts[table.numpy()].sum())
        exact_hits += exact_p_value(counts, table.numpy()) <= alpha
        paper_hits += normal_sf(paper_z(valid, 9, 0.25)) <= alpha
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / n_texts)
    assert exact_hits / n_texts <= bound
    assert paper_hits / n_texts > bound  # the paper's test over-rejects this text


def test_exact_p_values_of_all_valid_varied_text_are_small():
    # A watermarked text that visits many regions: every transition valid.
    table = valid_table(8, 0.25, "k")
    seq = [0]
    for _ in range(12):
        seq.append(int(torch.nonzero(table[seq[-1]])[-1]))
    scored = [False] + [True] * 12
    counts = transition_matrix(seq, scored, 8)
    assert exact_p_value(counts, table.numpy()) < 1e-3
