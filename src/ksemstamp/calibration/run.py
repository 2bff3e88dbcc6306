"""The calibration run: human texts, keyed tables, real and simulated power, one result dict."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ..jsonl import read_jsonl
from ..plots import progress_bar
from ..scheme.core import WatermarkScheme
from ..settings.calibration import ALPHAS, CalibrationSettings  # noqa: F401  (re-exported: their former home)
from ..text.corpora import SOURCE_LABELS, human_texts
from .embeddings import embedding_store, with_cached_encoder
from .scoring import (
    DIAGNOSTIC,
    ScoredTexts,
    calibration_keys,
    own_key,
    p_values,
    score_texts,
    stats_of,
)
from .summary import group_rates, power_summary, summarise_null


def _read_watermarked(path: str, fingerprint: str) -> tuple[list[str], list[str | None], dict]:
    """Texts and prompts of usable records, and counts of what was skipped and what it cost."""
    texts, prompts = [], []
    skipped = {"not_ok": 0, "other_key": 0}
    cost = {"sentences": 0, "candidates": 0, "fallbacks": 0}
    for rec in read_jsonl(path):
        data = rec.data or {}
        if rec.error or data.get("status", "ok") != "ok" or not isinstance(data.get("text"), str):
            skipped["not_ok"] += 1
        elif data.get("key_fingerprint") not in (None, fingerprint):
            skipped["other_key"] += 1
        else:
            texts.append(data["text"])
            prompt = data.get("prompt")
            prompts.append(prompt if isinstance(prompt, str) else None)
            for name, field in (("sentences", "num_sentences"), ("candidates", "candidates")):
                cost[name] += int(data.get(field) or 0)
            cost["fallbacks"] += int(data.get("fallbacks") or 0)
    return texts, prompts, {"skipped": skipped, "cost": cost}


def run_calibration(
    scheme: WatermarkScheme,
    settings: CalibrationSettings,
    describe: dict[str, Any] | None = None,
    progress: bool = True,
    scan: bool = False,
) -> dict[str, Any]:
    """Measure false-positive rates on human text over many keys, and power beside them.

    Args:
        scheme: encoder, partition and (for real generations) the key they were made with.
        settings: what to measure.
        describe: extra fields recorded as they are (command line, watermark settings).
        progress: show progress bars.
        scan: the p-values include the mark's windowed tests (``detection.scan``), as
            ``detect`` reports them (a mark without them ignores it).

    Returns:
        A JSON-ready dict of numbers (see ``write_outputs`` for the files made from it).
    """
    started = time.perf_counter()
    scheme, human, available = _score_human(scheme, settings, progress, scan)
    stats = stats_of(human)
    tables = calibration_keys(human.mark, settings.num_keys, settings.seed)
    rng = np.random.default_rng(settings.seed)
    per_key = [
        p_values(human, table, rng)
        for table in progress_bar(tables, desc="keys", unit="key", disable=not progress)
    ]
    sources = [s for s in settings.sources if len(human.select(s))]
    null = {s: summarise_null(per_key, human.select(s), settings.alphas) for s in sources}
    null["overall"] = summarise_null(per_key, np.arange(len(human)), settings.alphas)
    by_group = {str(a): group_rates(per_key, human.groups, a) for a in settings.alphas}
    power, configured = _power(scheme, human, tables, per_key, settings, rng, progress, scan)
    return {
        **(describe or {}),
        "calibration": _what_was_measured(scheme, human.mark, settings, scan, stats),
        "sources": {s: _source_summary(human, s, available[s]) for s in sources},
        "texts_total": len(human),
        "null": null,
        "groups": by_group,
        **_pooled_distribution(per_key),
        "configured_key": configured,
        "power": power,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _score_human(
    scheme: WatermarkScheme, settings: CalibrationSettings, progress: bool, scan: bool
) -> tuple[WatermarkScheme, ScoredTexts, dict[str, int]]:
    """The human texts of ``settings.sources`` scored under ``scheme`` (``score_texts``), the
    scheme that scored them (its encoder behind the embedding store when ``reuse_embeddings``),
    and the pieces each source had; refuses when no text could be scored."""
    texts, available = human_texts(
        scheme.splitter, settings.sources, settings.max_texts, settings.window_words, settings.seed
    )
    store = embedding_store(scheme.encoder) if settings.reuse_embeddings else None
    scheme = with_cached_encoder(scheme, store)
    human = score_texts(
        scheme,
        [t.text for t in texts],
        [t.source for t in texts],
        progress=progress,
        scan=scan,
        # The document, speech or account a text was cut from (its id less the piece number).
        groups=[f"{t.source}:{t.doc_id.rsplit(':', 1)[0]}" for t in texts],
    )
    if len(human) == 0:
        raise ValueError("no human text could be scored; check the sources")
    return scheme, human, available


def _power(
    scheme: WatermarkScheme,
    human: ScoredTexts,
    tables: list,
    per_key: list[dict[str, np.ndarray]],
    settings: CalibrationSettings,
    rng: np.random.Generator,
    progress: bool,
    scan: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Power beside the false-positive rates (simulated under every key's table, and of each
    file of real generations under the configured key), and the configured key's rates on the
    human texts. Empirical-FPR thresholds for power come from the human news pieces when there
    are any."""
    stats = stats_of(human)
    news = human.select("news")
    reference = "news" if len(news) else "all sources"
    power: dict[str, Any] = {}
    if settings.simulated_per_key > 0:
        null_news = [{s: p[s][news] for s in stats} if len(news) else p for p in per_key]
        lengths = human.num_scored[news if len(news) else slice(None)]
        simulated = _simulated_power(
            human.mark, tables, lengths, null_news, reference, settings, rng, progress
        )
        if simulated is not None:
            power["simulated"] = simulated
    own = p_values(human, own_key(human.mark))
    configured = {
        "key_fingerprint": scheme.key_fingerprint,
        "human_fpr": {
            stat: {str(a): float(np.mean(own[stat] <= a)) for a in settings.alphas}
            for stat in stats
        },
    }
    own_news = {s: own[s][news] for s in stats} if len(news) else own
    for path in settings.watermarked:
        power[f"generated: {Path(path).name}"] = _generated_power(
            scheme, path, own_news, reference, settings, progress, scan
        )
    return power, configured


