"""Command handlers of ``python watermark.py {generate,detect,demo,calibrate,serve,evaluate,
keygen}``.

Each handler takes the subcommand's values (``args``) and its settings, built by
``ksemstamp.cli_args`` from the settings dataclasses: defaults, then ``--config`` YAML files
(later ones win), then flags (``--gamma 0.25``, ``--no-adaptive-batch``, ...).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .assets import AssetError
from .cli_args import parse
from .config import WatermarkConfig, build_detector, build_scheme, build_watermarker
from .parallel import Job
from .records import ERROR_FIELDS, RecordProcessor, key_problem, process_jsonl, text_problem
from .text.corpora import news_prompt
from .text.textcheck import printable

# ---------------------------------------------------------------------- generate


@dataclass
class RecordJob:
    """Builds a command's ``RecordProcessor`` in a process of its own, on that process's
    device (picklable: settings, not models, cross to ``ddp_spawn`` processes)."""

    command: str
    settings: dict[str, Any]
    """``WatermarkConfig`` fields, the key included (it stays in memory)."""
    option: bool = False
    """``generate``: ``--no-watermark``; ``detect``: progress bars."""

    def __call__(self, device) -> Job:
        cfg = WatermarkConfig.from_dict({**self.settings, "device": str(device)})
        processor = PROCESSORS[self.command](cfg, self.option)
        return Job(processor.rows, processor.models)


def _generate_processor(cfg: WatermarkConfig, no_watermark: bool = False) -> RecordProcessor:
    watermarker = build_watermarker(cfg)
    fingerprint = None if no_watermark else watermarker.scheme.key_fingerprint

    def check(data: dict) -> str | None:
        prompt = data.get("prompt")
        if prompt is None:
            return "missing field 'prompt'"
        if not isinstance(prompt, str):
            return f"'prompt' must be a string, got {type(prompt).__name__}"
        return None

    def process(datas: list[dict]) -> list[dict]:
        results = watermarker.generate([d["prompt"] for d in datas], watermark=not no_watermark)
        return [{**res.to_record(), "key_fingerprint": fingerprint} for res in results]

    models = _models(watermarker.scheme, watermarker)
    return RecordProcessor(check, process, ERROR_FIELDS["generate"], models)


def _models(scheme, watermarker=None) -> dict[str, Any]:
    """The models a scheme (and a watermarker's LM) sit on, for device checks."""
    models = {"encoder": scheme.encoder, "partition": scheme.partition}
    model = getattr(getattr(watermarker, "sampler", None), "model", None)
    return models | ({"lm": model} if model is not None else {})


def cmd_generate(args, cfg: WatermarkConfig) -> int:
    if args.input:
        return _process_jsonl(
            args,
            cfg,
            name="generate",
            unit="prompt",
            batch_size=cfg.prompt_batch,
            option=args.no_watermark,
        )
    _single_process(args, "generate")
    if args.prompt is None:
        raise SystemExit("generate: give --prompt TEXT or --input FILE.jsonl")
    watermarker = build_watermarker(cfg)
    res = watermarker.generate(
        [args.prompt], watermark=not args.no_watermark, progress=not args.quiet
    )[0]
    if res.status != "ok":
        print(f"error: {res.error}", file=sys.stderr)
        return 1
    print(printable(res.text))  # a text's control characters never act on the terminal
    notes = []
    if res.prompt_dropped_chars:
        notes.append(f"the LM saw the prompt without its first {res.prompt_dropped_chars:,} chars")
    if res.completion is not None:
        notes.append(f"completion (not watermarked): {res.completion!r}")
    if res.seed is not None:
        notes.append(f"seed {res.seed} (--seed {res.seed} gives this text again)")
    print(
        f"\n[{res.num_sentences} sentences, {res.num_tokens} tokens, {res.candidates} candidates, "
        f"{res.fallbacks} fallbacks, {res.seconds:.1f} s" + "".join(f"; {n}" for n in notes) + "]",
        file=sys.stderr,
    )
    return 0


# ---------------------------------------------------------------------- detect


def format_detection(result) -> str:
    """A readable report of one ``DetectionResult``."""
    lines = []
    if result.seed is not None:
        short = printable(result.seed if len(result.seed) <= 70 else result.seed[:67] + "...")
        pad = "" if result.scores is None else "        "
        lines.append(f"  {'':>3}  region {result.seed_region:>2}  {pad}{'seed':<8} {short}")
    scores = result.scores or [None] * len(result.sentences)
    for i, (sentence, region, verdict, score) in enumerate(
        zip(result.sentences, result.regions, result.verdicts, scores, strict=True), start=1
    ):
        short = printable(sentence if len(sentence) <= 70 else sentence[:67] + "...")
        shown = (
            "" if result.scores is None else ("        " if score is None else f"{score:+7.2f} ")
        )
        lines.append(f"  {i:>3}  region {region:>2}  {shown}{verdict:<8} {short}")
    if result.status != "ok":
        lines.append(f"status: {result.status} ({result.error})")
        return "\n".join(lines)
    verdict = "WATERMARKED" if result.watermarked else "not watermarked"
    # The region mark's z is the paper's; the direction mark's is its exact statistic.
    kind = "exact" if result.scores is not None else "paper"
    counted = "positive" if result.scores is not None else "valid"
    if result.span is not None and result.span_p_value is not None:
        lines.append(
            f"most marked span: sentences {result.span[0] + 1}-{result.span[1]}, "
            f"z = {result.span_z:.2f}, p = {result.span_p_value:.3g}; scattered marked "
            f"sentences p = {result.mixture_p_value:.3g}; whole text p = "
            f"{result.text_p_value:.3g}; p below combines the three"
        )
    if result.normalized:
        changed = ", ".join(
            f"{n} {kind.replace('_', '-')}" for kind, n in sorted(result.normalized.items())
        )
        lines.append(f"normalised before scoring (characters): {changed}")
    lines.append(
        f"scored {result.num_scored}, {counted} {result.num_valid}  |  z = {result.z_score:.2f} "
        f"({kind})  p = {result.p_value:.3g} ({result.statistic})  ->  {verdict}"
    )
    return "\n".join(lines)


def _detect_processor(cfg: WatermarkConfig, progress: bool = False) -> RecordProcessor:
    detector = build_detector(cfg)
    fingerprint = detector.scheme.key_fingerprint

    def check(data: dict) -> str | None:
        return text_problem(data) or key_problem(data, fingerprint)

    def process(datas: list[dict]) -> list[dict]:
        # A chat answer (a record `generate --chat` wrote, or every record under --chat) is
        # not seeded by its instruction.
        prompts = [None if cfg.chat or d.get("chat") is True else d.get("prompt") for d in datas]
        results = detector.detect_batch([d["text"] for d in datas], prompts, progress=progress)
        return [res.to_record() for res in results]

    return RecordProcessor(check, process, ERROR_FIELDS["detect"], _models(detector.scheme))


PROCESSORS: dict[str, Callable[[WatermarkConfig, bool], RecordProcessor]] = {
    "generate": _generate_processor,
    "detect": _detect_processor,
}


def _process_jsonl(args, cfg: WatermarkConfig, **command) -> int:
    """``records.process_jsonl`` with this module's processors (``PROCESSORS``, looked up at
    run time) and ``RecordJob``."""
    return process_jsonl(args, cfg, processors=PROCESSORS, job=RecordJob, **command)


def _single_process(args, name: str) -> None:
    """Refuse device settings for one prompt or text: they spread ``--input`` files."""
    if args.parallel.requested():
        raise SystemExit(
            f"{name}: --accelerator, --devices and --strategy spread an --input file over "
            "devices; for one prompt or text choose the device with --device (cpu, cuda, ...)"
        )


def cmd_detect(args, cfg: WatermarkConfig) -> int:
    if args.input:
        option = not args.quiet and not args.parallel.requested()
        return _process_jsonl(
            args, cfg, name="detect", unit="text", batch_size=args.batch_size, option=option
        )
    _single_process(args, "detect")
    if args.text is not None:
        text = args.text
    elif args.file:
        # At most the limit and one character more: enough to know the file is over it,
        # whatever its size (a 400 MB file, /dev/zero).
        with open(args.file, encoding="utf-8-sig", errors="replace") as handle:
            text = handle.read(cfg.max_text_chars + 1)
        if len(text) > cfg.max_text_chars:
            print(
                f"error: {args.file} has more than {cfg.max_text_chars:,} characters; the limit "
                f"is {cfg.max_text_chars:,} (max_text_chars)",
                file=sys.stderr,
            )
            return 1
    else:
        raise SystemExit("detect: give --text TEXT, --file FILE or --input FILE.jsonl")
    prompt = args.prompt
    if cfg.chat and prompt is not None:
        print("chat: the prompt is an instruction and seeds no sentence; ignored", file=sys.stderr)
        prompt = None
    result = build_detector(cfg).detect(text, prompt, progress=not args.quiet)
    print(format_detection(result))
    return 0 if result.status != "error" else 1


# ---------------------------------------------------------------------- demo


def cmd_demo(args, cfg: WatermarkConfig) -> int:
    from .keys import DEMO_KEY, KEY_ENV

    prompt = news_prompt(args.article, args.prompt_words)
    if cfg.valid_mode == "keyed" and not cfg.key and not os.environ.get(KEY_ENV):
        # The demo's own key, said as part of the demo rather than as a warning.
        cfg = dataclasses.replace(cfg, key=DEMO_KEY)
        print(
            "key: the public demo key, so anyone can forge or strip this mark; for real use\n"
            f'  export {KEY_ENV}="$(python watermark.py keygen)"\n'
        )
    scheme = build_scheme(cfg)
    watermarker = build_watermarker(cfg, scheme)
    detector = build_detector(cfg, scheme)
    print(f"prompt (held-out news article {args.article}):\n  {printable(prompt)}\n")
    res = watermarker.generate([prompt], progress=not args.quiet)[0]
    if res.status != "ok":
        print(f"error: {res.error}", file=sys.stderr)
        return 1
    print(
        f"watermarked continuation ({res.num_tokens} tokens, {res.seconds:.1f} s):\n"
        f"  {printable(res.text)}\n"
    )
    per = res.candidates / max(res.num_sentences, 1)
    print(
        f"generation: {res.num_sentences} sentences, {res.candidates} candidates "
        f"({per:.1f} per sentence), {res.fallbacks} fallbacks\n"
    )
    start = time.perf_counter()
    result = detector.detect(res.text, prompt)
    print(f"detection ({time.perf_counter() - start:.2f} s):")
    print(format_detection(result))
    return 0


# ---------------------------------------------------------------------- calibrate


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as a shell command, with the value of any ``--key`` flag hidden."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append("***")
            hide_next = False
        elif arg == "--key":
            shown.append(arg)
            hide_next = True
        elif arg.startswith("--key="):
            shown.append("--key=***")
        else:
            shown.append(arg)
    return "python watermark.py " + shlex.join(shown)


def cmd_calibrate(args, cfg: WatermarkConfig) -> int:
    from .calibration import run_calibration, write_outputs
    from .keys import DEMO_KEY, key_fingerprint

    settings = args.calibration
    scheme = build_scheme(cfg)
    shown = ("mark", "encoder", "partition", "centroids", "gamma", "valid_mode")
    describe = {
        "command": command_line(args.argv),
        "settings": {k: v for k, v in cfg.to_dict().items() if k in shown},
    }
    if cfg.checkpoint:
        describe["settings"]["checkpoint"] = cfg.checkpoint
    elif cfg.partition == "kmeans":
        path = cfg.centroid_path().resolve()
        root = Path(__file__).resolve().parents[2]
        describe["settings"]["centroids"] = str(
            path.relative_to(root) if path.is_relative_to(root) else path
        )
    if scheme.key_fingerprint == key_fingerprint(DEMO_KEY):
        describe["key"] = "the public demo key (KSEMSTAMP_KEY unset)"
    result = run_calibration(scheme, settings, describe, progress=not args.quiet, scan=cfg.scan)
    paths = write_outputs(result, args.output_dir)
    overall = result["null"]["overall"]
    for stat in result["calibration"]["statistics"]:
        f = overall[stat]["fpr"]["0.01"]
        print(
            f"{stat}: FPR at nominal 1% = {100 * f['mean']:.2f}% (sd over keys "
            f"{100 * f['sd']:.2f}%) on {overall['texts']} human texts x {settings.num_keys} keys",
            file=sys.stderr,
        )
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


def cmd_serve(args, cfg: WatermarkConfig) -> int:
    from .serve import Limits, serve

    limits = Limits(max_chars=args.max_chars or cfg.max_text_chars)
    serve(cfg, args.host, args.port, limits, not args.no_generate)
    return 0


def cmd_keygen(args, _settings: None) -> int:
    """Print a new random key: ``export KSEMSTAMP_KEY="$(python watermark.py keygen)"``."""
    from .keys import new_key

    print(new_key())
    return 0


def cmd_evaluate(args, settings) -> int:
    """``settings`` is an ``EvalSettings``; ``--quiet`` and ``--only-attacks`` narrow it."""
    from .evaluation.run import main_from_settings

    if args.quiet:
        settings = dataclasses.replace(settings, progress=False)
    if args.only_attacks:
        settings = settings.select_attacks(args.only_attacks)
    return main_from_settings(settings)


def quiet_model_loading() -> None:
    """No progress bars while models load (transformers' and the Hugging Face Hub's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


RESUMABLE = ("evaluate",)
"""Commands without ``--input`` whose rerun resumes (their stages are kept as they finish)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``watermark.py``; returns the exit status (bad settings exit with 2, Ctrl-C 130)."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt as stop:
        # Ctrl-C: one line saying what was kept, not a traceback. Under the `ddp` strategy
        # every process gets it; the first one speaks for all.
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
            command = next((a for a in (argv or sys.argv[1:]) if a in RESUMABLE), None)
            detail = str(stop) or (
                "rerun the same command to resume" if command else "nothing was written"
            )
            print(f"interrupted: {detail}", file=sys.stderr)
        return 130


def _main(argv: Sequence[str]) -> int:
    invocation = parse(argv)
    if invocation.args.print_config:
        print(invocation.printed_config(), end="")
        return 0
    if invocation.args.quiet and invocation.command != "keygen":
        quiet_model_loading()
    handler = {
        "generate": cmd_generate,
        "detect": cmd_detect,
        "demo": cmd_demo,
        "calibrate": cmd_calibrate,
        "evaluate": cmd_evaluate,
        "serve": cmd_serve,
        "keygen": cmd_keygen,
    }[invocation.command]
    try:
        return handler(invocation.args, invocation.settings)
    except (ValueError, FileNotFoundError, AssetError) as err:
        # Settings that only fail once objects are built (gamma * K, centroid files, encoders):
        # one line naming the problem, not a traceback. Messages never hold the key.
        print("error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    except OSError as err:
        # An output that is read-only, a folder, or on a full disk: what and where, one line.
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
