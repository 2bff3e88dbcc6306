"""Windowed detection: the span of a text that carries the mark, with an exact p-value.

A watermarked passage pasted into human text is diluted in the whole text's z: three quarters
of human sentences halve it. The scan looks at spans of consecutive scored sentences and takes
the largest span z. Under the direction mark every sentence's score is linear in the key's
Gaussian directions, ``s_t = sum_c a_tc n_c . u_t``, so over random keys the scores of a text
that does not depend on the key are jointly normal with mean 0 and the key-free covariance

    cov[t, t'] = (a_t . a_t') (u_t . u_t')

(``a_t`` the sentence's context weights, ``u_t`` its vector). The largest span z is then a
function of a normal vector of known law, and its null law is sampled from that law: no
assumption about the text enters. The p-value ``(1 + #{draws >= observed}) / (draws + 1)`` is
valid for any number of draws (the draws come from a generator seeded by the key-free plan,
not by the scores); its smallest value is ``1 / (draws + 1)``.

The detector combines the scan with the whole-text test by Bonferroni: ``p = min(1, 2 min(p_text,
p_scan))``. A whole watermarked text keeps its exact, arbitrarily small p (doubled); a
passage in human text gets the scan's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

MIN_UNITS = 3
"""Shortest span scanned, in scored sentences: shorter spans add many tests and little power
(a pasted passage worth detecting holds several sentences)."""
DRAWS = 4999
"""Null draws of the largest span z (the smallest p-value the scan can give is 1 / 5000)."""
MIN_DRAWS = 999
"""Long texts get fewer draws, so a draw budget (``DRAW_BUDGET``) bounds the time, never fewer
than this (a p-value floor of 1 / 1000, still far below alpha = 1% after Bonferroni)."""
DRAW_BUDGET = 5e8
"""Most multiply-adds spent on null draws (``draws * T^2``): about a second on one core."""
ALL_SPANS_UP_TO = 48
"""Texts with at most this many scored sentences scan every span; longer ones a grid of spans
(lengths growing by a factor 1.25, starts every quarter of a length), O(T log T) of them."""


@dataclass(frozen=True)
class ScanResult:
    """The best span and the scan's p-value.

    Attributes:
        z: the largest span z.
        start, stop: the span, as indices into the scored sentences (``stop`` exclusive).
        p_value: its p-value under the null law of the largest span z.
    """

    z: float
    start: int
    stop: int
    p_value: float


def score_covariance(weights: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``(T, T)`` null covariance of the scores of sentences with context ``weights`` ``(T, K)``
    and ``vectors`` ``(T, D)`` over random keys (see the module docstring)."""
    weights = np.asarray(weights, dtype=np.float64)
    vectors = np.asarray(vectors, dtype=np.float64)
    return (weights @ weights.T) * (vectors @ vectors.T)


def spans(count: int, min_units: int = MIN_UNITS) -> np.ndarray:
    """``(S, 2)`` spans ``[start, stop)`` of at least ``min_units`` of ``count`` units (the
    whole text included): all of them up to ``ALL_SPANS_UP_TO`` units, else a grid."""
    if count < min_units:
        return np.zeros((0, 2), dtype=np.int64)
    out: set[tuple[int, int]] = {(0, count)}
    if count <= ALL_SPANS_UP_TO:
        out |= {(i, j) for i in range(count) for j in range(i + min_units, count + 1)}
    else:
        length = float(min_units)
        while round(length) < count:
            n = int(round(length))
            step = max(1, n // 4)
            out |= {(i, i + n) for i in range(0, count - n + 1, step)}
            out.add((count - n, count))
            length *= 1.25
    return np.array(sorted(out), dtype=np.int64)


def _span_z(samples: np.ndarray, windows: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """``(..., S)`` span z of score ``samples`` ``(..., T)``."""
    cumulative = np.concatenate(
        [np.zeros(samples.shape[:-1] + (1,)), np.cumsum(samples, axis=-1)], axis=-1
    )
    return (cumulative[..., windows[:, 1]] - cumulative[..., windows[:, 0]]) / spread


def null_maxima(cov: np.ndarray, windows: np.ndarray, draws: int, seed: bytes) -> np.ndarray:
    """``(draws,)`` largest span z of scores drawn from ``N(0, cov)``."""
    values, vectors = np.linalg.eigh(cov)
    factor = vectors * np.sqrt(np.clip(values, 0.0, None))
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed).digest()[:8], "little"))
    samples = rng.standard_normal((draws, len(cov))) @ factor.T
    return _span_z(samples, windows, _spread(cov, windows)).max(axis=1)


def null_law(
    cov: np.ndarray, seed: bytes, min_units: int = MIN_UNITS, draws: int = DRAWS
) -> np.ndarray | None:
    """The null draws of the largest span z for scores of covariance ``cov`` (``draws``, fewer
    for long texts under ``DRAW_BUDGET``), or ``None`` when there is no span to scan."""
    windows = spans(len(cov), min_units)
    if not len(windows):
        return None
    draws = max(MIN_DRAWS, min(draws, int(DRAW_BUDGET / len(cov) ** 2)))
    return null_maxima(cov, windows, draws, seed)


def scan_seed(sentences: list[str]) -> bytes:
    """The key-free bytes that seed a text's null draws: its scored sentences."""
    return "\n".join(sentences).encode("utf-8", "surrogatepass")


def _spread(cov: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Standard deviation of each span's sum of scores."""
    cumulative = np.zeros((len(cov) + 1, len(cov) + 1))
    cumulative[1:, 1:] = cov.cumsum(axis=0).cumsum(axis=1)
    a, b = windows[:, 0], windows[:, 1]
    var = cumulative[b, b] - cumulative[a, b] - cumulative[b, a] + cumulative[a, a]
    return np.sqrt(np.clip(var, 1e-12, None))


def scan(
    scores: np.ndarray,
    cov: np.ndarray,
    seed: bytes,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    null: np.ndarray | None = None,
) -> ScanResult | None:
    """The best span of ``scores`` ``(T,)`` and its p-value under ``N(0, cov)``, or ``None``
    when the text has fewer than ``min_units`` scored sentences.

    ``seed`` (bytes from the key-free plan) seeds the null draws; ``null`` passes the
    ``null_maxima`` of this text when they are already known (calibration scores one text under
    many keys, and the null law does not depend on the key).
    """
    scores = np.asarray(scores, dtype=np.float64)
    windows = spans(len(scores), min_units)
    if not len(windows):
        return None
    z = _span_z(scores, windows, _spread(cov, windows))
    best = int(np.argmax(z))
    if null is None:
        null = null_law(cov, seed, min_units, draws)
    p = (1 + int((null >= z[best] - 1e-12).sum())) / (len(null) + 1)
    return ScanResult(float(z[best]), int(windows[best, 0]), int(windows[best, 1]), p)


def combine(p_text: float, p_scan: float | None) -> float:
    """Bonferroni over the whole-text test and the scan."""
    if p_scan is None:
        return p_text
    return min(1.0, 2.0 * min(p_text, p_scan))
