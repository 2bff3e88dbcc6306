"""Generation throughput: output tokens per second with many prompts at once, watermarked
against plain ``generate`` on the same batch.

    python -m benchmarks.throughput --batches 1,8,64 --max-new-tokens 200 --device cuda
    python -m benchmarks.throughput --batches 1,8 --max-new-tokens 48       # a CPU's share

prints the table and writes ``results/throughput.json`` and ``throughput.md``. For each batch
size ``B``, ``B`` held-out news prompts (test split, ~32 words cut at a sentence end) are
continued in one call: by the default configuration (``configs/ksemstamp.yaml``) with
``search.prompt_batch = B``, so that the candidate rows of every prompt decode together, and by
``model.generate`` on the same ``B`` prompts in one left-padded batch with the same LM, weights
and sampling (EOS suppressed, as the sentence loop never ends a text early). Output tokens are
counted by re-tokenising the texts, the same way for both; the first call of each is an
untimed warm-up. ``benchmarks.generation`` has the one-prompt latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jsonargparse import ArgumentParser, Namespace

from ksemstamp.assets import load_lm
from ksemstamp.builders import build_watermarker
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts

from .harness import BENCH_KEY_LAYER, REPO, Section, fmt, measure, section_main


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


def bench_throughput(args: Namespace) -> dict[str, Any]:
    """Output tokens/s of the default configuration and of plain ``generate`` for each batch
    size of ``--batches``, on ``--device``."""
    layer = {
        **BENCH_KEY_LAYER,
        "model": {"device": args.device},
        "sampling": {"max_new_tokens": args.max_new_tokens, "seed": 0},
    }
    settings = load_watermark_settings([args.default_config], layer)
    model, tokenizer = load_lm(settings.model.lm, args.device, settings.model.lm_dtype)
    sizes = sorted({int(b) for b in str(args.batches).split(",")})
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
        "device": args.device,
        "lm": settings.model.lm,
        "lm_dtype": str(next(model.parameters()).dtype),
        "max_new_tokens": args.max_new_tokens,
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


def add_arguments(p: ArgumentParser) -> None:
    """The throughput benchmark's flags."""
    p.add_argument("--batches", type=str, default="1,8,64", help="prompts per call, e.g. 1,8,64")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--device", type=str, default="cpu", help="where the LM and encoder run")
    p.add_argument("--default-config", type=str, default=str(REPO / "configs" / "ksemstamp.yaml"))


SECTION = Section(
    name="throughput",
    title="Generation throughput",
    add_arguments=add_arguments,
    measure=bench_throughput,
    targets=throughput_targets,
    markdown=throughput_markdown,
)


def main(argv: Sequence[str] | None = None) -> int:
    return section_main(SECTION, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
