"""How far the encoder's arithmetic moves a text's z: one device and weight format against
another, on the same texts under the same key.

    python -m benchmarks precision --precision.texts 200               # fp32 vs bf16, fp16
    python -m benchmarks precision --precision.texts 400 --precision.device cuda \
        --precision.dtypes fp32,bf16                                    # CPU vs a GPU

prints the table and writes ``results/precision.json`` and ``precision.md``. The reference is
the default configuration on the CPU in fp32; each other setting (``--precision.device`` with each
of ``--precision.dtypes``) detects the same held-out human news texts of ~150 words, and the table gives the
absolute differences of their whole-text z and of their final p-values' decisions at 1%. A text
made on one machine and detected on another moves by these amounts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ksemstamp.builders import build_detector
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_windows

from .harness import (
    BENCH_KEY_LAYER,
    DEFAULT_CONFIG,
    RunSettings,
    at_least,
    fmt,
    refuse,
    section_report,
)


@dataclass(frozen=True)
class PrecisionSettings:
    """How far the encoder's device and weight format move a text's z."""

    texts: int = 200
    """Held-out human news texts (~150 words each)."""
    skip: int = 20
    """Held-out articles skipped before the texts."""
    device: str = "cpu"
    """The device compared with the CPU (cpu, cuda, ...)."""
    dtypes: list[str] = field(default_factory=lambda: ["fp32", "bf16", "fp16"])
    """The encoder weight formats compared with the CPU's fp32 (``fp32,bf16``)."""
    config: str = str(DEFAULT_CONFIG)
    """The configuration whose detector is measured."""

    def __post_init__(self) -> None:
        problems = at_least(self, 1, "texts") + at_least(self, 0, "skip")
        if not self.dtypes:
            problems.append("dtypes must name one weight format or more")
        refuse(self, problems)


def precision(precision: PrecisionSettings | None = None, run: RunSettings | None = None) -> int:
    """Precision: how far the encoder's device and weight format move a text's z."""
    precision = precision or PrecisionSettings()
    return section_report(
        "precision",
        "Precision benchmark",
        run or RunSettings(),
        {"precision": precision},
        lambda: bench_precision(precision),
        lambda section: [],
        precision_markdown,
    )


def _detect(config: str, texts: list[str], device: str, dtype: str):
    layer = {**BENCH_KEY_LAYER, "model": {"device": device, "encoder_dtype": dtype}}
    settings = load_watermark_settings([config], layer)
    return build_detector(settings).detect_batch(texts)


def bench_precision(settings: PrecisionSettings) -> dict[str, Any]:
    """Whole-text z and 1% decisions of each setting against the CPU's fp32."""
    texts = news_windows(settings.texts, skip=settings.skip)
    reference = _detect(settings.config, texts, "cpu", "fp32")
    rows = []
    for dtype in settings.dtypes:
        if settings.device == "cpu" and dtype == "fp32":
            continue
        results = _detect(settings.config, texts, settings.device, dtype)
        pairs = [
            (r.z_score, g.z_score, r.p_value, g.p_value)
            for r, g in zip(reference, results, strict=True)
            if r.z_score is not None and g.z_score is not None
        ]
        dz = np.abs(np.array([g - r for r, g, _, _ in pairs]))
        flips = sum((p <= 0.01) != (q <= 0.01) for _, _, p, q in pairs)
        rows.append(
            {
                "device": settings.device,
                "encoder_dtype": dtype,
                "texts": len(pairs),
                "median_abs_dz": float(np.median(dz)),
                "p99_abs_dz": float(np.quantile(dz, 0.99)),
                "max_abs_dz": float(dz.max()),
                "decision_flips_at_1pct": int(flips),
            }
        )
    return {"rows": rows, "texts": len(texts)}


def precision_markdown(section: dict[str, Any]) -> list[str]:
    """The precision table."""
    lines = [
        "## Precision",
        "",
        f"{section['texts']} held-out human news texts (~150 words), whole-text z against the "
        "default configuration on the CPU in fp32, same key.",
        "",
        "| device | encoder | texts | median abs dz | p99 | max | decisions at 1% changed |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in section["rows"]:
        lines.append(
            f"| {row['device']} | {row['encoder_dtype']} | {row['texts']} "
            f"| {fmt(row['median_abs_dz'], 4)} | {fmt(row['p99_abs_dz'], 4)} "
            f"| {fmt(row['max_abs_dz'], 4)} | {row['decision_flips_at_1pct']} |"
        )
    return lines + [""]
