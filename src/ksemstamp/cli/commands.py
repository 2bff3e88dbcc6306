"""The commands that generate and detect, make keys, calibrate, serve and train.

Each is a function whose signature and docstring are its options (``cli.options``): the
watermark settings at the top (``--search.max_candidates 8``, ``--mark.kind region``),
``--config FILE`` (repeatable), ``--print_config``. The registry that names them, with the
commands of the other packages (``evaluate``, the training tools, ``centroids``, ``corpus``),
is ``cli.COMMANDS``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from ..builders import build_detector, build_scheme, build_watermarker, checked_key
from ..detection.detectable import length_note
from ..records import JsonlFiles
from ..settings.calibration import CalibrationSettings
from ..settings.checks import Range
from ..settings.devices import DeviceSettings
from ..settings.groups import PACKAGE_DATA
from ..settings.watermark import WatermarkSettings
from ..text.corpora import news_prompt
from ..text.textcheck import printable
from .console import ARGV, command_line, format_detection, print_err
from .parser import reads_no_generation
from .processors import run_records

SERVED = ("vllm", "openai")
"""Engines that spread their own work over devices (not ``--parallel.*``)."""

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- generate


def generate(
    settings: WatermarkSettings,
    prompt: str | None = None,
    input: str | None = None,
    output: str | None = None,
    watermark: bool = True,
    parallel: DeviceSettings | None = None,
    quiet: bool = False,
    mixed: bool = False,
) -> int:
    """Generate watermarked continuations of one prompt, or of every prompt of a JSONL file.

    Args:
        prompt: one prompt (the text is printed, a summary on stderr).
        input: JSONL with {"id": ..., "prompt": ...} per line.
        output: JSONL output (required with --input; resumable).
        watermark: false: plain sentence-by-sentence sampling with the same settings.
        parallel: the devices an --input file is spread over (Trainer.predict).
        quiet: no progress bars.
        mixed: resume into an --output whose records were made under another key or other
            identity settings (refused otherwise: one file would hold two marks).
    """
    parallel = parallel or DeviceSettings()
    if prompt is not None and input is not None:
        raise ValueError("generate: give --prompt or --input, not both")
    if input:
        if settings.sampling.engine in SERVED and parallel.requested():
            raise ValueError(
                f"generate: --parallel.* starts one process and model per device; with "
                f"sampling.engine {settings.sampling.engine} the engine spreads its own work "
                "(--engine.tensor_parallel_size, or a server's replicas: docs/gpu.md)"
            )
        files = JsonlFiles(input, output, parallel, quiet, mixed)
        batch = settings.search.prompt_batch
        return run_records(files, settings, "generate", "prompt", batch, not watermark)
    _single_process(parallel, output, "generate")
    if prompt is None:
        raise ValueError("generate: give --prompt TEXT or --input FILE.jsonl")
    res = build_watermarker(settings).generate([prompt], watermark=watermark, progress=not quiet)[0]
    if res.status != "ok":
        print_err(f"error: {res.error}")
        return 1
    print(printable(res.text))  # a text's control characters never act on the terminal
    notes = []
    if res.prompt_dropped_chars:
        notes.append(f"the LM saw the prompt without its first {res.prompt_dropped_chars:,} chars")
    if res.completion is not None:
        notes.append(f"completion (not watermarked): {res.completion!r}")
    if res.seed is not None:
        notes.append(f"seed {res.seed} (--sampling.seed {res.seed} gives this text again)")
    print_err(
        f"\n[{res.num_sentences} {settings.unit}s, {res.num_tokens} tokens, "
        f"{res.candidates} candidates, "
        f"{res.fallbacks} fallbacks, {res.seconds:.1f} s" + "".join(f"; {n}" for n in notes) + "]"
    )
    short = length_note(res, settings) if watermark else None
    if short is not None:
        print_err(f"warning: {short['warning']}")
    return 0


# ---------------------------------------------------------------------- detect


def _single_process(parallel: DeviceSettings, output: str | None, name: str) -> None:
    """Refuse what only an ``--input`` file takes, for one prompt or text (whose result is
    printed): device settings, which spread the file, and ``--output``."""
    if output is not None:
        raise ValueError(f"{name}: --output goes with --input (one text's result is printed)")
    if parallel.requested():
        raise ValueError(
            f"{name}: --parallel.* spread an --input file over devices; for one prompt or "
            "text choose the device with --model.device (cpu, cuda, ...)"
        )


@reads_no_generation
def detect(
    settings: WatermarkSettings,
    text: str | None = None,
    file: str | None = None,
    input: str | None = None,
    prompt: str | None = None,
    output: str | None = None,
    batch_size: Annotated[int, Range(1, 4096)] = 64,
    parallel: DeviceSettings | None = None,
    strict: bool = False,
    quiet: bool = False,
) -> int:
    """Detect the watermark in one text, a text file, or every text of a JSONL file.

    Args:
        text: one text.
        file: a plain-text file holding one text.
        input: JSONL with {"text": ..., ["prompt": ...]} per line.
        prompt: with --text or --file: the prompt the text continues.
        output: JSONL output (required with --input; resumable).
        batch_size: texts per encoder pass (--input).
        parallel: the devices an --input file is spread over (Trainer.predict).
        strict: --input: refuse (an error record each) the records made under other identity
            settings than these (another encoder, centroids, mark or unit); without it they
            are scored and say so (identity_mismatch). The same as --detection.strict.
        quiet: no progress bars.
    """
    parallel = parallel or DeviceSettings()
    if strict:
        settings = settings.updated({"detection": {"strict": True}})
    if sum(x is not None for x in (text, file, input)) > 1:
        raise ValueError("detect: give one of --text, --file and --input")
    if input:
        files = JsonlFiles(input, output, parallel, quiet)
        option = not quiet and not parallel.requested()
        return run_records(files, settings, "detect", "text", batch_size, option)
    _single_process(parallel, output, "detect")
    limit = settings.limits.max_text_chars
    if file:
        # At most the limit and one character more: enough to know the file is over it,
        # whatever its size (a 400 MB file, /dev/zero).
        with open(file, encoding="utf-8-sig", errors="replace") as handle:
            text = handle.read(limit + 1)
        if len(text) > limit:
            print_err(
                f"error: {file} has more than {limit:,} characters; the limit is {limit:,} "
                "(limits.max_text_chars)"
            )
            return 1
    elif text is None:
        raise ValueError("detect: give --text TEXT, --file FILE or --input FILE.jsonl")
    if settings.chat and prompt is not None:
        logger.info("chat: the prompt is an instruction and seeds no sentence; ignored")
        prompt = None
    detector = build_detector(settings)
    result = detector.detect(text, prompt, progress=not quiet)
    print(format_detection(result, detector.mark, settings.unit))
    return 0 if result.status != "error" else 1


# ---------------------------------------------------------------------- demo, keygen


def demo(
    settings: WatermarkSettings,
    article: Annotated[int, Range(0, 100_000)] = 0,
    prompt_words: Annotated[int, Range(1, 10_000)] = 32,
    quiet: bool = False,
) -> int:
    """Watermark the opening of a held-out news article, then detect the mark.

    Args:
        article: index of the test-split article.
        prompt_words: prompt length in words, cut back to a sentence end (paper: about 32).
        quiet: no progress bars.
    """
    from ..keys import DEMO_KEY, KEY_ENV

    prompt = news_prompt(article, prompt_words)
    if settings.key is None and os.environ.get(KEY_ENV) is None:
        # The demo's own key, said as part of the demo rather than as a warning.
        settings = dataclasses.replace(settings, key=DEMO_KEY)
        print(
            "key: the public demo key, so anyone can forge or strip this mark; for real use\n"
            f'  export {KEY_ENV}="$(ksemstamp keygen)"   (first: source .venv/bin/activate)\n'
        )
    scheme = build_scheme(settings)
    watermarker = build_watermarker(settings, scheme)
    detector = build_detector(settings, scheme)
    print(f"prompt (held-out news article {article}):\n  {printable(prompt)}\n")
    res = watermarker.generate([prompt], progress=not quiet)[0]
    if res.status != "ok":
        print_err(f"error: {res.error}")
        return 1
    print(
        f"watermarked continuation ({res.num_tokens} tokens, {res.seconds:.1f} s):\n"
        f"  {printable(res.text)}\n"
    )
    per = res.candidates / max(res.num_sentences, 1)
    unit = settings.unit
    print(
        f"generation: {res.num_sentences} {unit}s, {res.candidates} candidates "
        f"({per:.1f} per {unit}), {res.fallbacks} fallbacks\n"
    )
    start = time.perf_counter()
    result = detector.detect(res.text, prompt)
    print(f"detection ({time.perf_counter() - start:.2f} s):")
    print(format_detection(result, detector.mark, unit))
    short = length_note(res, settings)
    if short is not None:
        # Said after the verdict, and in its light: one story, not a forecast it contradicts.
        have = f"{short['scored_units']} scored {unit}{'' if short['scored_units'] == 1 else 's'}"
        outcome = "detected this time, but" if result.watermarked else "not detected:"
        print_err(
            f"note: {outcome} {have} is short ({short['why']}); a longer text "
            "(--sampling.max_new_tokens) gives more"
        )
    return 0


def keygen() -> int:
    """Print a new random key (256 bits): export KSEMSTAMP_KEY="$(ksemstamp keygen)"."""
    from ..keys import new_key

    print(new_key())
    return 0


# ---------------------------------------------------------------------- calibrate, serve


SERVE_NEEDS = ("fastapi", "starlette", "uvicorn", "multipart", "python_multipart")
"""The modules of the ``serve`` extra (a missing one: ``serve`` says which extra to install)."""


def _shown_path(path: Path) -> str:
    """``path`` as a report shows it: a file shipped in the package by its place in it
    (``ksemstamp/data/...``), one under the working directory relative to it, else whole."""
    path = path.resolve()
    for root, prefix in ((PACKAGE_DATA.parent, "ksemstamp"), (Path.cwd(), "")):
        if path.is_relative_to(root):
            return str(Path(prefix) / path.relative_to(root))
    return str(path)


@reads_no_generation
def calibrate(
    settings: WatermarkSettings,
    calibration: CalibrationSettings | None = None,
    output_dir: str = "calibration",
    quiet: bool = False,
) -> int:
    """Measure false-positive rates on held-out human text over many keys, with power.

    Args:
        calibration: what to measure.
        output_dir: the JSON, report and PNG go here (created; default ``calibration`` under
            the working directory).
        quiet: no progress bars.
    """
    from ..keys import DEMO_KEY, key_fingerprint

    calibration = calibration or CalibrationSettings()
    scheme = build_scheme(settings)  # a weak key is refused before the run's modules load
    from ..calibration import run_calibration, write_outputs

    shown = {"model": {"encoder": settings.model.encoder}, "mark": settings.to_dict()["mark"]}
    shown["partition"] = {"kind": settings.partition.kind}
    if settings.model.checkpoint:
        shown["model"]["checkpoint"] = settings.model.checkpoint
    elif settings.partition.kind == "kmeans":
        shown["partition"]["centroids"] = _shown_path(settings.centroid_path())
    describe = {"command": command_line(ARGV), "settings": shown}
    if scheme.key_fingerprint == key_fingerprint(DEMO_KEY):
        describe["key"] = "the public demo key (KSEMSTAMP_KEY unset)"
    result = run_calibration(
        scheme, calibration, describe, progress=not quiet, scan=settings.detection.scan
    )
    paths = write_outputs(result, output_dir)
    overall = result["null"]["overall"]
    for stat in result["calibration"]["statistics"]:
        f = overall[stat]["fpr"]["0.01"]
        logger.info(
            "%s: FPR at nominal 1%% = %.2f%% (sd over keys %.2f%%) on %d human texts x %d keys",
            stat,
            100 * f["mean"],
            100 * f["sd"],
            overall["texts"],
            calibration.num_keys,
        )
    logger.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return 0


def serve(
    settings: WatermarkSettings,
    host: str = "127.0.0.1",
    port: Annotated[int, Range(0, 65_535)] = 8000,
    max_chars: Annotated[int, Range(1, 100_000_000)] | None = None,
    generation: bool = True,
    quiet: bool = False,
) -> int:
    """A local web page: detect, batch and generate.

    Args:
        host: address to listen on.
        port: port (0: any free port).
        max_chars: longest text (default: limits.max_text_chars).
        generation: false: detection only, no LM loaded.
        quiet: no progress bars while the models load.
    """
    key = checked_key(settings)  # a weak key is refused before the page's modules load
    if key is not None:  # resolved once: the demo key's warning shows once
        settings = dataclasses.replace(settings, key=key)
    try:
        from ..serve import Limits, serve
    except ImportError as err:
        if err.name not in SERVE_NEEDS:
            raise
        raise ValueError(
            f"the web page needs {err.name}: pip install 'ksemstamp[serve]' (make setup "
            "installs it)"
        ) from None

    serve(
        settings,
        host,
        port,
        Limits(max_chars=max_chars or settings.limits.max_text_chars),
        generation,
    )
    return 0


def train(argv: Sequence[str]) -> int:
    """Fine-tune a sentence encoder and fit its centroids (LightningCLI, as train.py):
    ksemstamp train fit --config configs/train/news.yaml."""
    from .train import cli_main

    cli_main(list(argv))
    return 0


train.takes_argv = True  # type: ignore[attr-defined]
