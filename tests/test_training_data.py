"""Pair files, the pair DataModule, offline paraphrasers and the resumable pair builder."""

from __future__ import annotations

import json
import math
import os
import random

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ksemstamp.training.data import PairDataModule, read_pairs  # noqa: E402
from ksemstamp.training.pairs import build_pairs, done_ids, word_overlap  # noqa: E402


def write_pairs(path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps({"id": str(i), "text": f"text {i}", "paraphrase": f"para {i}"}) + "\n"
            )


def test_read_pairs_ignores_a_cut_last_line_but_not_a_broken_middle(tmp_path):
    path = tmp_path / "p.jsonl"
    write_pairs(path, 3)
    with path.open("a") as f:
        f.write('{"text": "cut sho')
    assert read_pairs(path) == [("text 0", "para 0"), ("text 1", "para 1"), ("text 2", "para 2")]
    assert len(read_pairs(path, limit=2)) == 2
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{broken", lines[1]]) + "\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_pairs(path)
    path.write_text(json.dumps({"text": "only text"}) + "\n")
    with pytest.raises(ValueError, match="paraphrase"):
        read_pairs(path)


def test_datamodule_drops_the_last_training_batch_but_keeps_validation_rows(tmp_path):
    write_pairs(tmp_path / "train.jsonl", 10)
    write_pairs(tmp_path / "val.jsonl", 5)
    dm = PairDataModule(str(tmp_path / "train.jsonl"), str(tmp_path / "val.jsonl"), batch_size=4)
    dm.setup("fit")
    train = list(dm.train_dataloader())
    assert [len(b["text"]) for b in train] == [4, 4]  # 10 pairs: the last 2 are dropped
    assert all(len(b["text"]) == len(b["paraphrase"]) for b in train)
    # Row i of texts pairs with row i of paraphrases after shuffling.
    assert all(
        t.split()[1] == p.split()[1]
        for b in train
        for t, p in zip(b["text"], b["paraphrase"], strict=True)
    )
    assert [len(b["text"]) for b in dm.val_dataloader()] == [4, 1]


def test_datamodule_reads_several_files_in_order_and_drops_repeated_texts(tmp_path):
    write_pairs(tmp_path / "a.jsonl", 3)  # text 0..2
    with (tmp_path / "b.jsonl").open("w") as f:
        for text, para in [("text 1", "other 1"), ("text 7", "para 7"), ("text 8", "para 8")]:
            f.write(json.dumps({"text": text, "paraphrase": para}) + "\n")
    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    dm = PairDataModule(files, None, batch_size=2, max_train_pairs=4)
    dm.setup("fit")
    # "text 1" from b.jsonl repeats a text of a.jsonl: dropped before the limit is applied
    assert dm.train_set.pairs == [
        ("text 0", "para 0"),
        ("text 1", "para 1"),
        ("text 2", "para 2"),
        ("text 7", "para 7"),
    ]


def test_datamodule_rejects_too_few_pairs(tmp_path):
    write_pairs(tmp_path / "train.jsonl", 3)
    dm = PairDataModule(str(tmp_path / "train.jsonl"), None, batch_size=4)
    with pytest.raises(ValueError, match="fewer than one batch"):
        dm.setup("fit")
    with pytest.raises(ValueError):
        PairDataModule(batch_size=1)


def test_done_ids_cuts_a_half_written_line(tmp_path):
    path = tmp_path / "p.jsonl"
    write_pairs(path, 2)
    with path.open("a") as f:
        f.write('{"id": "2", "te')
    assert done_ids(path) == {"0", "1"}
    assert path.read_text().endswith("\n")
    assert len(path.read_text().splitlines()) == 2


def test_word_overlap():
    assert word_overlap("The cat sat.", "the CAT sat") == 1.0
    assert word_overlap("a b", "c d") == 0.0
    assert word_overlap("a b c", "a b d") == pytest.approx(2 / 4)


def test_wordnet_paraphraser_substitutes_and_reinflects():
    from ksemstamp.training.wordnet import WordNetParaphraser

    wn = WordNetParaphraser(rate=1.0)
    assert wn.synonyms("the") == ()  # stopword
    assert wn.synonyms("London") == ()  # capitalised: names are left alone
    budget_syns = wn.synonyms("prices")
    assert budget_syns and all(s.endswith("s") for s in budget_syns)  # plural kept
    assert "monetary_value" not in budget_syns  # multi-word lemmas are skipped
    sentence = "The committee approved the budget after a long debate."
    out = wn.paraphrase(sentence, random.Random(0))
    assert out is not None and out != sentence
    assert out.startswith("The ") and out.endswith(".")  # punctuation and names preserved
    assert wn.paraphrase("The of and.", random.Random(0)) is None


@pytest.mark.e2e
def test_build_pairs_is_resumable(tmp_path):
    out = tmp_path / "pairs.jsonl"
    assert build_pairs(out, 4, split="val", progress=False) == 4
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["method"] == "wordnet" and r["text"] != r["paraphrase"] for r in first)
    assert all(r["similarity"] >= 0.75 and r["overlap"] <= 0.85 for r in first)
    # Simulate a crash mid-line, then resume to 6 pairs: nothing is written twice.
    with out.open("a") as f:
        f.write('{"id": "half')
    assert build_pairs(out, 6, split="val", progress=False) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and len({r["id"] for r in rows}) == 6
    assert rows[:4] == first
    assert build_pairs(out, 6, split="val", progress=False) == 0


