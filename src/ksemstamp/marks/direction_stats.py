"""The direction mark's statistic: the key-free evidence of a text and its p-values under keys.

A scored unit's score is ``s_t = sum_c a_tc n_c . u_t``: its processed vector ``u_t`` (unit
length) projected on the blend of the key's directions ``n_c`` that its context weights
``a_t`` give. Summed over a text, ``S = sum_c n_c . w_c`` with ``w_c = sum_t a_tc u_t``, so a
text's evidence under any key is its per-context sums ``w_c``: over random keys (independent
standard normal directions) ``S`` is exactly normal with mean 0 and variance
``V = sum_c |w_c|^2``, whatever the text, and ``z = S / sqrt(V)`` is exactly standard normal
for any text written without the key (``stats.direction_z``). With the windowed tests
(``detection.scan``) a text also keeps its scores' null covariance and the null draws of the
span, mixture and weighted statistics; a key's p-value then combines the four.

The detector applies its own key to this evidence and calibration applies many (``p_values``):
one implementation of the statistic. ``text_gains`` is how generation ranks candidates by what
they add to this statistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..detection.scan import CombinedResult, NullLaw, combined_tests, null_laws, scan_seed
from ..detection.spans import as_float64, score_covariance
from ..detection.stats import P_FLOOR, context_sums, log_normal_sf, normal_sf, reported_p
from ..results import DetectionResult


@dataclass
class DirectionEvidence:
    """One text's key-free evidence (see the module docstring)."""

    contexts: np.ndarray
    """``(C,)`` the contexts (regions) whose directions the text's sums meet."""
    sums: np.ndarray
    """``(C, D)`` the sums ``w_c``."""
    variance: float
    """``V``: the null variance of the text's score sum."""
    vectors: Tensor | None = None
    """Windowed tests: ``(T, D)`` the scored units' vectors (float64)."""
    weights: Tensor | None = None
    """Windowed tests: ``(T, K)`` their context weights (float64)."""
    cov: Tensor | None = None
    """Windowed tests: ``(T, T)`` the scores' null covariance."""
    null: NullLaw | None = None
    """Windowed tests: the null draws (``None``: a text too short to scan)."""


def text_evidence(
    vectors: Sequence[Tensor],
    weights: Sequence[Tensor],
    sentences: Sequence[list[str]],
    scan: bool,
) -> list[DirectionEvidence]:
    """The evidence of texts with ``(T_i, D)`` scored vectors, ``(T_i, K)`` context weights
    and scored ``sentences`` (their text seeds the windowed tests' null draws); the null laws
    are drawn for all texts at once (``scan``)."""
    out = []
    for v, w in zip(vectors, weights, strict=True):
        distinct, sums = context_sums(v.double().cpu().numpy(), w.double().cpu().numpy())
        out.append(DirectionEvidence(distinct, sums, float((sums**2).sum())))
    if not scan:
        return out
    covs = [
        score_covariance(as_float64(w), as_float64(v))
        for v, w in zip(vectors, weights, strict=True)
    ]
    laws = null_laws(covs, [scan_seed(list(s)) for s in sentences])
    for e, v, w, cov, law in zip(out, vectors, weights, covs, laws, strict=True):
        e.vectors, e.weights, e.cov, e.null = as_float64(v), as_float64(w), cov, law
    return out


@dataclass
class DirectionBatch:
    """Many texts' evidence stacked: row ``r`` of ``sums`` belongs to text ``text[r]`` and
    meets the direction of context ``contexts[r]``."""

    evidence: list[DirectionEvidence]
    text: np.ndarray
    contexts: np.ndarray
    sums: np.ndarray
    variance: np.ndarray


def stack_evidence(evidence: Sequence[DirectionEvidence]) -> DirectionBatch:
    """The texts' evidence as one ``DirectionBatch``."""
    evidence = list(evidence)
    dim = evidence[0].sums.shape[1] if evidence else 0
    return DirectionBatch(
        evidence,
        np.concatenate([np.full(len(e.contexts), i) for i, e in enumerate(evidence)] or [[]]),
        np.concatenate([e.contexts for e in evidence] or [[]]).astype(np.int64),
        np.concatenate([e.sums for e in evidence]) if evidence else np.zeros((0, dim)),
        np.array([e.variance for e in evidence], dtype=np.float64),
    )


