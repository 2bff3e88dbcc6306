"""Detection beyond the whole-text z: the marked span, the marked share, and one exact p-value.

A watermarked passage pasted into human text is diluted in the whole text's z: three quarters
of human sentences halve it. Three more statistics look for it (``spans`` defines them): the
*span* scan, the largest z over spans of consecutive scored sentences (a marked passage in one
piece); the *mixture* statistic (marked sentences scattered among human ones, whatever their
order); and the *weighted* whole-text z, which counts sentences that move together under the
null about once instead of each in full.

Under the direction mark the scores of a text that does not depend on the key are, over random
keys, jointly normal with mean 0 and a key-free covariance (``spans.score_covariance``). Every
statistic here is a function of that normal vector, so its null law is sampled from it
(``null_law``): no assumption about the text enters. The draws come from a generator seeded by
the key-free plan, not by the scores.

One p-value combines the four tests (``combined_test``): the smallest of the whole text's and
the weighted whole text's exact p, the span's and the mixture's p (each the share of draws at
least as extreme), referred to the law of that smallest p over the same draws. The tests look at
the same scores, so this costs far less than Bonferroni over four tests. The p-value
``(1 + #{draws <= observed}) / (draws + 1)`` is exact for any number of draws; below its floor
``1 / (draws + 1)`` the Bonferroni bound ``4 min(p)`` is reported instead when it is smaller
(still exact: that branch is only taken when the simulated p-value already sits at its floor),
so a whole watermarked text keeps its arbitrarily small p.

Batched and on the device: ``null_laws`` and ``combined_tests`` take many texts at once and
compute in float64 on the device of the covariances they are given (the encoder's), texts of
the same length together. The normal draws come from numpy's generator seeded by the text, and
the covariance's factor from numpy's ``eigh`` on the CPU, so a text's p-value is the same on
every device and in every batch (``tests/test_scan_golden.py`` pins them).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..settings.marks import SCAN_TESTS
from .spans import (
    GLS_SHRINKAGE,
    MIN_UNITS,
    as_float64,
    gls_weights,
    mixture_statistic,
    span_spread,
    span_windows,
    span_zs,
    unit_spread,
)

DRAWS = 4999
"""Null draws of the largest span z (the smallest p-value the scan can give is 1 / 5000)."""
MIN_DRAWS = 999
"""Long texts get fewer draws, so a draw budget (``DRAW_BUDGET``) bounds the time, never fewer
than this (a p-value floor of 1 / 1000, still far below alpha = 1%)."""
DRAW_BUDGET = 5e8
"""Most multiply-adds spent on null draws (``draws * T^2``): about a second on one core."""


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


@dataclass(frozen=True)
class NullLaw:
    """Draws of each statistic over random keys for one text (key-free; ``null_laws``), as
    float64 tensors on the device of the text's covariance.

    Attributes:
        text: ``(B,)`` whole-text z of each draw.
        span: ``(B,)`` largest span z of each draw, sorted.
        mixture: ``(B,)`` mixture statistic of each draw, sorted.
        weighted: ``(B,)`` weighted whole-text z of each draw (``None`` without that test).
        weights: ``(T,)`` the text's weights of that z (``gls_weights``), scaled so that it is
            ``weights . s`` (``None`` without that test).
        smallest: ``(B,)`` each draw's smallest p over the tests (``combined_test``).
    """

    text: Tensor
    span: Tensor
    mixture: Tensor
    weighted: Tensor | None
    weights: Tensor | None
    smallest: Tensor

    @property
    def draws(self) -> int:
        return len(self.text)


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
        log_p_value: its natural logarithm, computed in log space (finite where ``p_value``
            underflows to 0: a text far beyond any threshold).
        log_weighted_p_value: the weighted test's, likewise.
    """

    span: ScanResult
    mixture: float
    mixture_p_value: float
    weighted_z: float | None
    weighted_p_value: float | None
    p_value: float
    log_p_value: float = 0.0
    log_weighted_p_value: float | None = None


