"""A generation alone and beside another CPU job, with OpenMP's threads spinning or sleeping
while they wait for work.

    python -m benchmarks threads                       # on an otherwise idle machine

prints the table and writes ``results/threads.json`` and ``threads.md``. Each cell is one
child process that loads the default watermarker, generates one warm-up text, then times
``threads.prompts`` held-out news prompts of ``threads.max_new_tokens`` tokens (seed 0). The
other job is a second child that multiplies float32 matrices on every core with torch's
defaults until it is stopped, as any other torch job on a shared machine does. ``default``
is OpenMP's own wait policy (threads spin a while before they sleep: what ``ksemstamp`` keeps
on an idle machine), ``passive`` what importing ``ksemstamp`` sets when the load average shows
another job (threads sleep at once); ``1 thread`` is ``--model.threads 1``. The policy
decides how threads wait, not what they compute: the cells of one thread count must write the
same texts (``same texts``; one thread sums floats in another order, and its texts may
differ).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from .harness import DEFAULT_CONFIG, REPO, RunSettings, at_least, fmt, refuse, section_report

WORKER = """
import json, sys, time
policy, threads, config, prompts, tokens = sys.argv[1:6]
if policy == "default":
    import torch  # OpenMP reads its wait policy when torch loads: before ksemstamp sets one
from ksemstamp import build_watermarker
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts
layer = {"key": "benchmark-threads-key", "allow_weak_key": True,
         "sampling": {"seed": 0, "max_new_tokens": int(tokens)}}
if threads != "auto":
    layer["model"] = {"threads": int(threads)}
watermarker = build_watermarker(load_watermark_settings([config], layer))
texts = news_prompts(int(prompts) + 1, 32)
watermarker.generate(texts[:1])
start = time.perf_counter()
results = watermarker.generate(texts[1:])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "tokens": sum(r.num_tokens for r in results),
                  "texts": [r.text for r in results]}))
"""

OTHER_JOB = """
import torch
a = torch.randn(512, 512)
while True:
    a = torch.tanh(a @ a)
"""

CELLS = (
    # (name, wait policy, threads, beside the other job)
    ("alone, default", "default", "auto", False),
    ("alone, passive", "passive", "auto", False),
    ("beside, default", "default", "auto", True),
    ("beside, passive", "passive", "auto", True),
    ("beside, passive, 1 thread", "passive", "1", True),
)


@dataclass(frozen=True)
class ThreadsSettings:
    """A generation alone and beside another CPU job, by OpenMP wait policy."""

    prompts: int = 2
    """Held-out news prompts timed in each cell (after one warm-up prompt)."""
    max_new_tokens: int = 40
    """Tokens of each text."""
    config: str = str(DEFAULT_CONFIG)
    """The configuration whose watermarker generates."""

    def __post_init__(self) -> None:
        refuse(self, at_least(self, 1, "prompts", "max_new_tokens"))


def threads(threads: ThreadsSettings | None = None, run: RunSettings | None = None) -> int:
    """Threads: a generation alone and beside another CPU job, by OpenMP wait policy."""
    threads = threads or ThreadsSettings()
    return section_report(
        "threads",
        "Threads benchmark",
        run or RunSettings(),
        {"threads": threads},
        lambda: bench_threads(threads),
        threads_targets,
        threads_markdown,
    )


def _cell(settings: ThreadsSettings, policy: str, count: str, beside: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    other = None
    if beside:
        other_env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
        other = subprocess.Popen([sys.executable, "-c", OTHER_JOB], env=other_env)
        time.sleep(2.0)  # running before the cell starts
    try:
        argv = [sys.executable, "-c", WORKER, policy, count, settings.config]
        argv += [str(settings.prompts), str(settings.max_new_tokens)]
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    if done.returncode != 0:
        raise RuntimeError(f"the {policy} cell failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_threads(settings: ThreadsSettings) -> dict[str, Any]:
    """Seconds per output token of every cell, and its ratio to the default alone."""
    rows = []
    for name, policy, count, beside in CELLS:
        got = _cell(settings, policy, count, beside)
        rows.append(
            {
                "cell": name,
                "policy": policy,
                "threads": count,
                "beside_other_job": beside,
                "seconds": got["seconds"],
                "tokens": got["tokens"],
                "seconds_per_token": got["seconds"] / max(got["tokens"], 1),
                "texts": got["texts"],
            }
        )
    base = rows[0]["seconds_per_token"]
    for row in rows:
        row["vs_default_alone"] = row["seconds_per_token"] / base
        row["same_texts"] = row["texts"] == rows[0]["texts"]
    return {"rows": rows, "cores": len(os.sched_getaffinity(0))}


def _row(section: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in section["rows"] if r["cell"] == name)


def threads_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Beside another job, a run with the policy ``ksemstamp`` picks there (passive) stays
    within 3x of the default alone."""
    beside = _row(section, "beside, passive")["vs_default_alone"]
    return [
        {"target": "beside another job: <= 3x the default alone", "measured": beside,
         "met": beside <= 3.0},
    ]  # fmt: skip


def threads_markdown(section: dict[str, Any]) -> list[str]:
    """The threads table."""
    lines = [
        "## Threads",
        "",
        f"{section['cores']} cores; one child process a cell, its seconds per output token and "
        "their ratio to the default policy alone (one run).",
        "",
        "| cell | wait policy | threads | s / token | vs default alone | same texts |",
        "|---|---|---|---|---|---|",
    ]
    for row in section["rows"]:
        lines.append(
            f"| {row['cell']} | {row['policy']} | {row['threads']} "
            f"| {fmt(row['seconds_per_token'], 3)} | {fmt(row['vs_default_alone'])}x "
            f"| {'yes' if row['same_texts'] else 'no'} |"
        )
    return lines + [""]
