"""Generation throughput: output tokens per second with many prompts at once, watermarked
against plain ``generate`` on the same batch.

    python -m benchmarks throughput --throughput.batches 1,8,64 --throughput.device cuda
    python -m benchmarks throughput --throughput.batches 1,8 \
        --throughput.max_new_tokens 48                                   # a CPU's share

prints the table and writes ``results/throughput.json`` and ``throughput.md``. For each batch
size ``B``, ``B`` held-out news prompts (test split, ~32 words cut at a sentence end) are
continued in one call: by the default configuration (``configs/ksemstamp.yaml``) with
``search.prompt_batch = B``, so that the candidate rows of every prompt decode together, and by
``model.generate`` on the same ``B`` prompts in one left-padded batch with the same LM, weights
and sampling (EOS suppressed, as the sentence loop never ends a text early). Output tokens are
counted by re-tokenising the texts, the same way for both; the first call of each is an
untimed warm-up. ``python -m benchmarks generation`` has the one-prompt latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ksemstamp.assets import load_lm
from ksemstamp.builders import build_watermarker
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts

from .harness import (
    BENCH_KEY_LAYER,
    DEFAULT_CONFIG,
    RunSettings,
    at_least,
    fmt,
    measure,
    refuse,
    section_report,
)


@dataclass(frozen=True)
class ThroughputSettings:
    """Output tokens per second with many prompts in one call, watermarked and plain."""

    batches: list[int] = field(default_factory=lambda: [1, 8, 64])
    """Prompts per call, one row each (``1,8,64``)."""
    max_new_tokens: int = 200
    """New tokens per prompt."""
    device: str = "cpu"
    """Where the LM and the encoder run (cpu, cuda, ...)."""
    config: str = str(DEFAULT_CONFIG)
    """The configuration measured."""

    def __post_init__(self) -> None:
        problems = at_least(self, 1, "max_new_tokens")
        if not self.batches or min(self.batches) < 1:
            problems.append(f"batches must be one or more sizes >= 1, got {self.batches}")
        refuse(self, problems)


def throughput(throughput: ThroughputSettings | None = None, run: RunSettings | None = None) -> int:
    """Generation throughput: many prompts in one call, watermarked against plain generate."""
    throughput = throughput or ThroughputSettings()
    return section_report(
        "throughput",
        "Generation throughput",
        run or RunSettings(),
        {"throughput": throughput},
        lambda: bench_throughput(throughput),
        throughput_targets,
        throughput_markdown,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _plain(model, tokenizer, sampling, prompts: list[str], seed: int) -> list[str]:
    """``model.generate`` of ``prompts`` in one left-padded batch, the texts it added."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=True,
        temperature=sampling.temperature,
        repetition_penalty=sampling.repetition_penalty,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        max_new_tokens=sampling.max_new_tokens,
        suppress_tokens=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    with torch.inference_mode(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(**enc, generation_config=config)
    _synchronize(model.device)
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def bench_throughput(bench: ThroughputSettings) -> dict[str, Any]:
    """Output tokens/s of the configuration and of plain ``generate`` for each batch size of
    ``bench.batches``, on ``bench.device``."""
    layer = {
        **BENCH_KEY_LAYER,
        "model": {"device": bench.device},
        "sampling": {"max_new_tokens": bench.max_new_tokens, "seed": 0},
    }
    settings = load_watermark_settings([bench.config], layer)
    model, tokenizer = load_lm(settings.model.lm, bench.device, settings.model.lm_dtype)
    sizes = sorted(set(bench.batches))
    prompts = news_prompts(max(sizes), words=32)

    def tokens(texts: list[str]) -> int:
        return sum(len(tokenizer(t.strip())["input_ids"]) for t in texts)

    rows = []
    for size in sizes:
        batch = prompts[:size]
        layered = settings.updated({"search": {"prompt_batch": size}})
        watermarker = build_watermarker(layered, lm=(model, tokenizer))
        watermarker.generate(batch[:1])  # warm-up
        _plain(model, tokenizer, settings.sampling, batch[:1], 0)

        def marked(watermarker=watermarker, batch=batch):
            return [r.text for r in watermarker.generate(batch)]

        m_marked = measure(marked)
        m_plain = measure(lambda batch=batch: _plain(model, tokenizer, settings.sampling, batch, 1))
        row = {
            "prompts": size,
            "watermarked_tokens": tokens(m_marked.value),
            "watermarked_seconds": m_marked.seconds,
            "plain_tokens": tokens(m_plain.value),
            "plain_seconds": m_plain.seconds,
        }
        row["watermarked_tokens_per_second"] = row["watermarked_tokens"] / m_marked.seconds
        row["plain_tokens_per_second"] = row["plain_tokens"] / m_plain.seconds
        row["watermarked_over_plain"] = (
            row["watermarked_tokens_per_second"] / row["plain_tokens_per_second"]
        )
        rows.append(row)
        print(
            f"  {size:>3} prompts: watermarked {row['watermarked_tokens_per_second']:8.1f} tok/s, "
            f"plain {row['plain_tokens_per_second']:8.1f} tok/s",
            flush=True,
        )
    return {
        "device": bench.device,
        "lm": settings.model.lm,
        "lm_dtype": str(next(model.parameters()).dtype),
        "max_new_tokens": bench.max_new_tokens,
        "rows": rows,
    }


def throughput_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """On a GPU, at 64 prompts, at least half of batched plain ``generate``'s tokens/s."""
    if not section["device"].startswith("cuda"):
        return []
    at = {row["prompts"]: row for row in section["rows"]}
    value = at[64]["watermarked_over_plain"] if 64 in at else None
    return [
        {
            "target": "watermarked >= 0.5 of batched plain generate's tokens/s at 64 prompts (GPU)",
            "measured": value,
            "met": value is not None and value >= 0.5,
        }
    ]


def throughput_markdown(section: dict[str, Any]) -> list[str]:
    """The throughput table."""
    lines = [
        "## Throughput",
        "",
        f"{section['lm']} ({section['lm_dtype']}) on {section['device']}, "
        f"{section['max_new_tokens']} new tokens per prompt, all prompts of a row in one call.",
        "",
        "| prompts | watermarked tokens / s | plain `generate` tokens / s | ratio |",
        "|---|---|---|---|",
    ]
    for row in section["rows"]:
        lines.append(
            f"| {row['prompts']} | {fmt(row['watermarked_tokens_per_second'], 1)} "
            f"| {fmt(row['plain_tokens_per_second'], 1)} | {fmt(row['watermarked_over_plain'])} |"
        )
    return lines + [""]
