"""Where a paraphrase takes the direction mark's evidence, measured on an evaluation run.

For each attacked text of a ``direction``-mark run whose attack kept the number of sentences
(so that sentence ``t`` of the attacked text is the paraphrase of sentence ``t``), a sentence's
evidence after the attack is its attacked vector projected on the direction of its attacked
context. Two things can lose it: the projection itself (the paraphrase moves the sentence's own
embedding) and the context (the paraphrase moves the *previous* sentence, and with it the
direction the sentence is scored on). ``attribute`` separates the two by scoring the attacked
vectors on the clean text's contexts, and measures how much of the context a paraphrase keeps
at several context temperatures (``WatermarkScheme.context_weights``): the mean over sentences
of ``a . a'``, the clean and attacked context weights of a sentence.

It also gives a first estimate of the power a temperature would have, from the same texts:
each sentence keeps its clean score (a candidate chosen for a soft context's direction is
assumed to score as high on it as one chosen for a region's direction does on that), its
attacked score on the clean context is scaled by ``a . a'``, and both sums are divided by the
exact statistic's own normaliser under that temperature. The estimate ignores the noise of the
part of the context a paraphrase does not keep; a generation under that temperature is the test.

    python -m research.study attribution --eval-config docs/evaluation/confirm-run.yaml \\
        --algorithm ksemstamp --output research/study/attribution.json

``region_agreement`` adds, for every watermarked algorithm of the run, how often an attacked
sentence keeps its region and its transition: the quantities the region mark lives on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ksemstamp.config import build_scheme, load_settings_file
from ksemstamp.detection.stats import context_sums, direction_z
from ksemstamp.evaluation.settings import EvalSettings
from ksemstamp.jsonl import read_jsonl_objects
from ksemstamp.scheme import soft_context_weights

TEMPERATURES = (0.0, 0.02, 0.03, 0.05, 0.07, 0.1)
Z_AT_1_PERCENT = 2.3263478740408408


def _z(vectors: np.ndarray, weights: np.ndarray, total: float) -> float:
    """``total`` over the exact statistic's normaliser for these vectors and context weights."""
    sums = context_sums(vectors, weights)[1]
    return total / math.sqrt(float((sums**2).sum()))


