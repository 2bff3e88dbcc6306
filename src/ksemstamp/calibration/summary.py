"""Summaries over keys: false-positive rates, distance from uniform, power."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .scoring import DIAGNOSTIC, STATS


def _stats(p: dict[str, np.ndarray]) -> list[str]:
    """The statistics present in one key's p-values (the direction mark has ``exact`` only)."""
    return [s for s in STATS if s in p]


def ks_distance(p: np.ndarray) -> tuple[float, float]:
    """Distance of p-values from uniform: ``(sup |F(u) - u|, sup (F(u) - u))``.

    The second, one-sided number is what matters for false positives: how far the share of
    p-values at or below some ``u`` exceeds ``u``. A conservative test has it near zero even
    when its two-sided distance is large.
    """
    p = np.sort(np.asarray(p, dtype=np.float64))
    n = len(p)
    if n == 0:
        return float("nan"), float("nan")
    # ECDF just after each ties block minus u, and u minus the ECDF just before each block.
    values, first = np.unique(p, return_index=True)
    after = np.append(first[1:], n) / n
    before = first / n
    above = float(np.max(after - values))
    below = float(np.max(values - before))
    return max(above, below, 0.0), max(above, 0.0)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, standard deviation, min, 5th/95th percentiles and max over keys."""
    v = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
        "min": float(v.min()),
        "q05": float(np.percentile(v, 5)),
        "q95": float(np.percentile(v, 95)),
        "max": float(v.max()),
    }


def tpr_at_fpr(alt_p: np.ndarray, null_p: np.ndarray, fpr: float) -> float:
    """Share of ``alt_p`` flagged by the best threshold that flags at most ``fpr`` of ``null_p``.

    Texts are flagged when their p-value is below the smallest null p-value whose inclusion
    would push the null's flagged share above ``fpr``; ties with it stay unflagged.
    """
    null_p = np.sort(np.asarray(null_p, dtype=np.float64))
    if len(null_p) == 0:
        return float("nan")
    values = np.unique(null_p)
    rates = np.searchsorted(null_p, values, side="right") / len(null_p)
    over = values[rates > fpr]
    cut = float(over.min()) if len(over) else float("inf")
    return float(np.mean(np.asarray(alt_p) < cut))


def summarise_null(
    per_key: list[dict[str, np.ndarray]], index: np.ndarray, alphas: Sequence[float]
) -> dict[str, Any]:
    """False-positive rates and distance from uniform over keys for the texts in ``index``."""
    out: dict[str, Any] = {"texts": int(len(index))}
    for stat in (*_stats(per_key[0]), DIAGNOSTIC):
        fpr = {}
        for alpha in alphas:
            rates = [float(np.mean(p[stat][index] <= alpha)) for p in per_key]
            fpr[str(alpha)] = {
                **spread(rates),
                "keys_above_alpha": float(np.mean([r > alpha for r in rates])),
            }
        dists = [ks_distance(p[stat][index]) for p in per_key]
        pooled = ks_distance(np.concatenate([p[stat][index] for p in per_key]))
        out[stat] = {
            "fpr": fpr,
            "ks": spread([d[0] for d in dists]),
            "ks_excess": spread([d[1] for d in dists]),
            "ks_pooled": pooled[0],
            "ks_excess_pooled": pooled[1],
        }
    return out


def power_summary(
    alt: list[dict[str, np.ndarray]],
    null: list[dict[str, np.ndarray]],
    alphas: Sequence[float],
    empirical_fprs: Sequence[float] = (0.01, 0.001),
) -> dict[str, Any]:
    """True-positive rates over keys: at the nominal ``alphas``, and at thresholds set so that
    the human texts scored under the same key are flagged at most at ``empirical_fprs``."""
    out: dict[str, Any] = {}
    for stat in _stats(alt[0]):
        nominal = {str(a): spread([float(np.mean(p[stat] <= a)) for p in alt]) for a in alphas}
        empirical = {}
        for fpr in empirical_fprs:
            rates = [tpr_at_fpr(a[stat], h[stat], fpr) for a, h in zip(alt, null, strict=True)]
            empirical[str(fpr)] = spread(rates)
        out[stat] = {"tpr_at_alpha": nominal, "tpr_at_empirical_fpr": empirical}
    return out


def group_rates(
    per_key: list[dict[str, np.ndarray]],
    groups: Sequence[str],
    alpha: float,
    min_size: int = 20,
    stat: str = "exact",
) -> dict[str, Any]:
    """False positives by group (a document, speech or account cut into several texts).

    Texts of one group share a topic, and under one key their scores move together, so a key
    can flag many of them at once even when the rate over all texts and keys is exact. For each
    group of at least ``min_size`` texts and each key, the share flagged at ``alpha``; reported:
    the largest share over groups and keys, where it happened, the number of (group, key) cells
    above 15%, and the chance that so many of a group's texts would be flagged if they were
    independent (a binomial tail, for scale)."""
    from math import comb

    sizes: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g:
            sizes.setdefault(g, []).append(i)
    big = {g: np.array(ix) for g, ix in sizes.items() if len(ix) >= min_size}
    out: dict[str, Any] = {"min_size": min_size, "alpha": alpha, "groups": len(big)}
    if not big:
        return out
    worst = (0.0, "", -1, 0)
    cells_above = 0
    for g, ix in big.items():
        for k, p in enumerate(per_key):
            flagged = int((p[stat][ix] <= alpha).sum())
            share = flagged / len(ix)
            cells_above += share > 0.15
            if share > worst[0]:
                worst = (share, g, k, flagged)
    share, group, key, flagged = worst
    n = len(big[group]) if group else 0
    tail = sum(comb(n, j) * alpha**j * (1 - alpha) ** (n - j) for j in range(flagged, n + 1))
    out.update(
        {
            "texts": int(sum(len(ix) for ix in big.values())),
            "largest_share": share,
            "largest_group": group,
            "largest_group_texts": n,
            "largest_key": key,
            "cells": len(big) * len(per_key),
            "cells_above_15pct": int(cells_above),
            "independent_tail": float(tail) if group else None,
        }
    )
    return out
