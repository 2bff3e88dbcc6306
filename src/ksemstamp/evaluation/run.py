"""The evaluation pipeline: prompts -> generations -> attacks -> detection -> metrics -> report.

Every stage writes one JSONL file per algorithm (and attack) in the run folder, one record per
prompt id, appended and flushed as it is made; a rerun skips the ids already there, so an
interrupted run resumes where it stopped and a larger ``num_prompts`` extends a finished run.
Every stage returns (and the report counts) the records of this run's prompts only, so a smaller
``num_prompts`` reports its first prompts from a folder that holds more.

Run folder layout::

    settings.json                    the settings that fix the stored records
    prompts.jsonl                    id, article_id, prompt, human (the negative)
    generations/<algorithm>.jsonl    via Trainer.predict (shards merged)
    attacks/<algorithm>.<attack>.jsonl    sentence attacks and the document-level rewrite
    edits/<algorithm>.<edit>.jsonl        edits without a language model (``edit_stage``)
    detections/<algorithm>.<text>.jsonl   text = human, none (no attack), an attack or an edit
    sizes/<algorithm>.jsonl          p-value of each sentence-end prefix (``size``)
    quality/<algorithm>.jsonl        oracle perplexity and pooled hidden state per text
    results.json, results.md, roc.png

Positives are the (attacked) watermarked texts, negatives the human continuations of the same
articles, cut at a sentence end once they reach ``max_new_tokens`` generator tokens (the
generations stop the same way). Both are scored with their prompt. The ROC score is each
detector's z-score (the paper's z under the region mark, the direction statistic's z under the
direction mark, KGW's z); a text with no score (too short) gets ``MISSING_SCORE``, below every
real z. For the sentence-level schemes with the ``exact`` statistic, the same texts are also
ranked by their exact p-value (``exact`` in each detection entry), which is calibrated and
finer grained than z at a few sentences per text. Every algorithm's texts are also decided at
a stated alpha by their p-value (``at_alpha``), and the size of each mark is measured
(``size``).

The ``Run`` stages (``stages``) share the run folder's state and resume rules, and
``run_evaluation`` assembles their records; prompts are built in ``prompt_set``, settings (and
the check that a run folder holds a run with the same ones) are in ``settings``, the edits, the
rewrite and the size in ``edit_stage``, ``rewrite`` and ``size``, the report in ``report``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_json_atomic, write_text_atomic
from ..settings.evaluation import EvalSettings
from .prompt_set import (  # noqa: F401  (re-exported: the prompt rules' former home)
    build_prompts,
    cut_at_token,
    cut_to_tokens,
    human_continuation,
    split_article,
)
from .report import markdown_table, plot_roc
from .scoring import MISSING_SCORE, detection_entry, generation_stats
from .stages import Run

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- whole pipeline


def run_evaluation(settings: EvalSettings, progress: bool = True) -> dict:
    """Run (or resume) every stage and write ``results.json``, ``results.md`` and ``roc.png``
    (``progress``: progress bars)."""
    from .size import size_stage

    run = Run(settings, progress)
    prompts = run.prompts()
    prompt_of = {p["id"]: p["prompt"] for p in prompts}
    human = {p["id"]: p["human"] for p in prompts}
    results: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "prompts": len(prompts),
        "similarity": f"cosine of {settings.similarity_encoder} sentence embeddings "
        "(an embedding stand-in for BERTScore)",
        "score": "each detector's z-score (see statistics); texts too short to score get "
        + str(MISSING_SCORE),
        "detection": {},
        "quality": {},
        "statistics": {},
        "size": {},
    }
    generations = {a: run.generate(a, prompts) for a in settings.algorithms}
    for algorithm in settings.algorithms:
        gens = {i: g for i, g in generations[algorithm].items() if g.get("status") == "ok"}
        texts = {i: g["text"] for i, g in gens.items()}
        stats = generation_stats(gens.values())
        results["quality"][algorithm] = _quality(run, algorithm, texts, prompt_of, stats)
        if algorithm == "none":  # nothing to detect
            continue
        negatives = run.detect(algorithm, "human", {i: human[i] for i in texts}, prompt_of)
        # The sentence schemes' exact p-value also ranks the texts (KGW's p is z's normal tail).
        cfg = settings.watermark_config(algorithm)
        rank_by_exact = algorithm != "kgw" and cfg.detection.statistic == "exact"
        per_attack: dict[str, Any] = {}
        for name, (variant, attacked) in _variants(run, algorithm, gens, prompts).items():
            positives = run.detect(algorithm, name, variant, prompt_of)
            if not positives or not negatives:
                # Every generation failed (see the generation records): nothing to rank.
                logger.warning("%s/%s: no positives or no negatives", algorithm, name)
                continue
            per_attack[name] = detection_entry(name, positives, negatives, attacked, rank_by_exact)
        results["detection"][algorithm] = per_attack
        results["statistics"][algorithm] = run.statistic_label(algorithm)
        results["size"][algorithm] = size_stage(run, algorithm, texts, prompt_of)
    results["quality"]["human"] = _quality(run, "human", human, prompt_of, {})

    write_json_atomic(run.root / "results.json", results)
    write_text_atomic(run.root / "results.md", markdown_table(results))
    plot_roc(results, run.root / "roc.png")
    return results


def _quality(
    run: Run, name: str, texts: dict[str, str], prompt_of: dict[str, str], extra: dict
) -> dict[str, Any]:
    """The oracle's perplexity, Ent-3 and Sem-Ent of ``texts``, with ``extra`` beside them."""
    from .metrics import ngram_entropy, semantic_entropy

    settings = run.settings
    scores = run.quality(name, texts, prompt_of)
    ppl = [s["perplexity"] for s in scores.values() if s["perplexity"] is not None]
    emb = np.array([s["embedding"] for s in scores.values() if s["embedding"]])
    sem, k = semantic_entropy(emb, settings.sem_ent_k, settings.seed) if len(emb) else (0.0, 0)
    return {
        "texts": len(texts),
        "perplexity": float(np.mean(ppl)) if ppl else None,
        # The mean is what papers report; one degenerate text can dominate it.
        "perplexity_median": float(np.median(ppl)) if ppl else None,
        "ent3": ngram_entropy(list(texts.values()), 3),
        "sem_ent": sem,
        "sem_ent_k": k,
        **extra,
    }


