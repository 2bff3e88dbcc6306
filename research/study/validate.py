"""Check the simulator against real generations of the same documents and design.

Real side: a ``watermark.py generate`` output (the pool's held-out prompts, one key) and the
``watermark.py detect`` output of it. Simulated side: the same documents and design under many
keys. Both are summarised the same way; the real figures rest on a few texts under one key, so
they are compared with the simulated spread over keys, not with a single number.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ksemstamp.jsonl import read_jsonl

from .design import Design
from .runner import Sweep


def real_summary(generated: str | Path, detected: str | Path) -> dict:
    """Cost and clean power of real watermarked texts."""
    gen = [r.data for r in read_jsonl(generated) if r.data and r.data.get("status") == "ok"]
    det = [r.data for r in read_jsonl(detected) if r.data and r.data.get("status") == "ok"]
    sentences = sum(r["num_sentences"] for r in gen)
    p = np.array([r["p_value"] for r in det], dtype=float)
    return {
        "texts": len(gen),
        "sentences_per_text": sentences / max(len(gen), 1),
        "candidates_mean": sum(r["candidates"] for r in gen) / max(sentences, 1),
        "fallback_share": sum(r["fallbacks"] for r in gen) / max(sentences, 1),
        "scored_per_text": float(np.mean([r["num_scored"] for r in det])) if det else None,
        "valid_share": float(np.mean([r["num_valid"] / max(r["num_scored"], 1) for r in det]))
        if det
        else None,
        "power_0.01": float(np.mean(p <= 0.01)) if len(p) else None,
        "power_0.05": float(np.mean(p <= 0.05)) if len(p) else None,
        "ids": [r["id"] for r in gen],
    }


def simulated_summary(
    sweep: Sweep, design: Design, ids: Sequence[str], pool_ids: list[str]
) -> dict:
    """The simulator's figures for the pool documents ``ids``, with the spread over keys."""
    docs = [pool_ids.index(i) for i in ids if i in pool_ids]
    result = sweep.run(design, docs=docs)
    return {
        "texts": result["texts"],
        "keys": result["keys"],
        "sentences_per_text": result["sentences_per_text"],
        "candidates_mean": result["candidates_mean"],
        "fallback_share": result["fallback_share"],
        "invalid_share": result["invalid_share"],
        "scored_per_text": result["scored_per_text"],
        "valid_share": result["valid_share"],
        "power_0.01": result["power"]["clean"]["0.01"],
        "power_0.05": result["power"]["clean"]["0.05"],
    }
