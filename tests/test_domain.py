"""The "Your own domain" walk-through of docs/training.md, run as written on a non-news corpus
(House of Commons speeches) with small sizes: pairs, training with centroids fitted on the
corpus, prompts, then generation and detection from the checkpoint."""

import json
import shlex
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each command exactly as docs/training.md gives it, and what the test adds to keep it small
# and reproducible (later flags win).
WALKTHROUGH = [
    (
        "ksemstamp corpus export --source parliament --output data/domain.txt",
        [],
    ),
    (
        "ksemstamp pairs --corpus data/domain.txt --num 2000 --output data/pairs/domain-train.jsonl",
        ["--num", "48", "--quiet"],
    ),
    (
        "ksemstamp pairs --corpus data/domain.txt --split val --num 200 "
        "--output data/pairs/domain-val.jsonl",
        ["--num", "8", "--quiet"],
    ),
    (
        "python train.py fit --config configs/train/news.yaml --config configs/train/domain.yaml",
        [
            "--trainer.max_steps=4",
            "--data.batch_size=8",
            "--model.val_kmeans_sentences=0",
            "--kmeans.num_sentences=320",
            "--trainer.enable_progress_bar=false",
        ],
    ),
    (
        "ksemstamp corpus prompts --corpus data/domain.txt --num 20 "
        "--output data/domain-prompts.jsonl",
        ["--num", "2"],
    ),
    (
        "ksemstamp generate --model.checkpoint checkpoints/domain/final.ckpt "
        "--input data/domain-prompts.jsonl --output data/domain-generations.jsonl",
        # a fixed seed: unseeded, each run samples new texts, and a 100-token text of ~4
        # sentences now and then misses p <= 0.01 by chance (once seen at p = 0.013)
        ["--sampling.max_new_tokens", "100", "--sampling.seed", "0", "--quiet"],
    ),
    (
        "ksemstamp detect --model.checkpoint checkpoints/domain/final.ckpt "
        "--input data/domain-generations.jsonl --output data/domain-detections.jsonl",
        ["--quiet"],
    ),
]


def run(command: str, extra: list[str]) -> None:
    """One command of the walk-through, in this process, from the current folder."""
    from ksemstamp.cli import main
    from ksemstamp.cli.train import cli_main

    words = shlex.split(command)
    if words[:2] == ["python", "train.py"]:
        args = [str(ROOT / a) if a.startswith("configs/") else a for a in words[2:]]
        with mock.patch.object(sys, "argv", [sys.argv[0]]):
            cli_main([*args, *extra])
    else:
        assert words[0] == "ksemstamp"
        assert main([*words[1:], *extra]) == 0, command


def test_the_walkthrough_is_the_one_in_the_docs():
    docs = " ".join((ROOT / "docs/training.md").read_text().split())
    for command, _ in WALKTHROUGH:
        assert command in docs, command


@pytest.mark.slow
@pytest.mark.e2e
def test_your_own_domain_from_pairs_to_detection(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command, extra in WALKTHROUGH:
        run(command, extra)
    # The centroids came from the speeches, and the checkpoint holds what the mark needs.
    from ksemstamp.scheme.checkpoint import checkpoint_centroids

    fitted = checkpoint_centroids("checkpoints/domain/final.ckpt")
    fitted.require("direction", "final.ckpt")
    assert fitted.num_regions == 64 and fitted.settings["num_sentences"] == 320
    assert fitted.settings["source"].startswith("data/domain.txt, fit split")
    generations = [
        json.loads(x) for x in Path("data/domain-generations.jsonl").read_text().splitlines()
    ]
    detections = [
        json.loads(x) for x in Path("data/domain-detections.jsonl").read_text().splitlines()
    ]
    assert len(generations) == len(detections) == 2
    assert all(g["status"] == "ok" and g["num_sentences"] >= 3 for g in generations)
    for d in detections:
        assert d["status"] == "ok" and d["p_value"] <= 0.01, d
