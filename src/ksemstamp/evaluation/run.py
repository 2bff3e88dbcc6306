"""The evaluation pipeline: prompts -> generations -> attacks -> detection -> metrics -> report.

Every stage writes one JSONL file per algorithm (and attack) in the run folder, one record per
prompt id, appended and flushed as it is made; a rerun skips the ids already there, so an
interrupted run resumes where it stopped and a larger ``num_prompts`` extends a finished run.

Run folder layout::

    settings.json                    the settings that fix the stored records
    prompts.jsonl                    id, article_id, prompt, human (the negative)
    generations/<algorithm>.jsonl    via Trainer.predict (shards merged)
    attacks/<algorithm>.<attack>.jsonl
    detections/<algorithm>.<text>.jsonl   text = human, none (no attack) or an attack
    quality/<algorithm>.jsonl        oracle perplexity and pooled hidden state per text
    results.json, results.md, roc.png

Positives are the (attacked) watermarked texts, negatives the human continuations of the same
articles, cut at a sentence end once they reach ``max_new_tokens`` generator tokens (the
generations stop the same way). Both are scored with their prompt. The ROC score is the paper's
z-score; a text with no score (too short) gets ``MISSING_SCORE``, below every real z. For the
sentence-level schemes with the ``exact`` statistic, the same texts are also ranked by their
key-randomisation p-value (``exact`` in each detection entry), which is calibrated and finer
grained than z at a few sentences per text.

Length (~450 lines): the ``Run`` stages share the run folder's state and resume rules, and
``run_evaluation`` assembles their records; settings are in ``settings``, the report in
``report``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..corpora import leading_sentences, news_articles
from ..io import (
    ResumableWriter,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)
from .metrics import flagged_at_alpha
from .report import LABELS, markdown_table, plot_roc
from .settings import FIXED_SETTINGS, EvalSettings

MISSING_SCORE = -1000.0
WATERMARKED = tuple(name for name in LABELS if name != "none")
# ---------------------------------------------------------------------- prompts


# The prompt rule of every command; other modules import it under this name.
split_article = leading_sentences


def cut_to_tokens(sentences: Sequence[str], count_tokens, max_tokens: int) -> str:
    """Whole sentences from the start until they reach ``max_tokens`` tokens."""
    kept: list[str] = []
    total = 0
    for sentence in sentences:
        kept.append(sentence)
        total += count_tokens(sentence)
        if total >= max_tokens:
            break
    return " ".join(kept)


def cut_at_token(text: str, token_starts, tokens: int) -> tuple[str, str] | None:
    """``text`` cut after its first ``tokens`` tokens, as ``(prompt, rest)`` (``rest`` keeps
    the space before its first word), or ``None`` when the text is not longer than that.
    ``token_starts(text)`` gives the character offset where each token starts."""
    starts = token_starts(text)
    if len(starts) <= tokens:
        return None
    return text[: starts[tokens]], text[starts[tokens] :]


def human_continuation(
    splitter, prompt: str, rest: str, count_tokens, max_tokens: int
) -> tuple[str, int]:
    """The article after ``prompt`` (``rest``, verbatim) as a human negative, cut at a sentence
    end once it holds ``max_tokens`` tokens and at least one sentence after the prompt's own,
    and how many sentences of ``rest`` start after the prompt's end. When the prompt ends
    mid-sentence the negative starts with the rest of that sentence, as a generation starts with
    its completion (and then always has a watermarked sentence); sentences are cut as detection
    cuts prompt and text (``detector.continuation_sentences``)."""
    head = prompt.rstrip()
    spans = splitter.spans(head + rest)
    inside = [at + len(s) for at, s in spans if at < len(head)]
    end = max([len(head), *inside[-1:]])
    total = count_tokens((head + rest)[len(head) : end])
    after = [(at, s) for at, s in spans if at >= len(head)]
    for k, (at, sentence) in enumerate(after):
        if total >= max_tokens and k:
            break
        end = at + len(sentence)
        total += count_tokens(sentence)
    return (head + rest)[len(head) : end], len(after)


def build_prompts(settings: EvalSettings, count_tokens, token_starts=None) -> list[dict]:
    """The first ``num_prompts`` usable test-split articles as prompts with human negatives.

    Prompts are whole sentences of about ``prompt_words`` words, or, with ``prompt_tokens``,
    the article's first tokens cut wherever they end (``token_starts`` is then required).
    """
    from ..splitter import get_splitter

    splitter = get_splitter()
    out = []
    for index, article in enumerate(news_articles("test")):
        if settings.prompt_tokens is None:
            prompt_sentences, rest = split_article(
                splitter.split(article.text), settings.prompt_words
            )
            prompt = " ".join(prompt_sentences)
            human = cut_to_tokens(rest, count_tokens, settings.max_new_tokens)
            following = len(rest)
        else:
            cut = cut_at_token(article.text.strip(), token_starts, settings.prompt_tokens)
            if cut is None:
                continue
            prompt = cut[0]
            human, following = human_continuation(
                splitter, prompt, cut[1], count_tokens, settings.max_new_tokens
            )
        if following < settings.min_human_sentences:
            continue
        out.append(
            {
                "id": f"news-test-{index}",
                "article_id": article.article_id,
                "prompt": prompt,
                "human": human,
            }
        )
        if len(out) == settings.num_prompts:
            break
    return out


# ---------------------------------------------------------------------- stages


class Run:
    """One evaluation run in ``settings.output_dir``; each stage method is resumable."""

    def __init__(self, settings: EvalSettings) -> None:
        self.settings = settings
        self.root = Path(settings.output_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._check_settings()
        self._lms: dict[str, tuple] = {}
        self._encoders: dict[str, Any] = {}
        self.key_index: dict[Any, int] = {}
        """Prompt id -> index of its evaluation key (set by ``prompts``)."""

    def _check_settings(self) -> None:
        fixed: dict[str, Any] = {k: getattr(self.settings, k) for k in FIXED_SETTINGS}
        # Attacks are kept by name: running a subset later is fine, redefining a name is not.
        fixed["attacks"] = {a["name"]: a for a in self.settings.attacks}
        path = self.root / "settings.json"
        if path.exists():
            stored = json.loads(path.read_text())
            changed = sorted(k for k in FIXED_SETTINGS if stored.get(k) != fixed[k])
            attacks = stored.get("attacks", {})
            changed += sorted(
                f"attack {name}"
                for name, spec in fixed["attacks"].items()
                if name in attacks and attacks[name] != spec
            )
            if changed:
                raise ValueError(
                    f"{self.root} holds a run with other settings ({', '.join(changed)}): "
                    "use a new output_dir, or delete the folder to start over"
                )
            fixed["attacks"] = {**attacks, **fixed["attacks"]}
        write_json_atomic(path, fixed)

    def _progress(self, **kwargs) -> tqdm:
        return tqdm(disable=not self.settings.progress, **kwargs)

    def lm(self, spec: str):
        from ..assets import load_lm

        if spec not in self._lms:
            self._lms[spec] = load_lm(spec)
        return self._lms[spec]

    def encoder(self, spec: str):
        from ..assets import load_encoder

        if spec not in self._encoders:
            self._encoders[spec] = load_encoder(spec)
        return self._encoders[spec]

    # -- prompts
    def prompts(self) -> list[dict]:
        from transformers import AutoTokenizer

        from ..assets import resolve_lm_path

        path = self.root / "prompts.jsonl"
        from .predict import read_records

        stored = read_records(path)
        if len(stored) >= self.settings.num_prompts:
            return self._assign_keys(stored[: self.settings.num_prompts])
        lm = self.settings.watermark_config(
            "ksemstamp" if "ksemstamp" in self.settings.algorithms else self.settings.algorithms[0]
        ).lm
        tokenizer = AutoTokenizer.from_pretrained(resolve_lm_path(lm))

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        def starts(text: str) -> list[int]:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            return [a for a, _ in enc["offset_mapping"]]

        rows = build_prompts(self.settings, count, starts)
        write_jsonl_atomic(path, rows)
        return self._assign_keys(rows)

    def _assign_keys(self, prompts: list[dict]) -> list[dict]:
        self.key_index = {p["id"]: i % self.settings.num_keys for i, p in enumerate(prompts)}
        return prompts

    # -- generation
    def generate(self, algorithm: str, prompts: list[dict]) -> dict[str, dict]:
        from .predict import GeneratorFactory, merge_shards, predict_to_shards, shard_paths

        folder = self.root / "generations"
        target = folder / f"{algorithm}.jsonl"
        order = [p["id"] for p in prompts]
        # Shards left by an interrupted run hold finished prompts: fold them in first.
        done = {r["id"] for r in merge_shards(shard_paths(folder, algorithm), target, order)}
        pending = [
            {"id": p["id"], "prompt": p["prompt"], "key_index": self.key_index.get(p["id"], 0)}
            for p in prompts
            if p["id"] not in done
        ]
        if pending:
            print(f"generate {algorithm}: {len(pending)} prompts", file=sys.stderr)
        configs = [
            self.settings.watermark_config(algorithm, k) for k in range(self.settings.num_keys)
        ]
        factory = GeneratorFactory(
            algorithm, [{**c.to_dict(), "key": c.key} for c in configs], dict(self.settings.kgw)
        )
        # One predict call for every key: under `ddp` each call starts the other processes.
        predict_to_shards(
            factory,
            pending,
            folder,
            algorithm,
            devices=self.settings.devices,
            accelerator=self.settings.accelerator,
            strategy=self.settings.strategy,
            batch_size=self.settings.prompt_batch,
            progress=self.settings.progress,
        )
        records = merge_shards(shard_paths(folder, algorithm), target, order)
        return {r["id"]: r for r in records if r["id"] in set(order)}

    # -- attacks
    def attack(self, algorithm: str, spec: dict, generations: dict[str, dict]) -> dict[str, dict]:
        from ..splitter import get_splitter
        from .attacks import Attack, build_paraphraser

        path = self.root / "attacks" / f"{algorithm}.{spec['name']}.jsonl"
        ids = [i for i, g in generations.items() if g.get("status") == "ok"]
        with ResumableWriter(path) as out:
            pending = [i for i in ids if not out.has_id(i)]
            if pending:
                lm = None
                if spec.get("paraphraser", "lm") == "lm":
                    lm = self.lm(spec.get("model", "smollm2-135m-instruct"))
                attack = Attack(
                    build_paraphraser(spec, lm=lm),
                    self.encoder(self.settings.similarity_encoder),
                    get_splitter(),
                    select=spec.get("select", "best"),
                    similarity_bound=spec.get("similarity_bound", 0.8),
                )
                bar = self._progress(total=len(pending), desc=f"attack {algorithm}/{spec['name']}")
                step = self.settings.attack_batch
                for start in range(0, len(pending), step):
                    chunk = pending[start : start + step]
                    for i, res in zip(
                        chunk, attack([generations[i]["text"] for i in chunk]), strict=True
                    ):
                        out.write({"id": i, **dataclasses.asdict(res)})
                    bar.update(len(chunk))
                bar.close()
        from .predict import read_records

        return {r["id"]: r for r in read_records(path)}

    # -- detection
    def detect(
        self, algorithm: str, name: str, texts: dict[str, str], prompts: dict[str, str]
    ) -> dict[str, dict]:
        path = self.root / "detections" / f"{algorithm}.{name}.jsonl"
        with ResumableWriter(path) as out:
            pending = [i for i in texts if not out.has_id(i)]
            for key_index in range(self.settings.num_keys):
                group = [i for i in pending if self.key_index.get(i, 0) == key_index]
                if not group:
                    continue
                detect = self._detector(algorithm, key_index)
                for start in range(0, len(group), 64):
                    chunk = group[start : start + 64]
                    for i, res in zip(
                        chunk,
                        detect([texts[i] for i in chunk], [prompts[i] for i in chunk]),
                        strict=True,
                    ):
                        out.write({"id": i, "key_index": key_index, **res})
        from .predict import read_records

        return {r["id"]: r for r in read_records(path)}

    def _detector(self, algorithm: str, key_index: int = 0):
        cfg = self.settings.watermark_config(algorithm, key_index)
        if algorithm == "kgw":
            from .baselines import KGWDetector, KGWSettings

            model, tokenizer = self.lm(cfg.lm)
            kgw = KGWDetector(model.config, tokenizer, KGWSettings(**self.settings.kgw))
            return lambda texts, prompts: kgw.detect_batch(texts)
        from ..config import build_detector, build_scheme

        key = (algorithm, "detector", key_index)
        if key not in self._encoders:
            scheme = build_scheme(cfg, None if cfg.checkpoint else self.encoder(cfg.encoder))
            self._encoders[key] = build_detector(cfg, scheme)
        detector = self._encoders[key]

        def run(texts: list[str], prompts: list[str]) -> list[dict]:
            return [
                {
                    k: v
                    for k, v in r.to_record().items()
                    if k in ("z_score", "p_value", "num_scored", "num_valid", "status")
                }
                for r in detector.detect_batch(texts, prompts)
            ]

        return run

    # -- quality
    def quality(self, name: str, texts: dict[str, str], prompts: dict[str, str]) -> dict[str, dict]:
        from .metrics import Oracle

        path = self.root / "quality" / f"{name}.jsonl"
        with ResumableWriter(path) as out:
            pending = [i for i in texts if not out.has_id(i)]
            if pending:
                oracle = Oracle(
                    *self.lm(self.settings.oracle), batch_size=self.settings.oracle_batch
                )
                bar = self._progress(total=len(pending), desc=f"oracle {name}")
                step = self.settings.oracle_batch
                for start in range(0, len(pending), step):
                    chunk = pending[start : start + step]
                    scores = oracle.score([prompts[i] for i in chunk], [texts[i] for i in chunk])
                    for i, s in zip(chunk, scores, strict=True):
                        out.write({"id": i, **dataclasses.asdict(s)})
                    bar.update(len(chunk))
                bar.close()
        from .predict import read_records

        return {r["id"]: r for r in read_records(path)}


# ---------------------------------------------------------------------- whole pipeline


def _score(det: dict) -> float:
    z = det.get("z_score")
    return MISSING_SCORE if z is None else float(z)


def _exact_score(det: dict) -> float:
    """``-log10 p`` of the key-randomisation p-value; a text without one ranks below all."""
    p = det.get("p_value")
    if p is None:
        return -1.0
    # Equal p-values reached by different sums differ in the last bits (0.3686224489795918
    # against 0.36862244897959173); rounding makes them tie, as equal evidence should.
    return -math.log10(max(float(f"{float(p):.12g}"), 1e-300))


def run_evaluation(settings: EvalSettings) -> dict:
    """Run (or resume) every stage and write ``results.json``, ``results.md`` and ``roc.png``."""

    from .metrics import detection_metrics, ngram_entropy, semantic_entropy

    run = Run(settings)
    prompts = run.prompts()
    prompt_of = {p["id"]: p["prompt"] for p in prompts}
    human = {p["id"]: p["human"] for p in prompts}
    results: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "prompts": len(prompts),
        "similarity": f"cosine of {settings.similarity_encoder} sentence embeddings "
        "(an embedding stand-in for BERTScore)",
        "score": "paper z-score; texts too short to score get " + str(MISSING_SCORE),
        "detection": {},
        "quality": {},
    }
    generations = {a: run.generate(a, prompts) for a in settings.algorithms}

    def quality_of(name: str, texts: dict[str, str], extra: dict) -> dict:
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

    for algorithm in settings.algorithms:
        gens = {i: g for i, g in generations[algorithm].items() if g.get("status") == "ok"}
        texts = {i: g["text"] for i, g in gens.items()}
        results["quality"][algorithm] = quality_of(
            algorithm, texts, _generation_stats(gens.values())
        )
        if algorithm not in WATERMARKED:
            continue
        negatives = run.detect(algorithm, "human", {i: human[i] for i in texts}, prompt_of)
        # The sentence schemes' exact p-value also ranks the texts (KGW's p is z's normal tail).
        rank_by_exact = (
            algorithm != "kgw" and settings.watermark_config(algorithm).statistic == "exact"
        )
        per_attack: dict[str, Any] = {}
        variants = {"none": (texts, None)}
        for spec in settings.attacks:
            attacked = run.attack(algorithm, spec, gens)
            variants[spec["name"]] = ({i: a["text"] for i, a in attacked.items()}, attacked)
        for name, (variant, attacked) in variants.items():
            positives = run.detect(algorithm, name, variant, prompt_of)
            ids = sorted(positives)
            scores = [_score(positives[i]) for i in ids] + [
                _score(negatives[i]) for i in sorted(negatives)
            ]
            labels = [1] * len(ids) + [0] * len(negatives)
            if not ids or not negatives:
                # Every generation failed (see the generation records): nothing to rank.
                print(f"{algorithm}/{name}: no positives or no negatives", file=sys.stderr)
                continue
            entry = detection_metrics(scores, labels)
            if rank_by_exact:
                exact = [_exact_score(positives[i]) for i in ids] + [
                    _exact_score(negatives[i]) for i in sorted(negatives)
                ]
                entry["exact"] = {
                    k: v for k, v in detection_metrics(exact, labels).items() if k != "roc"
                }
                entry["at_alpha"] = flagged_at_alpha(
                    [positives[i] for i in ids], [negatives[i] for i in sorted(negatives)]
                )
            if attacked is not None:
                entry["similarity"] = float(np.mean([a["similarity"] for a in attacked.values()]))
                entry["sentence_similarity"] = float(
                    np.mean([a["sentence_similarity"] for a in attacked.values()])
                )
                changed = sum(a["changed"] for a in attacked.values())
                entry["changed_sentence_share"] = changed / max(
                    1, sum(a["sentences"] for a in attacked.values())
                )
            per_attack[name] = entry
        results["detection"][algorithm] = per_attack
    results["quality"]["human"] = quality_of("human", human, {})

    write_json_atomic(run.root / "results.json", results)
    write_text_atomic(run.root / "results.md", markdown_table(results))
    plot_roc(results, run.root / "roc.png")
    return results


def _generation_stats(records) -> dict:
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
    }


# ---------------------------------------------------------------------- command line


def main_from_settings(settings: EvalSettings) -> int:
    """Entry of ``watermark.py evaluate``: run, print the table, say what was written."""
    results = run_evaluation(settings)
    root = Path(settings.output_dir)
    print((root / "results.md").read_text())
    print(
        f"wrote {root / 'results.json'}, {root / 'results.md'}, {root / 'roc.png'}", file=sys.stderr
    )
    return 0 if results["detection"] or results["quality"] else 1
