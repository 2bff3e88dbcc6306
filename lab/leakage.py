"""How much of the key a design's texts give away, and whether they repeat themselves.

    python -m lab leakage --names plain24,c032k12,w050 --output docs/evaluation/steering/leakage

An attacker who holds a key's watermarked texts and the public encoder and centroids (both
key-free) can estimate each region's keyed direction as the normalised sum of the scored units'
vectors, each weighted by its context weight on that region. This reads the texts of every check
named (``runs/lab/check-NAME/generations.jsonl``, on the prompts all of them generated), makes
that estimate from each key's texts and reports its cosine to the key's true direction, averaged
over the regions by the weight the texts put on each (0 is a guess, 1 the key itself). The
unwatermarked check is the estimate's null: what the same number of unmarked units gives.

Beside it, per text: the mean score of its units on the true directions (in the null's standard
deviations: the evidence the estimate feeds on), the share of its word 3-grams that repeat an earlier one, and its distinct
word 2-grams over all of them (lower: more repetitive).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from ksemstamp import WatermarkSettings, build_detector

from .check import KEYS, RUNS, read_jsonl


def estimate_directions(vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(K, D)`` unit-norm estimates of the keyed directions from ``(M, D)`` unit vectors and
    their ``(M, K)`` context weights (a region no unit weighs is all zeros)."""
    sums = weights.double().T @ vectors.double()
    return torch.nn.functional.normalize(sums, dim=-1)


def alignment(estimated: torch.Tensor, true: torch.Tensor, mass: torch.Tensor) -> float:
    """The mean cosine of ``estimated`` to ``true`` directions (any norm) over the regions,
    weighted by ``mass`` (the context weight the units put on each region)."""
    true = torch.nn.functional.normalize(true.double(), dim=-1)
    cosines = (estimated.double() * true).sum(dim=-1)
    mass = mass.double()
    return float((cosines * mass).sum() / mass.sum())


def repetition(text: str) -> tuple[float, float]:
    """``(repeated, distinct)``: the share of a text's word 3-grams that repeat an earlier one,
    and its distinct word 2-grams over all of them."""
    words = text.lower().split()
    trigrams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    bigrams = [tuple(words[i : i + 2]) for i in range(len(words) - 1)]
    seen: set = set()
    repeated = 0
    for gram in trigrams:
        repeated += gram in seen
        seen.add(gram)
    return (
        repeated / len(trigrams) if trigrams else 0.0,
        len(set(bigrams)) / len(bigrams) if bigrams else 1.0,
    )


def _units(detector, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The scored units' vectors and context weights of ``rows`` and each text's unit count."""
    plans = detector.plan_batch([r["text"] for r in rows], [r["prompt"] for r in rows])
    vectors, weights, counts = [], [], []
    for plan in plans:
        data = plan.data
        index = torch.tensor([t for t, scored in enumerate(plan.scored) if scored])
        vectors.append(data.vectors[index])
        weights.append(data.weights[index + int(data.own)])
        counts.append(len(index))
    return torch.cat(vectors), torch.cat(weights), counts


def measure(detector, rows: list[dict]) -> dict:
    """One check's figures over its ``rows`` (each with ``key``, ``text`` and ``prompt``)."""
    cosines, scores, units = [], [], 0
    for k in sorted({r["key"] for r in rows}):
        vectors, weights, counts = _units(detector, [r for r in rows if r["key"] == k])
        true = torch.from_numpy(detector.mark.material(KEYS[k])).to(vectors.device)
        estimated = estimate_directions(vectors, weights)
        cosines.append(alignment(estimated, true, weights.double().sum(dim=0)))
        per_unit = ((weights.double() @ true) * vectors.double()).sum(dim=-1)
        scores += [float(chunk.mean()) for chunk in per_unit.split(counts) if len(chunk)]
        units += sum(counts)
    repeated, distinct = zip(*(repetition(r["text"]) for r in rows), strict=True)
    return {
        "texts": len(rows),
        "units": units,
        "cosine_by_key": cosines,
        "cosine": float(np.mean(cosines)),
        "mean_unit_score": float(np.median(scores)),
        "repeated_trigrams": float(np.mean(repeated)),
        "distinct_bigrams": float(np.mean(distinct)),
    }


def markdown(rows: dict[str, dict]) -> str:
    head = [
        "check",
        "texts (units)",
        "estimate's cosine to the key: mean (per key)",
        "median unit score",
        "repeated 3-grams",
        "distinct 2-grams",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        keys = ", ".join(f"{c:.3f}" for c in r["cosine_by_key"])
        cells = [
            f"`{name}`",
            f"{r['texts']} ({r['units']})",
            f"{r['cosine']:.3f} ({keys})",
            f"{r['mean_unit_score']:.3f}",
            f"{r['repeated_trigrams']:.3f}",
            f"{r['distinct_bigrams']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def leakage(names: list[str], output: str) -> int:
    """The key's directions as estimated from each check's texts, and their repetition.

    Args:
        names: the checks, in the table's order (an unwatermarked one is the null).
        output: the folder for leakage.md and leakage.json.
    """
    checks = {}
    for name in names:
        path = RUNS / f"check-{name}" / "generations.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{path}: run `python -m lab check --run.name {name}` first")
        checks[name] = {r["id"]: r for r in read_jsonl(path) if r["status"] == "ok"}
    shared = set.intersection(*(set(rows) for rows in checks.values()))
    settings = dataclasses.replace(WatermarkSettings(), key=KEYS[0], allow_weak_key=True)
    detector = build_detector(settings)
    table = {
        name: measure(detector, [rows[i] for i in sorted(shared)]) for name, rows in checks.items()
    }
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    text = markdown(table)
    (folder / "leakage.md").write_text(text)
    (folder / "leakage.json").write_text(json.dumps(table, indent=1) + "\n")
    print(text, end="")
    return 0
