"""The measurement behind docs/paper.md's valid-table row (``research.paper.valid_table``), on
hand-built transition counts (no models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ksemstamp.calibration.scoring import scored_from_counts
from ksemstamp.keys import valid_table
from research.paper.valid_table import cpu_seeded_table, markdown, table_figures


def test_cpu_seeded_table_is_the_reference_seeding_on_a_cpu_generator():
    table = cpu_seeded_table(8, 0.25)
    for q in range(8):
        gen = torch.Generator().manual_seed(q * 15485863)
        assert set(np.flatnonzero(table[q])) == set(torch.randperm(8, generator=gen)[:2].tolist())
    assert table.sum(axis=1).tolist() == [2] * 8
    assert not np.array_equal(table, valid_table(8, 0.25, None, "paper").numpy())


def test_valid_rate_counts_transitions_into_valid_regions():
    k = 4
    table = np.zeros((k, k), dtype=bool)
    table[np.arange(k), (np.arange(k) + 1) % k] = True  # one valid region per row, none self
    counts = np.zeros((3, k, k), dtype=np.int64)
    counts[0, 0, 1] = 3  # valid
    counts[0, 0, 0] = 1  # stays: invalid
    counts[1, 2, 3] = 2  # valid
    counts[2, 1, 1] = 4  # stays: invalid
    scored = scored_from_counts(counts, 1, "news")
    labels = ["news", "news", "tweets"]
    f = table_figures(table, counts, labels, scored, gamma=0.25)
    assert f["self_valid"] == 0
    assert f["valid_rate"] == pytest.approx(5 / 10)
    assert f["valid_rate_by_source"] == {"news": pytest.approx(5 / 6), "tweets": 0.0}
    assert set(f["flagged"]) == {"paper", "exact"}


def test_markdown_names_each_table():
    f = {
        "self_valid": 1,
        "valid_rate": 0.3,
        "valid_rate_by_source": {"news": 0.3},
        "flagged": {"paper": 0.05, "exact": 0.01},
    }
    report = {
        "config": "configs/ksemstamp-paper.yaml",
        "num_regions": 8,
        "gamma": 0.25,
        "texts": 2,
        "texts_by_source": {"news": 2},
        "scored_transitions": 10,
        "human_same_region_share": 0.5,
        "command": "python -m research.paper.valid_table",
        "tables": {
            "paper": {"rows": [[5, 2]], **f},
            "cpu_seeded": {"rows": [[1, 3]], **f},
            "keyed": {
                "keys": 3,
                "self_valid_mean": 2.0,
                "valid_rate_mean": 0.25,
                "valid_rate_range": [0.2, 0.3],
                "flagged_mean": {"paper": 0.02, "exact": 0.01},
            },
        },
    }
    text = markdown(report)
    assert (
        "| `valid_mode: paper` (the reference code's CUDA draw) | 1 of 8 | 30.0% (news 30.0%)"
        in text
    )
    assert "[5, 2]" in text and "25.0% (keys: 20.0% to 30.0%)" in text