def attribute(
    eval_config: str | Path,
    algorithm: str = "ksemstamp",
    temperatures: Sequence[float] = TEMPERATURES,
) -> dict[str, Any]:
    """Per attack of the run, the evidence a paraphrase keeps and where it loses the rest.

    Reads the run folder of ``eval_config`` (prompts, generations, attacks, the human
    detections for each prompt's key index); the key is rebuilt as the evaluation builds it
    (``$KSEMSTAMP_KEY``)."""
    settings = EvalSettings(**load_settings_file(eval_config))
    run = Path(settings.output_dir)
    prompts = {r["id"]: r for r in read_jsonl_objects(run / "prompts.jsonl")}
    clean = {r["id"]: r for r in read_jsonl_objects(run / "generations" / f"{algorithm}.jsonl")}
    keys = {
        r["id"]: r.get("key_index", 0)
        for r in read_jsonl_objects(run / "detections" / f"{algorithm}.none.jsonl")
    }
    schemes: dict[int, Any] = {}

    def scheme_for(key_index: int):
        if key_index not in schemes:
            cfg = settings.watermark_config(algorithm, key_index)
            if cfg.mark.kind != "direction":
                raise ValueError(f"{algorithm} does not use the direction mark")
            encoder = next(iter(schemes.values())).encoder if schemes else None
            schemes[key_index] = build_scheme(cfg, encoder=encoder)
        return schemes[key_index]

    out: dict[str, Any] = {"eval_config": str(eval_config), "algorithm": algorithm, "attacks": {}}
    for attack in settings.attacks:
        name = attack["name"]
        path = run / "attacks" / f"{algorithm}.{name}.jsonl"
        if not path.exists():
            continue
        texts = aligned = 0
        agree, z_actual, z_kept, s_clean, s_attacked = [], [], [], [], []
        proxy: dict[float, dict[str, list[float]]] = {
            t: {"clean": [], "attacked": [], "context": []} for t in temperatures
        }
        for record in read_jsonl_objects(path):
            rid = record["id"]
            if rid not in clean or clean[rid].get("status", "ok") != "ok":
                continue
            scheme = scheme_for(keys.get(rid, 0))
            texts += 1
            seed = scheme.splitter.split(prompts[rid]["prompt"])[-1:]
            before = scheme.splitter.split(clean[rid]["text"])
            after = scheme.splitter.split(record["text"])
            if len(before) != len(after) or not seed or not before:
                continue
            aligned += 1
            e_before = scheme.embed(seed + before)
            e_after = scheme.embed(seed + after)
            v_before = scheme.vectors(e_before[1:]).double().numpy()
            v_after = scheme.vectors(e_after[1:]).double().numpy()
            c_before = scheme.locate(e_before)[0][:-1].numpy()
            c_after = scheme.locate(e_after)[0][:-1].numpy()
            directions = scheme.directions.double().numpy()
            agree.append(float(np.mean(c_before == c_after)))
            z_actual.append(direction_z(v_after, c_after, directions))
            z_kept.append(direction_z(v_after, c_before, directions))
            clean_scores = (v_before * directions[c_before]).sum(axis=1)
            kept_scores = (v_after * directions[c_before]).sum(axis=1)
            s_clean.append(float(clean_scores.mean()))
            s_attacked.append(float(kept_scores.mean()))
            for t in temperatures:
                w_before, w_after = (_weights(scheme, e[:-1], t) for e in (e_before, e_after))
                rho = (w_before * w_after).sum(axis=1)
                proxy[t]["context"].append(float(rho.mean()))
                proxy[t]["clean"].append(_z(v_before, w_before, float(clean_scores.sum())))
                proxy[t]["attacked"].append(_z(v_after, w_after, float((rho * kept_scores).sum())))

        def power(z: list[float]) -> float | None:
            return float(np.mean(np.array(z) >= Z_AT_1_PERCENT)) if z else None

        out["attacks"][name] = {
            "texts": texts,
            "aligned": aligned,
            "region_agreement_of_context": float(np.mean(agree)) if agree else None,
            "mean_sentence_score": {
                "clean": _mean(s_clean),
                "attacked_on_clean_context": _mean(s_attacked),
            },
            "power_at_1pct": {
                "attacked": power(z_actual),
                "attacked_on_clean_contexts": power(z_kept),
            },
            "mean_z": {"attacked": _mean(z_actual), "attacked_on_clean_contexts": _mean(z_kept)},
            "temperatures": {
                str(t): {
                    "context_kept": _mean(p["context"]),
                    "estimated_mean_z_clean": _mean(p["clean"]),
                    "estimated_mean_z_attacked": _mean(p["attacked"]),
                    "estimated_power_clean": power(p["clean"]),
                    "estimated_power_attacked": power(p["attacked"]),
                }
                for t, p in proxy.items()
            },
        }
    return out


