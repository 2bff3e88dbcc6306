"""Detection speed: ``Detector.detect_batch`` against the bare encoder on the same sentences.

    python -m benchmarks detection --detection.texts 100
    python -m benchmarks detection --detection.texts 400 --detection.device cuda

prints the table and writes ``results/detection.json`` and ``detection.md``. Held-out human news
texts of ~150 words are split, embedded in one encoder pass and tested (exact p-value per
text); the bare ``encoder.encode`` of the same sentences with the same batch size is the bound.
Best of alternating repeats. The per-text work outside the encoder is timed on its own too:
the key applied to the texts' plans and their exact tests with the scan
(``Detector.score_batch``), which on a GPU must not become the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ksemstamp.builders import build_detector, build_scheme
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.settings import WatermarkSettings
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_windows

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
class DetectionSettings:
    """Batched detection against the bare encoder on the same sentences."""

    texts: int = 100
    """Held-out human news texts (~150 words each) to detect."""
    repeats: int = 3
    """Alternating repeats of each side; the best one counts."""
    skip: int = 20
    """Held-out articles skipped before the texts (``bench``: at least
    ``generation.prompts``, the articles the prompts come from)."""
    device: str = "cpu"
    """Where detection's encoder runs (cpu, cuda, ...)."""
    config: str = str(DEFAULT_CONFIG)
    """The configuration whose encoder, partition and statistic are measured."""

    def __post_init__(self) -> None:
        refuse(self, at_least(self, 1, "texts", "repeats") + at_least(self, 0, "skip"))


def detection(detection: DetectionSettings | None = None, run: RunSettings | None = None) -> int:
    """Detection speed: batched detection against the bare encoder on the same sentences."""
    detection = detection or DetectionSettings()
    return section_report(
        "detection",
        "Detection benchmark",
        run or RunSettings(),
        {"detection": detection},
        lambda: bench_detection(detection),
        detection_targets,
        detection_markdown,
    )


def default_scheme(settings: DetectionSettings) -> WatermarkScheme:
    """The scheme of ``settings.config`` under the benchmark key, on ``settings.device``."""
    layer = {**BENCH_KEY_LAYER, "model": {"device": settings.device}}
    return build_scheme(load_watermark_settings([settings.config], layer))


def bench_detection(settings: DetectionSettings, skip: int | None = None) -> dict[str, Any]:
    """``Detector.detect_batch`` against ``encoder.encode`` on the same sentences: held-out news
    texts after the first ``skip`` articles (``settings.skip`` unless given: those the
    generation prompts come from); and the work outside the encoder (``Detector.score_batch``
    of the texts' plans) on its own."""
    scheme = default_scheme(settings)
    detector = build_detector(WatermarkSettings.from_dict(BENCH_KEY_LAYER), scheme)
    texts = news_windows(settings.texts, skip=settings.skip if skip is None else skip)
    splitter = scheme.splitter
    split = measure(lambda: [s for t in texts for s in splitter.split(t)])
    sentences = split.value
    batch = scheme.encode_batch_size
    encoder = scheme.encoder

    def raw():
        # back on the host, so that a GPU's asynchronous work is inside the time
        return encoder.encode(sentences, batch_size=batch, convert_to_tensor=True).cpu()

    raw()  # warm-up, untimed
    detector.detect_batch(texts[:8])
    plans = detector.plan_batch(texts)
    detect_runs, raw_runs, score_runs = [], [], []
    for i in range(settings.repeats):
        # Alternate which goes first, so drift from other jobs hits both alike.
        pair = [("detect", lambda: detector.detect_batch(texts)), ("raw", raw)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (detect_runs if name == "detect" else raw_runs).append(measure(fn))
        score_runs.append(measure(lambda: detector.score_batch(plans)))
    best_detect = min(detect_runs, key=lambda m: m.seconds)
    best_raw = min(raw_runs, key=lambda m: m.seconds)
    best_score = min(score_runs, key=lambda m: m.seconds)
    results = best_detect.value
    return {
        "device": str(scheme.device),
        "texts": len(texts),
        "sentences": len(sentences),
        "scored_units_per_text": sum(p.num_scored for p in plans) / max(1, len(plans)),
        "batch_size": batch,
        "repeats": settings.repeats,
        "statistic": detector.statistic,
        "detect_seconds": [round(m.seconds, 3) for m in detect_runs],
        "raw_encode_seconds": [round(m.seconds, 3) for m in raw_runs],
        "score_seconds": [round(m.seconds, 3) for m in score_runs],
        "split_seconds": split.seconds,
        "detect_texts_per_second": len(texts) / best_detect.seconds,
        "detect_sentences_per_second": len(sentences) / best_detect.seconds,
        "raw_sentences_per_second": len(sentences) / best_raw.seconds,
        "detect_over_raw": best_raw.seconds / best_detect.seconds,
        "score_ms_per_text": 1e3 * best_score.seconds / len(texts),
        "outside_encoder_ms_per_text": 1e3 * (best_detect.seconds - best_raw.seconds) / len(texts),
        "detect_peak_rss_mib": max(m.peak_mib for m in detect_runs),
        "raw_peak_rss_mib": max(m.peak_mib for m in raw_runs),
        "scored_ok": sum(r.status == "ok" for r in results),
    }


def detection_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The detection targets of benchmarks/README.md and whether they are met: on a CPU, 90%
    of the bare encoder's sentences/s and at most 3 ms of work per text outside the encoder
    (the key, the exact test, the scan); on a GPU, half of the bare encoder's sentences/s."""
    if section.get("device", "cpu").startswith("cuda"):
        return [
            {
                "target": "detection >= 50% of raw encoder sentences/s on the GPU",
                "measured": section["detect_over_raw"],
                "met": section["detect_over_raw"] >= 0.5,
            }
        ]
    return [
        {
            "target": "detection >= 90% of raw encoder sentences/s",
            "measured": section["detect_over_raw"],
            "met": section["detect_over_raw"] >= 0.9,
        },
        {
            "target": "key, exact test and scan <= 3 ms per text",
            "measured": section["score_ms_per_text"],
            "met": section["score_ms_per_text"] <= 3.0,
        },
    ]


def detection_markdown(det: dict[str, Any]) -> list[str]:
    """The detection table."""
    return [
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
        f"took {fmt(det['split_seconds'], 3)} s of it). Device: {det.get('device', 'cpu')}. "
        f"Per text ({fmt(det.get('scored_units_per_text'), 1)} scored units): "
        f"{fmt(det.get('score_ms_per_text'))} ms to apply the key and run the exact test and "
        f"the scan (`Detector.score_batch`); {fmt(det.get('outside_encoder_ms_per_text'))} ms "
        f"of `detect_batch` beyond the bare encoder's time.",
        "",
    ]
