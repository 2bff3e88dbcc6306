"""Detection beyond the whole-text z: the marked span, the marked share, and one exact p-value.

A watermarked passage pasted into human text is diluted in the whole text's z: three quarters
of human sentences halve it. Three more statistics look for it:

* the *span* scan: over spans of consecutive scored sentences, the largest span z (a marked
  passage in one piece);
* the *mixture* statistic: the log-likelihood ratio of the sentences' scores under a mixture in
  which a share ``MIXTURE_SHARE`` of sentences are marked with mean score ``MIXTURE_MEAN``,
  ``sum_t log(1 - pi + pi exp(mu z_t - mu^2 / 2))`` (marked sentences scattered among human
  ones, whatever their order);
* the *weighted* whole-text z: the scores weighted by ``w = (C + lam mean(diag C) I)^-1 1``
  (generalised least squares with shrinkage ``lam = GLS_SHRINKAGE``, ``C`` the null covariance
  below), which counts sentences that move together under the null (one topic, one region)
  about once instead of each in full. The human sentences around a pasted marked passage are
  such sentences; the marked ones, which generation keeps apart, are not. The weights depend
  on the text alone, so ``w . s / sqrt(w' C w)`` is standard normal over keys like the plain z.

Under the direction mark every sentence's score is linear in the key's Gaussian directions,
``s_t = sum_c a_tc n_c . u_t``, so over random keys the scores of a text that does not depend
on the key are jointly normal with mean 0 and the key-free covariance

    cov[t, t'] = (a_t . a_t') (u_t . u_t')

(``a_t`` the sentence's context weights, ``u_t`` its vector). Every statistic here is a function
of that normal vector, so its null law is sampled from it (``null_law``): no assumption about
the text enters. The draws come from a generator seeded by the key-free plan, not by the scores.

One p-value combines the four tests (``combined_test``): the smallest of the whole text's and
the weighted whole text's exact p, the span's and the mixture's p (each the share of draws at
least as extreme), referred to the law of that smallest p over the same draws. The tests look at
the same scores, so this costs far less than Bonferroni over four tests. The p-value
``(1 + #{draws <= observed}) / (draws + 1)`` is exact for any number of draws; below its floor
``1 / (draws + 1)`` the Bonferroni bound ``4 min(p)`` is reported instead when it is smaller
(still exact: that branch is only taken when the simulated p-value already sits at its floor),
so a whole watermarked text keeps its arbitrarily small p.
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
than this (a p-value floor of 1 / 1000, still far below alpha = 1%)."""
DRAW_BUDGET = 5e8
"""Most multiply-adds spent on null draws (``draws * T^2``): about a second on one core."""
MIXTURE_SHARE = 0.3
"""Share of marked sentences the mixture statistic is tuned for (a text three quarters human has
a quarter; one half human a half)."""
MIXTURE_MEAN = 1.5
"""Mean score of a marked sentence the mixture statistic is tuned for: the kept sentence's score
after a paraphrase, between its clean value (about 2) and one half of it. Simulated over
interleavings of 50% and 75% human sentences and scores of 1.2 to 2.0, this pair lost at most a
few points of power against the best pair for each case."""
GLS_SHRINKAGE = 1.0
"""Shrinkage of the weighted whole-text test, in units of the mean null variance of a sentence:
0 is full generalised least squares (two sentences that always move together weigh as one), a
large value the plain sum. At 1, two identical sentences weigh together 1.3 times one sentence
unlike them. Measured on the robust run's texts under the base encoder
(``research.robust.weights``, the whole-text test alone): 1 kept the paraphrase where it was
and took the text three quarters human from 0.54 to 0.64 at 1%; 0.3 took it to 0.68, and every
value of 1 or less lost one of the 12 texts paraphrased twice, which the combination keeps."""
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


@dataclass(frozen=True)
class NullLaw:
    """Draws of each statistic over random keys for one text (key-free; ``null_law``).

    Attributes:
        text: ``(B,)`` whole-text z of each draw.
        span: ``(B,)`` largest span z of each draw.
        mixture: ``(B,)`` mixture statistic of each draw.
        weighted: ``(B,)`` weighted whole-text z of each draw (``None`` without that test).
        weights: ``(T,)`` the text's weights of that z (``gls_weights``), scaled so that it is
            ``weights . s`` (``None`` without that test).
        smallest: ``(B,)`` each draw's smallest p over the tests (``combined_test``).
    """

    text: np.ndarray
    span: np.ndarray
    mixture: np.ndarray
    weighted: np.ndarray | None
    weights: np.ndarray | None
    smallest: np.ndarray

    @property
    def draws(self) -> int:
        return len(self.text)