def _tail_share(values: Tensor, ordered: Tensor, drawn: bool = False) -> Tensor:
    """The p-value of each of ``values`` ``(..., M)`` against the sorted null draws ``ordered``
    ``(..., B)``: ``(1 + #{draws >= v}) / (B + 1)`` for an observed value, and for a value
    that is itself one of the draws (``drawn``) ``#{draws >= v} / (B + 1)``, itself counted
    once in place of the observed text (which may be above or below it: counting it never
    makes a draw's p-value larger than the observed's would be, so the combined p-value errs
    on the safe side by at most one draw)."""
    count = ordered.shape[-1]
    below = torch.searchsorted(ordered, (values - 1e-12).contiguous(), side="left")
    return ((0.0 if drawn else 1.0) + (count - below).double()) / (count + 1.0)


def _own_shares(draws: Tensor) -> tuple[Tensor, Tensor]:
    """``(draws sorted, each draw's _tail_share among them)`` for ``(..., B)`` draws, the
    shares from the sort's ranks (a draw's count of draws at least as large is ``B`` less its
    place); where two draws lie within the tolerance of ``_tail_share`` the ranks would not
    say it, and the shares are searched for as ``_tail_share`` does."""
    ordered, order = draws.sort(dim=-1)
    if bool((ordered.diff(dim=-1) < 1e-12).any()):
        return ordered, _tail_share(draws, ordered, drawn=True)
    count = draws.shape[-1]
    places = torch.arange(count, dtype=draws.dtype, device=draws.device).expand_as(draws)
    shares = torch.empty_like(draws).scatter_(-1, order, (count - places) / (count + 1.0))
    return ordered, shares


def normal_tail(z: Tensor) -> Tensor:
    """``P(N(0, 1) >= z)`` elementwise, in float64, through its logarithm: torch's ``ndtr(-z)``
    underflows to 0 from z = 8.3 in float64 (5.5 in float32), ``log_ndtr`` stays exact, and its
    exponential holds every tail above float64's smallest number (z up to about 37.5)."""
    return torch.special.log_ndtr(-z.double()).exp()


def _draw_count(units: int, draws: int) -> int:
    return max(MIN_DRAWS, min(draws, int(DRAW_BUDGET / units**2)))


def _seed(seed: bytes) -> int:
    return int.from_bytes(hashlib.sha256(seed).digest()[:8], "little")


def scan_seed(sentences: list[str]) -> bytes:
    """The key-free bytes that seed a text's null draws: its scored sentences."""
    return "\n".join(sentences).encode("utf-8", "surrogatepass")


