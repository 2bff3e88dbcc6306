"""What steering costs before a generator's first token, by the size of its vocabulary.

    python -m benchmarks steering                     # SmolLM2 (49k), Gemma-3 (262k), 128k

prints the table and writes ``results/steering.json`` and ``steering.md``. For each vocabulary,
with an empty cache: decoding every entry alone (the pieces the cutter needs anyway), the
mask of word entries, and setting up the key's steering (the probes that name the cache, the
``generation.steering.SAMPLE`` entries whose projections standardise the bias); then embedding
``steering.entries`` further word entries, picked at random, as steering does when they are
first plausible at some step. ``every word entry`` is what embedding all of them would take at
that rate (the whole table steering once needed before the first token). The 128k vocabulary is
the first 131,072 entries of Gemma-3's: no tokenizer with a 128k vocabulary is at hand offline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ksemstamp.assets import ORACLE_LM, resolve_lm_path
from ksemstamp.builders import build_scheme
from ksemstamp.generation import steering as steering_module
from ksemstamp.generation.cutter import vocabulary_pieces
from ksemstamp.generation.steering import Steering, token_table, word_tokens
from ksemstamp.marks import build_mark
from ksemstamp.settings.files import load_watermark_settings

from .harness import (
    BENCH_KEY_LAYER,
    DEFAULT_CONFIG,
    RunSettings,
    at_least,
    fmt,
    refuse,
    section_report,
)

LIMIT_SECONDS = 60.0
"""The target: steering ready in under a minute before the first token, on 2 CPU cores."""


@dataclass(frozen=True)
class SteeringSettings:
    """What steering costs before the first token."""

    entries: int = 1000
    """Word entries embedded after the set-up, as at a first text's steps."""
    seed: int = 0
    """Picks those entries."""

    def __post_init__(self) -> None:
        refuse(self, at_least(self, 1, "entries"))


def steering(steering: SteeringSettings | None = None, run: RunSettings | None = None) -> int:
    """Steering: set-up seconds by vocabulary size, and the rate entries are embedded at."""
    steering = steering or SteeringSettings()
    return section_report(
        "steering",
        "Steering set-up benchmark",
        run or RunSettings(),
        {"steering": steering},
        lambda: bench_steering(steering),
        steering_targets,
        steering_markdown,
    )


def _vocabularies() -> list[tuple[str, Any, int]]:
    from transformers import AutoTokenizer

    settings = load_watermark_settings([DEFAULT_CONFIG])
    smol = AutoTokenizer.from_pretrained(resolve_lm_path(settings.model.lm))
    gemma = AutoTokenizer.from_pretrained(resolve_lm_path(ORACLE_LM))
    return [
        ("SmolLM2-135M", smol, len(smol)),
        ("Gemma-3 (first 128k entries)", gemma, 131_072),
        ("Gemma-3-270M", gemma, len(gemma)),
    ]


def bench_steering(settings: SteeringSettings) -> dict[str, Any]:
    """One row per vocabulary: seconds of each set-up step, with an empty cache."""
    scheme = build_scheme(load_watermark_settings([DEFAULT_CONFIG], BENCH_KEY_LAYER))
    mark = build_mark(scheme)
    rows = []
    for name, tokenizer, vocab in _vocabularies():
        start = time.perf_counter()
        pieces = vocabulary_pieces(tokenizer, vocab)
        decoded = time.perf_counter()
        words = word_tokens(tokenizer, vocab, pieces)
        masked = time.perf_counter()
        table = token_table(tokenizer, vocab, scheme, mark, None, pieces)
        steer = Steering(table, mark.directions, 0.5, words)
        ready = time.perf_counter()
        gen = torch.Generator().manual_seed(settings.seed)
        left = (words & ~table.known).nonzero().squeeze(-1)
        picked = left[torch.randperm(len(left), generator=gen)[: settings.entries]]
        before = time.perf_counter()
        steer.bias(torch.ones(1, len(mark.directions))).among(_marked(vocab, picked))
        rate = len(picked) / (time.perf_counter() - before) if len(picked) else float("nan")
        rows.append(
            {
                "vocabulary": name,
                "entries": vocab,
                "word_entries": int(words.sum()),
                "decode_seconds": decoded - start,
                "word_mask_seconds": masked - decoded,
                "setup_seconds": ready - masked,
                "ready_seconds": ready - start,
                "entries_per_second": rate,
                "every_word_entry_seconds": int(words.sum()) / rate,
            }
        )
    return {"rows": rows, "sample": steering_module.SAMPLE, "entries": settings.entries}


def _marked(vocab: int, ids: torch.Tensor) -> torch.Tensor:
    inside = torch.zeros(1, vocab, dtype=torch.bool)
    inside[0, ids] = True
    return inside


def steering_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Ready before the first token in under a minute, for every vocabulary."""
    return [
        {
            "target": f"steering ready in under {LIMIT_SECONDS:.0f} s: {row['vocabulary']}",
            "measured": round(row["ready_seconds"], 1),
            "met": row["ready_seconds"] < LIMIT_SECONDS,
        }
        for row in section["rows"]
    ]


def steering_markdown(section: dict[str, Any]) -> list[str]:
    """The set-up table."""
    lines = [
        "## Steering before the first token",
        "",
        f"An empty cache; the bias standardised by {section['sample']} entries; then "
        f"{section['entries']} random word entries embedded as steering meets them.",
        "",
        "| vocabulary | entries | word entries | decode (s) | word mask (s) | set-up (s) "
        "| ready (s) | entries/s after | every word entry (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in section["rows"]:
        lines.append(
            f"| {row['vocabulary']} | {row['entries']:,} | {row['word_entries']:,} "
            f"| {fmt(row['decode_seconds'], 1)} | {fmt(row['word_mask_seconds'], 1)} "
            f"| {fmt(row['setup_seconds'], 1)} | {fmt(row['ready_seconds'], 1)} "
            f"| {fmt(row['entries_per_second'], 0)} | {fmt(row['every_word_entry_seconds'], 0)} |"
        )
    return lines + [""]
