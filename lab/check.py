"""The design check: a design's texts generated on held-out prompts, attacked, detected.

    python -m lab check --run.name base --run.prompts 24
    python -m lab check --run.name c128 --run.prompts 12 --search.max_candidates 128 \
        --search.candidate_batch 128 --search.prune_keep 32 [--sampling.temperature 0.9]
    python -m lab check --run.name c128 --run.attack rewrite      # every window rewritten
    python -m lab check --run.name plain --run.plain              # the same sampler, no mark
    python -m lab check --run.name kgw --run.kgw --run.attack rewrite  # the token baseline
    python -m lab compare --first base --second c128              # paired by prompt

The first ``run.prompts`` ``val``-split news prompts (cut as the evaluation cuts its test-split
prompts) are generated under ``KEYS`` (prompt ``i`` under key ``i mod 3``) with the settings of
``lab/check.yaml`` and the command line (``--group.field``, as every command), attacked by one
of the evaluation's Gemma-3-270M attacks (``ATTACKS``), scored by the evaluation's perplexity
oracle, and detected; the share detected at an exact 1% (and per key), the median z and the
effective share of units, clean and under every attack run so far, go to ``summary.json``.
Everything is kept under ``runs/lab/check-NAME/`` and a rerun resumes. ``--run.plain`` runs the
same sampler unwatermarked (the perplexity a design is held to; its texts are not attacked);
``--run.kgw`` generates, attacks and detects KGW texts on the same prompts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from ksemstamp import WatermarkSettings, build_detector, build_watermarker
from ksemstamp.experimental import (
    EDITS,
    EvalSettings,
    KGWDetector,
    KGWGenerator,
    Oracle,
    apply_edit,
    build_attack,
    build_prompts,
    get_splitter,
    load_encoder,
    load_lm,
    needs_human,
    news_articles,
)

RUNS = Path("runs/lab")
KEYS = ("robust-check-key-0", "robust-check-key-1", "robust-check-key-2")
ALPHA = 0.01
PARAPHRASE = {
    "name": "lm-paraphrase",
    "paraphraser": "lm",
    "model": "gemma3-270m",
    "prompts": "reword",
    "num_candidates": 4,
    "select": "best",
}
ATTACKS = {
    # name -> (the attack's settings, the texts it attacks, its file, its variant)
    "reword": (PARAPHRASE, "clean", "attacked.jsonl", "attacked"),
    "rewrite": (
        {
            "name": "lm-rewrite",
            "paraphraser": "lm-rewrite",
            "model": "gemma3-270m",
            "num_candidates": 4,
            "window": [2, 4],
            "similarity_bound": 0.75,
            "max_overlap": 0.8,
            "every_window": True,
        },
        "clean",
        "attacked-rewrite.jsonl",
        "rewrite",
    ),
    "recursive": (PARAPHRASE, "attacked", "attacked-recursive.jsonl", "recursive"),
    "bigram": (
        {**PARAPHRASE, "name": "lm-bigram", "num_candidates": 8, "select": "bigram"}
        | {"similarity_bound": 0.75},
        "clean",
        "attacked-bigram.jsonl",
        "bigram",
    ),
    "fewshot": (
        {**PARAPHRASE, "name": "lm-paraphrase-fewshot", "prompts": "few-shot"},
        "clean",
        "attacked-fewshot.jsonl",
        "fewshot",
    ),
}


@dataclass(frozen=True)
class CheckSettings:
    """One design check."""

    name: str = "base"
    """Its folder: ``runs/lab/check-NAME``."""
    prompts: int = 24
    """Held-out ``val`` prompts, spread over the three keys."""
    attack: Literal["reword", "rewrite", "recursive", "bigram", "fewshot"] = "reword"
    """The attack this run adds (``recursive``: the paraphrase again, over ``reword``'s)."""
    stage: Literal["all", "generate", "attack", "detect", "edits"] = "all"
    """Stop after generating or attacking, only detect what is there, or detect every edit
    without an LM (``edits``: reorder, crop, interleavings with human sentences, ...)."""
    plain: bool = False
    """The same sampler unwatermarked (perplexity baseline; not attacked)."""
    kgw: bool = False
    """KGW texts (the evaluation's baseline) instead of the design's."""


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def val_prompts(count: int, words: int = 32) -> list[dict]:
    """The first ``count`` ``val``-split prompts, kept in ``runs/lab/val-prompts.jsonl`` so that
    every check reads the same ones."""
    path = RUNS / "val-prompts.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    if len(rows) < count:
        settings = EvalSettings(num_prompts=count, prompt_words=words)
        rows = [
            {"id": row["id"], "prompt": row["prompt"]}
            for row in build_prompts(settings, lambda text: len(text.split()), split="val")
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows[:count]


def append(path: Path, rows: list[dict]) -> None:
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def keyed(settings: WatermarkSettings, k: int) -> WatermarkSettings:
    """The check's settings under its ``k``-th key."""
    return dataclasses.replace(settings, key=KEYS[k], allow_weak_key=True)


def generate(settings: WatermarkSettings, run: CheckSettings, prompts: list[dict], path: Path):
    """Generate the prompts ``path`` does not hold yet, four at a time, appending as it goes."""
    done = {r["id"] for r in read_jsonl(path)} if path.exists() else set()
    order = {q["id"]: i for i, q in enumerate(prompts)}
    todo = [q for q in prompts if q["id"] not in done]
    if run.kgw:
        lm = load_lm(settings.model.lm, settings.model.device, settings.model.lm_dtype)
        kgw = KGWGenerator(*lm, sampling=settings.sampling)
        for start in range(0, len(todo), 4):
            chunk = todo[start : start + 4]
            texts = kgw.generate([q["prompt"] for q in chunk])
            append(path, [_row(q, order, r) for q, r in zip(chunk, texts, strict=True)])
        return
    lm = None
    for k in range(len(KEYS)):
        mine = [q for q in todo if order[q["id"]] % len(KEYS) == k]
        if not mine:
            continue
        lm = lm or load_lm(settings.model.lm, settings.model.device, settings.model.lm_dtype)
        watermarker = build_watermarker(keyed(settings, k), lm=lm)
        for start in range(0, len(mine), 4):
            chunk = mine[start : start + 4]
            results = watermarker.generate([q["prompt"] for q in chunk], watermark=not run.plain)
            append(
                path,
                [_row(q, order, r.to_record()) for q, r in zip(chunk, results, strict=True)],
            )


def _row(prompt: dict, order: dict[str, int], record: dict) -> dict:
    index = order[prompt["id"]]
    return {"id": prompt["id"], "key": index % len(KEYS), "prompt": prompt["prompt"], **record}


def attack(out: Path, name: str, generations: list[dict], device: str) -> None:
    """Attack every generated text (or, for ``recursive``, its paraphrase) that ``name``'s
    file does not hold yet, four at a time, appending as it goes."""
    spec, source, file, _ = ATTACKS[name]
    path = out / file
    have = {r["id"] for r in read_jsonl(path)} if path.exists() else set()
    if source == "clean":
        texts = {g["id"]: g["text"] for g in generations}
    else:
        texts = {r["id"]: r["text"] for r in read_jsonl(out / ATTACKS["reword"][2])}
    todo = [(i, t) for i, t in texts.items() if i not in have]
    if not todo:
        return
    attacker = build_attack(
        spec,
        load_lm("gemma3-270m", device),
        load_encoder("all-mpnet-base-v2", device),
        get_splitter(),
    )
    for start in range(0, len(todo), 4):
        chunk = todo[start : start + 4]
        results = attacker([t for _, t in chunk])
        # A sentence attack reports its sentences' mean similarity; the rewrite its windows'.
        rows = [
            {
                "id": i,
                "text": r.text,
                "similarity": getattr(r, "sentence_similarity", None)
                or getattr(r, "window_similarity", None),
            }
            for (i, _), r in zip(chunk, results, strict=True)
        ]
        append(path, rows)


def perplexity(
    out: Path, generations: list[dict], device: str, compute: bool = True
) -> dict[str, dict]:
    """The evaluation's oracle's perplexity of every text given its prompt, kept in
    ``perplexity.jsonl`` (``compute=False``: only what that file holds, the oracle not loaded)."""
    path = out / "perplexity.jsonl"
    scored = {r["id"]: r for r in read_jsonl(path)} if path.exists() else {}
    todo = [g for g in generations if g["id"] not in scored]
    if todo and compute:
        oracle = Oracle(*load_lm("gemma3-270m", device))
        rows = oracle.score([g["prompt"] for g in todo], [g["text"] for g in todo])
        append(
            path,
            [{"id": g["id"], "perplexity": r.perplexity} for g, r in zip(todo, rows, strict=True)],
        )
        scored = {r["id"]: r for r in read_jsonl(path)}
    return scored


def detectors(settings: WatermarkSettings, run: CheckSettings):
    """Per key index, ``(texts, prompts) -> [(z, p, unit scores or None)]``."""
    if run.kgw:
        model, tokenizer = load_lm(settings.model.lm, settings.model.device)
        kgw = KGWDetector(model.config, tokenizer)

        def detect_kgw(texts, prompts):
            return [(r["z_score"], r["p_value"], None) for r in kgw.detect_batch(texts)]

        return dict.fromkeys(range(len(KEYS)), detect_kgw)
    out = {}
    for k in range(len(KEYS)):
        detector = build_detector(keyed(settings, k))

        def detect(texts, prompts, detector=detector):
            return [
                (r.z_score, r.p_value, [x for x in r.scores if x is not None])
                for r in detector.detect_batch(texts, prompts=prompts)
            ]

        out[k] = detect
    return out


def variant_summary(records: list[dict]) -> dict:
    """Share detected at ``ALPHA`` (overall and under the worst key), median z and the median
    effective share of units (``N_eff / N``: 1 for independent units) of ``records``."""
    p = np.array([r["p"] for r in records])
    keys = np.array([r["key"] for r in records])
    per_key = [float((p[keys == k] <= ALPHA).mean()) for k in sorted(set(keys.tolist()))]
    shares = [r["effective_share"] for r in records if r["effective_share"] is not None]
    return {
        "texts": len(records),
        "detected_1pct": float((p <= ALPHA).mean()),
        "worst_key": min(per_key),
        "median_z": float(np.median([r["z"] for r in records])),
        "median_neff_share": float(np.median(shares)) if shares else None,
    }


def effective_share(z: float, scores: list[float] | None) -> float | None:
    """``N_eff / N`` of a text whose unit scores sum to ``S`` at ``z``: ``N_eff = (S / z)^2``."""
    if not scores or not z:
        return None
    return len(scores) / (sum(scores) / z) ** 2


def detect_all(settings, run, generations, attacked) -> tuple[list[dict], dict]:
    """Every text's detection, clean and under every attack so far, and each variant's
    summary."""
    detect = detectors(settings, run)
    records, summary = [], {}
    for variant in ("clean", *attacked):
        own = attacked.get(variant, {})
        rows = []
        for k in range(len(KEYS)):
            mine = [
                g for g in generations if g["key"] == k and (variant == "clean" or g["id"] in own)
            ]
            if not mine:
                continue
            texts = [g["text"] if variant == "clean" else own[g["id"]]["text"] for g in mine]
            for g, (z, p, scores) in zip(
                mine, detect[k](texts, [g["prompt"] for g in mine]), strict=True
            ):
                if z is None:
                    continue
                rows.append(
                    {
                        "id": g["id"],
                        "key": k,
                        "variant": variant,
                        "z": z,
                        "p": p,
                        "effective_share": effective_share(z, scores),
                        "similarity": own.get(g["id"], {}).get("similarity"),
                    }
                )
        records += rows
        if rows:
            summary[variant] = variant_summary(rows)
    return records, summary


def edits(settings: WatermarkSettings, generations: list[dict]) -> dict:
    """Every edit without an LM on each generated text, detected at an exact 1% (overall and
    worst key); the interleavings take human sentences of ``val`` articles after the prompts'."""
    splitter = get_splitter()
    human = [
        s
        for article in news_articles("val")[200:260]
        for s in splitter.split(article.text)
        if len(s.split()) >= 4
    ]
    detector = {k: build_detector(keyed(settings, k)) for k in range(len(KEYS))}
    out = {}
    for name in EDITS:
        hits, per_key = [], {}
        for k, det in detector.items():
            mine = [g for g in generations if g["key"] == k]
            texts = []
            for i, g in enumerate(mine):
                need = needs_human(name) * len(splitter.split(g["text"]))
                start = (i * 37) % max(1, len(human) - need)
                texts.append(apply_edit(name, g["text"], g["id"], human[start : start + need]))
            found = det.detect_batch(texts, prompts=[g["prompt"] for g in mine]) if mine else []
            mine_hits = [r.p_value is not None and r.p_value <= ALPHA for r in found]
            hits += mine_hits
            if mine_hits:
                per_key[k] = float(np.mean(mine_hits))
        out[name] = {"detected_1pct": float(np.mean(hits)), "worst_key": min(per_key.values())}
    return out


def check(settings: WatermarkSettings, run: CheckSettings) -> int:
    """A design's texts on held-out prompts: generated, attacked and detected.

    Args:
        run: the check's name, size, attack and stage.
    """
    out = RUNS / f"check-{run.name}"
    out.mkdir(parents=True, exist_ok=True)
    prompts = val_prompts(run.prompts)
    wanted = {q["id"] for q in prompts}
    path = out / "generations.jsonl"
    if run.stage in ("all", "generate"):
        generate(settings, run, prompts, path)
    generations = (
        [g for g in read_jsonl(path) if g["status"] == "ok" and g["id"] in wanted]
        if path.exists()
        else []
    )
    device = settings.model.device
    if run.stage in ("all", "attack") and not run.plain:
        attack(out, run.attack, generations, device)
    attacked = {
        variant: {r["id"]: r for r in read_jsonl(out / file)}
        for _, _, file, variant in ATTACKS.values()
        if (out / file).exists()
    }
    # A later stage (edits) keeps the perplexities an earlier one scored in the summary.
    scored = perplexity(out, generations, device, compute=run.stage in ("all", "attack"))
    tokens = max(1, sum(g["num_tokens"] for g in generations))
    summary = {
        "name": run.name,
        "watermarked": "kgw" if run.kgw else not run.plain,
        "settings": settings.to_dict(),
        "texts": len(generations),
        "decoded_per_token": sum(g.get("decoded_tokens", g["num_tokens"]) for g in generations)
        / tokens,
        "seconds_per_token": sum(g.get("seconds", 0.0) for g in generations) / tokens,
        "units_per_text": float(np.median([g.get("num_sentences", 0) for g in generations])),
        "perplexity_median": float(np.median([r["perplexity"] for r in scored.values()]))
        if scored
        else None,
        "perplexity_by_id": {i: r["perplexity"] for i, r in scored.items()},
    }
    records, variants = detect_all(settings, run, generations, attacked)
    summary.update(variants)
    if run.stage == "edits":
        (out / "edits.json").write_text(json.dumps(edits(settings, generations), indent=1))
    if (out / "edits.json").exists():
        summary["edits"] = json.loads((out / "edits.json").read_text())
    (out / "detections.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "settings"}))
    return 0
