"""Calibration of the detector on human text, with detection power beside it.
May import: ksemstamp core modules and detection, scheme, settings, text; never cli or builders.

Human-written text does not depend on the secret key, so the share of human texts a detector
flags at level ``alpha`` is its false-positive rate. One key gives one valid table and therefore
one draw of that rate; this module measures it over many keyed tables at once:

1. Human texts that the centroids never saw are cut into generation-sized pieces (consecutive
   sentences up to about 200 tokens): held-out news (``val`` and ``test`` splits; centroids are
   fitted on ``fit``), House of Commons speeches and health-news tweets, each labelled.
2. Every distinct sentence is embedded once; the detector then gives each text's regions and
   which transitions it scores (seed, repeats), exactly as ``Detector.detect_batch`` does.
3. Those transitions do not depend on the key. For each of ``num_keys`` keyed tables only the
   valid count changes, so both p-values of every text under every table come from one table
   look-up: the paper's normal tail of the z-score, and the exact key-randomisation p-value,
   whose null law (computed once per text) does not depend on the table at all.
4. Detection power is reported beside it, from real generations (``watermarked=(FILE.jsonl, ...)``
   written by ``ksemstamp generate``) and, for k-means partitions, from *simulated* region
   sequences that move by the domain transition matrix restricted to each valid set (an ideal
   rejection sampler: no fallbacks, no margin).

Outputs (``write_outputs``): ``calibration.json`` (all numbers), ``report.md`` and ``pvalues.png``.

Modules: ``embeddings`` (each distinct sentence embedded once, kept on disk), ``scoring``
(key-free scoring and p-values under many tables), ``summary`` (rates and spreads over keys),
``run`` (settings and the measurement), ``report`` (markdown, plot, files). The human texts come
from ``ksemstamp.text.corpora``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each name from the module that defines it, loaded on first use: the ``calibrate`` command's
# options (``settings``) are read without loading what a run needs (torch, the encoder). The
# corpus helpers are re-exported: they were defined here before ``corpora`` held them.
_EXPORTS = {
    **dict.fromkeys(
        ("SOURCE_LABELS", "SOURCES", "HumanText", "allocate", "human_texts", "make_windows"),
        "..text.corpora",
    ),
    **dict.fromkeys(("CachedEncoder", "embedding_store", "with_cached_encoder"), ".embeddings"),
    **dict.fromkeys(("plot_pvalues", "render_report", "write_outputs"), ".report"),
    **dict.fromkeys(("ALPHAS", "CalibrationSettings"), "..settings.calibration"),
    "run_calibration": ".run",
    **dict.fromkeys(
        (
            "DIAGNOSTIC",
            "STATS",
            "ScoredTexts",
            "calibration_tables",
            "p_values",
            "score_texts",
            "scored_from_counts",
            "simulate_watermarked",
        ),
        ".scoring",
    ),
    **dict.fromkeys(
        ("ks_distance", "power_summary", "spread", "summarise_null", "tpr_at_fpr"), ".summary"
    ),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
