"""How the evaluation scores and decides detections: the ROC scores (z, or ``-log10 p`` of the
exact p-value), the share of texts flagged at a stated alpha, and generation statistics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MISSING_SCORE = -1000.0
"""The ROC score of a text too short to score: below every real z."""


def roc_score(det: dict) -> float:
    """The detector's z; a text without one ranks below every real z."""
    z = det.get("z_score")
    return MISSING_SCORE if z is None else float(z)


def exact_score(det: dict) -> float:
    """``-log10 p`` of the key-randomisation p-value; a text without one ranks below all."""
    p = det.get("p_value")
    if p is None:
        return -1.0
    # Equal p-values reached by different sums differ in the last bits (0.3686224489795918
    # against 0.36862244897959173); rounding makes them tie, as equal evidence should.
    return -math.log10(max(float(f"{float(p):.12g}"), 1e-300))


ALPHAS = (0.01, 0.05)


def flagged_at_alpha(positives: list[dict], negatives: list[dict]) -> dict:
    """The decision a user makes: the share of texts with ``p_value <= alpha``, watermarked
    (TPR) and human (FPR), at each of ``ALPHAS``; a text without a p-value is not flagged. With
    several evaluation keys, also per key (each key's own texts) with the mean and the worst key.
    Either list may be empty (its shares are then ``None``).
    """

    def share(records: list[dict], alpha: float) -> float | None:
        if not records:
            return None
        hits = [r.get("p_value") is not None and r["p_value"] <= alpha for r in records]
        return float(np.mean(hits))

    keys = sorted({r.get("key_index", 0) for r in positives + negatives})
    out: dict[str, Any] = {}
    for alpha in ALPHAS:
        entry: dict[str, Any] = {"tpr": share(positives, alpha), "fpr": share(negatives, alpha)}
        if len(keys) > 1:
            per_key = [
                share([r for r in positives if r.get("key_index", 0) == k], alpha) for k in keys
            ]
            per_key_fpr = [
                share([r for r in negatives if r.get("key_index", 0) == k], alpha) for k in keys
            ]
            tprs = [x for x in per_key if x is not None]
            fprs = [x for x in per_key_fpr if x is not None]
            entry["tpr_per_key"] = per_key
            entry["fpr_per_key"] = per_key_fpr
            entry["tpr_mean_over_keys"] = float(np.mean(tprs)) if tprs else None
            entry["tpr_worst_key"] = float(min(tprs)) if tprs else None
            entry["fpr_mean_over_keys"] = float(np.mean(fprs)) if fprs else None
            entry["fpr_worst_key"] = float(max(fprs)) if fprs else None
        out[str(alpha)] = entry
    return out


def generation_stats(records) -> dict:
    """Cost of an algorithm's generations, from their records."""
    records = list(records)
    sentences = sum(r.get("num_sentences", 0) for r in records)
    candidates = sum(r.get("candidates", 0) for r in records)
    return {
        "candidates_per_sentence": candidates / sentences if sentences else None,
        "margin_rejection_share": (
            sum(r.get("rejected_margin", 0) for r in records) / candidates if candidates else None
        ),
        "fallbacks": sum(r.get("fallbacks", 0) for r in records),
        "ended_by_model": sum(bool(r.get("ended_by_model")) for r in records),
        "mean_tokens": float(sum(r.get("num_tokens", 0) for r in records) / max(1, len(records))),
        "decoded_per_token": (
            sum(r.get("decoded_tokens", 0) for r in records) / tokens
            if (tokens := sum(r.get("num_tokens", 0) for r in records))
            and all("decoded_tokens" in r for r in records)
            else None
        ),
    }


def detection_entry(
    name: str,
    positives: dict[str, dict],
    negatives: dict[str, dict],
    attacked: dict[str, dict] | None,
    rank_by_exact: bool,
) -> dict[str, Any]:
    """AUROC and TPRs of one variant's detections against the human ones, by z (and by the
    exact p-value when ``rank_by_exact``), its decisions at alpha and its attack's summary."""
    from .metrics import detection_metrics
    from .rewrite import attack_summary

    ids, human = sorted(positives), sorted(negatives)
    labels = [1] * len(ids) + [0] * len(human)
    scores = [roc_score(positives[i]) for i in ids] + [roc_score(negatives[i]) for i in human]
    entry = detection_metrics(scores, labels)
    entry["kind"] = "none" if name == "none" else "edit" if attacked is None else "attack"
    if rank_by_exact:
        exact = [exact_score(positives[i]) for i in ids] + [
            exact_score(negatives[i]) for i in human
        ]
        entry["exact"] = {k: v for k, v in detection_metrics(exact, labels).items() if k != "roc"}
    # Every algorithm decided by its own p-value (labelled in results["statistics"]).
    entry["at_alpha"] = flagged_at_alpha([positives[i] for i in ids], [negatives[i] for i in human])
    if attacked is not None:
        entry.update(attack_summary(list(attacked.values())))
    return entry
