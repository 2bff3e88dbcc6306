"""The scan's statistics of a text's sentence scores, and the scores' null covariance.

Three statistics look for marked sentences among human ones (``scan`` gives their p-values):

* the *span* z: over spans of consecutive scored sentences (``spans``), each span's sum of
  scores over its null standard deviation; the scan takes the largest (a marked passage in one
  piece);
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

(``a_t`` the sentence's context weights, ``u_t`` its vector): ``score_covariance``.

Every span's sum comes from differences of cumulative sums, one span length at a time
(``span_zs``), and every span's null spread from the covariance's cumulative sums
(``span_spread``); ``span_windows`` keeps each text length's spans on its device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

MIN_UNITS = 3
"""Shortest span scanned, in scored sentences: shorter spans add many tests and little power
(a pasted passage worth detecting holds several sentences)."""
MIXTURE_SHARE = 0.3
"""Share of marked sentences the mixture statistic is tuned for (a text three quarters human has
a quarter; one half human a half)."""
MIXTURE_MEAN = 1.5
"""Mean score of a marked sentence the mixture statistic is tuned for: the kept sentence's score
after a paraphrase, between its clean value and one half of it (how the pair was chosen:
docs/design.md, "Constants measured once")."""
GLS_SHRINKAGE = 1.0
"""Shrinkage of the weighted whole-text test, in units of the mean null variance of a sentence:
0 is full generalised least squares (two sentences that always move together weigh as one), a
large value the plain sum. At 1, two identical sentences weigh together 1.3 times one sentence
unlike them (how 1 was chosen: docs/design.md, "Constants measured once")."""
ALL_SPANS_UP_TO = 48
"""Texts with at most this many scored sentences scan every span; longer ones a grid of spans
(lengths growing by a factor 1.25, starts every quarter of a length), O(T log T) of them."""


def as_float64(x, device: torch.device | None = None) -> Tensor:
    """``x`` as a float64 tensor (on ``device``; ``None``: a tensor's own device)."""
    return torch.as_tensor(x, dtype=torch.float64, device=device)


def score_covariance(weights, vectors) -> Tensor:
    """``(..., T, T)`` null covariance of the scores of sentences with context ``weights``
    ``(..., T, K)`` and ``vectors`` ``(..., T, D)`` over random keys (see the module docstring),
    float64 on their device."""
    weights = as_float64(weights)
    vectors = as_float64(vectors, weights.device)
    return (weights @ weights.transpose(-1, -2)) * (vectors @ vectors.transpose(-1, -2))


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


@functools.lru_cache(maxsize=256)
def span_windows(count: int, min_units: int, device: torch.device) -> tuple[Tensor, tuple]:
    """``spans`` as a tensor ``(S, 2)``, and per span length ``(length, starts, rows)``: the
    starts of that length's spans (``None``: every start, the contiguous case) and their rows in
    the ``(S, 2)`` tensor."""
    windows = spans(count, min_units)
    lengths = []
    for length in np.unique(windows[:, 1] - windows[:, 0]):
        rows = np.flatnonzero(windows[:, 1] - windows[:, 0] == length)
        starts = windows[rows, 0]
        every = len(starts) == count - length + 1
        lengths.append(
            (
                int(length),
                None if every else torch.as_tensor(starts, device=device),
                torch.as_tensor(rows, device=device),
            )
        )
    return torch.as_tensor(windows, device=device), tuple(lengths)


def span_zs(samples: Tensor, spread: Tensor, lengths: tuple) -> Iterator[tuple[Tensor, Tensor]]:
    """Per span length, ``(rows, z)``: the spans' rows in ``spans`` and their z ``(..., n)``
    for scores ``samples`` ``(..., T)``, each span's sum over its ``spread`` (broadcasting as
    ``(..., S)``): differences of cumulative sums, one length at a time."""
    cumulative = torch.nn.functional.pad(samples.cumsum(dim=-1), (1, 0))
    for length, starts, rows in lengths:
        sums = cumulative[..., length:] - cumulative[..., :-length]
        if starts is not None:
            sums = sums.index_select(-1, starts)
        yield rows, sums / spread[..., rows]


def span_spread(cov, windows) -> Tensor:
    """``(..., S)`` standard deviation of each span's sum of scores of ``(..., T, T)`` ``cov``."""
    cov = as_float64(cov)
    windows = torch.as_tensor(windows, device=cov.device)
    cumulative = torch.nn.functional.pad(cov.cumsum(dim=-2).cumsum(dim=-1), (1, 0, 1, 0))
    a, b = windows[:, 0], windows[:, 1]
    var = cumulative[..., b, b] - cumulative[..., a, b] - cumulative[..., b, a]
    return (var + cumulative[..., a, a]).clamp(min=1e-12).sqrt()


def unit_spread(cov: Tensor) -> Tensor:
    """``(..., T)`` standard deviation of each sentence's score of ``(..., T, T)`` ``cov``."""
    return cov.diagonal(dim1=-2, dim2=-1).clamp(min=1e-12).sqrt()


def mixture_statistic(samples, spread) -> Tensor:
    """``(...,)`` the mixture log-likelihood ratio of score ``samples`` ``(..., T)`` with null
    standard deviations ``spread`` ``(..., T)`` (see the module docstring)."""
    z = as_float64(samples) / as_float64(spread)
    mu, share = MIXTURE_MEAN, MIXTURE_SHARE
    # log(1 - pi + pi exp(x)) = log(1 - pi) + softplus(x + log(pi) - log(1 - pi))
    lead = math.log1p(-share)
    shifted = mu * z + (math.log(share) - mu * mu / 2 - lead)
    return (lead + torch.nn.functional.softplus(shifted, threshold=40.0)).sum(dim=-1)


def gls_weights(cov, shrinkage: float = GLS_SHRINKAGE) -> Tensor:
    """``(..., T)`` weights of the weighted whole-text z, ``(C + shrinkage mean(diag C) I)^-1 1``,
    scaled so that ``weights . s`` is standard normal under scores of covariance ``cov``."""
    cov = as_float64(cov)
    n = cov.shape[-1]
    ridge = shrinkage * cov.diagonal(dim1=-2, dim2=-1).mean(dim=-1).clamp(min=1e-12)
    eye = torch.eye(n, dtype=cov.dtype, device=cov.device)
    ones = torch.ones(cov.shape[:-1] + (1,), dtype=cov.dtype, device=cov.device)
    w = torch.linalg.solve(cov + ridge[..., None, None] * eye, ones)[..., 0]
    quadratic = (w[..., None, :] @ cov @ w[..., :, None])[..., 0, 0]
    return w / quadratic.clamp(min=1e-24).sqrt()[..., None]
