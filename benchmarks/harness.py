"""What every benchmark shares: timing and peak memory of one call, distributions over prompts,
the report (command, machine, settings, load) and its JSON and Markdown files, and the settings
every benchmark takes (``RunSettings``: ``--run.threads``, ``--run.output_dir``).

Memory is the peak resident set size (Linux ``VmHWM``) of this process during a measured call:
the high-water mark is reset through ``/proc/self/clear_refs`` before the call, so it includes
what was already resident (the models) plus whatever the call added on top.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ksemstamp.cli import console

REPO = Path(__file__).resolve().parents[1]
"""The checkout (default configuration files and the results folder are found from it)."""
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CONFIG = REPO / "configs" / "ksemstamp.yaml"
"""The shipped default configuration, which the benchmarks measure unless told otherwise."""
PAPER_CONFIG = REPO / "configs" / "ksemstamp-paper.yaml"
BENCH_KEY = "ksemstamp-benchmark-key"
"""A fixed, public key: benchmarks must be repeatable, and nothing here needs secrecy."""
BENCH_KEY_LAYER = {"key": BENCH_KEY, "allow_weak_key": True}
"""The benchmark key as a settings layer: public and guessable on purpose, so it says so."""


# ---------------------------------------------------------------------- memory and time


def peak_rss_mib() -> float:
    """Peak resident set size of this process since the last reset, in MiB (``VmHWM``)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class Measured:
    """Wall-clock seconds and peak RSS of one call, and what it returned."""

    seconds: float
    peak_mib: float
    value: Any


def measure(fn: Callable[[], Any]) -> Measured:
    """Call ``fn`` once, timing it and recording the process's peak memory during the call."""
    reset_peak_rss()
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    return Measured(seconds, peak_rss_mib(), value)


# ---------------------------------------------------------------------- distributions


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, 90th percentile and worst (largest) of per-prompt or per-sentence figures."""
    vals = [v for v in values if v is not None]
    return {
        "median": quantile(vals, 0.5),
        "p90": quantile(vals, 0.9),
        "worst": max(vals) if vals else None,
        "n": len(vals),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is zero."""
    return a / b if a is not None and b else None


def fmt(value: Any, digits: int = 2) -> str:
    """A table cell: ``-`` for nothing, yes/no, floats to ``digits`` places."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def dist_cell(d: dict[str, Any] | None, digits: int = 2) -> str:
    """``median / p90 / worst`` of a ``distribution``."""
    if not d:
        return "-"
    return " / ".join(fmt(d[k], digits) for k in ("median", "p90", "worst"))


# ---------------------------------------------------------------------- what every benchmark takes


@dataclass(frozen=True)
class RunSettings:
    """What every benchmark takes: torch's threads and where the results go."""

    threads: int | None = None
    """Torch threads (null: torch's default, every core the process may use; a shared
    machine: 1)."""
    output_dir: str = str(RESULTS)
    """The folder the JSON and Markdown results go to."""

    def __post_init__(self) -> None:
        refuse(self, at_least(self, 1, "threads") if self.threads is not None else [])


def at_least(settings: Any, bound: int, *names: str, why: str = "") -> list[str]:
    """The problems of the fields ``names`` of ``settings`` below ``bound``, each starting with
    its field's name (``why`` follows each)."""
    return [
        f"{name} must be >= {bound}{why}, got {getattr(settings, name)}"
        for name in names
        if getattr(settings, name) < bound
    ]


def refuse(settings: Any, problems: list[str]) -> None:
    """Raise ``ValueError`` listing ``problems``, one a line under a title line; the command
    line names each by its flag (``training.warmup (--training.warmup) must be >= 1 ...``)."""
    if problems:
        raise ValueError("\n".join([f"invalid {type(settings).__name__}", *problems]))


def apply_threads(run: RunSettings) -> None:
    """Set torch's thread count from ``run.threads`` when given."""
    if run.threads:
        torch.set_num_threads(run.threads)


