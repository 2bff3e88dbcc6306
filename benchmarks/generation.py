"""Generation speed: the shipped configurations against plain sampling, and the sequential
engine on a sample of sentences.

    python -m benchmarks generation --generation.prompts 20 --generation.max_new_tokens 200

prints the table and writes ``results/generation.json`` (every figure, per prompt and per
sentence) and ``generation.md``; ``python -m benchmarks bench`` runs it with detection and
training as the benchmark of record. ``generation_runs`` runs the variants (what they are is
said there), this module summarises them into the report's section, and ``generation_report``
holds its targets and tables.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ksemstamp.assets import resolve_lm_dtype
from ksemstamp.settings import WatermarkSettings
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts

from .generation_report import generation_markdown, generation_targets
from .generation_runs import HARD, STALL_SECONDS, GenerationBench, PromptRun, Variant
from .harness import (
    BENCH_KEY_LAYER,
    DEFAULT_CONFIG,
    PAPER_CONFIG,
    RunSettings,
    apply_threads,
    at_least,
    distribution,
    header_markdown,
    new_report,
    ratio,
    refuse,
    repo_relative,
    targets_markdown,
    write_report,
)


@dataclass(frozen=True)
class GenerationSettings:
    """Watermarked generation against plain sampling, and the sequential engine."""

    prompts: int = 20
    """Held-out news prompts, one per call."""
    max_new_tokens: int = 200
    """New tokens per prompt."""
    prompt_words: int = 32
    """Prompt length in words (cut back to a sentence end)."""
    default_config: str = str(DEFAULT_CONFIG)
    """The configuration of the ``default`` variant (and of plain ``generate``)."""
    paper_config: str = str(PAPER_CONFIG)
    """The configuration of the ``paper`` variant."""
    max_candidates: int | None = None
    """Overrides ``search.max_candidates`` (N_max) of both configurations."""
    lm_dtype: str | None = None
    """Overrides ``model.lm_dtype`` of both configurations (fp32, bf16, ...)."""
    device: str | None = None
    """Overrides ``model.device`` of both configurations (cuda, cuda:1; null: the files')."""
    time_budget: float | None = None
    """Seconds of generation after which no further prompt is started (null: no limit)."""
    sequential_sentences: int = 6
    """Sentences of the default run searched again by both strategies (0: none)."""
    sequential_budget: float = 900.0
    """Seconds after which no further sequential sample sentence is started."""
    warmup: bool = True
    """Untimed warm-up calls first (false: none)."""

    def __post_init__(self) -> None:
        problems = at_least(self, 1, "prompts", "max_new_tokens", "prompt_words")
        problems += at_least(self, 0, "sequential_sentences")
        if self.max_candidates is not None:
            problems += at_least(self, 1, "max_candidates")
        refuse(self, problems)


def generation(generation: GenerationSettings | None = None, run: RunSettings | None = None) -> int:
    """Generation speed: the shipped configurations against plain sampling, one prompt a call.

    Then the sequential engine on a sample of the default run's sentences.
    """
    generation = generation or GenerationSettings()
    run = run or RunSettings()
    apply_threads(run)
    report = new_report("generation", {"generation": generation, "run": run})

    def save(section: dict[str, Any], final: bool = False) -> str:
        report["generation"] = section
        report["targets"] = generation_targets(section)
        return write_report(report, run.output_dir, "generation", render, final)

    print(save(run_generation(generation, save), final=True))
    return 0


def render(report: dict[str, Any]) -> str:
    lines = header_markdown(report, "Generation benchmark")
    if "generation" in report:
        lines += generation_markdown(report["generation"], report["settings"]["generation"])
    return "\n".join(lines + targets_markdown(report.get("targets", []))) + "\n"


def read_config(path: Path, settings: GenerationSettings) -> WatermarkSettings:
    """A configuration file as shipped, with the benchmark's key, length and one prompt per call
    (per-prompt timing); ``settings.lm_dtype`` and ``settings.max_candidates`` override it when
    given, and ``settings.device`` puts it on that device."""
    # A fixed seed: every variant and every rerun samples the same way.
    layer: dict[str, Any] = {
        **BENCH_KEY_LAYER,
        "sampling": {"max_new_tokens": settings.max_new_tokens, "seed": 0},
        "search": {"prompt_batch": 1},
    }
    model = {"lm_dtype": settings.lm_dtype, "device": settings.device}
    if any(model.values()):
        layer["model"] = {k: v for k, v in model.items() if v}
    if settings.max_candidates:
        layer["search"]["max_candidates"] = settings.max_candidates
    return load_watermark_settings([path], layer)


def make_variants(settings: GenerationSettings) -> list[Variant]:
    """Plain ``generate``, the plain sentence loop and the default's watermark, all from
    ``settings.default_config``, and the paper's watermark from ``settings.paper_config``."""
    default = read_config(Path(settings.default_config), settings)
    paper = read_config(Path(settings.paper_config), settings)
    source = repo_relative(settings.default_config)
    return [
        Variant("hf_generate", "hf", default, source, watermark=False),
        Variant("plain_loop", "loop", default, source, watermark=False),
        Variant("default", "loop", default, source),
        Variant("paper", "loop", paper, repo_relative(settings.paper_config)),
    ]


def run_generation(
    settings: GenerationSettings, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Every variant on every prompt, then the sequential sample; ``on_progress`` sees the
    section so far after each prompt (long runs on shared machines get killed)."""
    prompts = news_prompts(settings.prompts, settings.prompt_words)
    bench = GenerationBench(make_variants(settings))

    def section(runs: dict[str, list[PromptRun]], sequential=None) -> dict[str, Any]:
        floor = runs["hf_generate"]
        return {
            "prompts_completed": len(floor),
            "hard_threshold": HARD,
            "stall_seconds": STALL_SECONDS,
            "variants": [summarize_variant(v, runs[v.name], floor) for v in bench.variants],
            "sequential": sequential,
        }

    def progress(runs: dict[str, list[PromptRun]]) -> None:
        if on_progress:
            on_progress(section(runs))

    runs = bench.run(prompts, settings.warmup, settings.time_budget, on_prompt=progress)
    sequential = None
    if settings.sequential_sentences > 0:
        print("sequential sample", flush=True)
        rows = bench.sequential_sample(
            prompts, runs["default"], settings.sequential_sentences, settings.sequential_budget
        )
        sequential = summarize_sequential(rows)
    return section(runs, sequential)


def variant_settings(cfg: WatermarkSettings) -> dict[str, Any]:
    """The settings groups a variant's row reports (the report's ``settings`` of a variant)."""
    return {
        group: values
        for group, values in cfg.to_dict().items()
        if group in ("model", "partition", "mark", "search", "sampling")
    }


def summarize_variant(
    variant: Variant, runs: list[PromptRun], floor: list[PromptRun]
) -> dict[str, Any]:
    """Totals and per-prompt distributions of one variant; ``floor`` is plain ``generate`` on
    the same prompts (per-prompt ratios of seconds per output token)."""
    seconds = sum(r.seconds for r in runs)
    tokens = sum(r.tokens for r in runs)
    sentences = sum(r.sentences for r in runs)
    candidates = sum(r.candidates for r in runs)
    decoded = sum(r.decoded_tokens for r in runs)
    wasted = sum(r.wasted_tokens for r in runs)
    per_sentence = [(c, s) for r in runs for c, s in r.per_sentence]
    hard = [(c, s) for c, s in per_sentence if c >= HARD]
    ratios = [
        r.seconds_per_token / f.seconds_per_token
        for r, f in zip(runs, floor, strict=True)
        if r.seconds_per_token and f.seconds_per_token
    ]
    cfg = variant.config
    return {
        "name": variant.name,
        "kind": variant.kind,
        "config_file": variant.source,
        "watermark": variant.watermark,
        "settings": variant_settings(cfg),
        "lm_dtype_resolved": resolve_lm_dtype(cfg.model.lm_dtype, cfg.model.device),
        "prompts": len(runs),
        "seconds": seconds,
        "output_tokens": tokens,
        "sentences": sentences,
        "tokens_per_second": tokens / seconds if seconds else None,
        "seconds_per_token": seconds / tokens if tokens else None,
        "seconds_per_token_per_prompt": distribution([r.seconds_per_token for r in runs]),
        "over_hf_generate_per_prompt": distribution(ratios) if variant.kind != "hf" else None,
        "candidates_per_sentence": candidates / sentences if sentences else None,
        "candidates_per_sentence_per_prompt": distribution(
            [r.candidates / r.sentences for r in runs if r.sentences]
        )
        if variant.watermark
        else None,
        "candidates_per_sentence_per_sentence": distribution([c for c, _ in per_sentence])
        if variant.watermark
        else None,
        "sentence_seconds": distribution([s for _, s in per_sentence]) if per_sentence else None,
        "sentences_over_60s": sum(s > STALL_SECONDS for _, s in per_sentence),
        "fallbacks": sum(r.fallbacks for r in runs),
        "timed_out": sum(r.timed_out for r in runs),
        "decoded_tokens": decoded,
        "decoded_per_output_token": decoded / tokens if tokens else None,
        # Speculative waste: rows decoded past the accepted one or cut unfinished.
        "wasted_token_share": wasted / decoded if decoded and sentences else None,
        # Everything not in the final text: rejected candidates plus speculative waste.
        "discarded_token_share": 1 - tokens / decoded if decoded and sentences else None,
        "hard_sentences": len(hard),
        "hard_seconds_per_sentence": statistics.mean(s for _, s in hard) if hard else None,
        "peak_rss_mib": max(r.peak_mib for r in runs),
        "per_prompt_seconds": [round(r.seconds, 3) for r in runs],
        "per_prompt_tokens": [r.tokens for r in runs],
        "per_prompt_sentences": [r.sentences for r in runs],
        "per_prompt_candidates": [r.candidates for r in runs],
        "per_sentence": [[c, round(s, 3)] for c, s in per_sentence],
    }


def summarize_sequential(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sequential over batched on the sampled sentences: overall, per candidate, and on the
    sentences where both searches needed >= ``HARD`` candidates."""

    def total(items, name, key):
        return sum(r[name][key] for r in items)

    both_hard = [
        r
        for r in rows
        if r["batched"]["candidates"] >= HARD and r["sequential"]["candidates"] >= HARD
    ]
    hard_in_run = [r for r in rows if r["hard_in_default_run"]]
    out: dict[str, Any] = {"sentences": len(rows), "rows": rows}
    for label, items in (
        ("all", rows),
        ("hard_in_default_run", hard_in_run),
        ("both_hard", both_hard),
    ):
        if not items:
            out[label] = None
            continue
        seq_s, bat_s = total(items, "sequential", "seconds"), total(items, "batched", "seconds")
        seq_c, bat_c = (
            total(items, "sequential", "candidates"),
            total(items, "batched", "candidates"),
        )
        out[label] = {
            "sentences": len(items),
            "sequential_seconds_per_sentence": seq_s / len(items),
            "batched_seconds_per_sentence": bat_s / len(items),
            "sequential_over_batched_per_sentence": ratio(seq_s, bat_s),
            "sequential_over_batched_per_candidate": ratio(seq_s / seq_c, bat_s / bat_c)
            if seq_c and bat_c
            else None,
            "candidates_sequential": seq_c,
            "candidates_batched": bat_c,
        }
    return out