def mixture_statistic(samples: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """``(...,)`` the mixture log-likelihood ratio of score ``samples`` ``(..., T)`` with null
    standard deviations ``spread`` ``(T,)`` (see the module docstring)."""
    z = samples / spread
    mu, share = MIXTURE_MEAN, MIXTURE_SHARE
    return np.logaddexp(np.log1p(-share), np.log(share) + mu * z - mu * mu / 2).sum(axis=-1)


def gls_weights(cov: np.ndarray, shrinkage: float = GLS_SHRINKAGE) -> np.ndarray:
    """``(T,)`` weights of the weighted whole-text z, ``(C + shrinkage mean(diag C) I)^-1 1``,
    scaled so that ``weights . s`` is standard normal under scores of covariance ``cov``."""
    n = len(cov)
    ridge = shrinkage * max(float(np.mean(np.diag(cov))), 1e-12)
    w = np.linalg.solve(cov + ridge * np.eye(n), np.ones(n))
    return w / np.sqrt(max(float(w @ cov @ w), 1e-24))


def _tail_share(values: np.ndarray, reference: np.ndarray, drawn: bool = False) -> np.ndarray:
    """The p-value of each of ``values`` against the null draws ``reference``:
    ``(1 + #{reference >= v}) / (len(reference) + 1)`` for an observed value, and for a value
    that is itself one of the draws (``drawn``) ``#{reference >= v} / (len(reference) + 1)``,
    itself counted once in place of the observed text (which may be above or below it: counting
    it never makes a draw's p-value larger than the observed's would be, so the combined
    p-value errs on the safe side by at most one draw)."""
    ordered = np.sort(reference)
    above = len(ordered) - np.searchsorted(ordered, np.asarray(values) - 1e-12, side="left")
    return ((0.0 if drawn else 1.0) + above) / (len(ordered) + 1.0)


def _normal_tail(z: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return ndtr(-np.asarray(z, dtype=np.float64))


def null_law(
    cov: np.ndarray,
    seed: bytes,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    shrinkage: float | None = GLS_SHRINKAGE,
) -> NullLaw | None:
    """The null draws of every statistic for scores of covariance ``cov`` (``draws``, fewer
    for long texts under ``DRAW_BUDGET``), or ``None`` when there is no span to scan.
    ``shrinkage``: the weighted test's (``gls_weights``); ``None`` leaves that test out (the
    detector before it had one, for comparisons)."""
    windows = spans(len(cov), min_units)
    if not len(windows):
        return None
    draws = max(MIN_DRAWS, min(draws, int(DRAW_BUDGET / len(cov) ** 2)))
    values, vectors = np.linalg.eigh(cov)
    factor = vectors * np.sqrt(np.clip(values, 0.0, None))
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed).digest()[:8], "little"))
    samples = rng.standard_normal((draws, len(cov))) @ factor.T
    text = samples.sum(axis=1) / np.sqrt(max(float(cov.sum()), 1e-12))
    span = _span_z(samples, windows, _spread(cov, windows)).max(axis=1)
    mixture = mixture_statistic(samples, _unit_spread(cov))
    tests = [_normal_tail(text), _tail_share(span, span, True), _tail_share(mixture, mixture, True)]
    weights = weighted = None
    if shrinkage is not None:
        weights = gls_weights(cov, shrinkage)
        weighted = samples @ weights
        tests.append(_normal_tail(weighted))
    return NullLaw(text, span, mixture, weighted, weights, np.minimum.reduce(tests))


def _unit_spread(cov: np.ndarray) -> np.ndarray:
    return np.sqrt(np.clip(np.diag(cov), 1e-12, None))


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
    null: NullLaw | None = None,
) -> ScanResult | None:
    """The best span of ``scores`` ``(T,)`` and its p-value under ``N(0, cov)``, or ``None``
    when the text has fewer than ``min_units`` scored sentences.

    ``seed`` (bytes from the key-free plan) seeds the null draws; ``null`` passes the
    ``null_law`` of this text when it is already known (calibration scores one text under
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
    p = float(_tail_share(z[best], null.span))
    return ScanResult(float(z[best]), int(windows[best, 0]), int(windows[best, 1]), p)


@dataclass(frozen=True)
class CombinedResult:
    """The span, the mixture statistic, the weighted whole-text z and the p-value that combines
    them with the whole text.

    Attributes:
        span: the best span (``ScanResult``, its own p-value included).
        mixture: the mixture statistic of the scores.
        mixture_p_value: its p-value under the null draws.
        weighted_z: the weighted whole-text z (``gls_weights``; ``None`` without that test).
        weighted_p_value: its exact p-value (the normal tail; ``None`` without that test).
        p_value: the combined p-value (see the module docstring).
    """

    span: ScanResult
    mixture: float
    mixture_p_value: float
    weighted_z: float | None
    weighted_p_value: float | None
    p_value: float


def combined_test(
    scores: np.ndarray,
    cov: np.ndarray,
    p_text: float,
    seed: bytes = b"",
    null: NullLaw | None = None,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    shrinkage: float | None = GLS_SHRINKAGE,
) -> CombinedResult | None:
    """Span, mixture, weighted z and one p-value for ``scores`` ``(T,)`` of null covariance
    ``cov`` whose whole-text test gave ``p_text``; ``None`` when the text is too short to scan
    (its p-value is then ``p_text`` alone). ``null``: this text's ``null_law``, when already
    drawn (its own tests then count, whatever ``shrinkage`` says)."""
    scores = np.asarray(scores, dtype=np.float64)
    if null is None:
        null = null_law(cov, seed, min_units, draws, shrinkage)
    if null is None:
        return None
    span = scan(scores, cov, seed, min_units, null=null)
    mixture = float(mixture_statistic(scores, _unit_spread(cov)))
    p_mixture = float(_tail_share(mixture, null.mixture))
    observed = [p_text, span.p_value, p_mixture]
    weighted = p_weighted = None
    if null.weights is not None:
        weighted = float(null.weights @ scores)
        p_weighted = float(_normal_tail(weighted))
        observed.append(p_weighted)
    smallest = min(observed)
    floor = 1.0 / (null.draws + 1)
    p = (1.0 + int((null.smallest <= smallest + 1e-15).sum())) / (null.draws + 1)
    if p <= floor:
        p = min(p, len(observed) * smallest)
    return CombinedResult(span, mixture, p_mixture, weighted, p_weighted, float(min(1.0, p)))
