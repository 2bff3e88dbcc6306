"""Check the whole path on this machine's GPUs: train on one, generate and detect on all.

    ksemstamp gpucheck                 # every visible GPU
    ksemstamp gpucheck --devices 2     # the first two
    ksemstamp gpucheck --cpu           # the same logic on 2 CPU processes (gloo)

In a scratch folder (``--workdir``, default a temporary one) it takes a small corpus (the
bundled House of Commons speeches, or ``--corpus``), builds WordNet paraphrase pairs from it,
trains the encoder for a few steps on one device and fits K = 64 centroids on the corpus
(``train.py``'s CLI in this process), then runs ``ksemstamp generate`` and ``detect`` from the
checkpoint on all devices with ``--parallel.strategy ddp`` (as a user would, in subprocesses).
Last, in this process on the first device, the web page's detector (``serve``'s app, without a
server) scores the generated texts and human windows of the corpus, and the evaluation's
metrics (AUROC, TPR at 1% FPR) are computed on the device from those scores.

It fails loudly, exit status 1 and a line starting with ``FAILED``, when a step fails, when
training did not run on the accelerator (read while it trains: Lightning moves the model back
to the CPU when ``fit`` returns), when a generating or detecting process reports its models on
any device but its own (each process checks this itself, and this command checks that every
device was used once), when the web page's detector disagrees with ``detect``, or when the
watermark is not found in most generated texts.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated
from unittest import mock

from ..settings.checks import Range
from .console import print_err

LINE = re.compile(r"rank (\d+)/(\d+): models on (\S+): ([^\r\n]*)")
"""``parallel.DEVICE_LINE`` as printed by each process, wherever it starts: the processes share
one stderr, and a progress bar another one closes (a carriage return, no newline) can stand
before it on the same line."""


class CheckFailed(RuntimeError):
    """The path does not work on this machine: the message says where."""


def expected_devices(cpu: bool, devices: int | None) -> list[str]:
    """The device each process should report: ``cuda:0`` .. ``cuda:N-1``, or ``cpu`` twice."""
    if cpu:
        return ["cpu"] * (devices or 2)
    import torch

    if not torch.cuda.is_available():
        raise CheckFailed(
            "no CUDA GPU is visible to torch (a CPU-only torch, or no driver); "
            "`--cpu` checks the same logic on this CPU"
        )
    count = devices or torch.cuda.device_count()
    if count > torch.cuda.device_count():
        raise CheckFailed(f"--devices {count}, but torch sees {torch.cuda.device_count()} GPUs")
    return [f"cuda:{i}" for i in range(count)]


def check_ranks(stderr: str, expected: list[str], step: str) -> list[str]:
    """The per-process lines of a step's ``stderr``, checked: one per rank, each on its own
    expected device. Returns them."""
    found = {int(m[1]): (int(m[2]), m[3], m[4]) for m in LINE.finditer(stderr)}
    if sorted(found) != list(range(len(expected))):
        raise CheckFailed(
            f"{step}: expected one process per device ({len(expected)}), saw ranks {sorted(found)}"
        )
    for rank, (world, device, _) in found.items():
        if world != len(expected) or device != expected[rank]:
            raise CheckFailed(
                f"{step}: rank {rank} of {world} has its models on {device}, expected "
                f"{expected[rank]} of {len(expected)}"
            )
    return [f"rank {r}/{found[r][0]}: {found[r][1]}: {found[r][2]}" for r in sorted(found)]


def _run(argv: list[str], step: str, env: dict[str, str]) -> str:
    """Run ``python -m ksemstamp ...``; its stderr, or ``CheckFailed`` with its last lines."""
    return _process(argv, step, env).stderr


def _process(argv: list[str], step: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``python -m ksemstamp ...``; the finished process, or ``CheckFailed``."""
    proc = subprocess.run(
        [sys.executable, "-m", "ksemstamp", *argv], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise CheckFailed(f"{step} exited with status {proc.returncode}:\n{tail}")
    return proc


PROBE = "ksemstamp.training.callbacks.DeviceProbe"
"""The callback that reads where training runs, during training (``train``)."""


def train(work: Path, corpus: Path, accelerator: str, steps: int) -> tuple[Path, str]:
    """Pairs from the corpus and a short fit on one device; the final checkpoint and the
    device training ran on, read while it ran (``training.callbacks.DeviceProbe``)."""
    from ..training.callbacks import DeviceProbe
    from ..training.pairs import build_pairs
    from .train import cli_main

    pairs = work / "pairs.jsonl"
    build_pairs(pairs, num=8 * steps, corpus=str(corpus), progress=False)
    args = [
        "fit",
        f"--data.train_file={pairs}",
        "--data.val_file=null",
        "--data.batch_size=8",
        f"--trainer.max_steps={steps}",
        f"--trainer.accelerator={accelerator}",
        "--trainer.devices=1",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={work}",
        "--model.val_kmeans_sentences=0",
        f"--kmeans.corpus={corpus}",
        "--kmeans.split=all",
        "--kmeans.num_sentences=640",
        f"--kmeans.export_dir={work / 'encoder'}",
        f"--kmeans.centroid_file={work / 'centroids.pt'}",
        f"--checkpoint.dirpath={work / 'run'}",
        f"--trainer.callbacks+={PROBE}",
    ]
    with mock.patch.object(sys, "argv", [sys.argv[0]]):  # our flags are not the CLI's
        cli = cli_main(args)
    probe = next(c for c in cli.trainer.callbacks if isinstance(c, DeviceProbe))
    if probe.trainer_device is None:
        raise CheckFailed("train: no training step ran")
    if probe.model_device != probe.trainer_device:
        raise CheckFailed(
            f"train: the model sat on {probe.model_device} while it trained, "
            f"the trainer on {probe.trainer_device}"
        )
    return work / "run" / "final.ckpt", probe.trainer_device


def run_check(
    work: Path,
    cpu: bool = False,
    devices: int | None = None,
    steps: int = 4,
    prompts: int = 4,
    corpus: Path | None = None,
    max_new_tokens: int = 96,
) -> list[str]:
    """Every step of the check; returns the report lines (raises ``CheckFailed``)."""
    from ..io import write_jsonl_atomic, write_text_atomic
    from ..jsonl import read_jsonl_objects
    from ..keys import KEY_ENV, new_key
    from ..text.corpusfile import corpus_prompts, export_source

    expected = expected_devices(cpu, devices)
    accelerator = "cpu" if cpu else "gpu"
    work.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        corpus = work / "corpus.txt"
        write_text_atomic(corpus, "".join(d + "\n" for d in export_source("parliament")))
    checkpoint, trained_on = train(work, corpus, accelerator, steps)
    if not trained_on.startswith("cpu" if cpu else "cuda"):
        raise CheckFailed(f"train: ran on {trained_on}, not on the {accelerator}")
    report = [f"train: {steps} steps and K = 64 centroids on {trained_on} -> {checkpoint}"]

    rows = corpus_prompts(corpus, prompts * len(expected), split="all")
    write_jsonl_atomic(work / "prompts.jsonl", rows)
    # The user's key if set; else a fresh strong one (the check marks and detects its own texts).
    env = {**os.environ, KEY_ENV: os.environ.get(KEY_ENV) or new_key()}
    flags = [
        f"--model.checkpoint={checkpoint}",
        f"--parallel.accelerator={accelerator}",
        f"--parallel.devices={len(expected)}",
        "--parallel.strategy=ddp",
        "--quiet",
    ]
    for step, source, target in (
        ("generate", "prompts.jsonl", "generations.jsonl"),
        ("detect", "generations.jsonl", "detections.jsonl"),
    ):
        # Seeded, so that a failure reproduces under the same key.
        more = (
            [f"--sampling.max_new_tokens={max_new_tokens}", "--sampling.seed=0"]
            if step == "generate"
            else []
        )
        stderr = _run(
            [step, "--input", str(work / source), "--output", str(work / target), *flags, *more],
            step,
            env,
        )
        report += [f"{step}: {line}" for line in check_ranks(stderr, expected, step)]
        records = read_jsonl_objects(work / target)
        bad = [r for r in records if r.get("status") not in ("ok", "too_short")]
        if len(records) != len(rows) or bad:
            raise CheckFailed(f"{step}: {len(records)} records of {len(rows)}, {len(bad)} failed")
    detected = sum(bool(r.get("watermarked")) for r in records)
    report.append(f"detect: {detected} of {len(records)} generated texts watermarked at p <= 0.01")
    if detected * 2 < len(records):
        raise CheckFailed(f"detect: the mark was found in only {detected} of {len(records)} texts")
    generated = read_jsonl_objects(work / "generations.jsonl")
    human = human_windows(corpus, 4 * len(generated))
    report += web_and_metrics(checkpoint, env[KEY_ENV], expected[0], generated, records, human)
    if importlib.util.find_spec("vllm") is not None:  # the served engine, where vLLM is installed
        report += vllm_step(work, checkpoint, env, expected[0], rows[0]["prompt"], max_new_tokens)
    return report


def vllm_step(
    work: Path, checkpoint: Path, env: dict[str, str], device: str, prompt: str, tokens: int
) -> list[str]:
    """One text generated through ``sampling.engine vllm`` on ``device`` and detected there."""
    text = work / "vllm.txt"
    flags = [f"--model.checkpoint={checkpoint}", f"--model.device={device}"]
    more = [f"--sampling.max_new_tokens={tokens}", "--sampling.seed=0", "--quiet"]
    argv = ["generate", "--prompt", prompt, "--sampling.engine=vllm", *flags, *more]
    text.write_text(_process(argv, "generate through vLLM", env).stdout)
    argv = ["detect", "--file", str(text), "--prompt", prompt, *flags]
    shown = _process(argv, "detect the vLLM text", env).stdout
    if "WATERMARKED" not in shown:
        raise CheckFailed(
            f"vllm: the text generated through vLLM was not found watermarked:\n{shown}"
        )
    return [f"vllm: a text generated through vLLM on {device} was detected as watermarked"]


def human_windows(corpus: Path, count: int, words: int = 120) -> list[str]:
    """``count`` human texts of the corpus, the first ``words`` words of its last documents
    (the prompts come from its first ones)."""
    from ..text.corpusfile import read_documents

    documents = [d for d in read_documents(corpus) if len(d.split()) >= words // 2]
    return [" ".join(d.split()[:words]) for d in documents[-count:]]


def web_and_metrics(
    checkpoint: Path,
    key: str,
    device: str,
    generated: list[dict],
    detected: list[dict],
    human: list[str],
) -> list[str]:
    """The web page's detector on ``device`` (the ``serve`` app's, without a server): its
    verdicts on the generated texts must be ``detect``'s; then the evaluation's metrics,
    computed on the device, from its z-scores of the generated texts against ``human`` ones."""
    from ..evaluation.metrics import auroc, roc_curve, tpr_at_fpr
    from ..serve import create_app
    from ..settings.watermark import WatermarkSettings

    settings = WatermarkSettings.from_dict(
        {"key": key, "model": {"checkpoint": str(checkpoint), "device": device}}
    )
    state = create_app(settings, generation=False).state.serve
    found = [state.detector.detect(g["text"], g["prompt"]) for g in generated]
    for result, record, g in zip(found, detected, generated, strict=True):
        view = state.view(result, g["text"], 0.0)
        if view["status"] != record["status"] or not _close(result.p_value, record["p_value"]):
            raise CheckFailed(
                f"web: the page's detector gave p = {result.p_value} where detect gave "
                f"{record['p_value']}"
            )
    model_device = str(state.scheme.device)
    if model_device != device:
        raise CheckFailed(f"web: the page's models sit on {model_device}, expected {device}")
    negatives = [r.z_score for r in state.detector.detect_batch(human) if r.z_score is not None]
    positives = [r.z_score for r in found if r.z_score is not None]
    scores, labels = positives + negatives, [1] * len(positives) + [0] * len(negatives)
    area = auroc(scores, labels, device=device)
    fpr, tpr, _ = roc_curve(scores, labels, device=device)
    return [
        f"web: the page's detector on {device} agrees with detect on {len(found)} texts",
        f"metrics on {device}: AUROC {area:.3f}, TPR at 1% FPR {tpr_at_fpr(fpr, tpr, 0.01):.3f} "
        f"({len(positives)} generated texts against {len(negatives)} human ones)",
    ]


def _close(a: float | None, b: float | None) -> bool:
    """Equal p-values to a ten-thousandth of their size, or both missing. One process's and
    another's float32 arithmetic may differ in the last bits of a projection, and a normal
    tail magnifies a z's relative error by about z squared (z = 3.6: a relative 3e-6 seen)."""
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= 1e-4 * max(abs(b), 1e-300)


def gpucheck(
    devices: Annotated[int, Range(1, 4096)] | None = None,
    cpu: bool = False,
    workdir: str | None = None,
    corpus: str | None = None,
    steps: Annotated[int, Range(1, 100_000)] = 4,
    prompts: Annotated[int, Range(1, 10_000)] = 4,
    max_new_tokens: Annotated[int, Range(1, 100_000)] = 96,
) -> int:
    """Train, generate and detect on this machine's GPUs, and check each ran where it should.

    Args:
        devices: GPUs to use (default: every visible one).
        cpu: check the same logic on 2 CPU processes instead.
        workdir: scratch folder (default: a temporary one, removed).
        corpus: a corpus file instead of the bundled speeches.
        steps: training steps.
        prompts: prompts per device.
        max_new_tokens: tokens per generated text.
    """
    with tempfile.TemporaryDirectory(prefix="ksemstamp-gpucheck-") as scratch:
        work = Path(workdir or scratch)
        try:
            report = run_check(
                work,
                cpu=cpu,
                devices=devices,
                steps=steps,
                prompts=prompts,
                corpus=Path(corpus) if corpus else None,
                max_new_tokens=max_new_tokens,
            )
        except CheckFailed as err:
            print_err(f"FAILED: {err}")
            return 1
    print("\n".join(report))
    print("ok: training, generation and detection ran on the expected devices")
    return 0
