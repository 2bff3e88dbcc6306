"""A generated text too short to be detected says so: in its record and on stderr."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import ksemstamp.cli as cli
import ksemstamp.cli.commands as commands
import ksemstamp.cli.processors as records
from ksemstamp.detection.detectable import length_note, scored_units, units_needed
from ksemstamp.detection.stats import exact_p_value, normal_sf, paper_z
from ksemstamp.results import GenerationResult, SentenceRecord
from ksemstamp.settings import WatermarkSettings

REGION = WatermarkSettings.from_dict({"mark": {"kind": "region"}})


def _result(units: int, prompt: str = "A prompt sentence.", chat: bool = False):
    sentences = [SentenceRecord(f"Clause {i},", 0, 1, num_tokens=6) for i in range(units)]
    return GenerationResult(prompt=prompt, text="...", sentences=sentences, chat=chat)


def test_the_region_mark_needs_the_units_its_exact_test_can_reach_alpha_with():
    import numpy as np

    least, typical = units_needed(REGION)  # gamma 0.25, alpha 0.01
    assert (least, typical) == (4, 4)
    # n scored units, each after another region and each valid: the exact p is gamma ** n
    for n, reaches in ((3, False), (4, True)):
        counts = np.zeros((8, 8), dtype=int)
        table = np.zeros((8, 8), dtype=bool)
        for t in range(n):
            counts[t, t + 1] = 1
            table[t, [t + 1, (t + 2) % 8]] = True
        for q in range(n, 8):
            table[q, :2] = True
        assert exact_p_value(counts, table) == pytest.approx(0.25**n)
        assert (exact_p_value(counts, table) <= 0.01) == reaches
    paper = WatermarkSettings.from_dict(
        {"mark": {"kind": "region"}, "detection": {"statistic": "paper"}}
    )
    least, _ = units_needed(paper)
    assert normal_sf(paper_z(least, least, 0.25)) <= 0.01 < normal_sf(paper_z(1, 1, 0.25))


def test_the_direction_mark_needs_what_a_typical_text_reaches():
    assert units_needed(WatermarkSettings()) == (1, 4)  # alpha 0.01 over the scan's four tests
    scan_off = WatermarkSettings.from_dict({"detection": {"scan": False}})
    assert units_needed(scan_off) == (1, 3)
    strict = WatermarkSettings.from_dict({"detection": {"alpha": 0.001}})
    assert units_needed(strict)[1] > 4


def test_a_short_text_says_how_many_units_it_has_and_needs():
    settings = WatermarkSettings()
    note = length_note(_result(2), settings)
    assert note["scored_units"] == 2 and note["units_needed"] == 4
    assert note["warning"].startswith("only 2 scored clauses: a text typically needs 4")
    assert length_note(_result(4), settings) is None
    assert length_note(GenerationResult(prompt="x", status="error"), settings) is None
    # the region mark: under its bound no text can reach alpha
    note = length_note(_result(3), REGION)
    assert "cannot reach alpha 0.01 even if every one carries the mark (needs 4)" in note["warning"]
    # a chat answer's first unit only seeds where units are scored after the one before
    assert scored_units(_result(4, chat=True), REGION) == 3
    assert scored_units(_result(4, chat=True), settings) == 4  # own contexts score every one


class _Watermarker:
    """Stands in for a built watermarker: every prompt gets a two-clause text."""

    scheme = SimpleNamespace(key_fingerprint="f" * 12, encoder=None, partition=None, identity=None)
    engine = SimpleNamespace(model=None)  # no LM in this process

    def generate(self, prompts, watermark=True, progress=False):
        return [_result(2, prompt=p) for p in prompts]


def test_generate_says_a_text_is_too_short_in_its_record_and_on_stderr(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(commands, "build_watermarker", lambda settings: _Watermarker())
    monkeypatch.setattr(records, "build_watermarker", lambda settings: _Watermarker())
    assert cli.main(["generate", "--prompt", "A prompt sentence.", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning: only 2 scored clauses: a text typically needs 4" in err
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"id": 1, "prompt": "One."}\n{"id": 2, "prompt": "Two."}\n')
    assert cli.main(["generate", "--input", str(src), "--output", str(out), "--quiet"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["scored_units"], r["units_needed"]) for r in rows] == [(2, 4), (2, 4)]
    assert all(r["warning"].startswith("only 2 scored clauses") for r in rows)
    assert "warning: 2 texts are too short to be detected" in capsys.readouterr().err
