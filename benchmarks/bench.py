"""Throughput and memory of generation, detection and encoder training, in one run.

Run from the repository root (see ``benchmarks/README.md``)::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench.py --prompts 20 --max-new-tokens 200

It prints tables and writes ``benchmarks/results/latest.json`` and ``latest.md``.

Generation: the shipped configurations, read from their files (``configs/ksemstamp.yaml``, the
default, and ``configs/ksemstamp-paper.yaml``), so the figures follow whatever they say; plain
``generate`` with the default's LM, weight format and sampling settings (the floor); the
default's sentence loop without a watermark. All continue the same held-out news prompts (test
split, ~32 words cut at a sentence end), one prompt per call, under one fixed key, interleaved
prompt by prompt in a rotating order so that load from other jobs falls on all of them alike.
The reference strategy (one ``generate`` call per candidate) would need hours for whole prompts:
it searches a sample of the default run's sentences instead, each from the same prefix as the
batched sampler, in alternating order.

Memory is the peak resident set size (Linux ``VmHWM``) of this process during each measured call:
the high-water mark is reset through ``/proc/self/clear_refs`` before the call, so it includes
what was already resident (the models) plus whatever the call added on top.

Length (~1000 lines): one self-contained script with a section per benchmark (generation
variants and the sequential sample, detection, training) and the report that puts them side by
side; it takes its prompts and texts from ``ksemstamp.corpora`` like every command.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import platform
import random
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # run from a checkout without installing

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ksemstamp.assets import load_encoder, load_lm, resolve_lm_dtype  # noqa: E402
from ksemstamp.config import (  # noqa: E402
    WatermarkConfig,
    build_detector,
    build_scheme,
    build_watermarker,
)
from ksemstamp.corpora import news_articles, news_prompts, news_windows  # noqa: E402
from ksemstamp.sampler import GroupResult  # noqa: E402
from ksemstamp.splitter import get_splitter  # noqa: E402
from ksemstamp.watermarker import GenerationResult, Watermarker  # noqa: E402

# A fixed, public key: benchmarks must be repeatable, and nothing here needs secrecy.
BENCH_KEY = "ksemstamp-benchmark-key"
HARD = 8  # "hard" sentences: those that needed at least this many candidates
STALL_SECONDS = 60.0  # a sentence searched longer than this counts as a stall

# ---------------------------------------------------------------------- memory


def peak_rss_mib() -> float:
    """Peak resident set size of this process since the last reset, in MiB (``VmHWM``)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


def current_rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class Measured:
    """Wall-clock seconds and peak RSS of one call, and what it returned."""

    seconds: float
    peak_mib: float
    value: Any


def measure(fn: Callable[[], Any]) -> Measured:
    reset_peak_rss()
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    return Measured(seconds, peak_rss_mib(), value)


# ---------------------------------------------------------------------- generation


@dataclass
class Variant:
    """One way of producing continuations: a configuration file's watermark, its plain sentence
    loop, or plain ``generate`` with its LM and sampling settings."""

    name: str
    kind: str  # "hf" (model.generate), "loop" (the sentence loop)
    config: WatermarkConfig
    source: str  # the configuration file it was read from
    watermark: bool = True


def read_config(path: Path, args: argparse.Namespace, **overrides: Any) -> WatermarkConfig:
    """A configuration file as shipped, with the benchmark's key, length and one prompt per call
    (per-prompt timing); ``--lm-dtype`` and ``--max-candidates`` override it when given."""
    settings = dict(key=BENCH_KEY, max_new_tokens=args.max_new_tokens, prompt_batch=1)
    if args.lm_dtype:
        settings["lm_dtype"] = args.lm_dtype
    if args.max_candidates:
        settings["max_candidates"] = args.max_candidates
    return WatermarkConfig.from_yaml(path, **settings, **overrides)