def _what_was_measured(
    scheme: WatermarkScheme,
    mark: Any,
    settings: CalibrationSettings,
    scan: bool,
    stats: tuple[str, ...],
) -> dict[str, Any]:
    """The result's ``calibration`` entry: the keys, the scheme and the settings measured."""
    described = mark.describe(scan)
    return {
        "num_keys": settings.num_keys,
        "keys": f"{described['drawn']} of the keys 'calibration|{settings.seed}|i', i < num_keys",
        "mark": described["kind"],
        **described["settings"],
        "scan": scan,
        "statistics": list(stats),
        "alphas": list(settings.alphas),
        "window_words": settings.window_words,
        "seed": settings.seed,
        "num_regions": scheme.num_regions,
        "description": {k: v for k, v in described.items() if k != "settings"},
    }


def _source_summary(human: ScoredTexts, source: str, available: int) -> dict[str, Any]:
    """How many texts of ``source`` were scored, and how often a sentence stays in the region
    of the one before it."""
    idx = human.select(source)
    counts = human.counts[idx]
    return {
        "description": SOURCE_LABELS[source],
        "available_pieces": available,
        "texts": int(len(idx)),
        "too_short": human.too_short.get(source, 0),
        "scored_mean": float(human.num_scored[idx].mean()),
        "same_region_share": float(np.trace(counts.sum(axis=0)) / max(1, counts.sum())),
    }


def _pooled_distribution(per_key: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Histograms of the p-values pooled over keys, and the FPR against nominal alpha."""
    stats = [s for s in per_key[0] if s != DIAGNOSTIC]
    pooled = {s: np.concatenate([p[s] for p in per_key]) for s in (*stats, DIAGNOSTIC)}
    edges = np.linspace(0.0, 1.0, 21)
    curve_alphas = np.logspace(-4, 0, 41)
    return {
        "histogram": {
            "edges": edges.tolist(),
            **{s: np.histogram(v, bins=edges, density=True)[0].tolist() for s, v in pooled.items()},
        },
        "fpr_curve": {
            "alphas": curve_alphas.tolist(),
            **{s: [float(np.mean(pooled[s] <= a)) for a in curve_alphas] for s in stats},
        },
    }


def _simulated_power(
    mark: Any,
    tables: list,
    length_pool: np.ndarray,
    null_news: list[dict[str, np.ndarray]],
    reference: str,
    settings: CalibrationSettings,
    rng: np.random.Generator,
    progress: bool,
) -> dict[str, Any] | None:
    """Power on simulated watermarked texts under every key (``Mark.simulated_power``, for a
    mark that can simulate them; ``None`` otherwise)."""
    keys = progress_bar(tables, desc="simulate", unit="key", disable=not progress)
    simulated = mark.simulated_power(keys, length_pool, settings.simulated_per_key, rng)
    if simulated is None:
        return None
    sims = simulated["p_values"]
    return {
        "what": simulated["what"],
        "texts_per_key": settings.simulated_per_key,
        "lengths": "scored counts drawn from the human news pieces",
        "empirical_fpr_reference": f"{len(null_news[0]['exact'])} human pieces "
        f"({reference}) under the same key",
        **power_summary(sims, null_news, settings.alphas),
    }


def _generated_power(
    scheme: WatermarkScheme,
    path: str,
    own_news: dict[str, np.ndarray],
    reference: str,
    settings: CalibrationSettings,
    progress: bool,
    scan: bool = False,
) -> dict[str, Any]:
    """Power on the real generations of ``path`` under the configured key."""
    wm_texts, wm_prompts, info = _read_watermarked(path, scheme.key_fingerprint)
    skipped, cost = info["skipped"], info["cost"]
    if not wm_texts:
        raise ValueError(
            f"{path}: no usable watermarked record (skipped {skipped}); records must "
            "have status ok and the key fingerprint of the configured key"
        )
    real = score_texts(
        scheme,
        wm_texts,
        ["watermarked"] * len(wm_texts),
        wm_prompts,
        progress=progress,
        scan=scan,
    )
    real_p = p_values(real, own_key(real.mark))
    distinct = (real.counts > 0).sum(axis=(1, 2))
    diagonal = np.trace(real.counts, axis1=1, axis2=2)
    return {
        "what": f"real generations read from {Path(path).name}, detected with the "
        "configured key (one key: no spread)",
        "file": str(path),
        "texts": len(real),
        "too_short": real.too_short.get("watermarked", 0),
        "skipped": skipped,
        "candidates_per_sentence": cost["candidates"] / max(1, cost["sentences"]),
        "fallbacks": cost["fallbacks"],
        "num_scored_mean": float(real.num_scored.mean()),
        # A text that only repeats one transition carries little evidence for the exact test.
        "distinct_transitions_mean": float(distinct.mean()),
        "one_region_share": float(np.mean((distinct == 1) & (diagonal == real.num_scored))),
        "empirical_fpr_reference": f"{len(own_news['exact'])} human pieces "
        f"({reference}) under the configured key",
        **power_summary([real_p], [own_news], settings.alphas),
    }