def repo_relative(path: str | Path) -> str:
    """``path`` relative to the checkout when it lies inside it (for reports), else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


# ---------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    """The machine and library versions a report ran on."""
    import sentence_transformers
    import transformers

    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = found.group(1).strip() if found else cpu
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "peak_rss_method": "VmHWM from /proc/self/status, reset via /proc/self/clear_refs"
        if reset_peak_rss()
        else "VmHWM from /proc/self/status, NOT reset (process-wide peak)",
    }


def new_report(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """A report's header: the command as run (``python -m benchmarks NAME ...``), the settings
    (each group as a mapping, every other option as it is; not the output folder), the machine
    and the load."""
    command = "OMP_NUM_THREADS={} python -m benchmarks {} {}".format(
        os.environ.get("OMP_NUM_THREADS", "unset"), name, shlex.join(arguments_of(name))
    ).strip()
    return {
        "command": command,
        "settings": {group: recorded(value) for group, value in settings.items()},
        "machine": machine_info(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "started": time.perf_counter(),
    }


def arguments_of(name: str) -> list[str]:
    """The arguments command ``name`` was given, as the command line recorded them (empty when
    the command was called from Python, not through ``python -m benchmarks``)."""
    argv = console.ARGV  # ["-m", "benchmarks", NAME, ...arguments]
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["benchmarks", name]:
            return list(argv[i + 2 :])
    return []


def recorded(value: Any) -> Any:
    """A settings group as a mapping without its output folder, any other value as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if k != "output_dir"}
    return list(value) if isinstance(value, tuple) else value


def header_markdown(report: dict[str, Any], title: str) -> list[str]:
    """The lines every report's Markdown starts with: title, command, machine, load, time."""
    m = report["machine"]
    return [
        f"# {title}" + ("" if report.get("complete") else " (run still going)"),
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
        f"with {m['torch_threads']} thread(s), OMP_NUM_THREADS={m['OMP_NUM_THREADS']}, "
        f"transformers {m['transformers']}, sentence-transformers {m['sentence_transformers']}. "
        f"Load average at start / end: {report['load_average_start']} / {report['load_average_end']}. "
        f"Total wall-clock {report['total_seconds'] / 60:.1f} min. Peak memory: "
        f"{m['peak_rss_method']}.",
        "",
    ]


def targets_markdown(targets: Sequence[dict[str, Any]]) -> list[str]:
    """The targets table: what was aimed at, what was measured, whether it was met (nothing
    for a benchmark without targets)."""
    if not targets:
        return []
    lines = ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in targets:
        lines.append(f"| {t['target']} | {fmt(t['measured'])} | {fmt(t['met'])} |")
    return lines


def section_report(
    name: str,
    title: str,
    run: RunSettings,
    settings: dict[str, Any],
    measure: Callable[[], dict[str, Any]],
    targets: Callable[[dict[str, Any]], list[dict[str, Any]]],
    markdown: Callable[[dict[str, Any]], list[str]],
) -> int:
    """A benchmark whose report is one section (``detection``, ``training``, ...): measure it,
    then print and write ``NAME.json`` and ``NAME.md`` under ``run.output_dir``. ``settings``
    are what the report records (``run`` is added)."""
    apply_threads(run)
    report = new_report(name, {**settings, "run": run})
    report[name] = measure()
    report["targets"] = targets(report[name])

    def render(r: dict[str, Any]) -> str:
        lines = header_markdown(r, title) + markdown(r[name])
        return "\n".join(lines + targets_markdown(r["targets"])) + "\n"

    print(write_report(report, run.output_dir, name, render, final=True))
    return 0


def write_report(
    report: dict[str, Any],
    out: str | Path,
    name: str,
    render: Callable[[dict[str, Any]], str],
    final: bool,
) -> str:
    """Finish the header (load at the end, total time, ``complete``), then write
    ``out/NAME.json`` and ``out/NAME.md`` (``render(report)``); returns the Markdown.

    Called after every prompt of a long run with ``final=False``, so a run killed on a shared
    machine keeps what it measured."""
    report["complete"] = final
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report["total_seconds"] = time.perf_counter() - report["started"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    saved = {k: v for k, v in report.items() if k != "started"}
    # Compact: the Markdown beside it is the one to read; the JSON is for programs.
    (out / f"{name}.json").write_text(json.dumps(saved, separators=(",", ":")) + "\n")
    text = render(report)
    (out / f"{name}.md").write_text(text)
    return text
