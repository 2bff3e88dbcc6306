"""Detection statistics over a text's region transitions.

A text's sentences fall in regions ``q_0, q_1, ..., q_T``; each scored transition
``(q_{t-1}, q_t)`` is *valid* when ``q_t`` is in the valid set ``G(q_{t-1})``. Two tests:

``paper``
    The one-proportion z-test of SemStamp / k-SemStamp: ``z = (S_V - gamma T) / sqrt(gamma (1-gamma) T)``
    with a normal tail. It assumes each sentence is valid with probability ``gamma`` independently
    of the previous one. Human text is not like that (consecutive sentences often share a region),
    so its p-values are too small on human text.

``exact`` (default)
    A key-randomisation test. Human text does not depend on the secret key, so its valid count
    under our table is one draw of the valid count under a uniformly random table (each row an
    independent uniformly random ``gamma K``-subset, which is how the keyed table is built). Given the
    text's transition counts ``n[a, b]``, the valid count is ``sum_a S_a`` with
    ``S_a = sum_{b in G(a)} n[a, b]``; the law of each ``S_a`` over random subsets is computed
    exactly by dynamic programming, and the rows are independent, so the laws convolve. The
    p-value ``P(S >= S_V)`` is exact under the null, whatever the structure of the text.

``direction`` (the statistic of the ``direction`` mark)
    Each scored sentence ``t`` has a vector ``u_t`` (its centred unit embedding) and a context
    ``c_t`` (the region of the sentence before it); the key gives each context a direction
    ``n_c`` with i.i.d. standard normal components, and the sentence's score is
    ``s_t = n_{c_t} . u_t``. With ``w_c = sum_{t: c_t = c} u_t``, the total score is
    ``S = sum_c n_c . w_c``. Over uniformly random keys the ``n_c`` are independent standard
    Gaussian vectors, so for a text that does not depend on the key ``S`` is exactly normal
    with mean 0 and variance ``sum_c |w_c|^2``: ``z = S / sqrt(sum_c |w_c|^2)`` is exactly a
    standard normal and ``p = P(N(0, 1) >= z)``, whatever the text's structure (sentences on
    one topic share a context and point the same way, which the variance accounts for).

    Soft contexts: sentence ``t`` may instead be scored on ``sum_c a_tc n_c`` for key-free
    weights ``a_tc`` (a function of the text). Then ``S = sum_c n_c . w_c`` with
    ``w_c = sum_t a_tc u_t``, and the same argument gives the same exact z.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

STATISTICS = ("exact", "paper")


def paper_z(num_valid: int, num_scored: int, gamma: float) -> float:
    """The paper's z-score; requires ``num_scored >= 1``."""
    if num_scored < 1:
        raise ValueError("the z-score needs at least one scored sentence")
    return (num_valid - gamma * num_scored) / math.sqrt(gamma * (1 - gamma) * num_scored)


