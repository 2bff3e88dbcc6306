"""How far the encoder's arithmetic moves a text's z: one device and weight format against
another, on the same texts under the same key.

    python -m benchmarks.precision --texts 200                                  # fp32 vs bf16, fp16
    python -m benchmarks.precision --texts 400 --device cuda --dtypes fp32,bf16  # CPU vs a GPU

prints the table and writes ``results/precision.json`` and ``precision.md``. The reference is
the default configuration on the CPU in fp32; each other setting (``--device`` with each of
``--dtypes``) detects the same held-out human news texts of ~150 words, and the table gives the
absolute differences of their whole-text z and of their final p-values' decisions at 1%. A text
made on one machine and detected on another moves by these amounts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from jsonargparse import ArgumentParser, Namespace

from ksemstamp.builders import build_detector
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_windows

from .harness import BENCH_KEY_LAYER, REPO, Section, fmt, section_main


def _detect(args: Namespace, texts: list[str], device: str, dtype: str):
    layer = {**BENCH_KEY_LAYER, "model": {"device": device, "encoder_dtype": dtype}}
    settings = load_watermark_settings([args.default_config], layer)
    return build_detector(settings).detect_batch(texts)


def bench_precision(args: Namespace) -> dict[str, Any]:
    """Whole-text z and 1% decisions of each setting against the CPU's fp32."""
    texts = news_windows(args.texts, skip=args.skip)
    reference = _detect(args, texts, "cpu", "fp32")
    rows = []
    for dtype in str(args.dtypes).split(","):
        if args.device == "cpu" and dtype == "fp32":
            continue
        results = _detect(args, texts, args.device, dtype)
        pairs = [
            (r.z_score, g.z_score, r.p_value, g.p_value)
            for r, g in zip(reference, results, strict=True)
            if r.z_score is not None and g.z_score is not None
        ]
        dz = np.abs(np.array([g - r for r, g, _, _ in pairs]))
        flips = sum((p <= 0.01) != (q <= 0.01) for _, _, p, q in pairs)
        rows.append(
            {
                "device": args.device,
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


def add_arguments(p: ArgumentParser) -> None:
    """The precision benchmark's flags."""
    p.add_argument("--texts", type=int, default=200)
    p.add_argument("--skip", type=int, default=20, help="held-out articles skipped first")
    p.add_argument("--device", type=str, default="cpu")
    p.add_argument("--dtypes", type=str, default="fp32,bf16,fp16", help="encoder weight formats")
    p.add_argument("--default-config", type=str, default=str(REPO / "configs" / "ksemstamp.yaml"))


SECTION = Section(
    name="precision",
    title="Precision benchmark",
    add_arguments=add_arguments,
    measure=bench_precision,
    targets=lambda section: [],
    markdown=precision_markdown,
)


def main(argv: Sequence[str] | None = None) -> int:
    return section_main(SECTION, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
