"""The scan's p-values are pinned: batched, on any device, they are the recorded ones.

``tests/golden/scan.json`` holds the combined test's outputs for 42 random texts (2 to 90
scored units, the grid of spans beyond 48 included; unmarked, partly and strongly marked),
recorded with the per-text implementation the detector used before detection was batched.
The texts are remade here from a fixed seed. Any change to the statistics' arithmetic that
moves a p-value by more than rounding fails here; a change meant to alter them re-records with
``KSEMSTAMP_RECORD_GOLDEN=1`` and says why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ksemstamp.detection.scan import combined_test
from ksemstamp.detection.spans import score_covariance
from ksemstamp.detection.stats import normal_sf
from tests.test_golden import golden_text

GOLDEN = Path(__file__).parent / "golden" / "scan.json"
RECORD = os.environ.get("KSEMSTAMP_RECORD_GOLDEN") == "1"
UNITS = (3, 4, 5, 8, 12, 15, 18, 25, 40, 48, 49, 60, 90, 2)
MARKS = (0.0, 1.0, 3.0)
FIELDS = ("p_value", "span_z", "span_p_value", "mixture", "mixture_p_value")


def texts():
    """``(scores, cov, p_text, seed)`` of every pinned text, remade from one seed."""
    rng = np.random.default_rng(20261128)
    out = []
    for i, units in enumerate(UNITS):
        for marked in MARKS:
            weights = np.abs(rng.standard_normal((units, 6))) ** 4
            weights /= np.linalg.norm(weights, axis=1, keepdims=True)
            vectors = rng.standard_normal((units, 16)) + 0.8
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            key = rng.standard_normal((6, 16))
            scores = np.einsum("tk,kd,td->t", weights, key, vectors)
            scores[units // 3 : units // 3 + max(1, units // 4)] += marked
            cov = score_covariance(weights, vectors)
            p_text = normal_sf(float(scores.sum() / np.sqrt(np.asarray(cov).sum())))
            out.append((scores, cov, p_text, f"text {i} {marked}".encode()))
    return out


def _record(result) -> dict | None:
    if result is None:
        return None
    return {
        "p_value": result.p_value,
        "span": [result.span.start, result.span.stop],
        "span_z": result.span.z,
        "span_p_value": result.span.p_value,
        "mixture": result.mixture,
        "mixture_p_value": result.mixture_p_value,
        "weighted_z": result.weighted_z,
        "weighted_p_value": result.weighted_p_value,
    }


def _check(got: dict | None, want: dict | None) -> None:
    assert (got is None) == (want is None)
    if want is None:
        return
    assert got["span"] == want["span"]
    for name in (*FIELDS, "weighted_z", "weighted_p_value"):
        assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12), name


def test_one_text_at_a_time_gives_the_recorded_p_values():
    got = [_record(combined_test(s, c, p, seed)) for s, c, p, seed in texts()]
    if RECORD:
        GOLDEN.write_text(golden_text(got))
    want = json.loads(GOLDEN.read_text())
    assert len(got) == len(want) == len(UNITS) * len(MARKS)
    for g, w in zip(got, want, strict=True):
        _check(g, w)