def normal_sf(z: float) -> float:
    """One-sided upper tail of the standard normal."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def log_normal_sf(z: float) -> float:
    """The natural logarithm of ``normal_sf(z)``, computed in log space (finite for any z:
    ``normal_sf`` underflows to 0 from z = 38.5)."""
    import torch

    return float(torch.special.log_ndtr(torch.tensor(-float(z), dtype=torch.float64)))


P_FLOOR = 1e-300
"""Smallest p-value reported as a number. A smaller one (a text far beyond any threshold,
z > 37) is reported as this bound, with its exact value as ``log10_p_value``: an exact
p-value is never 0."""


def reported_p(log_p: float) -> tuple[float, float | None]:
    """A p-value given by its natural logarithm as it is reported: ``(p, None)``, or
    ``(P_FLOOR, log10 p)`` when ``p`` is below ``P_FLOOR``."""
    if log_p >= math.log(P_FLOOR):
        return math.exp(log_p), None
    return P_FLOOR, log_p / math.log(10.0)


def subset_sum_pmf(values: np.ndarray, size: int) -> np.ndarray:
    """Law of ``sum(values[S])`` for ``S`` a uniformly random subset of ``size`` indices.

    ``values`` are non-negative integers; returns ``pmf`` with ``pmf[s] = P(sum = s)``. Dynamic
    programming over the non-zero elements only (a text's transition row is mostly zeros):
    ``ways[j, s]`` counts subsets of ``j`` non-zero elements summing to ``s``; a subset with ``j``
    non-zero members takes its other ``size - j`` from the zeros in ``C(zeros, size - j)`` ways.
    """
    values = np.asarray(values, dtype=np.int64)
    nonzero = values[values > 0]
    zeros = len(values) - len(nonzero)
    total = int(nonzero.sum())
    top = min(size, len(nonzero))
    ways = np.zeros((top + 1, total + 1), dtype=np.float64)
    ways[0, 0] = 1.0
    for v in nonzero:
        # Iterate j downwards so each element is used at most once.
        for j in range(top, 0, -1):
            ways[j, v:] += ways[j - 1, : total + 1 - v]
    pmf = np.zeros(total + 1)
    for j in range(top + 1):
        if 0 <= size - j <= zeros:
            pmf += ways[j] * math.comb(zeros, size - j)
    return pmf / math.comb(len(values), size)


def null_count_pmf(counts: Tensor | np.ndarray, size: int) -> np.ndarray:
    """Law of the valid count of ``(K, K)`` transition ``counts`` over uniformly random tables
    with ``size`` valid regions per row: each row's subset-sum law, convolved over the rows
    (they are independent random subsets). ``law[s] = P(S = s)``."""
    law = np.ones(1)
    for row in np.asarray(counts, dtype=np.int64):
        if row.sum() > 0:
            law = np.convolve(law, subset_sum_pmf(row, size))
    return law


def exact_p_value(transitions: Tensor | np.ndarray, table: Tensor | np.ndarray) -> float:
    """Key-randomisation p-value ``P(S >= S_V)`` for a ``(K, K)`` transition-count matrix.

    ``table`` is the ``(K, K)`` boolean valid table in use; only its row size ``gamma K`` enters the
    null law, its entries give the observed count.
    """
    counts = np.asarray(transitions, dtype=np.int64)
    valid = np.asarray(table, dtype=bool)
    observed = int(counts[valid].sum())
    size = int(valid[0].sum())
    return float(min(1.0, null_count_pmf(counts, size)[observed:].sum()))


def transition_matrix(regions: list[int], scored: list[bool], num_regions: int) -> np.ndarray:
    """``(K, K)`` counts of the transitions ``(regions[t-1], regions[t])`` with ``scored[t]``."""
    counts = np.zeros((num_regions, num_regions), dtype=np.int64)
    for t in range(1, len(regions)):
        if scored[t]:
            counts[regions[t - 1], regions[t]] += 1
    return counts


def context_sums(vectors: np.ndarray, contexts) -> tuple[np.ndarray, np.ndarray]:
    """The key-free part of the ``direction`` statistic: the contexts ``(C,)`` the scored
    sentences use and ``(C, D)`` the sums ``w_c`` of their (weighted) vectors.

    ``contexts``: ``(T,)`` region indices, or ``(T, K)`` context weights (``w_c`` is then
    ``sum_t a_tc u_t``; one-hot rows give the same sums as indices)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    weights = np.asarray(contexts)
    if weights.ndim == 2:
        if np.all((weights == 0) | (weights == 1)) and np.all(weights.sum(axis=1) == 1):
            weights = weights.argmax(axis=1)
        else:
            weights = weights.astype(np.float64)
            distinct = np.flatnonzero((weights != 0).any(axis=0))
            return distinct, weights[:, distinct].T @ vectors
    contexts = weights.astype(np.int64)
    distinct, index = np.unique(contexts, return_inverse=True)
    sums = np.zeros((len(distinct), vectors.shape[1]))
    np.add.at(sums, index, vectors)
    return distinct, sums


def direction_z(vectors: np.ndarray, contexts, directions: np.ndarray) -> float:
    """Exact z of the ``direction`` statistic (see the module docstring).

    Args:
        vectors: ``(T, D)`` vectors of the scored sentences (at least one, not all zero).
        contexts: ``(T,)`` context of each (row index into ``directions``), or ``(T, K)``
            context weights (the direction of row ``t`` is ``sum_c a_tc n_c``).
        directions: ``(K, D)`` the key's directions.
    """
    distinct, sums = context_sums(vectors, contexts)
    variance = float((sums**2).sum())
    if len(distinct) == 0 or variance <= 0:
        raise ValueError("the direction statistic needs at least one non-zero scored vector")
    total = float(np.einsum("cd,cd->", np.asarray(directions, dtype=np.float64)[distinct], sums))
    return total / math.sqrt(variance)
