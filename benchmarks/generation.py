"""Generation speed: the shipped configurations against plain sampling, and the sequential
strategy on a sample of sentences.

    python -m benchmarks.generation --prompts 20 --max-new-tokens 200

prints the table and writes ``results/generation.json`` (every figure, per prompt and per
sentence) and ``generation.md``; ``python -m benchmarks.bench`` runs it with detection and
training as the benchmark of record.

Variants: the shipped configurations, read from their files (``configs/ksemstamp.yaml``, the
default, and ``configs/ksemstamp-paper.yaml``), so the figures follow whatever they say; plain
``generate`` with the default's LM, weight format and sampling settings (the floor); the
default's sentence loop without a watermark. All continue the same held-out news prompts (test
split, ~32 words cut at a sentence end), one prompt per call, under one fixed key, interleaved
prompt by prompt in a rotating order so that load from other jobs falls on all of them alike.
The reference strategy (one ``generate`` call per candidate) would need hours for whole prompts:
it searches a sample of the default run's sentences instead, each from the same prefix as the
batched sampler, in alternating order.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser, Namespace

from ksemstamp.assets import load_lm, resolve_lm_dtype
from ksemstamp.builders import build_scheme, build_watermarker
from ksemstamp.generation.sampler import GroupResult
from ksemstamp.settings import WatermarkSettings
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts
from ksemstamp.watermarker import GenerationResult, Watermarker

from .harness import (
    BENCH_KEY_LAYER,
    REPO,
    apply_threads,
    dist_cell,
    distribution,
    fmt,
    header_markdown,
    measure,
    new_report,
    parser,
    ratio,
    repo_relative,
    targets_markdown,
    write_report,
)

HARD = 8
""""Hard" sentences: those that needed at least this many candidates."""
STALL_SECONDS = 60.0
"""A sentence searched longer than this counts as a stall."""

# ---------------------------------------------------------------------- generation


@dataclass
class Variant:
    """One way of producing continuations: a configuration file's watermark, its plain sentence
    loop, or plain ``generate`` with its LM and sampling settings."""

    name: str
    kind: str  # "hf" (model.generate), "loop" (the sentence loop)
    config: WatermarkSettings
    source: str  # the configuration file it was read from
    watermark: bool = True


def read_config(path: Path, args: Namespace) -> WatermarkSettings:
    """A configuration file as shipped, with the benchmark's key, length and one prompt per call
    (per-prompt timing); ``--lm-dtype`` and ``--max-candidates`` override it when given."""
    # A fixed seed: every variant and every rerun samples the same way.
    layer: dict[str, Any] = {
        **BENCH_KEY_LAYER,
        "sampling": {"max_new_tokens": args.max_new_tokens, "seed": 0},
        "search": {"prompt_batch": 1},
    }
    if args.lm_dtype:
        layer["model"] = {"lm_dtype": args.lm_dtype}
    if args.max_candidates:
        layer["search"]["max_candidates"] = args.max_candidates
    return load_watermark_settings([path], layer)


def make_variants(args: Namespace) -> list[Variant]:
    default = read_config(Path(args.default_config), args)
    paper = read_config(Path(args.paper_config), args)
    rel = {c: repo_relative(c) for c in (args.default_config, args.paper_config)}
    return [
        Variant("hf_generate", "hf", default, rel[args.default_config], watermark=False),
        Variant("plain_loop", "loop", default, rel[args.default_config], watermark=False),
        Variant("default", "loop", default, rel[args.default_config]),
        Variant("paper", "loop", paper, rel[args.paper_config]),
    ]


class TimedSampler:
    """Wraps a sampler and records each round's wall-clock and candidates drawn per group."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.rounds: list[tuple[float, list[int]]] = []

    def sample_round(self, prefixes, rows, judge, generator=None, contexts=None, **kwargs):
        start = time.perf_counter()
        out: list[GroupResult] = self.inner.sample_round(
            prefixes, rows, judge, generator, contexts, **kwargs
        )
        self.rounds.append((time.perf_counter() - start, [len(r.candidates) for r in out]))
        return out


def sentence_seconds(
    result: GenerationResult, rounds: list[tuple[float, list[int]]]
) -> list[float]:
    """Seconds spent in sampling rounds for each accepted sentence of a one-document run.

    A sentence's rounds are those whose candidates add up to its ``candidates`` count (the
    sentence loop resets the count after each accepted sentence).
    """
    out = []
    it = iter(rounds)
    for record in result.sentences:
        drawn, seconds = 0, 0.0
        while drawn < record.candidates:
            round_seconds, counts = next(it)
            drawn += counts[0]
            seconds += round_seconds
        out.append(seconds)
    return out


