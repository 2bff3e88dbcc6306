"""The candidate curve's summary (``research.robust.candidates``) on a tiny run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.robust import candidates


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _folder(tmp_path: Path, name: str, p_clean: list[float], p_attacked: list[float]) -> Path:
    folder = tmp_path / name
    ids = [f"t{i}" for i in range(len(p_clean))]
    _write(folder / "prompts.jsonl", [{"id": i} for i in ids])
    _write(
        folder / "generations" / "ksemstamp.jsonl",
        [
            {
                "id": i,
                "num_sentences": 2,
                "candidates": 16,
                "num_tokens": 10,
                "decoded_tokens": 50,
                "seconds": 1.0,
                "scores": [1.0, 3.0],
            }
            for i in ids
        ],
    )
    for name_, ps in (("none", p_clean), ("lm-paraphrase", p_attacked)):
        _write(
            folder / "detections" / f"ksemstamp.{name_}.jsonl",
            [
                {"id": i, "key_index": k % 2, "p_value": p, "z_score": 3.0 - p}
                for k, (i, p) in enumerate(zip(ids, ps, strict=True))
            ],
        )
    _write(
        folder / "attacks" / "ksemstamp.lm-paraphrase.jsonl",
        [{"id": i, "similarity": 0.5 + 0.1 * k} for k, i in enumerate(ids)],
    )
    _write(
        folder / "quality" / "ksemstamp.jsonl",
        [{"id": i, "perplexity": 10.0 + k} for k, i in enumerate(ids)],
    )
    return folder


def test_decisions_count_each_key_and_report_the_worst() -> None:
    records = [
        {"key_index": 0, "p_value": 0.001, "z_score": 4.0},
        {"key_index": 0, "p_value": 0.002, "z_score": 3.5},
        {"key_index": 1, "p_value": 0.5, "z_score": 0.0},
        {"key_index": 1, "p_value": 0.01, "z_score": 2.4},
    ]
    d = candidates.decisions(records)
    assert d["rate"] == 0.75 and d["worst_key"] == 0.5 and d["texts"] == 4
    assert d["median_z"] == pytest.approx((2.4 + 3.5) / 2)
    assert candidates.decisions(records[:2])["worst_key"] == 1.0  # one key: its own share
    with pytest.raises(ValueError, match="alpha"):
        candidates.decisions(records, alpha=0.02)


def test_summary_of_one_folder_and_the_written_curve(tmp_path: Path) -> None:
    a = _folder(tmp_path, "a", [0.001, 0.001, 0.2, 0.001], [0.001, 0.3, 0.3, 0.3])
    b = _folder(tmp_path, "b", [0.001] * 4, [0.001] * 4)
    row = candidates.summarise(a, ["t0", "t1", "t2", "t3"])
    assert row["candidates_per_sentence"] == 8.0 and row["decoded_per_token"] == 5.0
    assert row["clean"]["rate"] == 0.75 and row["clean"]["worst_key"] == 0.5
    assert row["lm-paraphrase"]["rate"] == 0.25 and row["lm-paraphrase"]["worst_key"] == 0.0
    assert row["paraphrase_similarity"] == pytest.approx(0.65)
    assert row["median_sentence_score"] == 2.0 and row["perplexity_median"] == 11.5
    _write(a / "quality" / "none.jsonl", [{"id": f"t{k}", "perplexity": 20.0} for k in range(4)])
    out = tmp_path / "out"
    candidates.main(["--runs", f"8={a}", f"16={b}", "--output-dir", str(out), "--baseline", str(a)])
    curve = json.loads((out / "curve.json").read_text())
    assert set(curve["rows"]) == {"8", "16"}
    assert curve["rows"]["16"]["lm-paraphrase"]["rate"] == 1.0
    assert (out / "curve.png").stat().st_size > 0
    md = (out / "curve.md").read_text()
    assert "| 8 | 0.75 (0.50) |" in md and "median perplexity: 20.0" in md
    assert curve["unwatermarked_perplexity"] == 20.0


def test_a_folder_missing_records_is_named(tmp_path: Path) -> None:
    a = _folder(tmp_path, "a", [0.001, 0.001], [0.001, 0.001])
    with pytest.raises(SystemExit, match="no records yet for 1 prompts"):
        candidates.summarise(a, ["t0", "t9"])
