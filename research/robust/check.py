"""A design check on real generations (research only): held-out ``val`` prompts generated under
a design, attacked by the evaluation's Gemma paraphrase (``--attack reword``, the default), by its
rewrite of every window (``rewrite``), by the paraphrase again over the paraphrased texts
(``recursive``), by the bigram attack (``bigram``) or by the paraphrase under a second, few-shot
prompt (``fewshot``), detected; the decision rate at alpha 1%
(and per key), the median z and the effective sentences per text, clean and under every attack
run so far.

    KSEMSTAMP_ALLOW_WEAK_KEY=1 python -m research.robust.check --name base --prompts 24 \
        [--encoder FOLDER --centroids FILE] [--selection text] [--temperature 0.05] \
        [--units clauses] [--prune-tokens 4] [--attack rewrite]
    KSEMSTAMP_ALLOW_WEAK_KEY=1 python -m research.robust.check --name plain --plain  # no mark
    python -m research.robust.check --name kgw --kgw --attack rewrite  # the token baseline
    python -m research.robust.check --compare base other   # paired by prompt, after both ran
    python -m research.robust.check --name base --detect-units clauses  # other units, same texts

``--plain`` runs the same sampler unwatermarked (the perplexity every design is held to; its
texts are not attacked, and their detections are the null's); ``--kgw`` generates, attacks and
detects KGW texts (the robust run's baseline) on the same prompts. ``--units`` is ``sentences``
unless given (the default mark's units when the checks were made; the shipped default is now
``clauses``), so every check recorded here reruns as it was made.

Generations, attacks (``attacked.jsonl``, ``attacked-rewrite.jsonl``,
``attacked-recursive.jsonl``, ``attacked-bigram.jsonl``) and perplexities (under the evaluation's oracle) are cached under
``runs/robust/check-NAME/`` (reruns resume); each text's detection goes to ``detections.jsonl``
there, which ``--compare`` pairs by prompt (the same prompts and keys, each design's own
generations and attacks). The prompts are the first ``val``-split articles' opening sentences
(``val_prompts``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ksemstamp.assets import load_encoder, load_lm
from ksemstamp.builders import build_detector, build_scheme, build_watermarker
from ksemstamp.evaluation.metrics import Oracle
from ksemstamp.evaluation.prompt_set import build_prompts
from ksemstamp.evaluation.rewrite import build_attack
from ksemstamp.evaluation.settings import EvalSettings
from ksemstamp.settings import WatermarkSettings
from ksemstamp.text.corpora import news_articles
from ksemstamp.text.splitter import get_splitter

from .common import RUNS, read_jsonl

KEYS = ("robust-check-key-0", "robust-check-key-1", "robust-check-key-2")
ATTACK = {
    "name": "lm-paraphrase",
    "paraphraser": "lm",
    "model": "gemma3-270m",
    "prompts": "reword",
    "num_candidates": 4,
    "select": "best",
}
# The robust run's other two LM attacks (docs/evaluation/robust-lm.yaml): every window of 2-4
# sentences rewritten, and the paraphrase again over the paraphrased texts.
REWRITE = {
    "name": "lm-rewrite",
    "paraphraser": "lm-rewrite",
    "model": "gemma3-270m",
    "num_candidates": 4,
    "window": [2, 4],
    "similarity_bound": 0.75,
    "max_overlap": 0.8,
    "every_window": True,
}
# The bigram attack (docs/evaluation/robust-bigram.yaml): of 8 rewords, the one sharing the
# fewest token pairs with the original among those similar enough.
BIGRAM = {
    "name": "lm-bigram",
    "paraphraser": "lm",
    "model": "gemma3-270m",
    "prompts": "reword",
    "num_candidates": 8,
    "select": "bigram",
    "similarity_bound": 0.75,
}
# The second paraphrase prompt (docs/evaluation/robust-fewshot.yaml): the same model and
# selection under few-shot examples, a check that nothing is tuned to the reword prompt.
FEWSHOT = dict(ATTACK, name="lm-paraphrase-fewshot", prompts="few-shot")
# attack name -> (settings, the variant it attacks, its file under check-NAME, its variant)
ATTACKS = {
    "reword": (ATTACK, "clean", "attacked.jsonl", "attacked"),
    "rewrite": (REWRITE, "clean", "attacked-rewrite.jsonl", "rewrite"),
    "recursive": (ATTACK, "attacked", "attacked-recursive.jsonl", "recursive"),
    "bigram": (BIGRAM, "clean", "attacked-bigram.jsonl", "bigram"),
    "fewshot": (FEWSHOT, "clean", "attacked-fewshot.jsonl", "fewshot"),
}


def config(args, key: str) -> WatermarkSettings:
    model = {"lm_dtype": "fp32"}
    if args.encoder:
        model["encoder"] = args.encoder
    partition = {"centroids": args.centroids} if args.centroids else {}
    temperature = {"context_temperature": args.temperature} if args.temperature else {}
    units = {"units": args.units} if args.units else {}
    search = {"prune_tokens": args.prune_tokens} if args.prune_tokens else {}
    if args.candidates:
        search["max_candidates"] = args.candidates
    return WatermarkSettings.from_dict(
        {
            "key": key,
            "allow_weak_key": True,
            "model": model,
            "partition": partition,
            "mark": {"selection": args.selection, **temperature, **units},
            "search": search,
            "sampling": {"seed": 0, "max_new_tokens": 200},
        }
    )


def append(path: Path, rows: list[dict]) -> None:
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def val_prompts(count: int, words: int = 32) -> list[dict]:
    """The first ``count`` ``val``-split news prompts, cut as the evaluation cuts its test-split
    prompts (``build_prompts``), kept in ``runs/robust/val-prompts.jsonl`` so that every design
    check reads the same prompts."""
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


def compare(first: str, second: str) -> dict:
    """Paired differences (second minus first) of the z of the same prompts, clean and under
    each attack both checks ran, from their ``detections.jsonl``."""
    runs = [
        {(r["variant"], r["id"]): r for r in read_jsonl(RUNS / f"check-{n}" / "detections.jsonl")}
        for n in (first, second)
    ]
    out: dict = {"first": first, "second": second}
    for variant in ("clean", *(v for *_, v in ATTACKS.values())):
        pairs = sorted(k for k in runs[0].keys() & runs[1].keys() if k[0] == variant)
        if not pairs:
            continue
        diff = np.array([runs[1][k]["z"] - runs[0][k]["z"] for k in pairs])
        out[variant] = {
            "pairs": len(pairs),
            "mean_z_difference": float(diff.mean()),
            "standard_error": float(diff.std(ddof=1) / np.sqrt(len(diff))),
            "second_higher": int((diff > 0).sum()),
        }
        if variant != "clean":
            # How far the attacker moved each design's texts (its own encoder's similarity).
            out[variant]["similarity"] = [
                float(np.mean([runs[j][k]["similarity"] for k in pairs])) for j in (0, 1)
            ]
    return out


def edits(a, gens: list[dict]) -> dict:
    """Every edit without an LM (``evaluation.edits``) on each generated text, detected at an
    exact 1%; the interleavings take human sentences from ``val`` articles after the prompts'."""
    from ksemstamp.evaluation.edits import EDITS, apply_edit, needs_human

    splitter = get_splitter()
    human = [
        s
        for art in news_articles("val")[200:260]
        for s in splitter.split(art.text)
        if len(s.split()) >= 4
    ]
    detectors = {}  # one per key, built once for every edit
    for k, key in enumerate(KEYS):
        cfg = config(a, key)
        detectors[k] = build_detector(cfg, build_scheme(cfg))
    out = {}
    for name in EDITS:
        detected, per_key = [], {}
        for k, det in detectors.items():
            mine = [g for g in gens if g["key"] == k]
            if not mine:
                continue
            texts = []
            for i, g in enumerate(mine):
                need = needs_human(name) * len(splitter.split(g["text"]))
                start = (i * 37) % max(1, len(human) - need)
                texts.append(apply_edit(name, g["text"], g["id"], human[start : start + need]))
            hits = [
                r.p_value is not None and r.p_value <= 0.01
                for r in det.detect_batch(texts, prompts=[g["prompt"] for g in mine])
            ]
            detected += hits
            per_key[k] = float(np.mean(hits))
        out[name] = {"detected_1pct": float(np.mean(detected)), "worst_key": min(per_key.values())}
    return out


