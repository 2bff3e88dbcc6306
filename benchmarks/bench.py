"""The benchmark of record: generation, detection and encoder training speed in one run.

Run from the repository root (see ``benchmarks/README.md``)::

    python -m benchmarks.bench --prompts 20 --max-new-tokens 200

It prints the tables and writes ``results/latest.json`` (every figure, per prompt and per
sentence) and ``latest.md``. Each part is its own module and script as well
(``benchmarks.generation``, ``benchmarks.detection``, ``benchmarks.training``); this one runs
them with one command line, one report and the targets of all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jsonargparse import Namespace

from . import detection, generation, training
from .harness import (
    apply_threads,
    header_markdown,
    new_report,
    parser,
    targets_markdown,
    write_report,
)

SECTIONS = ("generation", "detection", "training")
NAME = "latest"
"""Results file name: ``latest.json`` and ``latest.md``."""


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of benchmarks/README.md for the sections run, each with its figure."""
    out = []
    if report.get("generation"):
        out += generation.generation_targets(report["generation"])
    if report.get("detection"):
        out += detection.detection_targets(report["detection"])
    if report.get("training"):
        out += training.training_targets(report["training"])
    return out


def render(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    lines = header_markdown(report, "Benchmark results")
    if report.get("generation"):
        lines += generation.generation_markdown(report["generation"], report["settings"])
    if report.get("detection"):
        lines += detection.detection_markdown(report["detection"])
    if report.get("training"):
        lines += training.training_markdown(report["training"])
    return "\n".join(lines + targets_markdown(report["targets"])) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> Namespace:
    p = parser(__doc__.split("\n\n")[0])
    generation.add_arguments(p)
    detection.add_arguments(p, config=False)
    training.add_arguments(p)
    p.add_argument(
        "--sections",
        type=str,
        default=",".join(SECTIONS),
        help="comma-separated subset of generation,detection,training",
    )
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}; choose from {list(SECTIONS)}")
    try:
        training.check_arguments(args)
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    apply_threads(args)
    sections = set(args.sections.split(","))
    report = new_report("bench", args, argv)

    def save(final: bool) -> str:
        report["targets"] = targets(report)
        return write_report(report, args.output_dir, NAME, render, final)

    if "generation" in sections:
        print("generation", flush=True)

        def progress(section: dict[str, Any]) -> None:
            report["generation"] = section
            save(final=False)

        report["generation"] = generation.run_generation(args, progress)
    if "detection" in sections:
        print("detection", flush=True)
        scheme = detection.default_scheme(args)
        report["detection"] = detection.bench_detection(args, scheme, skip=args.prompts)
    if "training" in sections:
        print("training", flush=True)
        report["training"] = training.bench_training(args)
    print()
    print(save(final=True))
    print(f"wrote {args.output_dir}/{NAME}.json and {NAME}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