def make_variants(args: argparse.Namespace) -> list[Variant]:
    default = read_config(Path(args.default_config), args)
    paper = read_config(Path(args.paper_config), args)
    rel = {
        c: str(Path(c).resolve().relative_to(REPO)) if Path(c).resolve().is_relative_to(REPO) else c
        for c in (args.default_config, args.paper_config)
    }
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

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.variants = make_variants(args)
        self.lms: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.watermarkers: dict[str, Watermarker] = {}
        self.runners: dict[str, Callable[[str, int], PromptRun]] = {}
        for v in self.variants:
            self.runners[v.name] = self._hf_runner(v) if v.kind == "hf" else self._loop_runner(v)

    def lm(self, cfg: WatermarkConfig) -> tuple[Any, Any]:
        """One loaded LM per (model, device, weight format), shared by the variants."""
        key = (cfg.lm, cfg.device, resolve_lm_dtype(cfg.lm_dtype, cfg.device))
        if key not in self.lms:
            self.lms[key] = load_lm(*key)
        return self.lms[key]

    def watermarker(self, cfg: WatermarkConfig) -> Watermarker:
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
            temperature=cfg.temperature,
            repetition_penalty=cfg.repetition_penalty,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            suppress_tokens=[eos],  # as the sentence loop: never end the text early
            pad_token_id=tokenizer.pad_token_id,
        )

        def run(prompt: str, index: int) -> PromptRun:
            enc = tokenizer(prompt, return_tensors="pt")

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
            enc = tokenizer(prompt, return_tensors="pt")
            with torch.inference_mode():
                model.generate(**enc, max_new_tokens=8, do_sample=False)
        for wm in self.watermarkers.values():
            wm.scheme.regions(["A warm-up sentence."])

    def output_tokens(self, text: str, cfg: WatermarkConfig) -> int:
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

        Whole prompts under ``sampler_strategy: sequential`` would take hours, so it searches
        sampled sentences instead: for each, both strategies start from the same prefix (the
        prompt and the default run's text before that sentence) and search for one sentence,
        in alternating order. Sentences that needed >= ``HARD`` candidates in the default run
        are sampled first.
        """
        a = self.args
        cfg = next(v.config for v in self.variants if v.name == "default")
        batched = self.watermarker(cfg)
        sequential = self.watermarker(dataclasses.replace(cfg, sampler_strategy="sequential"))
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


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """Median, 90th percentile and worst (largest) of per-prompt or per-sentence figures."""
    vals = [v for v in values if v is not None]
    return {
        "median": quantile(vals, 0.5),
        "p90": quantile(vals, 0.9),
        "worst": max(vals) if vals else None,
        "n": len(vals),
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
        "settings": {
            k: getattr(cfg, k)
            for k in (
                "lm",
                "lm_dtype",
                "mark",
                "context_temperature",
                "threshold",
                "centroids",
                "gamma",
                "margin",
                "valid_mode",
                "max_candidates",
                "prune_tokens",
                "prune_keep",
                "prune_margin",
                "novelty_patience",
                "margin_patience",
                "sentence_time_budget",
                "candidate_batch",
                "adaptive_batch",
                "temperature",
                "repetition_penalty",
            )
        },
        "lm_dtype_resolved": resolve_lm_dtype(cfg.lm_dtype, cfg.device),
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


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


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


# ---------------------------------------------------------------------- detection


def bench_detection(args: argparse.Namespace, scheme) -> dict[str, Any]:
    """``Detector.detect_batch`` against ``encoder.encode`` on the same sentences."""
    detector = build_detector(WatermarkConfig(key=BENCH_KEY), scheme)
    # Skip the articles the prompts came from, so these are other texts.
    texts = news_windows(args.detect_texts, skip=args.prompts)
    splitter = scheme.splitter
    split = measure(lambda: [s for t in texts for s in splitter.split(t)])
    sentences = split.value
    batch = scheme.encode_batch_size
    encoder = scheme.encoder

    def raw():
        return encoder.encode(sentences, batch_size=batch, convert_to_tensor=True)

    raw()  # warm-up, untimed
    detector.detect_batch(texts[:8])
    detect_runs, raw_runs = [], []
    for i in range(args.detect_repeats):
        # Alternate which goes first, so drift from other jobs hits both alike.
        pair = [("detect", lambda: detector.detect_batch(texts)), ("raw", raw)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (detect_runs if name == "detect" else raw_runs).append(measure(fn))
    best_detect = min(detect_runs, key=lambda m: m.seconds)
    best_raw = min(raw_runs, key=lambda m: m.seconds)
    results = best_detect.value
    return {
        "texts": len(texts),
        "sentences": len(sentences),
        "batch_size": batch,
        "repeats": args.detect_repeats,
        "statistic": detector.statistic,
        "detect_seconds": [round(m.seconds, 3) for m in detect_runs],
        "raw_encode_seconds": [round(m.seconds, 3) for m in raw_runs],
        "split_seconds": split.seconds,
        "detect_texts_per_second": len(texts) / best_detect.seconds,
        "detect_sentences_per_second": len(sentences) / best_detect.seconds,
        "raw_sentences_per_second": len(sentences) / best_raw.seconds,
        "detect_over_raw": best_raw.seconds / best_detect.seconds,
        "detect_peak_rss_mib": max(m.peak_mib for m in detect_runs),
        "raw_peak_rss_mib": max(m.peak_mib for m in raw_runs),
        "scored_ok": sum(r.status == "ok" for r in results),
    }


# ---------------------------------------------------------------------- training


def training_pairs(count: int) -> list[tuple[str, str]]:
    """``(sentence, variant)`` pairs from held-out news: the sentence and the same sentence
    with every fifth word dropped. Throughput depends only on lengths, so no paraphraser is
    needed, and the pairs are the same on every machine."""
    splitter = get_splitter()
    pairs = []
    for article in news_articles("test"):
        for sentence in splitter.split(article.text):
            words = sentence.split()
            if len(words) >= 6:
                shorter = " ".join(w for i, w in enumerate(words) if i % 5 != 4)
                pairs.append((sentence, shorter))
                if len(pairs) == count:
                    return pairs
    return pairs


def _lightning_steps(pairs, batch_size: int, steps: int) -> list[float]:
    """End time of every optimizer step of ``EncoderModule`` under a Lightning ``Trainer``."""
    import lightning as L
    from torch.utils.data import DataLoader

    from ksemstamp.training.data import PairDataset, collate_pairs
    from ksemstamp.training.module import EncoderModule

    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stamps.append(time.perf_counter())

    module = EncoderModule(max_seq_length=128, val_kmeans_sentences=0)
    loader = DataLoader(
        PairDataset(pairs), batch_size=batch_size, collate_fn=collate_pairs, drop_last=True
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[Stamp()],
    )
    trainer.fit(module, train_dataloaders=loader)
    return stamps


def _sentence_transformers_steps(pairs, batch_size: int, steps: int) -> list[float]:
    """End time of every optimizer step of sentence-transformers' own trainer, same loss."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.sampler import DefaultBatchSampler
    from torch.utils.data import SequentialSampler
    from transformers import TrainerCallback

    from ksemstamp.training.loss import margin_contrastive_loss

    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    class MarginLoss(torch.nn.Module):
        """The project's loss in sentence-transformers' loss interface (one pass per column)."""

        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, sentence_features, labels=None):
            anchor, positive = (self.model(f)["sentence_embedding"] for f in sentence_features)
            return margin_contrastive_loss(anchor, positive, delta=0.8, reduction="mean")

    class InOrderTrainer(SentenceTransformerTrainer):
        """Batches in file order, as the Lightning side's loader: the same batches on both sides.
        Shuffled batches would pad to other lengths, and padding is most of the cost difference
        between two batch orders of the same pairs."""

        def get_batch_sampler(self, dataset, batch_size, drop_last, **kwargs):
            return DefaultBatchSampler(
                SequentialSampler(dataset), batch_size=batch_size, drop_last=drop_last, **kwargs
            )

    model = load_encoder()
    model.max_seq_length = 128  # as EncoderModule's default
    data = Dataset.from_dict({"anchor": [t for t, _ in pairs], "positive": [p for _, p in pairs]})
    with tempfile.TemporaryDirectory() as out:
        args = SentenceTransformerTrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch_size,
            max_steps=steps,
            learning_rate=4e-5,
            warmup_ratio=0.1,
            weight_decay=0.01,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            dataloader_drop_last=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = InOrderTrainer(
            model=model, args=args, train_dataset=data, loss=MarginLoss(model), callbacks=[Stamp()]
        )
        trainer.train()
    return stamps


