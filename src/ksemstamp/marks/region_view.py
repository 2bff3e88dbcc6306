"""How the region mark's results read: its description for reports, its web view (the exact
law of the valid count, and what the p-value promises), and its simulated watermarked texts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..detection.stats import null_count_pmf, transition_matrix
from ..results import DetectionResult, shown_p


def describe_region(mark: Any) -> dict[str, Any]:
    """What ``Mark.describe`` says of the region mark."""
    scheme = mark.scheme
    return {
        "kind": "region",
        "short": f"region mark, γ = {mark.gamma:g}",
        "keys": "keyed valid tables",
        "drawn": "keyed tables",
        "counted": "valid",
        "z": "paper",
        "summary": f"Partition: K = {scheme.num_regions} regions, gamma = {mark.gamma}",
        "statistic": {
            "exact": "exact key-randomisation p-value of the count of sentences in valid regions",
            "paper": "the paper's one-proportion z-test, normal tail (not calibrated on human "
            "text)",
        },
        "first": "prompt: each text's first sentence only seeds.",
        "uniformity": [
            "gets over random keys, which is what a p-value promises. The exact test's p-values",
            "are discrete and conservative (many texts get p = 1), so its KS is large while its",
            "excess is near zero. `exact_randomised` breaks ties at random and is exactly uniform",
            "under the null law, so its pooled KS checks that law.",
        ],
        "fallbacks": "{n} fallbacks",
        "settings": {"gamma": mark.gamma, "valid_mode": mark.valid_mode},
    }


def _scored_transitions(result: DetectionResult) -> set[tuple[int, int]]:
    previous, out = result.seed_region, set()
    for region, verdict in zip(result.regions, result.verdicts, strict=True):
        if verdict in ("valid", "invalid") and previous is not None:
            out.add((previous, region))
        previous = region
    return out


def region_view(mark: Any, result: DetectionResult, alpha: float, unit: str) -> dict[str, Any]:
    """What ``Mark.view`` gives the page for the region mark."""
    gamma = mark.gamma
    return {
        "expected": gamma * result.num_scored,
        "expected_label": f"γ = {gamma:g}",
        "counted": "valid / scored",
        "z_label": "paper",
        "previous": True,
        "gamma": gamma,
        "null": _null_chart(mark, result),
        "explanation": _explanation(result, gamma, alpha),
    }


def _null_chart(mark: Any, result: DetectionResult) -> dict | None:
    """The exact law of the valid count for this text, and where the text falls."""
    if result.status != "ok":
        return None
    regions = list(result.regions)
    scored = [v in ("valid", "invalid") for v in result.verdicts]
    if result.seed_region is not None:
        regions, scored = [result.seed_region, *regions], [False, *scored]
    counts = transition_matrix(regions, scored, mark.scheme.num_regions)
    pmf = null_count_pmf(counts, mark.size)
    observed = result.num_valid
    return {
        "kind": "count",
        "pmf": [float(x) for x in pmf],
        "observed": observed,
        "tail": float(min(1.0, pmf[observed:].sum())),
        "expected": float(sum(i * x for i, x in enumerate(pmf))),
    }


def _explanation(result: DetectionResult, gamma: float, alpha: float) -> str:
    """What the p-value promises, in words."""
    if result.status != "ok":
        return result.error or ""
    one_step = ""
    transitions = _scored_transitions(result)
    if len(transitions) == 1 and result.num_scored > 1:
        ((a, b),) = transitions
        one_step = (
            f" All {result.num_scored} scored sentences make the same step, region {a} to "
            f"region {b}: under a random key that step is valid for all of them or for none, so "
            f"this text cannot reach a p-value below {gamma:g}, watermarked or not."
        )
    p, scored, valid = shown_p(result.p_value), result.num_scored, result.num_valid
    if result.statistic == "exact":
        promise = (
            f"If this text had been written without our key, a valid count of {valid} or more "
            f"out of {scored} scored sentences would turn up with probability {p} (the shaded "
            f"area of the chart), whatever its topic or style."
        )
    else:
        promise = (
            f"p = {p} is the normal tail of the paper's z; it assumes every sentence is valid "
            f"with chance {gamma:g} on its own, which human text that keeps its topic does not "
            f"meet, so it flags human text more often than its nominal rate."
        )
    return (
        f"{promise}{one_step} It does not cover text that quotes or paraphrases watermarked text "
        f"or was written by someone holding the key, and a text that stays in one region "
        f"carries little evidence either way. The text is called watermarked when p <= "
        f"{alpha:g}."
    )


def simulate_watermarked(
    transition: np.ndarray,
    table: np.ndarray,
    lengths: Sequence[int],
    rng: np.random.Generator,
) -> np.ndarray:
    """``(N, K, K)`` scored-transition counts of simulated watermarked texts.

    The first region is drawn from the domain's region frequencies; each next region from the
    domain's transitions out of the previous region, restricted to its valid set (uniform over
    the valid set if the domain never made such a move). One text per entry of ``lengths``,
    each with that many scored units.
    """
    transition = np.asarray(transition, dtype=np.float64)
    k = transition.shape[0]
    start = transition.sum(axis=1) + 1e-12
    start /= start.sum()
    moves = []
    for q in range(k):
        w = transition[q] * table[q]
        if w.sum() <= 0:
            w = table[q].astype(np.float64)
        moves.append(w / w.sum())
    out = np.zeros((len(lengths), k, k), dtype=np.int64)
    for i, length in enumerate(lengths):
        q = rng.choice(k, p=start)
        for _ in range(int(length)):
            nxt = rng.choice(k, p=moves[q])
            out[i, q, nxt] += 1
            q = nxt
    return out
