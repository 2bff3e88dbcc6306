"""Detection speed: ``Detector.detect_batch`` against the bare encoder on the same sentences.

    python -m benchmarks.detection --detect-texts 100

prints the table and writes ``results/detection.json`` and ``detection.md``. Held-out human news
texts of ~150 words are split, embedded in one encoder pass and tested (exact p-value per
text); the bare ``encoder.encode`` of the same sentences with the same batch size is the bound.
Best of alternating repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from ksemstamp.builders import build_detector, build_scheme
from ksemstamp.scheme import WatermarkScheme
from ksemstamp.settings import WatermarkSettings
from ksemstamp.settings_files import load_watermark_settings
from ksemstamp.text.corpora import news_windows

from .harness import BENCH_KEY_LAYER, REPO, Section, fmt, measure, section_main


def bench_detection(args: Namespace, scheme: WatermarkScheme, skip: int) -> dict[str, Any]:
    """``Detector.detect_batch`` against ``encoder.encode`` on the same sentences: held-out news
    texts after the first ``skip`` articles (those the generation prompts come from)."""
    detector = build_detector(WatermarkSettings.from_dict(BENCH_KEY_LAYER), scheme)
    texts = news_windows(args.detect_texts, skip=skip)
    splitter = scheme.splitter
    split = measure(lambda: [s for t in texts for s in splitter.split(t)])
    sentences = split.value
    batch = scheme.encode_batch_size
    encoder = scheme.encoder

    def raw():
        return encoder.encode(sentences, batch_size=batch, convert_to_tensor=True)

    raw()  # warm-up, untimed
    detector.detect_batch(texts[:8])
    detect_runs, raw_runs = [], []
    for i in range(args.detect_repeats):
        # Alternate which goes first, so drift from other jobs hits both alike.
        pair = [("detect", lambda: detector.detect_batch(texts)), ("raw", raw)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (detect_runs if name == "detect" else raw_runs).append(measure(fn))
    best_detect = min(detect_runs, key=lambda m: m.seconds)
    best_raw = min(raw_runs, key=lambda m: m.seconds)
    results = best_detect.value
    return {
        "texts": len(texts),
        "sentences": len(sentences),
        "batch_size": batch,
        "repeats": args.detect_repeats,
        "statistic": detector.statistic,
        "detect_seconds": [round(m.seconds, 3) for m in detect_runs],
        "raw_encode_seconds": [round(m.seconds, 3) for m in raw_runs],
        "split_seconds": split.seconds,
        "detect_texts_per_second": len(texts) / best_detect.seconds,
        "detect_sentences_per_second": len(sentences) / best_detect.seconds,
        "raw_sentences_per_second": len(sentences) / best_raw.seconds,
        "detect_over_raw": best_raw.seconds / best_detect.seconds,
        "detect_peak_rss_mib": max(m.peak_mib for m in detect_runs),
        "raw_peak_rss_mib": max(m.peak_mib for m in raw_runs),
        "scored_ok": sum(r.status == "ok" for r in results),
    }


def detection_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The detection target of benchmarks/README.md and whether it is met."""
    return [
        {
            "target": "detection >= 80% of raw encoder sentences/s",
            "measured": section["detect_over_raw"],
            "met": section["detect_over_raw"] >= 0.8,
        }
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
        f"took {fmt(det['split_seconds'], 3)} s of it).",
        "",
    ]


def add_arguments(p: ArgumentParser, config: bool = True) -> None:
    """The detection benchmark's flags; ``config=False`` leaves ``--default-config`` to the
    generation benchmark's flags (``bench`` takes both)."""
    p.add_argument("--detect-texts", type=int, default=100, help="texts for detection")
    p.add_argument("--detect-repeats", type=int, default=3)
    if config:
        p.add_argument(
            "--default-config",
            type=str,
            default=str(REPO / "configs" / "ksemstamp.yaml"),
            help="the configuration whose encoder, partition and statistic are measured",
        )
        p.add_argument(
            "--skip", type=int, default=20, help="held-out articles skipped before the texts"
        )


def default_scheme(args: Namespace) -> WatermarkScheme:
    """The scheme of ``--default-config`` under the benchmark key."""
    return build_scheme(load_watermark_settings([args.default_config], dict(BENCH_KEY_LAYER)))


SECTION = Section(
    name="detection",
    title="Detection benchmark",
    add_arguments=add_arguments,
    measure=lambda args: bench_detection(args, default_scheme(args), args.skip),
    targets=detection_targets,
    markdown=detection_markdown,
)


def main(argv: Sequence[str] | None = None) -> int:
    return section_main(SECTION, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
