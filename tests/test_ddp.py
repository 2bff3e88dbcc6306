"""The launch GPU users take, on 2 CPU processes: the ``ddp`` strategy, which starts the other
processes by running the same command again (``ddp_spawn`` is tested in test_training_fit.py and
test_parallel.py). Each command runs as a user types it, in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_parallel import PROMPTS, _same_records
from test_training_fit import check_artefacts, make_config

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
DDP = ["--parallel.accelerator", "cpu", "--parallel.devices", "2", "--parallel.strategy", "ddp"]
# One thread a process: two processes share the two cores.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=1800,
    )


def test_train_fit_with_the_ddp_strategy(tmp_path):
    config = make_config(tmp_path)
    fit = _run(
        "train.py",
        "fit",
        "--config",
        str(ROOT / "configs/train/news.yaml"),
        "--config",
        str(config),
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-4000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in fit.stderr
    check_artefacts(tmp_path)


def test_generate_input_with_the_ddp_strategy_writes_what_one_process_writes(tmp_path):
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    fast = [
        "--sampling.max_new_tokens",
        "24",
        "--search.max_candidates",
        "4",
        "--sampling.seed",
        "0",
        "--quiet",
    ]
    generate = ["generate", "--input", str(src), *fast]
    assert _run("watermark.py", *generate, "--output", str(one), cwd=tmp_path).returncode == 0
    run = _run("watermark.py", *generate, "--output", str(two), *DDP, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "rank 0/2: models on cpu:" in run.stderr and "rank 1/2: models on cpu:" in run.stderr
    generated = [json.loads(x) for x in two.read_text().splitlines()]
    assert [r["id"] for r in generated] == [p["id"] for p in PROMPTS]
    _same_records(generated, [json.loads(x) for x in one.read_text().splitlines()])
    assert not list(tmp_path.glob("*.shard*"))
    # only the first process reports the run
    assert run.stderr.count("generate: 4 ok, 0 failed") == 1
    # A document's text depends on its seed, key, settings and prompt, not on the prompts
    # generated beside it: one prompt a batch writes what four did.
    alone = tmp_path / "alone.jsonl"
    single = [*generate, "--output", str(alone), "--search.prompt_batch", "1"]
    assert _run("watermark.py", *single, cwd=tmp_path).returncode == 0
    _same_records([json.loads(x) for x in alone.read_text().splitlines()], generated)