def generate_kgw(a, prompts: list[dict], path: Path) -> None:
    """KGW texts (``evaluation.baselines``, the robust run's gamma 0.25 and delta 2) for
    ``prompts`` with the checks' sampling, four at a time, appended to ``path``; KGW has one
    public key, so the prompts' key index only groups them as the other designs' are."""
    from ksemstamp.evaluation.baselines import KGWGenerator

    cfg = config(a, KEYS[0])
    lm = load_lm(cfg.model.lm, "cpu", cfg.model.lm_dtype)
    generate = KGWGenerator(*lm, sampling=cfg.sampling).generate
    order = {q["id"]: i for i, q in enumerate(val_prompts(a.prompts))}
    for start in range(0, len(prompts), 4):
        chunk = prompts[start : start + 4]
        append(
            path,
            [
                {"id": q["id"], "key": order[q["id"]] % len(KEYS), "prompt": q["prompt"], **r}
                for q, r in zip(chunk, generate([q["prompt"] for q in chunk]), strict=True)
            ],
        )


def detector(a, k: int):
    """``(texts, prompts) -> [(z, p, unit scores or None)]`` for the design's key ``k``."""
    if a.kgw:
        from ksemstamp.evaluation.baselines import KGWDetector

        cfg = config(a, KEYS[0])
        model, tokenizer = load_lm(cfg.model.lm, "cpu", cfg.model.lm_dtype)
        kgw = KGWDetector(model.config, tokenizer)
        return lambda texts, prompts: [
            (r["z_score"], r["p_value"], None) for r in kgw.detect_batch(texts)
        ]
    cfg = config(a, KEYS[k])
    det = build_detector(cfg, build_scheme(cfg))
    return lambda texts, prompts: [
        (r.z_score, r.p_value, [x for x in r.scores if x is not None])
        for r in det.detect_batch(texts, prompts=prompts)
    ]