@pytest.mark.e2e
def test_build_pairs_takes_lm_rewrites_from_the_shared_paraphraser(tmp_path):
    import torch

    out = tmp_path / "pairs.jsonl"
    torch.manual_seed(0)  # the pairs' LM samples from torch's global stream
    assert build_pairs(out, 3, split="val", lm_share=1.0, chunk_size=4, progress=False) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert any(r["method"] == "lm" for r in rows)
    for r in rows:
        assert r["paraphrase"] and r["paraphrase"] != r["text"]
        assert 0.75 <= r["similarity"] <= 0.99 and r["overlap"] <= 0.85
        if r["method"] == "lm":  # the chat replies are read without their quotes
            assert not r["paraphrase"].startswith('"') and not r["paraphrase"].endswith('"')


def test_agreement_report_counts_shared_regions_and_margin():
    import torch

    from ksemstamp.training.evaluate import agreement_report

    def unit(*deg):
        rad = torch.tensor(deg) * torch.pi / 180
        return torch.stack([torch.cos(rad), torch.sin(rad)], dim=-1)

    centroids = unit(0, 180)  # region 0: right half-plane, region 1: left half-plane
    texts = unit(10, 80, 170, 200)
    paras = unit(20, 100, 160, 210)  # the second pair crosses the boundary at 90 degrees
    report = agreement_report(texts, paras, centroids, margin=0.5, batch_size=4)
    assert report["pairs"] == 4
    assert report["region_agreement"] == pytest.approx(0.75)
    # Only the text at 80 degrees is within the margin of the boundary; the rest all agree.
    assert report["margin_pass_rate"] == pytest.approx(0.75)
    assert report["region_agreement_margin"] == pytest.approx(1.0)
    assert report["chance_agreement"] == pytest.approx(0.5**2 + 0.5**2)
    assert report["region_kappa"] == pytest.approx((0.75 - 0.5) / (1 - 0.5))
    # Gaps to the boundary: 10 and 170 degrees are farthest (gap 1 - cos 160 - (1 - cos 20)),
    # then 200, then 80. The top half are two agreeing pairs; the top three add 200 (agrees).
    half = agreement_report(texts, paras, centroids, margin=0.5, batch_size=4, top_share=0.5)
    assert half["top_share"] == pytest.approx(0.5)
    assert half["region_agreement_top"] == pytest.approx(1.0)
    expected = 2 * math.cos(math.radians(10))
    assert half["top_margin"] == pytest.approx(expected, abs=1e-6)
    all_texts = agreement_report(texts, paras, centroids, batch_size=4, top_share=1.0)
    assert all_texts["region_agreement_top"] == pytest.approx(0.75)


def test_agreement_plot_draws_one_bar_per_report_and_group(tmp_path, monkeypatch):
    from ksemstamp.training import evaluate

    def report(value):
        group = {
            "pairs": 10,
            "region_agreement": value,
            "region_agreement_top": value + 0.1,
            "region_kappa": value - 0.1,
            "top_share": 0.7,
            "chance_agreement": 0.15,
        }
        over = {"seeds": [0, 1], "all/region_agreement": {"mean": value, "min": 0.5, "max": 0.9}}
        return {"encoder": "x", "all": group, "lm": dict(group), "over_seeds": over}

    bars = []
    import matplotlib.axes

    real_bar = matplotlib.axes.Axes.bar

    def spy(self, x, height, *args, **kwargs):
        bars.append((list(x), list(height)))
        return real_bar(self, x, height, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", spy)
    path = tmp_path / "agreement.png"
    evaluate.plot_agreement({"base": report(0.8), "tuned": report(0.6)}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # three panels (all pairs, kappa, top share) x two reports x two groups (all, lm)
    heights = [pytest.approx(h) for _, h in bars]
    assert heights == [[0.8, 0.8], [0.6, 0.6], [0.7, 0.7], [0.5, 0.5], [0.9, 0.9], [0.7, 0.7]]
    assert bars[0][0][0] < bars[1][0][0]  # side by side, base first