@dataclass
class PromptRun:
    """One variant on one prompt."""

    seconds: float
    peak_mib: float
    tokens: int
    sentences: int = 0
    candidates: int = 0
    fallbacks: int = 0
    timed_out: int = 0
    decoded_tokens: int = 0
    wasted_tokens: int = 0
    # per accepted sentence: (candidates drawn, seconds in sampling rounds)
    per_sentence: list[tuple[int, float]] = field(default_factory=list)
    text: str = ""
    sentence_texts: list[str] = field(default_factory=list)

    @property
    def seconds_per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens else None


class GenerationBench:
    """Builds every variant once and runs them prompt by prompt."""

    def __init__(self, args: Namespace) -> None:
        self.args = args
        self.variants = make_variants(args)
        self.lms: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.watermarkers: dict[str, Watermarker] = {}
        self.runners: dict[str, Callable[[str, int], PromptRun]] = {}
        for v in self.variants:
            self.runners[v.name] = self._hf_runner(v) if v.kind == "hf" else self._loop_runner(v)

    def lm(self, cfg: WatermarkSettings) -> tuple[Any, Any]:
        """One loaded LM per (model, device, weight format), shared by the variants."""
        model = cfg.model
        key = (model.lm, model.device, resolve_lm_dtype(model.lm_dtype, model.device))
        if key not in self.lms:
            self.lms[key] = load_lm(*key)
        return self.lms[key]

    def watermarker(self, cfg: WatermarkSettings) -> Watermarker:
        return build_watermarker(cfg, build_scheme(cfg), self.lm(cfg))

    def _loop_runner(self, variant: Variant) -> Callable[[str, int], PromptRun]:
        watermarker = self.watermarker(variant.config)
        self.watermarkers[variant.name] = watermarker
        timed = TimedSampler(watermarker.sampler)
        watermarker.sampler = timed

        def run(prompt: str, index: int) -> PromptRun:
            timed.rounds.clear()
            m = measure(lambda: watermarker.generate([prompt], watermark=variant.watermark)[0])
            result: GenerationResult = m.value
            if result.status != "ok":
                raise RuntimeError(f"{variant.name} failed on prompt {index}: {result.error}")
            seconds = sentence_seconds(result, timed.rounds)
            return PromptRun(
                seconds=m.seconds,
                peak_mib=m.peak_mib,
                tokens=self.output_tokens(result.text, variant.config),
                sentences=result.num_sentences,
                candidates=result.candidates,
                fallbacks=result.fallbacks,
                timed_out=sum(s.timed_out for s in result.sentences),
                decoded_tokens=result.decoded_tokens,
                wasted_tokens=result.wasted_tokens,
                per_sentence=[
                    (s.candidates, t) for s, t in zip(result.sentences, seconds, strict=True)
                ],
                text=result.text,
                sentence_texts=[s.text for s in result.sentences],
            )

        return run

    def _hf_runner(self, variant: Variant) -> Callable[[str, int], PromptRun]:
        from transformers import GenerationConfig

        cfg = variant.config
        model, tokenizer = self.lm(cfg)
        eos = tokenizer.eos_token_id
        gen_cfg = GenerationConfig(
            do_sample=True,
            temperature=cfg.sampling.temperature,
            repetition_penalty=cfg.sampling.repetition_penalty,
            top_k=cfg.sampling.top_k,
            top_p=cfg.sampling.top_p,
            max_new_tokens=cfg.sampling.max_new_tokens,
            suppress_tokens=[eos],  # as the sentence loop: never end the text early
            pad_token_id=tokenizer.pad_token_id,
        )

        def run(prompt: str, index: int) -> PromptRun:
            enc = tokenizer(prompt, return_tensors="pt").to(model.device)

            def call():
                with torch.inference_mode(), torch.random.fork_rng(devices=[]):
                    torch.manual_seed(index)
                    return model.generate(**enc, generation_config=gen_cfg)

            m = measure(call)
            new = m.value[0, enc["input_ids"].shape[1] :]
            text = tokenizer.decode(new, skip_special_tokens=True).strip()
            return PromptRun(
                m.seconds, m.peak_mib, self.output_tokens(text, cfg), decoded_tokens=len(new)
            )

        return run

    def warmup(self, prompt: str) -> None:
        """First calls pay one-off costs (lazy initialisation, allocator growth): pay them
        untimed with a short generation per LM and one encoder call per watermarker."""
        for model, tokenizer in self.lms.values():
            enc = tokenizer(prompt, return_tensors="pt").to(model.device)
            with torch.inference_mode():
                model.generate(**enc, max_new_tokens=8, do_sample=False)
        for wm in self.watermarkers.values():
            wm.scheme.regions(["A warm-up sentence."])

    def output_tokens(self, text: str, cfg: WatermarkSettings) -> int:
        """Tokens of a produced text, counted the same way for every variant."""
        return len(self.lm(cfg)[1](text)["input_ids"])

    def run(
        self,
        prompts: Sequence[str],
        on_prompt: Callable[[dict[str, list[PromptRun]]], None] | None = None,
    ) -> dict[str, list[PromptRun]]:
        """Run every variant on every prompt; ``on_prompt`` sees the runs after each prompt."""
        runs: dict[str, list[PromptRun]] = {v.name: [] for v in self.variants}
        names = [v.name for v in self.variants]
        if self.args.warmup:
            self.warmup(prompts[0])
        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            if i and time.perf_counter() - started > self.args.time_budget:
                # Whole prompts only: every variant must have run on the same prompts.
                print(f"  time budget reached after {i} prompts", flush=True)
                break
            # A rotating order: load from other jobs falls on every variant alike.
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                run = self.runners[name](prompt, i)
                runs[name].append(run)
                print(
                    f"  prompt {i + 1}/{len(prompts)} {name:<12} {run.seconds:7.1f} s "
                    f"{run.tokens:4d} tok {run.sentences:3d} sent {run.candidates:4d} cand",
                    flush=True,
                )
            if on_prompt:
                on_prompt(runs)
        return runs

    # ------------------------------------------------------------------ sequential sample
    def sequential_sample(
        self, prompts: Sequence[str], runs: list[PromptRun]
    ) -> list[dict[str, Any]]:
        """The reference strategy on a sample of the default run's sentences.

        Whole prompts under ``search.strategy: sequential`` would take hours, so it searches
        sampled sentences instead: for each, both strategies start from the same prefix (the
        prompt and the default run's text before that sentence) and search for one sentence,
        in alternating order. Sentences that needed >= ``HARD`` candidates in the default run
        are sampled first.
        """
        a = self.args
        cfg = next(v.config for v in self.variants if v.name == "default")
        batched = self.watermarker(cfg)
        sequential = self.watermarker(cfg.updated({"search": {"strategy": "sequential"}}))
        for wm in (batched, sequential):
            wm.max_sentences = 1
        pool = []
        for p, run in enumerate(runs):
            end = 0  # the run's text is its sentences joined by their separators
            for s, ((cands, _), sentence) in enumerate(
                zip(run.per_sentence, run.sentence_texts, strict=True)
            ):
                done = run.text[:end]
                pool.append(
                    (cands >= HARD, p, s, prompts[p].strip() + (" " + done if done else ""))
                )
                end = run.text.index(sentence, end) + len(sentence)
        rng = random.Random(0)
        hard = [x for x in pool if x[0]]
        easy = [x for x in pool if not x[0]]
        rng.shuffle(hard)
        rng.shuffle(easy)
        chosen = (hard + easy)[: a.sequential_sentences]
        out = []
        started = time.perf_counter()
        for i, (was_hard, p, s, prefix) in enumerate(chosen):
            if i and time.perf_counter() - started > a.sequential_budget:
                print(f"  sequential budget reached after {i} sentences", flush=True)
                break
            pair = [("batched", batched), ("sequential", sequential)]
            row: dict[str, Any] = {"prompt": p, "sentence": s, "hard_in_default_run": was_hard}
            for name, wm in pair if i % 2 == 0 else pair[::-1]:
                m = measure(lambda wm=wm, prefix=prefix: wm.generate([prefix])[0])
                res: GenerationResult = m.value
                row[name] = {
                    "seconds": m.seconds,
                    "candidates": res.candidates,
                    "fallbacks": res.fallbacks,
                    "peak_rss_mib": m.peak_mib,
                }
            print(
                f"  sentence {i + 1}/{len(chosen)} (prompt {p + 1}, #{s + 1}): batched "
                f"{row['batched']['seconds']:.1f} s / {row['batched']['candidates']} cand, "
                f"sequential {row['sequential']['seconds']:.1f} s / "
                f"{row['sequential']['candidates']} cand",
                flush=True,
            )
            out.append(row)
        return out


