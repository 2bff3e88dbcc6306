"""The lab's pieces that need no model: summaries, pairing, the curve's table."""

from __future__ import annotations

import json

import pytest

from lab import check, curve
from lab.__main__ import CHECK_DEFAULTS, COMMANDS, run


def _records():
    # two keys; key 0 detects both texts at 1%, key 1 one of two
    return [
        {"key": 0, "z": 4.0, "p": 0.001, "effective_share": 0.8},
        {"key": 0, "z": 3.0, "p": 0.005, "effective_share": 0.6},
        {"key": 1, "z": 2.0, "p": 0.05, "effective_share": None},
        {"key": 1, "z": 5.0, "p": 0.0001, "effective_share": 0.7},
    ]


def test_a_variant_is_summarised_overall_and_by_its_worst_key():
    summary = check.variant_summary(_records())
    assert summary["detected_1pct"] == 0.75 and summary["worst_key"] == 0.5
    assert summary["median_z"] == 3.5 and summary["median_neff_share"] == 0.7


def test_the_effective_share_is_the_units_a_text_counts_as_over_its_units():
    # four units of score 1 at z = 4 / sqrt(4) = 2: independent units, share 1
    assert check.effective_share(2.0, [1.0] * 4) == pytest.approx(1.0)
    # the same units at z = 1: they move together, counting as one
    assert check.effective_share(1.0, [1.0] * 4) == pytest.approx(0.25)
    assert check.effective_share(0.0, [1.0]) is None and check.effective_share(1.0, []) is None


def test_compare_pairs_the_same_prompts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(curve, "RUNS", tmp_path)
    for name, shift in (("a", 0.0), ("b", 1.0)):
        folder = tmp_path / f"check-{name}"
        folder.mkdir()
        rows = [
            {"id": f"p{i}", "variant": "clean", "z": float(i) + shift * (i % 2)} for i in range(4)
        ]
        (folder / "detections.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert curve.compare("a", "b") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clean"]["pairs"] == 4 and out["clean"]["mean_z_difference"] == 0.5
    assert out["clean"]["second_higher"] == 2


def _summary(name, candidates, temperature, clean, attacked, perplexity, seconds):
    return {
        "name": name,
        "settings": {
            "search": {"max_candidates": candidates, "prune_keep": 12},
            "sampling": {"temperature": temperature},
        },
        "texts": 12,
        "perplexity_median": perplexity,
        "perplexity_by_id": {"p0": perplexity, "p1": perplexity},
        "decoded_per_token": candidates / 1.5,
        "seconds_per_token": seconds,
        "clean": {"detected_1pct": clean, "worst_key": clean, "median_z": 6.0, "texts": 12},
        "attacked": {"detected_1pct": attacked, "worst_key": 0.5, "median_z": 3.0, "texts": 12},
        "edits": {"interleave-75": {"detected_1pct": 0.75, "worst_key": 0.5}},
    }


def _steered(summary: dict, steer: float) -> dict:
    summary["settings"]["search"]["steer"] = steer
    return summary


def test_the_curve_is_a_table_a_file_and_a_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(curve, "RUNS", tmp_path)
    for summary in (
        _summary("c32", 32, 0.7, 1.0, 0.75, 18.0, 0.2),
        _steered(_summary("c128", 128, 0.7, 1.0, 0.9, 17.5, 0.5), 0.5),
        {**_summary("plain", 1, 0.7, 0.0, 0.0, 17.0, 0.1), "watermarked": False},
    ):
        folder = tmp_path / f"check-{summary['name']}"
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "curve"
    assert curve.curve(["c32", "c128"], str(out), plain="plain") == 0
    table = (out / "curve.md").read_text()
    assert "| c32 | 32 | 12 | 0.0 | 0.7 | 12 |" in table
    assert "| c128 | 128 | 12 | 0.5 | 0.7 | 12 | 1.00 (1.00), z 6.0 | 0.90 (0.50), z 3.0 |" in table
    assert "| 0.75 (0.50) | 17.5 | 1.03 [1.03, 1.03] | 85.3 | 5.0x |" in table
    assert "median perplexity 17.0" in table
    data = json.loads((out / "curve.json").read_text())
    assert [r["name"] for r in data["rows"]] == ["c32", "c128"]
    assert (out / "curve.png").stat().st_size > 0
    by_steer = tmp_path / "by-steer"
    assert curve.curve(["c32", "c128"], str(by_steer), plain="plain", by="steer") == 0
    assert (by_steer / "curve.png").stat().st_size > 0
    with pytest.raises(FileNotFoundError, match="python -m lab check"):
        curve.curve(["missing"], str(out))


def test_the_lab_runs_through_the_packages_command_line(capsys):
    assert set(COMMANDS) == {"check", "compare", "curve", "leakage", "quality", "subset"}
    assert CHECK_DEFAULTS.exists()
    assert run(["--help"]) == 0
    assert "candidate curve" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        run(["check", "--run.prompts", "many"])
    assert bad.value.code == 2


def test_perplexity_is_compared_with_plain_text_prompt_by_prompt():
    plain = {"a": 10.0, "b": 20.0, "c": 40.0}
    # twice as perplexing on every prompt: ratio 2, and every resample agrees
    doubled = curve.paired_ratio({k: 2 * v for k, v in plain.items()}, plain)
    assert doubled["texts"] == 3 and doubled["ratio"] == pytest.approx(2.0)
    assert doubled["ci95"] == pytest.approx([2.0, 2.0])
    # a prompt only one side scored is left out; fewer than two pairs give no ratio
    mixed = curve.paired_ratio({"a": 5.0, "b": 40.0, "z": 1.0}, plain)
    assert mixed["texts"] == 2 and mixed["ratio"] == pytest.approx(1.0)
    assert mixed["ci95"][0] < 1.0 < mixed["ci95"][1]
    assert curve.paired_ratio({"a": 1.0}, plain) is None


def test_a_subset_holds_the_sources_texts_of_the_first_prompts_only(tmp_path, monkeypatch):
    import json

    from lab import subset as sub

    monkeypatch.setattr(sub, "RUNS", tmp_path)
    monkeypatch.setattr(sub, "val_prompts", lambda n: [{"id": f"p{i}"} for i in range(n)])
    source = tmp_path / "check-big"
    source.mkdir()
    for file in ("generations.jsonl", "attacked.jsonl"):
        rows = [{"id": f"p{i}", "text": f"{file} {i}"} for i in (3, 0, 5, 1)]
        (source / file).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sub.subset(sub.SubsetSettings(source="big", name="small", prompts=2)) == 0
    for file in ("generations.jsonl", "attacked.jsonl"):
        kept = [json.loads(line) for line in (tmp_path / "check-small" / file).open()]
        assert [r["id"] for r in kept] == ["p0", "p1"] and kept[0]["text"] == f"{file} 0"
    assert not (tmp_path / "check-small" / "perplexity.jsonl").exists()  # the source had none
