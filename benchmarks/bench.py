"""The benchmark of record: generation, detection and encoder training speed in one run.

Run from the repository root (see ``benchmarks/README.md``)::

    python -m benchmarks bench --generation.prompts 20 --generation.max_new_tokens 200

It prints the tables and writes ``results/latest.json`` (every figure, per prompt and per
sentence) and ``latest.md``. Each part is a command of its own as well
(``python -m benchmarks generation``, ``detection``, ``training``); this one runs them with one
command line, one report and the targets of all three.
"""

from __future__ import annotations

from typing import Any

from .detection import DetectionSettings, bench_detection, detection_markdown, detection_targets
from .generation import GenerationSettings, run_generation
from .generation_report import generation_markdown, generation_targets
from .harness import (
    RunSettings,
    apply_threads,
    header_markdown,
    new_report,
    targets_markdown,
    write_report,
)
from .training import TrainingSettings, bench_training, training_markdown, training_targets

SECTIONS = ("generation", "detection", "training")
NAME = "latest"
"""Results file name: ``latest.json`` and ``latest.md``."""


def bench(
    generation: GenerationSettings | None = None,
    detection: DetectionSettings | None = None,
    training: TrainingSettings | None = None,
    run: RunSettings | None = None,
    sections: tuple[str, ...] = SECTIONS,
) -> int:
    """The benchmark of record: generation, detection and training speed in one run.

    Args:
        generation: the generation section's settings.
        detection: the detection section's settings (its texts skip at least the articles
            the generation prompts come from).
        training: the training section's settings.
        run: torch's threads and where the results go.
        sections: the parts to run, of generation, detection and training (``a,b``).
    """
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown or not sections:
        given = f" (unknown: {', '.join(unknown)})" if unknown else ""
        raise ValueError(f"--sections: give one or more of {', '.join(SECTIONS)}{given}")
    generation = generation or GenerationSettings()
    detection = detection or DetectionSettings()
    training = training or TrainingSettings()
    run = run or RunSettings()
    apply_threads(run)
    groups = {"generation": generation, "detection": detection, "training": training}
    report = new_report("bench", {**groups, "run": run, "sections": sections})

    def save(final: bool) -> str:
        report["targets"] = targets(report)
        return write_report(report, run.output_dir, NAME, render, final)

    if "generation" in sections:
        print("generation", flush=True)

        def progress(section: dict[str, Any]) -> None:
            report["generation"] = section
            save(final=False)

        report["generation"] = run_generation(generation, progress)
    if "detection" in sections:
        print("detection", flush=True)
        skip = max(detection.skip, generation.prompts)
        report["detection"] = bench_detection(detection, skip=skip)
    if "training" in sections:
        print("training", flush=True)
        report["training"] = bench_training(training)
    print()
    print(save(final=True))
    print(f"wrote {run.output_dir}/{NAME}.json and {NAME}.md")
    return 0


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of benchmarks/README.md for the sections run, each with its figure."""
    out = []
    if report.get("generation"):
        out += generation_targets(report["generation"])
    if report.get("detection"):
        out += detection_targets(report["detection"])
    if report.get("training"):
        out += training_targets(report["training"])
    return out


def render(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    lines = header_markdown(report, "Benchmark results")
    if report.get("generation"):
        lines += generation_markdown(report["generation"], report["settings"]["generation"])
    if report.get("detection"):
        lines += detection_markdown(report["detection"])
    if report.get("training"):
        lines += training_markdown(report["training"])
    return "\n".join(lines + targets_markdown(report["targets"])) + "\n"