def _variants(
    run: Run, algorithm: str, gens: dict[str, dict], prompts: list[dict]
) -> dict[str, tuple[dict[str, str], dict[str, dict] | None]]:
    """The texts each variant holds, by name: ``none`` (the generations), every attack (with
    its records) and every edit without a language model (``edit_stage``, no records)."""
    from .edit_stage import edit_stage

    texts = {i: g["text"] for i, g in gens.items()}
    variants: dict[str, tuple[dict[str, str], dict[str, dict] | None]] = {"none": (texts, None)}
    stored: dict[str, dict[str, dict]] = {}
    for spec in run.settings.attacks:
        source = stored[spec["source"]] if "source" in spec else None
        attacked = stored[spec["name"]] = run.attack(algorithm, spec, gens, source)
        variants[spec["name"]] = ({i: a["text"] for i, a in attacked.items()}, attacked)
    for name, edited in edit_stage(run, algorithm, texts, prompts).items():
        variants[name] = ({i: e["text"] for i, e in edited.items()}, None)
    return variants


# ---------------------------------------------------------------------- command line


def evaluate(
    settings: EvalSettings, only_attacks: list[str] | None = None, quiet: bool = False
) -> int:
    """Evaluate as the paper does: generate, attack, detect; AUC, TPR at low FPR, quality.

    Resumable: every stage keeps what it finished in ``output_dir``, and a rerun goes on from
    there.

    Args:
        only_attacks: run only these of the configured attacks (names).
        quiet: no progress bars.
    """
    if only_attacks:
        settings = settings.select_attacks(only_attacks)
    results = run_evaluation(settings, progress=not quiet)
    root = Path(settings.output_dir)
    print((root / "results.md").read_text())
    logger.info("wrote %s, %s, %s", root / "results.json", root / "results.md", root / "roc.png")
    return 0 if results["detection"] or results["quality"] else 1