def bench_training(args: argparse.Namespace) -> dict[str, Any]:
    """Pairs/s of ``EncoderModule``'s step against sentence-transformers' own step."""
    if importlib.util.find_spec("ksemstamp.training.module") is None:
        return {"measured": False, "todo": "TODO: src/ksemstamp/training has no EncoderModule"}
    missing = [p for p in ("lightning", "datasets") if importlib.util.find_spec(p) is None]
    if missing:
        return {
            "measured": False,
            "todo": f"TODO: not measured, missing packages {missing} (pip install {' '.join(missing)})",
        }
    warm, steps, batch = args.train_warmup, args.train_steps, args.train_batch
    pairs = training_pairs(batch * (warm + steps))
    runners = {
        "encoder_module": _lightning_steps,
        "sentence_transformers": _sentence_transformers_steps,
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for r in range(args.train_repeats):
        names = list(runners) if r % 2 == 0 else list(runners)[::-1]
        for name in names:
            m = measure(lambda name=name: runners[name](pairs, batch, warm + steps))
            stamps = m.value
            # Steady state: from the end of the last warm-up step to the end of the last step.
            seconds = stamps[-1] - stamps[warm - 1]
            results[name].append(
                {"pairs_per_second": steps * batch / seconds, "peak_rss_mib": m.peak_mib}
            )
            print(f"  training {name:<22} {steps * batch / seconds:7.2f} pairs/s", flush=True)
    best = {n: max(x["pairs_per_second"] for x in runs) for n, runs in results.items()}
    return {
        "measured": True,
        "batch_size": batch,
        "warmup_steps": warm,
        "measured_steps": steps,
        "repeats": args.train_repeats,
        "max_seq_length": 128,
        "runs": results,
        "encoder_module_pairs_per_second": best["encoder_module"],
        "sentence_transformers_pairs_per_second": best["sentence_transformers"],
        "encoder_module_over_sentence_transformers": best["encoder_module"]
        / best["sentence_transformers"],
        "encoder_module_peak_rss_mib": max(x["peak_rss_mib"] for x in results["encoder_module"]),
        "sentence_transformers_peak_rss_mib": max(
            x["peak_rss_mib"] for x in results["sentence_transformers"]
        ),
    }


# ---------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    import sentence_transformers
    import transformers

    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = found.group(1).strip() if found else cpu
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "peak_rss_method": "VmHWM from /proc/self/status, reset via /proc/self/clear_refs"
        if reset_peak_rss()
        else "VmHWM from /proc/self/status, NOT reset (process-wide peak)",
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The speed targets of benchmarks/README.md, each with its measured figure and whether
    it is met."""
    out = []
    gen = report.get("generation")
    if gen:
        rows = {r["name"]: r for r in gen["variants"]}
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
        seq = gen.get("sequential") or {}
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
    det = report.get("detection")
    if det:
        out.append(
            {
                "target": "detection >= 80% of raw encoder sentences/s",
                "measured": det["detect_over_raw"],
                "met": det["detect_over_raw"] >= 0.8,
            }
        )
    train = report.get("training")
    if train:
        value = train.get("encoder_module_over_sentence_transformers")
        out.append(
            {
                "target": "EncoderModule training step within 10% of sentence-transformers' (pairs/s)",
                "measured": value,
                "met": value is not None and value >= 0.9,
                **({} if train.get("measured") else {"note": train["todo"]}),
            }
        )
    return out


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _dist(d: dict[str, Any] | None, digits: int = 2) -> str:
    """``median / p90 / worst`` of a distribution."""
    if not d:
        return "-"
    return " / ".join(fmt(d[k], digits) for k in ("median", "p90", "worst"))


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables."""
    s = report["settings"]
    m = report["machine"]
    gen = report.get("generation")
    lines = [
        "# Benchmark results" + ("" if report.get("complete") else " (run still going)"),
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
        f"with {m['torch_threads']} thread(s), OMP_NUM_THREADS={m['OMP_NUM_THREADS']}, "
        f"transformers {m['transformers']}, sentence-transformers {m['sentence_transformers']}. "
        f"Load average at start / end: {report['load_average_start']} / {report['load_average_end']}. "
        f"Total wall-clock {report['total_seconds'] / 60:.1f} min. Peak memory: "
        f"{m['peak_rss_method']}.",
        "",
    ]
    if gen:
        rows = {r["name"]: r for r in gen["variants"]}
        d = rows["default"]["settings"]
        lines += [
            "## Generation",
            "",
            f"{gen['prompts_completed']} of {s['prompts']} requested held-out news prompts (test "
            f"split, ~{s['prompt_words']} words cut at a sentence end), {s['max_new_tokens']} new "
            f"tokens each, one prompt per call, one fixed key, variants in a rotating order. "
            f"Generator {d['lm']} ({rows['default']['lm_dtype_resolved']}), sampling as the "
            f"default configuration (temperature {d['temperature']}, repetition penalty "
            f"{d['repetition_penalty']}).",
            "",
            "| variant | config | K / margin (or mark) / N_max | tokens / s | s per token: median / p90 "
            "/ worst prompt | x plain generate: median / p90 / worst prompt | candidates per "
            "sentence: mean; median / p90 / worst prompt | decoded tokens per output token "
            f"| longest sentence s | sentences > {STALL_SECONDS:g} s | fallbacks | peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in gen["variants"]:
            st = r["settings"]
            k = Path(st["centroids"]).stem.rsplit("-", 1)[-1].upper() if st["centroids"] else "K64"
            scheme = f"{k} / {st['margin']} / {st['max_candidates']}" if r["watermark"] else "-"
            if r["watermark"] and st.get("mark") == "direction":
                scheme = f"{k} / direction / {st['max_candidates']}"
                if st.get("prune_tokens"):
                    scheme += f", pruned to {st['prune_keep']} after {st['prune_tokens']} tokens"
            lines.append(
                f"| {r['name']} | `{r['config_file']}` | {scheme} | {fmt(r['tokens_per_second'])} "
                f"| {_dist(r['seconds_per_token_per_prompt'], 3)} "
                f"| {_dist(r['over_hf_generate_per_prompt'])} "
                f"| {fmt(r['candidates_per_sentence'], 1) if r['watermark'] else '-'}"
                f"{'; ' + _dist(r['candidates_per_sentence_per_prompt'], 1) if r['watermark'] else ''} "
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
        seq = gen.get("sequential")
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
    det = report.get("detection")
    if det:
        lines += [
            "## Detection",
            "",
            f"{det['texts']} held-out human news texts (~150 words), {det['sentences']} sentences, "
            f"encoder batch {det['batch_size']}, best of {det['repeats']} alternating repeats, "
            f"`{det['statistic']}` statistic.",
            "",
            "| | texts / s | sentences / s | peak RSS MiB |",
            "|---|---|---|---|",
            f"| `Detector.detect_batch` | {fmt(det['detect_texts_per_second'])} "
            f"| {fmt(det['detect_sentences_per_second'])} | {fmt(det['detect_peak_rss_mib'], 0)} |",
            f"| raw `encoder.encode` | - | {fmt(det['raw_sentences_per_second'])} "
            f"| {fmt(det['raw_peak_rss_mib'], 0)} |",
            "",
            f"Detection / raw encoder sentences/s: {fmt(det['detect_over_raw'])} (splitting alone "
            f"took {fmt(det['split_seconds'], 3)} s of it).",
            "",
        ]
    train = report.get("training")
    if train:
        lines += ["## Training", ""]
        if train.get("measured"):
            lines += [
                f"Batch {train['batch_size']} pairs, max_seq_length {train['max_seq_length']}, "
                f"{train['measured_steps']} measured steps after {train['warmup_steps']} warm-up "
                f"steps, best of {train['repeats']} alternating repeats; same pairs, same margin "
                f"loss (delta 0.8), AdamW lr 4e-5.",
                "",
                "| step | pairs / s | peak RSS MiB |",
                "|---|---|---|",
                f"| `EncoderModule` (Lightning) | {fmt(train['encoder_module_pairs_per_second'])} "
                f"| {fmt(train['encoder_module_peak_rss_mib'], 0)} |",
                f"| sentence-transformers trainer | "
                f"{fmt(train['sentence_transformers_pairs_per_second'])} "
                f"| {fmt(train['sentence_transformers_peak_rss_mib'], 0)} |",
                "",
                f"EncoderModule / sentence-transformers: "
                f"{fmt(train['encoder_module_over_sentence_transformers'])}.",
                "",
            ]
        else:
            lines += [f"**{train['todo']}**", ""]
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {fmt(t['measured'])} | {fmt(t['met'])} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=20, help="news prompts for generation")
    p.add_argument("--max-new-tokens", type=int, default=200, help="new tokens per prompt")
    p.add_argument("--prompt-words", type=int, default=32, help="prompt length in words")
    p.add_argument("--default-config", default=str(REPO / "configs" / "ksemstamp.yaml"))
    p.add_argument("--paper-config", default=str(REPO / "configs" / "ksemstamp-paper.yaml"))
    p.add_argument(
        "--max-candidates", type=int, default=None, help="override N_max of both configs"
    )
    p.add_argument(
        "--lm-dtype", default=None, help="override lm_dtype of both configs (fp32, bf16, ...)"
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
    p.add_argument("--detect-texts", type=int, default=100, help="texts for detection")
    p.add_argument("--detect-repeats", type=int, default=3)
    p.add_argument("--train-batch", type=int, default=16, help="pairs per training step")
    p.add_argument("--train-steps", type=int, default=6, help="measured training steps")
    p.add_argument("--train-warmup", type=int, default=2, help="untimed first training steps")
    p.add_argument("--train-repeats", type=int, default=2)
    p.add_argument(
        "--sections",
        default="generation,detection,training",
        help="comma-separated subset of generation,detection,training",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's, every available core; a shared machine: 1)",
    )
    p.add_argument("--output-dir", default=str(REPO / "benchmarks" / "results"))
    args = p.parse_args(argv)
    if args.train_warmup < 1:
        p.error("--train-warmup must be >= 1 (the first step pays one-off costs)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sections = set(args.sections.split(","))
    started = time.perf_counter()
    report: dict[str, Any] = {
        "command": "OMP_NUM_THREADS={} python benchmarks/bench.py {}".format(
            os.environ.get("OMP_NUM_THREADS", "unset"),
            shlex.join(sys.argv[1:] if argv is None else argv),
        ).strip(),
        # JSON has no infinity: an unlimited time budget is written as null.
        "settings": {
            k: (None if v == float("inf") else v)
            for k, v in vars(args).items()
            if k != "output_dir"
        },
        "machine": machine_info(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
    if "generation" in sections:
        print("generation", flush=True)
        prompts = news_prompts(args.prompts, args.prompt_words)
        bench = GenerationBench(args)

        def record(runs: dict[str, list[PromptRun]], sequential=None) -> None:
            floor = runs["hf_generate"]
            report["generation"] = {
                "prompts_completed": len(floor),
                "hard_threshold": HARD,
                "stall_seconds": STALL_SECONDS,
                "variants": [summarize_variant(v, runs[v.name], floor) for v in bench.variants],
                "sequential": sequential,
            }
            # Long runs on shared machines get killed: keep what is done so far on disk.
            write_report(report, Path(args.output_dir), started, final=False)

        runs = bench.run(prompts, on_prompt=record)
        if args.sequential_sentences > 0:
            print("sequential sample", flush=True)
            sample = bench.sequential_sample(prompts, runs["default"])
            record(runs, summarize_sequential(sample))
    scheme = build_scheme(WatermarkConfig.from_yaml(args.default_config, key=BENCH_KEY))
    if "detection" in sections:
        print("detection", flush=True)
        report["detection"] = bench_detection(args, scheme)
    if "training" in sections:
        print("training", flush=True)
        report["training"] = bench_training(args)
    text = write_report(report, Path(args.output_dir), started, final=True)
    print()
    print(text)
    print(f"wrote {args.output_dir}/latest.json and latest.md")
    return 0


def write_report(report: dict[str, Any], out: Path, started: float, final: bool) -> str:
    """Write ``latest.json`` and ``latest.md``; ``final=False`` marks a run still going."""
    report["complete"] = final
    report["targets"] = targets(report)
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report["total_seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "latest.md").write_text(text)
    return text


if __name__ == "__main__":
    raise SystemExit(main())
