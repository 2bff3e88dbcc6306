"""Throughput and memory of generation, detection and encoder training, in one run.

Run from the repository root (see ``benchmarks/README.md``)::

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench.py

It prints tables and writes ``benchmarks/results/latest.json`` and ``latest.md``.

Generation variants all continue the same held-out news prompts (test split, ~32 words cut at a
sentence end), one prompt per call, under one key and the paper's settings (K = 8, gamma = 0.25,
margin 0.035, temperature 0.7, repetition penalty 1.05, no top-k). The variants are interleaved
prompt by prompt, in a rotating order, so that load from other jobs on a shared machine falls on
all of them alike.

Memory is the peak resident set size (Linux ``VmHWM``) of this process during each measured call:
the high-water mark is reset through ``/proc/self/clear_refs`` before the call, so it includes
what was already resident (the models) plus whatever the call added on top.

Length (~940 lines): one self-contained script with a section per benchmark (generation
variants, detection, training) and the report that puts them side by side; it takes its
prompts and texts from ``ksemstamp.corpora`` like every command.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
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

from ksemstamp.assets import load_encoder, load_lm  # noqa: E402
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


# ---------------------------------------------------------------------- prompts and texts


# ---------------------------------------------------------------------- generation


@dataclass
class Variant:
    """One way of producing continuations."""

    name: str
    kind: str  # "hf" (model.generate), "loop" (our sentence loop)
    description: str
    watermark: bool = True
    strategy: str = "batched"
    candidate_batch: int = 32
    adaptive: bool = True
    novelty_patience: int = 0


def default_variants() -> list[Variant]:
    return [
        Variant("hf_generate", "hf", "HF model.generate, plain sampling (floor)", watermark=False),
        Variant("plain_loop", "loop", "our sentence loop, watermark=False", watermark=False),
        Variant("sequential", "loop", "one generate call per candidate (reference)", strategy="sequential"),
        Variant("batched_c8", "loop", "batched, adaptive rounds, cap 8", candidate_batch=8),
        Variant("batched_c16", "loop", "batched, adaptive rounds, cap 16", candidate_batch=16),
        Variant("batched_c32", "loop", "batched, adaptive rounds, cap 32 (default)"),
        Variant("batched_fixed8", "loop", "batched, fixed rounds of 8", candidate_batch=8, adaptive=False),
        Variant(
            "batched_c32_novelty10",
            "loop",
            "batched, adaptive, cap 32, novelty_patience 10 (project default)",
            novelty_patience=10,
        ),
    ]  # fmt: skip


class TimedSampler:
    """Wraps a sampler and records each round's wall-clock and candidates drawn per group."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.rounds: list[tuple[float, list[int]]] = []

    def sample_round(self, prefixes, rows, judge, generator=None, contexts=None):
        start = time.perf_counter()
        out: list[GroupResult] = self.inner.sample_round(prefixes, rows, judge, generator, contexts)
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
    decoded_tokens: int = 0
    wasted_tokens: int = 0
    # per accepted sentence: (candidates drawn, seconds in sampling rounds)
    per_sentence: list[tuple[int, float]] = field(default_factory=list)