def region_agreement(eval_config: str | Path) -> dict[str, Any]:
    """Per watermarked algorithm and attack of the run: how often an attacked sentence keeps
    its region (all sentences, and those that passed the margin), and its transition (its
    region and its previous sentence's), under that algorithm's own partition (key-free).
    Texts whose attack kept the number of sentences."""
    settings = EvalSettings(**load_settings_file(eval_config))
    run = Path(settings.output_dir)
    prompts = {r["id"]: r for r in read_jsonl_objects(run / "prompts.jsonl")}
    out: dict[str, Any] = {}
    encoder = None
    for algorithm in settings.algorithms:
        if algorithm in ("none", "kgw"):
            continue
        scheme = build_scheme(settings.watermark_config(algorithm), encoder=encoder)
        encoder = scheme.encoder
        clean = {r["id"]: r for r in read_jsonl_objects(run / "generations" / f"{algorithm}.jsonl")}
        for attack in settings.attacks:
            path = run / "attacks" / f"{algorithm}.{attack['name']}.jsonl"
            if not path.exists():
                continue
            own, margin_own, transition = [], [], []
            for record in read_jsonl_objects(path):
                before = scheme.splitter.split(clean[record["id"]]["text"])
                after = scheme.splitter.split(record["text"])
                seed = scheme.splitter.split(prompts[record["id"]]["prompt"])[-1:]
                if len(before) != len(after) or not seed or not before:
                    continue
                r_before, ok = (x.numpy() for x in scheme.regions(seed + before))
                r_after = scheme.regions(seed + after)[0].numpy()
                kept = r_before == r_after
                own += kept[1:].tolist()
                margin_own += kept[1:][ok[1:]].tolist()
                transition += (kept[1:] & kept[:-1]).tolist()
            out.setdefault(algorithm, {})[attack["name"]] = {
                "sentences": len(own),
                "region_kept": _mean(own),
                "region_kept_margin_passing": _mean(margin_own),
                "transition_kept": _mean(transition),
            }
    return out


def _weights(scheme, emb: torch.Tensor, temperature: float) -> np.ndarray:
    if temperature == 0:
        return scheme.region_weights(scheme.locate(emb)[0]).numpy()
    return soft_context_weights(emb, scheme.partition.centroids, temperature).numpy()


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def markdown(result: dict[str, Any]) -> str:
    """The tables of an ``attribute`` result."""
    lines = [
        f"Run: `{result['eval_config']}`, algorithm `{result['algorithm']}`. Texts whose attack "
        "kept the number of sentences; exact test at alpha 1%.",
        "",
        "| attack | texts (aligned) | context region kept | sentence score clean / attacked "
        "| power attacked | power attacked, clean contexts |",
        "|---|---|---|---|---|---|",
    ]
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for name, a in result["attacks"].items():
        s = a["mean_sentence_score"]
        lines.append(
            f"| {name} | {a['texts']} ({a['aligned']}) | {f(a['region_agreement_of_context'])} "
            f"| {f(s['clean'])} / {f(s['attacked_on_clean_context'])} "
            f"| {f(a['power_at_1pct']['attacked'])} "
            f"| {f(a['power_at_1pct']['attacked_on_clean_contexts'])} |"
        )
    lines += [
        "",
        "| attack | temperature | context kept | est. mean z clean / attacked "
        "| est. power clean / attacked |",
        "|---|---|---|---|---|",
    ]
    for name, a in result["attacks"].items():
        for t, r in a["temperatures"].items():
            lines.append(
                f"| {name} | {t} | {f(r['context_kept'])} "
                f"| {f(r['estimated_mean_z_clean'])} / {f(r['estimated_mean_z_attacked'])} "
                f"| {f(r['estimated_power_clean'])} / {f(r['estimated_power_attacked'])} |"
            )
    if result.get("region_agreement"):
        lines += [
            "",
            "Region agreement (each algorithm's own partition, key-free):",
            "",
            "| algorithm | attack | sentences | region kept (all / margin-passing) "
            "| transition kept |",
            "|---|---|---|---|---|",
        ]
        for algorithm, attacks in result["region_agreement"].items():
            for name, r in attacks.items():
                lines.append(
                    f"| {algorithm} | {name} | {r['sentences']} "
                    f"| {f(r['region_kept'])} / {f(r['region_kept_margin_passing'])} "
                    f"| {f(r['transition_kept'])} |"
                )
    return "\n".join(lines) + "\n"


def run_attribution(eval_config: str, algorithm: str, output: str) -> Path:
    """Write ``attribute``'s JSON to ``output`` and its tables beside it (``.md``)."""
    torch.set_grad_enabled(False)
    result = attribute(eval_config, algorithm)
    result["region_agreement"] = region_agreement(eval_config)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(result))
    return path
