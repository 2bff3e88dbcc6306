"""The quality table's degeneration counts and its paired comparison."""

from __future__ import annotations

import json

import pytest

import lab.quality as quality
from lab.quality import degeneration


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("Labels: government labor LaborLabLabLabil GoReaders.com.", {"piece_runs"}),
        ("It was the the the best of times.", {"piece_runs"}),
        ("What's the impact? What's the message? What's the award? We wait.", {"question_runs"}),
        (
            "The court will rule on Monday. Then it rests. The court will rule on Monday.",
            {"repeated_units"},
        ),
        ("Labels: national past Comm Labels: national pastComm seventeen.", {"glued"}),
        ("MailOnline and TechCorp said so on YouTube.", set()),
    ],
)
def test_each_kind_of_degeneration_is_counted(text, kinds):
    got = degeneration(text)
    assert {k for k, v in got.items() if v} == kinds, got


def test_fluent_text_and_varied_questions_are_not_degenerate():
    text = (
        "The council met on Monday and approved the budget. What happens next? Who pays for it? "
        "Officials said the schools would get more teachers, and parents welcomed the news."
    )
    assert not any(degeneration(text).values())


def test_the_table_pairs_each_design_with_plain_sampling(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for name, ppl, text in (
        ("plain", {"a": 10.0, "b": 20.0, "c": 10.0}, "A fine text about the council."),
        ("mark", {"a": 12.0, "b": 50.0, "c": 10.0}, "LabLabLab and more of it."),
    ):
        folder = runs / f"check-{name}"
        folder.mkdir(parents=True)
        rows = [{"id": i, "prompt": "P.", "text": text} for i in ppl]
        (folder / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "summary.json").write_text(json.dumps({"perplexity_by_id": ppl}))
    monkeypatch.setattr(quality, "RUNS", runs)
    out = tmp_path / "out"
    settings = quality.QualitySettings(names="mark", plain="plain", output=str(out))
    assert quality.quality(settings) == 0
    got = json.loads((out / "quality.json").read_text())
    ratio = got["mark"]["oracle_ratio"]
    assert ratio["ratio"] == pytest.approx((1.2 * 2.5 * 1.0) ** (1 / 3))
    assert got["mark"]["above_twice_plain"] == pytest.approx(1 / 3)
    assert got["mark"]["degenerate_texts"] == 3 and got["plain"]["degenerate_texts"] == 0
    assert (out / "quality.png").stat().st_size > 0 and "`mark` | 3 |" in (
        out / "quality.md"
    ).read_text()
