"""Committed results name only settings that exist.

Results files under ``docs/`` and ``benchmarks/results/`` record the settings they
were made with: evaluation settings files and the ``settings`` of ``results.json``
(``EvalSettings``, with ``watermark_overrides`` inside), the watermark settings of calibration
reports, of benchmark variants and of study validation runs (``WatermarkSettings``, in its
groups). When a setting is
renamed or removed, a reader can no longer tell what such a file ran with, nor rerun it; this
test names the file and the setting so that the file is regenerated or annotated in the same
change (``RETIRED``).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ksemstamp.settings import MARK_KINDS, WatermarkSettings
from ksemstamp.settings.evaluation import EvalSettings

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("docs", "benchmarks/results")
EVAL_MARKERS = {
    "algorithms",
    "attacks",
    "edits",
    "num_prompts",
    "watermark_configs",
    "watermark_overrides",
}
"""Keys only an evaluation's settings have."""


def field_names(cls: type) -> set[str]:
    """Every field name of a settings dataclass, nested settings dataclasses included (a file may
    name a nested group or one of its fields)."""
    hints = typing.get_type_hints(cls)
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        for kind in (hints.get(f.name), *typing.get_args(hints.get(f.name))):
            if dataclasses.is_dataclass(kind):
                names |= field_names(kind)
    return names


RETIRED = {
    "progress": "evaluation: the progress bars are the `--quiet` option of `evaluate` now",
}
"""Settings that older results record and that no longer exist, and what took their place."""
KNOWN = {
    "watermark": field_names(WatermarkSettings).union(
        *map(field_names, MARK_KINDS.values()),
        *(field_names(kind.search) for kind in MARK_KINDS.values()),
    ),
    "evaluation": field_names(EvalSettings) | set(RETIRED),
}


def settings_blocks(data: Any, where: str) -> Iterator[tuple[str, dict, str]]:
    """``(kind, settings, location)`` for every settings mapping recorded in a results file.

    ``settings`` mappings are evaluation settings when they hold an evaluation-only key, else
    watermark settings, except a benchmark's own flags (a ``settings`` beside ``machine``);
    ``watermark_overrides`` are watermark settings wherever they appear."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{where}.{key}"
            if isinstance(value, dict) and key == "watermark_overrides":
                yield "watermark", value, here
            elif isinstance(value, dict) and key == "settings" and "machine" not in data:
                yield ("evaluation" if EVAL_MARKERS & value.keys() else "watermark"), value, here
            yield from settings_blocks(value, here)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from settings_blocks(value, f"{where}[{i}]")


def results_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        for pattern in ("*.json", "*.yaml", "*.yml"):
            files += (ROOT / folder).rglob(pattern)
    return sorted(files)


def unknown_settings(path: Path) -> list[str]:
    """Problems of one file: each recorded setting that no settings dataclass has."""
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        blocks = list(settings_blocks(data, path.name))
    else:
        data = yaml.safe_load(text) or {}
        kind = "evaluation" if EVAL_MARKERS & set(data) else "watermark"
        blocks = [(kind, data, path.name), *settings_blocks(data, path.name)]
    problems = []
    for kind, settings, where in blocks:
        for name in sorted(set(settings) - KNOWN[kind]):
            problems.append(f"{where}: {name!r} is not one of the {kind} settings")
    return problems


def test_results_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in results_files()}
    assert "docs/evaluation/confirm-run.yaml" in names
    assert "docs/calibration/calibration.json" in names
    assert "benchmarks/results/latest.json" in names


@pytest.mark.parametrize("path", results_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_committed_results_name_existing_settings(path):
    assert unknown_settings(path) == []


def test_every_kind_of_settings_record_is_checked():
    """The blocks each kind of results file holds are found (a walker that found nothing would
    pass every file)."""
    kinds = {}
    for rel in (
        "docs/evaluation/confirm-run/pruned/results.json",
        "docs/calibration/calibration.json",
        "benchmarks/results/latest.json",
    ):
        data = json.loads((ROOT / rel).read_text())
        kinds[rel] = sorted({(k, w.lstrip(".")) for k, _, w in settings_blocks(data, "")})
    assert ("evaluation", "settings") in kinds["docs/evaluation/confirm-run/pruned/results.json"]
    assert ("watermark", "settings.watermark_overrides") in kinds[
        "docs/evaluation/confirm-run/pruned/results.json"
    ]
    assert kinds["docs/calibration/calibration.json"] == [("watermark", "settings")]
    variants = kinds["benchmarks/results/latest.json"]
    assert ("watermark", "generation.variants[2].settings") in variants
    assert all(w != "settings" for _, w in variants)  # the benchmark's own flags


def test_a_removed_setting_is_reported(tmp_path):
    record = {
        "settings": {"num_prompts": 5, "algorithms": ["none"], "watermark_overrides": {"gama": 1}},
        "generation": {"variants": [{"settings": {"temperature": 0.7, "old_knob": 3}}]},
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(record))
    assert unknown_settings(path) == [
        "results.json.settings.watermark_overrides: 'gama' is not one of the watermark settings",
        "results.json.generation.variants[0].settings: 'old_knob' is not one of the watermark settings",
    ]
    (tmp_path / "run.yaml").write_text("num_prompts: 3\nalgorithms: [none]\nprompt_word: 4\n")
    assert unknown_settings(tmp_path / "run.yaml") == [
        "run.yaml: 'prompt_word' is not one of the evaluation settings"
    ]