def _together(keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
    """Indices by key (units and draws): the texts computed together."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def _draw(cov: Tensor, seeds: Sequence[bytes], count: int) -> Tensor:
    """``(G, count, T)`` null draws of scores of covariances ``(G, T, T)``: each text's
    normals from numpy's generator seeded by its seed, times its factor from numpy's ``eigh``
    (the same numbers on every device, in any batch)."""
    host = cov.cpu().numpy()
    factors = np.empty_like(host)
    normals = np.empty((len(host), count, host.shape[-1]))
    for g, seed in enumerate(seeds):
        values, vectors = np.linalg.eigh(host[g])
        factors[g] = vectors * np.sqrt(np.clip(values, 0.0, None))
        np.random.default_rng(_seed(seed)).standard_normal(out=normals[g])
    factor = torch.from_numpy(factors).to(cov.device)
    return torch.from_numpy(normals).to(cov.device) @ factor.transpose(-1, -2)


def null_laws(
    covs: Sequence,
    seeds: Sequence[bytes],
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    shrinkage: float | None = GLS_SHRINKAGE,
) -> list[NullLaw | None]:
    """The null draws of every statistic for each text's scores of covariance ``covs[i]``
    ``(T_i, T_i)``, seeded by ``seeds[i]`` (``draws`` each, fewer for long texts under
    ``DRAW_BUDGET``), or ``None`` for a text with no span to scan. ``shrinkage``: the weighted
    test's (``gls_weights``); ``None`` leaves that test out. Computed on the covariances'
    device, texts of one length together."""
    covs = [as_float64(c) for c in covs]
    out: list[NullLaw | None] = [None] * len(covs)
    keys = [(len(c), _draw_count(len(c), draws)) for c in covs]
    for (units, count), ids in _together(keys).items():
        if units < min_units:
            continue
        cov = torch.stack([covs[i] for i in ids])
        samples = _draw(cov, [seeds[i] for i in ids], count)
        text = samples.sum(dim=-1) / cov.sum(dim=(-1, -2)).clamp(min=1e-12).sqrt()[:, None]
        windows, lengths = span_windows(units, min_units, cov.device)
        spread = span_spread(cov, windows)[:, None, :]
        largest = [z.amax(dim=-1) for _, z in span_zs(samples, spread, lengths)]
        span, span_shares = _own_shares(torch.stack(largest).amax(dim=0))
        mixture, mixture_shares = _own_shares(
            mixture_statistic(samples, unit_spread(cov)[:, None, :])
        )
        # Each draw's own p-values, side by side (a draw's smallest is taken across them).
        tests = [normal_tail(text), span_shares, mixture_shares]
        weights = weighted = None
        if shrinkage is not None:
            weights = gls_weights(cov, shrinkage)
            weighted = (samples @ weights[..., None])[..., 0]
            tests.append(normal_tail(weighted))
        smallest = torch.stack(tests).amin(dim=0)
        for b, i in enumerate(ids):
            out[i] = NullLaw(
                text[b],
                span[b],
                mixture[b],
                None if weighted is None else weighted[b],
                None if weights is None else weights[b],
                smallest[b],
            )
    return out


def null_law(
    cov,
    seed: bytes,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    shrinkage: float | None = GLS_SHRINKAGE,
) -> NullLaw | None:
    """``null_laws`` of one text."""
    return null_laws([cov], [seed], min_units, draws, shrinkage)[0]


def combined_tests(
    scores: Sequence,
    covs: Sequence,
    p_texts: Sequence[float],
    seeds: Sequence[bytes] = (),
    nulls: Sequence[NullLaw | None] | None = None,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    shrinkage: float | None = GLS_SHRINKAGE,
    log_p_texts: Sequence[float] | None = None,
) -> list[CombinedResult | None]:
    """Span, mixture, weighted z and one p-value for each text's ``scores[i]`` ``(T_i,)`` of
    null covariance ``covs[i]`` whose whole-text test gave ``p_texts[i]``; ``None`` for a text
    too short to scan (its p-value is then ``p_texts[i]`` alone). ``nulls``: the texts'
    ``null_laws`` when already drawn (their own tests then count, whatever ``shrinkage`` says);
    else they are drawn from ``seeds``. Batched as ``null_laws``. ``log_p_texts``: the whole
    text's p-values as natural logarithms, where a p-value may underflow (the combination is
    then computed in log space; default: the logarithms of ``p_texts``)."""
    covs = [as_float64(c) for c in covs]
    scores = [as_float64(s, c.device) for s, c in zip(scores, covs, strict=True)]
    if nulls is None:
        nulls = null_laws(covs, seeds, min_units, draws, shrinkage)
    out: list[CombinedResult | None] = [None] * len(scores)
    live = [i for i, law in enumerate(nulls) if law is not None]
    keys = [(len(scores[i]), nulls[i].draws) for i in live]
    for members in _together(keys).values():
        ids = [live[m] for m in members]
        combined = _combine(scores, covs, p_texts, nulls, ids, min_units, log_p_texts)
        for i, result in zip(ids, combined, strict=True):
            out[i] = result
    return out


def _combine(scores, covs, p_texts, nulls, ids, min_units, log_p_texts) -> list[CombinedResult]:
    """``combined_tests`` of texts ``ids``, all of one length and one number of draws."""
    laws = [nulls[i] for i in ids]
    s = torch.stack([scores[i] for i in ids])
    cov = torch.stack([covs[i] for i in ids])
    count = laws[0].draws
    windows, lengths = span_windows(s.shape[-1], min_units, s.device)
    rows, zs = zip(*span_zs(s, span_spread(cov, windows), lengths), strict=True)
    z = torch.cat(zs, dim=-1)
    best = torch.cat(rows)[z.argmax(dim=-1)]
    best_z = z.amax(dim=-1, keepdim=True)
    p_span = _tail_share(best_z, torch.stack([law.span for law in laws]))[:, 0]
    mixture = mixture_statistic(s, unit_spread(cov))
    p_mixture = _tail_share(mixture[:, None], torch.stack([law.mixture for law in laws]))[:, 0]
    p_text = as_float64([p_texts[i] for i in ids], s.device)
    if log_p_texts is not None:
        log_text = as_float64([log_p_texts[i] for i in ids], s.device)
    else:
        log_text = torch.log(p_text)
    # Each test's (p, log p), by its name in SCAN_TESTS: the Bonferroni factor is their number.
    tests = {"text": (p_text, log_text), "span": (p_span, torch.log(p_span))}
    tests["mixture"] = (p_mixture, torch.log(p_mixture))
    weighted = p_weighted = log_weighted = None
    if laws[0].weights is not None:
        weighted = (torch.stack([law.weights for law in laws]) * s).sum(dim=-1)
        p_weighted = normal_tail(weighted)
        log_weighted = torch.special.log_ndtr(-weighted.double())
        tests["weighted"] = (p_weighted, log_weighted)
    observed = [tests[name][0] for name in SCAN_TESTS if name in tests]
    logs = [tests[name][1] for name in SCAN_TESTS if name in tests]
    smallest = torch.stack(observed).amin(dim=0)
    hits = (torch.stack([law.smallest for law in laws]) <= smallest[:, None] + 1e-15).sum(dim=-1)
    simulated = (1.0 + hits.double()) / (count + 1)
    # Below the simulation's floor, the Bonferroni bound when it is smaller (still exact).
    at_floor = simulated <= 1.0 / (count + 1)
    p = torch.where(at_floor, torch.minimum(simulated, len(observed) * smallest), simulated)
    # The same in log space: finite where the p-value itself underflows to 0.
    bound = math.log(len(observed)) + torch.stack(logs).amin(dim=0)
    log_p = torch.where(at_floor, torch.minimum(simulated.log(), bound), simulated.log())
    none = [None] * len(ids)
    columns = zip(
        best.tolist(),
        best_z[:, 0].tolist(),
        p_span.tolist(),
        mixture.tolist(),
        p_mixture.tolist(),
        none if weighted is None else weighted.tolist(),
        none if p_weighted is None else p_weighted.tolist(),
        p.clamp(max=1.0).tolist(),
        log_p.clamp(max=0.0).tolist(),
        none if log_weighted is None else log_weighted.tolist(),
        strict=True,
    )
    where = windows.tolist()
    return [
        CombinedResult(
            ScanResult(span_z, *where[at], span_p), mix, mix_p, w_z, w_p, combined, log_p, log_w
        )
        for at, span_z, span_p, mix, mix_p, w_z, w_p, combined, log_p, log_w in columns
    ]


def combined_test(
    scores,
    cov,
    p_text: float,
    seed: bytes = b"",
    null: NullLaw | None = None,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    shrinkage: float | None = GLS_SHRINKAGE,
) -> CombinedResult | None:
    """``combined_tests`` of one text (``null``: its null law, when already drawn)."""
    if null is None:
        null = null_law(cov, seed, min_units, draws, shrinkage)
    return combined_tests([scores], [cov], [p_text], nulls=[null], min_units=min_units)[0]


def scan(
    scores,
    cov,
    seed: bytes,
    min_units: int = MIN_UNITS,
    draws: int = DRAWS,
    null: NullLaw | None = None,
) -> ScanResult | None:
    """The best span of ``scores`` ``(T,)`` and its p-value under ``N(0, cov)``, or ``None``
    when the text has fewer than ``min_units`` scored sentences (``null``: this text's
    ``null_law`` when already known)."""
    result = combined_test(scores, cov, 1.0, seed, null, min_units, draws)
    return None if result is None else result.span
