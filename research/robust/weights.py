"""Would the detector gain from weighting its sentences? (research only)

The whole-text z sums the sentences' scores. Any key-free weights ``w`` (a function of the text,
never of the key) give another exact test: over random keys ``w . s`` is normal with mean 0 and
variance ``w^T C w`` (``C`` the scores' null covariance, ``scan.score_covariance``), so
``z_w = w . s / sqrt(w^T C w)`` is a standard normal for any text that does not depend on the key.
Two families are measured on an evaluation run's own texts (each text under its own key):

* generalised least squares with shrinkage, ``w = (C + lam I)^-1 1``: correlated sentences
  (one topic, one region) count once; ``lam -> inf`` is the shipped sum, ``lam -> 0`` full GLS;
* sentence length, ``w_t = words_t^b``: longer sentences might keep more of their score under a
  paraphrase.

Last, the detector's combined p-value (``scan.combined_test``) is computed without its
weighted test (whole text, span, mixture: the detector before it had one) and with it as
shipped (``combined_p``): does the weighted test keep the text three quarters human, whose human
sentences are the correlated ones, without losing the paraphrase?

    KSEMSTAMP_KEY=robust-run python -m research.robust.weights [--run runs/eval-robust]

The table goes to ``runs/robust/weights.md`` (and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np
from scipy.stats import norm

from ksemstamp.builders import build_detector
from ksemstamp.detection import scan
from ksemstamp.detection.scan import score_covariance
from ksemstamp.evaluation.settings import EvalSettings
from ksemstamp.settings_files import load_settings_file

from .common import RUNS, read_jsonl

ALPHA = 0.01
SHRINKAGE = (None, 3.0, 1.0, 0.3, 0.1)
"""``lam`` of the GLS weights in units of the mean null variance; ``None``: the shipped sum."""
LENGTH_POWERS = (0.5, 1.0)
COMBINED_SHRINKAGE = (None, scan.GLS_SHRINKAGE)
"""The combined p-value without the weighted test (``None``) and with it, as shipped."""
SOURCES = {
    "clean": "generations/ksemstamp.jsonl",
    "lm-paraphrase": "attacks/ksemstamp.lm-paraphrase.jsonl",
    "lm-paraphrase-2": "attacks/ksemstamp.lm-paraphrase-2.jsonl",
    "lm-rewrite": "attacks/ksemstamp.lm-rewrite.jsonl",
    "lm-bigram": "attacks/ksemstamp.lm-bigram.jsonl",
    "interleave-75": "edits/ksemstamp.interleave-75.jsonl",
}


def weighted_z(scores: np.ndarray, cov: np.ndarray, weights: np.ndarray) -> float:
    """The exact z of the weighted score sum (see the module docstring)."""
    return float(weights @ scores / np.sqrt(weights @ cov @ weights))


def gls_weights(cov: np.ndarray, lam: float | None) -> np.ndarray:
    """``(C + lam mean(diag C) I)^-1 1``; all ones for ``lam`` ``None`` (the shipped sum)."""
    n = len(cov)
    if lam is None:
        return np.ones(n)
    return np.linalg.solve(cov + lam * float(np.mean(np.diag(cov))) * np.eye(n), np.ones(n))


def combined_p(scores: np.ndarray, cov: np.ndarray, seed: bytes, lam: float | None) -> float:
    """The detector's combined p-value (``scan.combined_test``) with the weighted test at
    shrinkage ``lam``, or without it for ``lam`` ``None`` (whole text, span and mixture only)."""
    p_text = float(norm.sf(scores.sum() / np.sqrt(cov.sum())))
    result = scan.combined_test(scores, cov, p_text, seed, shrinkage=lam)
    return p_text if result is None else result.p_value


def effective_sentences(cov: np.ndarray) -> tuple[float, float]:
    """Effective sentences of a text under the sum (``N^2 / 1'R1``) and under full GLS
    (``1'R^-1 1``), ``R`` the scores' null correlation."""
    sd = np.sqrt(np.diag(cov))
    r = cov / np.outer(sd, sd)
    ones = np.ones(len(cov))
    return len(cov) ** 2 / float(r.sum()), float(ones @ np.linalg.solve(r, ones))


def scored_texts(
    detectors: list, key_of: dict[str, int], prompt_of: dict[str, str], name: str, texts: dict
) -> list[dict]:
    """Each text's scores, null covariance and sentence lengths under its prompt's key
    (``detectors[k]`` is key ``k``'s)."""
    out = []
    for k, det in enumerate(detectors):
        mine = [i for i in texts if key_of.get(i) == k]
        if not mine:
            continue
        plans = det.plan_batch([texts[i] for i in mine], [prompt_of[i] for i in mine])
        for i, plan in zip(mine, plans, strict=True):
            rows = plan.scored_contexts()[0] if plan.error is None else []
            if not rows:
                continue
            ctx = plan.context_weights(rows)
            vectors = plan.vectors[rows]
            out.append(
                {
                    "id": i,
                    "key_index": k,
                    "scores": det.scheme.scores(vectors, ctx).double().numpy(),
                    "cov": score_covariance(ctx.double().numpy(), vectors.double().numpy()),
                    "words": np.array([len(plan.sentences[t].split()) for t in rows], float),
                }
            )
    print(f"{name}: {len(out)} texts", flush=True)
    return out


def p_row(records: list[dict], lam: float | None) -> dict:
    """Share at ``ALPHA`` and its worst key of the combined p-value (``combined_p``)."""
    p = np.array([combined_p(r["scores"], r["cov"], r["id"].encode(), lam) for r in records])
    keys = np.array([r["key_index"] for r in records])
    hit = p <= ALPHA
    z = np.array([weighted_z(r["scores"], r["cov"], np.ones(len(r["scores"]))) for r in records])
    return {
        "median_z": float(np.median(z)),
        "rate": float(hit.mean()),
        "worst_key": float(min(hit[keys == k].mean() for k in set(keys.tolist()))),
    }


def row(records: list[dict], weights) -> dict:
    """Median z, share at ``ALPHA`` and its worst key, for one choice of weights."""
    z = np.array([weighted_z(r["scores"], r["cov"], weights(r)) for r in records])
    keys = np.array([r["key_index"] for r in records])
    hit = z >= norm.isf(ALPHA)
    return {
        "median_z": float(np.median(z)),
        "rate": float(hit.mean()),
        "worst_key": float(min(hit[keys == k].mean() for k in set(keys.tolist()))),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, default=Path("runs/eval-robust"))
    p.add_argument("--config", default="docs/evaluation/robust-run.yaml")
    args = p.parse_args()
    os.environ.setdefault("KSEMSTAMP_KEY", "robust-run")
    settings = EvalSettings(**load_settings_file(args.config))
    table: dict[str, dict] = {}
    data: dict[str, list[dict]] = {}
    order = read_jsonl(str(args.run / "prompts.jsonl"))
    prompts = {q["id"]: q for q in order}
    key_of = {q["id"]: i % settings.num_keys for i, q in enumerate(order)}
    prompt_of = {i: q["prompt"] for i, q in prompts.items()}
    detectors: list = []
    for k in range(settings.num_keys):  # one encoder for all keys
        encoder = detectors[0].scheme.encoder if detectors else None
        detectors.append(build_detector(settings.watermark_config("ksemstamp", k), encoder=encoder))
    for name, path in SOURCES.items():
        if (args.run / path).exists():
            texts = {r["id"]: r["text"] for r in read_jsonl(str(args.run / path))}
            if texts:  # an attack the run has started but not yet written to
                data[name] = scored_texts(detectors, key_of, prompt_of, name, texts)
    human = {i: prompts[i]["human"] for i in (r["id"] for r in data["clean"])}
    data["human"] = scored_texts(detectors, key_of, prompt_of, "human", human)
    for name, records in data.items():
        entry = {"texts": len(records)}
        for lam in SHRINKAGE:
            entry[f"gls {lam}"] = row(records, lambda r, lam=lam: gls_weights(r["cov"], lam))
        for b in LENGTH_POWERS:
            entry[f"words^{b}"] = row(records, lambda r, b=b: r["words"] ** b)
        for lam in COMBINED_SHRINKAGE:
            entry[f"combined {lam}"] = p_row(records, lam)
        table[name] = entry
    eff = [effective_sentences(r["cov"]) for r in data["clean"]]
    summary = {
        "scored_median": statistics.median(len(r["scores"]) for r in data["clean"]),
        "effective_sum_median": statistics.median(a for a, _ in eff),
        "effective_gls_median": statistics.median(b for _, b in eff),
    }
    cols = [f"gls {lam}" for lam in SHRINKAGE] + [f"words^{b}" for b in LENGTH_POWERS]
    cols += [f"combined {lam}" for lam in COMBINED_SHRINKAGE]
    lines = [
        "| texts | n | "
        + " | ".join(
            c.replace("gls None", "sum (shipped)")
            .replace("combined None", "three tests")
            .replace(f"combined {scan.GLS_SHRINKAGE}", "four tests (shipped)")
            for c in cols
        )
        + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for name, entry in table.items():
        cells = [
            f"{entry[c]['rate']:.2f} ({entry[c]['worst_key']:.2f}), z {entry[c]['median_z']:.2f}"
            for c in cols
        ]
        lines.append(f"| {name} | {entry['texts']} | " + " | ".join(cells) + " |")
    lines.append(
        f"\nClean texts: median {summary['scored_median']} scored sentences, "
        f"{summary['effective_sum_median']:.1f} effective under the sum, "
        f"{summary['effective_gls_median']:.1f} under full GLS."
    )
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / "weights.md").write_text("\n".join(lines) + "\n")
    (RUNS / "weights.json").write_text(json.dumps({"rows": table, **summary}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