def direction_p_values(batch: DirectionBatch, materials: Sequence, details: bool = False) -> list:
    """Per key's ``(K, D)`` directions, each text's ``z`` and ``exact`` p-value (combined with
    the windowed tests for texts whose evidence holds them), computed for all texts at once;
    ``details``: also each text's whole-text p-value (``text``), its natural logarithm
    (``log_text``) and its windowed tests (``combined``: a ``CombinedResult`` or ``None``)."""
    evidence, text, variance = batch.evidence, batch.text.astype(np.int64), batch.variance
    if bool((variance <= 0).any()):
        raise ValueError("the direction statistic needs at least one non-zero scored vector")
    windowed = [i for i, e in enumerate(evidence) if e.null is not None]
    out = []
    for material in materials:
        directions = np.asarray(material, dtype=np.float64)
        dots = np.einsum("rd,rd->r", batch.sums, directions[batch.contexts])
        z = np.bincount(text, weights=dots, minlength=len(evidence)) / np.sqrt(variance)
        p_text = np.array([normal_sf(float(v)) for v in z])
        one = {"z": z, "exact": p_text.copy()}
        logs = [log_normal_sf(float(v)) for v in z]
        combined: list[CombinedResult | None] = [None] * len(evidence)
        if windowed:
            # The windowed tests read the scores as generation and the report give them:
            # float32 projections (the whole-text z above is float64 throughout).
            key = torch.as_tensor(directions).float()
            scores = [
                (
                    (evidence[i].weights.float() @ key.to(evidence[i].weights.device))
                    * evidence[i].vectors.float()
                )
                .sum(-1)
                .double()
                for i in windowed
            ]
            tested = combined_tests(
                scores,
                [evidence[i].cov for i in windowed],
                [float(p_text[i]) for i in windowed],
                nulls=[evidence[i].null for i in windowed],
                log_p_texts=[logs[i] for i in windowed],
            )
            for i, result in zip(windowed, tested, strict=True):
                combined[i] = result
                one["exact"][i] = result.p_value
        if details:
            one |= {"text": p_text, "log_text": np.array(logs), "combined": combined}
        out.append(one)
    return out


def text_gains(
    scores: Tensor,
    contexts: Tensor,
    vectors: Tensor,
    evidence: Sequence[tuple[Tensor | None, float]],
) -> Tensor:
    """``(R,)`` each candidate's score less what it repeats of its text's evidence so far.

    The detector's z of a text is ``S / sqrt(V)``: ``S`` the sum of its units' scores and
    ``V = |E|^2`` the null variance, ``E`` the sum of each unit's scored context (x) vector.
    Adding a candidate with score ``s`` and covariance ``c = a^T E u`` with the text moves the
    z, to first order, by ``(s - (S / V) c) / sqrt(V)`` (and a term common to all candidates).
    A candidate that says again what the text has said scores high for the same reason the
    earlier unit did, and adds variance as fast as evidence: ranked by its own score it is
    kept often, and a text of such units counts like a few (the effective number of units,
    ``N^2 / V``). Ranked by this gain, the kept unit is the one that raises the text's z most.

    Args:
        scores: ``(R,)`` the candidates' scores.
        contexts: ``(R, K)`` the contexts they were scored on.
        vectors: ``(R, D)`` their scored vectors.
        evidence: per candidate, its text's ``(K, D)`` evidence ``E`` (``None``: no unit kept
            yet) and score sum ``S``.
    """
    gains = scores.double().clone()
    for r, (total, score_sum) in enumerate(evidence):
        if total is None or score_sum <= 0:
            continue
        variance = float((total**2).sum())
        # a^T E u, as E^T a first (what ``a @ E`` computes, bit for bit), spelled as a
        # matrix-vector product so that every backend reads it alike.
        overlap = torch.mv(total.T, contexts[r].double()) @ vectors[r].double()
        gains[r] -= score_sum / variance * overlap
    return gains


@dataclass
class DirectionState:
    """What the direction mark remembers of a document's units kept so far."""

    weights: Tensor | None = None
    """``(K,)`` the context weights the last unit hands on (what the next is scored on under
    ``context: previous``, and what it is steered toward at first)."""
    evidence: Tensor | None = None
    """``(K, D)`` sum over the kept units of their scored context times their scored vector:
    the null variance of the text's score sum is its squared norm."""
    score: float = 0.0
    """The sum of the kept units' scores."""


class Scored(NamedTuple):
    """A candidate's ``Judgement.data``: the context weights it hands on, and the context
    weights it was scored on with its scored vector (what the text's evidence adds up)."""

    hands_on: Tensor
    evidence: tuple[Tensor, Tensor]


@dataclass
class DirectionPlan:
    """What the mark scores of a text (``ScoringPlan.data``)."""

    vectors: Tensor
    """``(N, D)`` the processed vector of each sentence."""
    weights: Tensor
    """``(N + 1, K)`` the context weights of the seed (row 0; zeros without one) and of each
    sentence."""
    own: bool = field(default=True)


def fill_result(result: DetectionResult, plan: Any, tested: dict, n: int, alpha: float) -> None:
    """A text's z, p-values and windowed tests (an exact p-value is never 0: below
    ``P_FLOOR`` the bound is reported with its value in log space)."""
    result.z_score = float(tested["z"][n])
    p_text, log_text = float(tested["text"][n]), float(tested["log_text"][n])
    p, log_p = p_text, log_text
    combined = tested["combined"][n]
    if combined is not None:
        rows = [t for t, scored in enumerate(plan.scored) if scored]
        best = combined.span
        weighted = combined.weighted_p_value
        result.details = {
            "text_p_value": max(p_text, P_FLOOR),
            "span": [rows[best.start], rows[best.stop - 1] + 1],
            "span_z": best.z,
            "span_p_value": best.p_value,
            "mixture_p_value": combined.mixture_p_value,
            "weighted_p_value": None if weighted is None else max(weighted, P_FLOOR),
        }
        p, log_p = combined.p_value, combined.log_p_value
    result.p_value, result.log10_p_value = reported_p(log_p) if p < P_FLOOR else (p, None)
    result.watermarked = result.p_value <= alpha