# ---------------------------------------------------------------------- summaries


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


# ---------------------------------------------------------------------- targets and table


def generation_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The generation targets of benchmarks/README.md, each with its figure and whether it is
    met."""
    out = []
    rows = {r["name"]: r for r in section["variants"]}
    for name in ("default", "paper"):
        ratios = rows[name]["over_hf_generate_per_prompt"] or {}
        for stat, bound in (("median", 3.0), ("p90", 6.0), ("worst", 10.0)):
            value = ratios.get(stat)
            out.append(
                {
                    "target": f"{name}: watermarked / plain generate, s per output token, "
                    f"{stat} over prompts <= {bound:g}x",
                    "measured": value,
                    "met": value is not None and value <= bound,
                }
            )
        worst = (rows[name]["sentence_seconds"] or {}).get("worst")
        out.append(
            {
                "target": f"{name}: no sentence searched longer than {STALL_SECONDS:g} s "
                "(longest sentence, s)",
                "measured": worst,
                "met": worst is not None and worst <= STALL_SECONDS,
            }
        )
    seq = section.get("sequential") or {}
    hard = (seq.get("both_hard") or seq.get("hard_in_default_run") or {}).get(
        "sequential_over_batched_per_sentence"
    )
    out.append(
        {
            "target": f"default: >= 3x faster than the sequential strategy on sentences "
            f"needing >= {HARD} candidates (sampled sentences)",
            "measured": hard,
            "met": hard is not None and hard >= 3.0,
        }
    )
    return out


def generation_markdown(section: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The generation tables: one row per variant, then the sequential sample."""
    rows = {r["name"]: r for r in section["variants"]}
    d = rows["default"]["settings"]
    lines = [
        "## Generation",
        "",
        f"{section['prompts_completed']} of {settings['prompts']} requested held-out news prompts "
        f"(test split, ~{settings['prompt_words']} words cut at a sentence end), "
        f"{settings['max_new_tokens']} new tokens each, one prompt per call, one fixed key, "
        f"variants in a rotating order. Generator {d['model']['lm']} "
        f"({rows['default']['lm_dtype_resolved']}), sampling as the default configuration "
        f"(temperature {d['sampling']['temperature']}, repetition penalty "
        f"{d['sampling']['repetition_penalty']}).",
        "",
        "| variant | config | K / margin (or mark) / N_max | tokens / s | s per token: median / p90 "
        "/ worst prompt | x plain generate: median / p90 / worst prompt | candidates per "
        "sentence: mean; median / p90 / worst prompt | decoded tokens per output token "
        f"| longest sentence s | sentences > {STALL_SECONDS:g} s | fallbacks | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in section["variants"]:
        mark, search = r["settings"]["mark"], r["settings"]["search"]
        centroids = r["settings"]["partition"]["centroids"]
        k = Path(centroids).stem.rsplit("-", 1)[-1].upper() if centroids else "K64"
        scheme = "-"
        if r["watermark"] and mark["kind"] == "direction":
            scheme = f"{k} / direction / {search['max_candidates']}"
            if search["prune_tokens"]:
                scheme += (
                    f", pruned to {search['prune_keep']} after {search['prune_tokens']} tokens"
                )
        elif r["watermark"]:
            scheme = f"{k} / {mark['margin']} / {search['max_candidates']}"
        per_prompt = dist_cell(r["candidates_per_sentence_per_prompt"], 1)
        candidates = (
            f"{fmt(r['candidates_per_sentence'], 1)}; {per_prompt}" if r["watermark"] else "-"
        )
        lines.append(
            f"| {r['name']} | `{r['config_file']}` | {scheme} | {fmt(r['tokens_per_second'])} "
            f"| {dist_cell(r['seconds_per_token_per_prompt'], 3)} "
            f"| {dist_cell(r['over_hf_generate_per_prompt'])} | {candidates} "
            f"| {fmt(r.get('decoded_per_output_token'), 2)} "
            f"| {fmt((r['sentence_seconds'] or {}).get('worst'), 1)} "
            f"| {r['sentences_over_60s'] if r['kind'] == 'loop' else '-'} "
            f"| {r['fallbacks'] if r['watermark'] else '-'} | {fmt(r['peak_rss_mib'], 0)} |"
        )
    lines += [
        "",
        "Per-prompt figures: each prompt's seconds per output token (output tokens counted "
        "by re-tokenising the text, the same way for every variant), and its ratio to plain "
        "`generate` on the same prompt; p90 interpolates between prompts. A sentence's "
        "seconds are those of the sampling rounds that produced it (embedding and judging "
        "included).",
        "",
    ]
    seq = section.get("sequential")
    if seq:
        lines += [
            "### Sequential strategy (a sample of sentences, not whole prompts)",
            "",
            f"Whole prompts under `sampler_strategy: sequential` would take hours, so "
            f"{seq['sentences']} sentences of the default run were searched again by both "
            f"strategies from the same prefix (the prompt and the text before the "
            f"sentence), one sentence each, in alternating order; sentences that needed >= "
            f"{HARD} candidates in the run were sampled first. The two searches draw "
            f"different candidates, so each needs its own number of them.",
            "",
            "| sentences | n | sequential s / sentence | batched s / sentence "
            "| sequential / batched per sentence | per candidate | candidates seq. / batched |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, name in (
            ("all sampled", "all"),
            (f">= {HARD} candidates in the default run", "hard_in_default_run"),
            (f">= {HARD} candidates in both searches", "both_hard"),
        ):
            x = seq.get(name)
            if not x:
                lines.append(f"| {label} | 0 | - | - | - | - | - |")
                continue
            lines.append(
                f"| {label} | {x['sentences']} | {fmt(x['sequential_seconds_per_sentence'], 1)} "
                f"| {fmt(x['batched_seconds_per_sentence'], 1)} "
                f"| {fmt(x['sequential_over_batched_per_sentence'])} "
                f"| {fmt(x['sequential_over_batched_per_candidate'])} "
                f"| {x['candidates_sequential']} / {x['candidates_batched']} |"
            )
        lines.append("")
    return lines


# ---------------------------------------------------------------------- command line


def add_arguments(p: ArgumentParser) -> None:
    """The generation benchmark's flags."""
    p.add_argument("--prompts", type=int, default=20, help="news prompts for generation")
    p.add_argument("--max-new-tokens", type=int, default=200, help="new tokens per prompt")
    p.add_argument("--prompt-words", type=int, default=32, help="prompt length in words")
    p.add_argument("--default-config", type=str, default=str(REPO / "configs" / "ksemstamp.yaml"))
    p.add_argument(
        "--paper-config", type=str, default=str(REPO / "configs" / "ksemstamp-paper.yaml")
    )
    p.add_argument(
        "--max-candidates", type=int | None, default=None, help="override N_max of both configs"
    )
    p.add_argument(
        "--lm-dtype",
        type=str | None,
        default=None,
        help="override lm_dtype of both configs (fp32, bf16, ...)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=float("inf"),
        help="seconds of generation after which no further prompt is started",
    )
    p.add_argument(
        "--sequential-sentences",
        type=int,
        default=6,
        help="sentences of the default run searched again by both strategies",
    )
    p.add_argument(
        "--sequential-budget",
        type=float,
        default=900.0,
        help="seconds after which no further sequential sample sentence is started",
    )
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip warm-up calls")


def run_generation(
    args: Namespace, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Every variant on every prompt, then the sequential sample; ``on_progress`` sees the
    section so far after each prompt (long runs on shared machines get killed)."""
    prompts = news_prompts(args.prompts, args.prompt_words)
    bench = GenerationBench(args)

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

    runs = bench.run(prompts, on_prompt=progress)
    sequential = None
    if args.sequential_sentences > 0:
        print("sequential sample", flush=True)
        sequential = summarize_sequential(bench.sequential_sample(prompts, runs["default"]))
    return section(runs, sequential)


def render(report: dict[str, Any]) -> str:
    lines = header_markdown(report, "Generation benchmark")
    if "generation" in report:
        lines += generation_markdown(report["generation"], report["settings"])
    return "\n".join(lines + targets_markdown(report.get("targets", []))) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    apply_threads(args)
    report = new_report("generation", args, argv)

    def save(section: dict[str, Any], final: bool = False) -> str:
        report["generation"] = section
        report["targets"] = generation_targets(section)
        return write_report(report, args.output_dir, "generation", render, final)

    text = save(run_generation(args, save), final=True)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
