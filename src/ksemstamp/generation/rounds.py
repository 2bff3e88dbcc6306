"""How many candidate rows a document draws in one round of the sentence loop.

With acceptance probability ``p`` for the current valid set and a round of ``n`` rows costing
about ``1 + row_cost * (n - 1)`` single-row decodes (``ROW_COST``), the expected cost per
accepted sentence is ``(1 + row_cost (n - 1)) / (1 - (1 - p)^n)``; ``round_size`` takes the
``n <= candidate_batch`` minimising it. ``p`` is a running acceptance rate per previous region
(``acceptance``), started from the mark's prior (``Mark.prior``) worth ``PRIOR_WEIGHT``
observations. The generator's own text soon overrides the prior where it differs from the
domain's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

ROW_COST = 0.065
"""Relative cost of one more row in a batched decode step, measured on a CPU with the default
LM (docs/design.md, "Constants measured once")."""
PRIOR_WEIGHT = 4.0
"""Observations the mark's prior acceptance rate is worth in a previous region's running rate."""
MIN_ACCEPTANCE = 1e-3
"""Floor of the acceptance rate a round is sized for (a round never grows without bound)."""
COST_TOLERANCE = 1e-12
"""A larger round must cost less than this below a smaller one's expected cost to be chosen."""


def acceptance(
    stats: dict[int, list[float]],
    previous: int,
    prior: Callable[[int], float],
    weight: float = PRIOR_WEIGHT,
) -> list[float]:
    """The running ``[accepted, drawn]`` counts after region ``previous`` in ``stats``, started
    (once) from ``prior(previous)`` worth ``weight`` observations; the caller adds to them."""
    if previous not in stats:
        stats[previous] = [prior(previous) * weight, weight]
    return stats[previous]


def round_size(p: float, candidate_batch: int, row_cost: float = ROW_COST) -> int:
    """The number of rows ``n <= candidate_batch`` with the least expected cost per accepted
    sentence at acceptance rate ``p`` (floored at ``MIN_ACCEPTANCE``)."""
    p = min(max(p, MIN_ACCEPTANCE), 1.0)
    best, best_cost = 1, math.inf
    for n in range(1, candidate_batch + 1):
        cost = (1 + row_cost * (n - 1)) / (1 - (1 - p) ** n)
        if cost < best_cost - COST_TOLERANCE:
            best, best_cost = n, cost
    return best