class GenerationBench:
    """Builds every variant once and runs them prompt by prompt."""

    def __init__(self, args: argparse.Namespace, scheme, lm) -> None:
        self.args = args
        self.scheme = scheme
        self.model, self.tokenizer = lm
        self.variants = default_variants()
        self.runners: dict[str, Callable[[str, int], PromptRun]] = {}
        for v in self.variants:
            if v.kind == "hf":
                self.runners[v.name] = self._hf_runner()
            else:
                self.runners[v.name] = self._loop_runner(v)

    def config(self, variant: Variant) -> WatermarkConfig:
        a = self.args
        return WatermarkConfig(
            key=BENCH_KEY,
            gamma=0.25,
            margin=0.035,
            max_candidates=a.max_candidates,
            max_new_tokens=a.max_new_tokens,
            novelty_patience=variant.novelty_patience,
            candidate_batch=variant.candidate_batch,
            adaptive_batch=variant.adaptive,
            sampler_strategy=variant.strategy,
            seed=0,
        )

    def _loop_runner(self, variant: Variant) -> Callable[[str, int], PromptRun]:
        watermarker: Watermarker = build_watermarker(
            self.config(variant), self.scheme, (self.model, self.tokenizer)
        )
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
                tokens=self.output_tokens(result.text),
                sentences=result.num_sentences,
                candidates=result.candidates,
                fallbacks=result.fallbacks,
                decoded_tokens=result.decoded_tokens,
                wasted_tokens=result.wasted_tokens,
                per_sentence=[
                    (s.candidates, t) for s, t in zip(result.sentences, seconds, strict=True)
                ],
            )

        return run

    def _hf_runner(self) -> Callable[[str, int], PromptRun]:
        from transformers import GenerationConfig

        cfg = self.config(Variant("hf", "hf", ""))
        eos = self.tokenizer.eos_token_id
        gen_cfg = GenerationConfig(
            do_sample=True,
            temperature=cfg.temperature,
            repetition_penalty=cfg.repetition_penalty,
            top_k=0,
            top_p=1.0,
            max_new_tokens=cfg.max_new_tokens,
            suppress_tokens=[eos],  # as the sentence loop: never end the text early
            pad_token_id=self.tokenizer.pad_token_id,
        )

        def run(prompt: str, index: int) -> PromptRun:
            enc = self.tokenizer(prompt, return_tensors="pt")

            def call():
                with torch.inference_mode(), torch.random.fork_rng(devices=[]):
                    torch.manual_seed(index)
                    return self.model.generate(**enc, generation_config=gen_cfg)

            m = measure(call)
            new = m.value[0, enc["input_ids"].shape[1] :]
            text = self.tokenizer.decode(new, skip_special_tokens=True).strip()
            return PromptRun(
                m.seconds, m.peak_mib, self.output_tokens(text), decoded_tokens=len(new)
            )

        return run

    def warmup(self, prompt: str) -> None:
        """First calls pay one-off costs (lazy initialisation, allocator growth): pay them
        untimed with a short generation and one encoder call."""
        enc = self.tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            self.model.generate(**enc, max_new_tokens=8, do_sample=False)
        self.scheme.regions(["A warm-up sentence."])

    def output_tokens(self, text: str) -> int:
        """Tokens of a produced text, counted the same way for every variant."""
        return len(self.tokenizer(text)["input_ids"])

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
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                run = self.runners[name](prompt, i)
                runs[name].append(run)
                print(
                    f"  prompt {i + 1}/{len(prompts)} {name:<22} {run.seconds:7.1f} s "
                    f"{run.tokens:4d} tok {run.sentences:3d} sent {run.candidates:4d} cand",
                    flush=True,
                )
            if on_prompt:
                on_prompt(runs)
        return runs


