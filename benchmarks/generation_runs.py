"""The generation benchmark's runs: each variant on each prompt, timed, and the sequential
engine on a sample of the default run's sentences (``generation`` summarises them).

Variants: the shipped configurations, read from their files (``configs/ksemstamp.yaml``, the
default, and ``configs/ksemstamp-paper.yaml``), so the figures follow whatever they say; plain
``generate`` with the default's LM, weight format and sampling settings (the floor); the
default's sentence loop without a watermark. All continue the same held-out news prompts (test
split, ~32 words cut at a sentence end), one prompt per call, under one fixed key, interleaved
prompt by prompt in a rotating order so that load from other jobs falls on all of them alike.
The reference engine (one ``generate`` call per candidate) would need hours for whole prompts:
it searches a sample of the default run's sentences instead, each from the same prefix as the
batched engine, in alternating order.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ksemstamp.assets import load_lm, resolve_lm_dtype
from ksemstamp.builders import build_scheme, build_watermarker
from ksemstamp.settings import WatermarkSettings
from ksemstamp.watermarker import GenerationProgress, GenerationResult, Watermarker

from .harness import measure

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


def sentence_seconds(ticks: list[tuple[float, int]]) -> list[float]:
    """Seconds the sentence loop spent on each accepted sentence of a one-document run.

    ``ticks`` are ``(time, sentences so far)``: the start, then one per round (the loop's
    ``on_progress``); a sentence's time runs from the round after the previous sentence was
    kept to the round that kept it.
    """
    out = []
    last_time, last_count = ticks[0]
    for when, count in ticks[1:]:
        if count > last_count:
            out.append(when - last_time)
            out.extend([0.0] * (count - last_count - 1))  # several kept in one round
            last_time, last_count = when, count
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

    def __init__(self, variants: list[Variant]) -> None:
        self.variants = variants
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
        ticks: list[tuple[float, int]] = []

        def tick(progress: GenerationProgress) -> None:
            ticks.append((time.perf_counter(), progress.sentences))

        def generate(prompt: str) -> GenerationResult:
            ticks[:] = [(time.perf_counter(), 0)]
            return watermarker.generate([prompt], watermark=variant.watermark, on_progress=tick)[0]

        def run(prompt: str, index: int) -> PromptRun:
            m = measure(lambda: generate(prompt))
            result: GenerationResult = m.value
            if result.status != "ok":
                raise RuntimeError(f"{variant.name} failed on prompt {index}: {result.error}")
            seconds = sentence_seconds(ticks)
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
        warmup: bool = True,
        time_budget: float | None = None,
        on_prompt: Callable[[dict[str, list[PromptRun]]], None] | None = None,
    ) -> dict[str, list[PromptRun]]:
        """Run every variant on every prompt, after untimed warm-up calls (``warmup``), starting
        no prompt after ``time_budget`` seconds (``None``: no limit); ``on_prompt`` sees the
        runs after each prompt."""
        runs: dict[str, list[PromptRun]] = {v.name: [] for v in self.variants}
        names = [v.name for v in self.variants]
        budget = math.inf if time_budget is None else time_budget
        if warmup:
            self.warmup(prompts[0])
        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            if i and time.perf_counter() - started > budget:
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
        self, prompts: Sequence[str], runs: list[PromptRun], sentences: int, budget: float
    ) -> list[dict[str, Any]]:
        """The reference engine on ``sentences`` sampled sentences of the default run, starting
        none after ``budget`` seconds.

        Whole prompts under ``sampling.engine: sequential`` would take hours, so it searches
        sampled sentences instead: for each, both engines start from the same prefix (the
        prompt and the default run's text before that sentence) and search for one sentence,
        in alternating order. Sentences that needed >= ``HARD`` candidates in the default run
        are sampled first.
        """
        cfg = next(v.config for v in self.variants if v.name == "default")
        batched = self.watermarker(cfg)
        sequential = self.watermarker(cfg.updated({"sampling": {"engine": "sequential"}}))
        for wm in (batched, sequential):
            wm.max_sentences = 1
        chosen = sample_prefixes(prompts, runs, sentences)
        out = []
        started = time.perf_counter()
        for i, (was_hard, p, s, prefix) in enumerate(chosen):
            if i and time.perf_counter() - started > budget:
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


def sample_prefixes(
    prompts: Sequence[str], runs: list[PromptRun], count: int
) -> list[tuple[bool, int, int, str]]:
    """``count`` sentences of ``runs`` (one run per prompt), those that needed >= ``HARD``
    candidates first, in a fixed random order: each as (hard, prompt index, sentence index,
    the prefix it was written after: the prompt and the run's text before it)."""
    pool = []
    for p, run in enumerate(runs):
        end = 0  # the run's text is its sentences joined by their separators
        for s, ((cands, _), sentence) in enumerate(
            zip(run.per_sentence, run.sentence_texts, strict=True)
        ):
            done = run.text[:end]
            pool.append((cands >= HARD, p, s, prompts[p].strip() + (" " + done if done else "")))
            end = run.text.index(sentence, end) + len(sentence)
    rng = random.Random(0)
    hard = [x for x in pool if x[0]]
    easy = [x for x in pool if not x[0]]
    rng.shuffle(hard)
    rng.shuffle(easy)
    return (hard + easy)[:count]