def run_attack(out: Path, name: str, gens: list[dict], ids: set[str]) -> None:
    """Attack every generated text of a prompt in ``ids`` (or its paraphrase, for
    ``recursive``) that ``name``'s file under ``out`` does not hold yet, four at a time,
    appending as it goes."""
    spec, source, file, _ = ATTACKS[name]
    path = out / file
    have = {r["id"] for r in read_jsonl(path)} if path.exists() else set()
    if source == "clean":
        texts = {g["id"]: g["text"] for g in gens}
    else:
        texts = {r["id"]: r["text"] for r in read_jsonl(out / ATTACKS["reword"][2])}
    todo = [(i, t) for i, t in texts.items() if i in ids and i not in have]
    if not todo:
        return
    attack = build_attack(
        spec, load_lm("gemma3-270m"), load_encoder("all-mpnet-base-v2"), get_splitter()
    )
    for start in range(0, len(todo), 4):
        chunk = todo[start : start + 4]
        res = attack([t for _, t in chunk])
        # A sentence attack reports its sentences' mean similarity; the rewrite, its windows'.
        append(
            path,
            [
                {
                    "id": i,
                    "text": r.text,
                    "sentence_similarity": getattr(r, "sentence_similarity", None)
                    or getattr(r, "window_similarity", None),
                }
                for (i, _), r in zip(chunk, res, strict=True)
            ],
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compare", nargs=2, metavar=("FIRST", "SECOND"), default=None)
    p.add_argument("--name")
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--encoder", default=None)
    p.add_argument("--centroids", default=None)
    p.add_argument("--selection", default="text")
    p.add_argument("--temperature", type=float, default=None, help="mark.context_temperature")
    p.add_argument("--units", default="sentences", help="mark.units (sentences, clauses)")
    p.add_argument("--prune-tokens", type=int, default=None, help="search.prune_tokens")
    p.add_argument("--candidates", type=int, default=None, help="search.max_candidates")
    p.add_argument("--plain", action="store_true", help="the same sampler, unwatermarked")
    p.add_argument("--kgw", action="store_true", help="KGW (gamma 0.25, delta 2) instead")
    p.add_argument("--stage", default="all", help="all, generate, attack, or edits (detect only)")
    p.add_argument("--attack", default="reword", choices=sorted(ATTACKS), help="the LM attack")
    p.add_argument(
        "--detect-units",
        default=None,
        help="detect with these units instead (writes summary-as-UNITS.json, generates nothing)",
    )
    a = p.parse_args()
    if a.compare:
        print(json.dumps(compare(*a.compare), indent=1))
        return
    if not a.name:
        p.error("--name is required (or --compare FIRST SECOND)")
    out = RUNS / f"check-{a.name}"
    out.mkdir(parents=True, exist_ok=True)
    prompts = val_prompts(a.prompts)
    gen_path = out / "generations.jsonl"
    done = {r["id"] for r in read_jsonl(gen_path)} if gen_path.exists() else set()
    lm = None
    if a.kgw and (a.plain or a.detect_units or a.stage == "edits"):
        p.error("--kgw generates and detects KGW texts only (no --plain, --detect-units, edits)")
    if a.detect_units:
        a.stage = "detect"  # the texts are a design's own; only their detection changes
    if a.stage in ("all", "generate") and a.kgw:
        generate_kgw(a, [q for q in prompts if q["id"] not in done], gen_path)
    elif a.stage in ("all", "generate"):
        for k, key in enumerate(KEYS):
            mine = [q for i, q in enumerate(prompts) if i % len(KEYS) == k and q["id"] not in done]
            if not mine:
                continue
            cfg = config(a, key)
            lm = lm or load_lm(cfg.model.lm, "cpu", "fp32")
            wm = build_watermarker(cfg, lm=lm)
            for start in range(0, len(mine), 4):
                chunk = mine[start : start + 4]
                res = wm.generate([q["prompt"] for q in chunk], watermark=not a.plain)
                append(
                    gen_path,
                    [
                        {"id": q["id"], "key": k, "prompt": q["prompt"], **r.to_record()}
                        for q, r in zip(chunk, res, strict=True)
                    ],
                )
    gens = [g for g in read_jsonl(gen_path) if g["status"] == "ok"]
    if a.stage in ("all", "attack") and not a.plain:
        run_attack(out, a.attack, gens, {q["id"] for q in prompts})
    # Every attack run so far, by its variant: id -> attacked record.
    attacked = {
        variant: {r["id"]: r for r in read_jsonl(out / file)}
        for _, _, file, variant in ATTACKS.values()
        if (out / file).exists()
    }
    ppl_path = out / "perplexity.jsonl"
    scored = {r["id"]: r for r in read_jsonl(ppl_path)} if ppl_path.exists() else {}
    if any(g["id"] not in scored for g in gens) and a.stage in ("all", "attack"):
        # The evaluation's oracle (``EvalSettings.oracle``): the text given its prompt.
        oracle = Oracle(*load_lm("gemma3-270m"))
        todo = [g for g in gens if g["id"] not in scored]
        rows = oracle.score([g["prompt"] for g in todo], [g["text"] for g in todo])
        append(
            ppl_path,
            [{"id": g["id"], "perplexity": r.perplexity} for g, r in zip(todo, rows, strict=True)],
        )
        scored = {r["id"]: r for r in read_jsonl(ppl_path)}
    summary = {
        "name": a.name,
        "watermarked": "kgw" if a.kgw else not a.plain,
        "texts": len(gens),
        "decoded_per_token": sum(g.get("decoded_tokens", g["num_tokens"]) for g in gens)
        / max(1, sum(g["num_tokens"] for g in gens)),
        "units_per_text": float(np.median([g["num_sentences"] for g in gens]))
        if not a.kgw
        else None,
        "perplexity_median": float(np.median([r["perplexity"] for r in scored.values()]))
        if scored
        else None,
    }
    # --detect-units: the same texts detected with other units than they were generated with.
    scored_as = argparse.Namespace(**{**vars(a), "units": a.detect_units or a.units})
    records, detectors = [], {}
    for variant in ("clean", *attacked):
        own = attacked.get(variant, {})
        zs, ps, neff, keys = [], [], [], []
        for k in range(len(KEYS)):
            mine = [g for g in gens if g["key"] == k and (variant == "clean" or g["id"] in own)]
            if not mine:
                continue
            slot = 0 if a.kgw else k  # KGW's one public key
            if slot not in detectors:
                detectors[slot] = detector(scored_as, k)
            detect = detectors[slot]
            texts = [g["text"] if variant == "clean" else own[g["id"]]["text"] for g in mine]
            results = detect(texts, [g["prompt"] for g in mine])
            for g, (z, pv, s) in zip(mine, results, strict=True):
                if z is None:
                    continue
                zs.append(z)
                ps.append(pv)
                if s is not None:  # unit scores: how many independent units they weigh
                    neff.append(len(s) ** 2 / (sum(s) / z) ** 2 / len(s) if z else 0)
                keys.append(k)
                records.append(
                    {
                        "id": g["id"],
                        "key": k,
                        "variant": variant,
                        "z": z,
                        "p": pv,
                        "similarity": own.get(g["id"], {}).get("sentence_similarity"),
                    }
                )
        ps, keys = np.array(ps), np.array(keys)
        per_key = [
            float((ps[keys == k] <= 0.01).mean()) for k in range(len(KEYS)) if (keys == k).any()
        ]
        summary[variant] = {
            "texts": len(zs),
            "detected_1pct": float((ps <= 0.01).mean()),
            "worst_key": min(per_key),
            "median_z": float(np.median(zs)),
            "median_neff_share": float(np.median(neff)) if neff else None,
        }
    if a.stage == "edits":
        summary["edits"] = edits(a, gens)
        (out / "edits.json").write_text(json.dumps(summary["edits"], indent=1))
    elif (out / "edits.json").exists() and not a.detect_units:
        summary["edits"] = json.loads((out / "edits.json").read_text())  # from its own stage
    suffix = f"-as-{a.detect_units}" if a.detect_units else ""
    (out / f"detections{suffix}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / f"summary{suffix}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