def summarize_variant(variant: Variant, runs: list[PromptRun]) -> dict[str, Any]:
    """Totals and per-unit figures of one variant over all prompts."""
    seconds = sum(r.seconds for r in runs)
    tokens = sum(r.tokens for r in runs)
    sentences = sum(r.sentences for r in runs)
    candidates = sum(r.candidates for r in runs)
    decoded = sum(r.decoded_tokens for r in runs)
    wasted = sum(r.wasted_tokens for r in runs)
    hard = [(c, s) for r in runs for c, s in r.per_sentence if c >= HARD]
    return {
        "name": variant.name,
        "description": variant.description,
        "kind": variant.kind,
        "watermark": variant.watermark,
        "sampler_strategy": variant.strategy if variant.kind == "loop" else None,
        "candidate_batch": variant.candidate_batch if variant.watermark else None,
        "adaptive_batch": variant.adaptive if variant.watermark else None,
        "novelty_patience": variant.novelty_patience if variant.watermark else None,
        "prompts": len(runs),
        "seconds": seconds,
        "output_tokens": tokens,
        "sentences": sentences,
        "tokens_per_second": tokens / seconds if seconds else None,
        "seconds_per_token": seconds / tokens if tokens else None,
        "seconds_per_sentence": seconds / sentences if sentences else None,
        "candidates_per_sentence": candidates / sentences if sentences else None,
        "fallbacks": sum(r.fallbacks for r in runs),
        "decoded_tokens": decoded,
        # Speculative waste: rows decoded past the accepted one or cut unfinished.
        "wasted_token_share": wasted / decoded if decoded and sentences else None,
        # Everything not in the final text: rejected candidates plus speculative waste.
        "discarded_token_share": 1 - tokens / decoded if decoded and sentences else None,
        "hard_sentences": len(hard),
        "hard_candidates_per_sentence": statistics.mean(c for c, _ in hard) if hard else None,
        "hard_seconds_per_sentence": statistics.mean(s for _, s in hard) if hard else None,
        "peak_rss_mib": max(r.peak_mib for r in runs),
        "per_prompt_seconds": [round(r.seconds, 3) for r in runs],
        "per_prompt_sentences": [r.sentences for r in runs],
        "per_sentence": [[c, round(s, 3)] for r in runs for c, s in r.per_sentence],
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def generation_ratios(rows: dict[str, dict[str, Any]], runs: dict[str, list[PromptRun]]) -> dict:
    """Wall-clock per output token against the floors, and sequential against batched."""
    out: dict[str, Any] = {}
    batched = [n for n in rows if n.startswith("batched")]
    for name in batched:
        out[name] = {
            "vs_hf_generate_per_token": ratio(
                rows[name]["seconds_per_token"], rows["hf_generate"]["seconds_per_token"]
            ),
            "vs_plain_loop_per_token": ratio(
                rows[name]["seconds_per_token"], rows["plain_loop"]["seconds_per_token"]
            ),
            "sequential_over_batched_per_sentence": ratio(
                rows["sequential"]["seconds_per_sentence"], rows[name]["seconds_per_sentence"]
            ),
            "sequential_over_batched_hard_sentences": ratio(
                rows["sequential"]["hard_seconds_per_sentence"],
                rows[name]["hard_seconds_per_sentence"],
            ),
            # Per prompt, sequential seconds per sentence over batched: the worst prompt.
            "sequential_over_batched_worst_prompt": min(
                (s.seconds / s.sentences) / (b.seconds / b.sentences)
                for s, b in zip(runs["sequential"], runs[name], strict=True)
                if s.sentences and b.sentences
            ),
        }
    out["sequential"] = {
        "vs_hf_generate_per_token": ratio(
            rows["sequential"]["seconds_per_token"], rows["hf_generate"]["seconds_per_token"]
        ),
        "vs_plain_loop_per_token": ratio(
            rows["sequential"]["seconds_per_token"], rows["plain_loop"]["seconds_per_token"]
        ),
    }
    out["plain_loop"] = {
        "vs_hf_generate_per_token": ratio(
            rows["plain_loop"]["seconds_per_token"], rows["hf_generate"]["seconds_per_token"]
        )
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
    """The issue's targets, each with the measured figure and whether it is met."""
    out = []
    gen = report.get("generation")
    if gen:
        r = gen["ratios"]["batched_c32"]
        for floor in ("hf_generate", "plain_loop"):
            value = r[f"vs_{floor}_per_token"]
            out.append(
                {
                    "target": f"batched (c32) wall-clock per output token <= 2x unwatermarked ({floor})",
                    "measured": value,
                    "met": value is not None and value <= 2.0,
                }
            )
        hard = r["sequential_over_batched_hard_sentences"]
        out.append(
            {
                "target": f"batched (c32) >= 3x faster than sequential on sentences with >= {HARD} candidates",
                "measured": hard,
                "met": hard is not None and hard >= 3.0,
            }
        )
        overall = r["sequential_over_batched_per_sentence"]
        out.append(
            {
                "target": "batched (c32) never slower than sequential overall (seconds per sentence)",
                "measured": overall,
                "met": overall is not None and overall >= 1.0,
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


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown tables."""
    s = report["settings"]
    m = report["machine"]
    lines = [
        "# Benchmark results" + ("" if report.get("complete") else " (run still going)"),
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores (shared with other jobs), torch {m['torch']} "
        f"with {m['torch_threads']} thread(s), OMP_NUM_THREADS={m['OMP_NUM_THREADS']}, "
        f"transformers {m['transformers']}, sentence-transformers {m['sentence_transformers']}. "
        f"Load average at start / end: {report['load_average_start']} / {report['load_average_end']}. "
        f"Total wall-clock {report['total_seconds'] / 60:.1f} min.",
        "",
        f"Settings: {report.get('generation', {}).get('prompts_completed', 0)} of "
        f"{s['prompts']} requested news prompts (test split, ~{s['prompt_words']} words cut at a "
        f"sentence end), {s['max_new_tokens']} new tokens each, SmolLM2-135M-Instruct (fp32) + "
        f"all-MiniLM-L6-v2, K = 8, gamma = 0.25, margin 0.035, one fixed key, temperature 0.7, "
        f"repetition penalty 1.05, no top-k, N_max = {s['max_candidates']}, one prompt per call. "
        f"Peak memory: {m['peak_rss_method']}.",
        "",
    ]
    gen = report.get("generation")
    if gen:
        lines += [
            "## Generation",
            "",
            "| variant | novelty patience | s / sentence | tokens / s | candidates / sentence "
            f"| wasted share | discarded share | fallbacks | sentences (>= {HARD} cand.) "
            f"| s / sentence (>= {HARD} cand.) | peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in gen["variants"]:
            lines.append(
                f"| {row['name']} | {fmt(row['novelty_patience'])} "
                f"| {fmt(row['seconds_per_sentence'])} | {fmt(row['tokens_per_second'])} "
                f"| {fmt(row['candidates_per_sentence'])} | {fmt(row['wasted_token_share'])} "
                f"| {fmt(row['discarded_token_share'])} | {fmt(row['fallbacks'])} "
                f"| {fmt(row['hard_sentences'])} | {fmt(row['hard_seconds_per_sentence'])} "
                f"| {fmt(row['peak_rss_mib'], 0)} |"
            )
        lines += [
            "",
            "*wasted share*: decoded tokens of rows drawn past the accepted one or cut unfinished "
            "(speculative batching waste, `GenerationResult.wasted_tokens`); *discarded share*: "
            "every decoded token not in the final text (rejected candidates too).",
            "",
            "| ratio | " + " | ".join(n for n in gen["ratios"] if n.startswith("batched")) + " |",
            "|---|" + "---|" * sum(n.startswith("batched") for n in gen["ratios"]),
        ]
        keys = [
            ("vs_hf_generate_per_token", "batched / HF generate, s per output token"),
            ("vs_plain_loop_per_token", "batched / plain sentence loop, s per output token"),
            ("sequential_over_batched_per_sentence", "sequential / batched, s per sentence"),
            ("sequential_over_batched_hard_sentences", f"sequential / batched, s per sentence (>= {HARD} cand.)"),
            ("sequential_over_batched_worst_prompt", "sequential / batched, worst prompt"),
        ]  # fmt: skip
        batched = [n for n in gen["ratios"] if n.startswith("batched")]
        for key, label in keys:
            lines.append(
                f"| {label} | " + " | ".join(fmt(gen["ratios"][n][key]) for n in batched) + " |"
            )
        seq = gen["ratios"]["sequential"]
        lines += [
            "",
            f"Sequential / HF generate per output token: {fmt(seq['vs_hf_generate_per_token'])}; "
            f"plain sentence loop / HF generate: "
            f"{fmt(gen['ratios']['plain_loop']['vs_hf_generate_per_token'])}.",
            "",
        ]
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
    p.add_argument("--prompts", type=int, default=2, help="news prompts for generation")
    p.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--prompt-words", type=int, default=32, help="prompt length in words")
    p.add_argument("--max-candidates", type=int, default=100, help="N_max (paper: 100)")
    p.add_argument(
        "--time-budget",
        type=float,
        default=float("inf"),
        help="seconds of generation after which no further prompt is started",
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
    p.add_argument("--threads", type=int, default=1, help="torch threads (shared machine: 1)")
    p.add_argument("--output-dir", default=str(REPO / "benchmarks" / "results"))
    args = p.parse_args(argv)
    if args.train_warmup < 1:
        p.error("--train-warmup must be >= 1 (the first step pays one-off costs)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
    scheme = build_scheme(WatermarkConfig(key=BENCH_KEY))
    if "generation" in sections:
        print("generation", flush=True)
        prompts = news_prompts(args.prompts, args.prompt_words)
        bench = GenerationBench(args, scheme, load_lm())

        def record(runs: dict[str, list[PromptRun]]) -> None:
            rows = {v.name: summarize_variant(v, runs[v.name]) for v in bench.variants}
            report["generation"] = {
                "prompts_completed": len(runs["hf_generate"]),
                "hard_threshold": HARD,
                "variants": list(rows.values()),
                "ratios": generation_ratios(rows, runs),
            }
            # Long runs on shared machines get killed: keep what is done so far on disk.
            write_report(report, Path(args.output_dir), started, final=False)

        record(bench.run(prompts, on_prompt=record))
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
