"""Command line: ``python watermark.py {generate,detect,demo,calibrate} ...``.

Settings come from the defaults of ``WatermarkConfig``, then ``--config`` YAML files (later ones
win), then flags (``--gamma 0.25``, ``--no-adaptive-batch``, ...): every setting can be given
either way.

Length (~480 lines): five subcommands, each with its flags, its one-text path and its JSONL path.
The flags are reflected from ``WatermarkConfig`` by hand; building the subcommands from the
settings dataclasses with jsonargparse, as ``train.py`` is built, would shorten this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from .assets import AssetError
from .config import (
    WatermarkConfig,
    build_detector,
    build_scheme,
    build_watermarker,
    load_settings_file,
)
from .corpora import news_prompt
from .io import ResumableWriter, read_jsonl


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (override --config)")
    hints = typing.get_type_hints(WatermarkConfig)
    for field in dataclasses.fields(WatermarkConfig):
        flag = "--" + field.name.replace("_", "-")
        hint = hints[field.name]
        if hint is bool:
            group.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
            )
            continue
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        group.add_argument(
            flag,
            dest=field.name,
            type=hint,
            default=argparse.SUPPRESS,
            metavar=hint.__name__.upper(),
        )


def _config(args: argparse.Namespace) -> WatermarkConfig:
    data: dict[str, Any] = {}
    for path in args.config or []:
        data.update(load_settings_file(path))
    names = {f.name for f in dataclasses.fields(WatermarkConfig)}
    data.update({k: v for k, v in vars(args).items() if k in names})
    return WatermarkConfig.from_dict(data)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="watermark.py",
        description="k-SemStamp / SemStamp semantic watermarks: generate and detect.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", action="append", help="YAML settings file (repeatable)")
        p.add_argument("--print-config", action="store_true", help="print settings and exit")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        _add_setting_flags(p)

    gen = sub.add_parser("generate", help="generate watermarked continuations")
    src = gen.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--input", help='JSONL with {"id": ..., "prompt": ...} per line')
    gen.add_argument("--output", help="JSONL output (required with --input; resumable)")
    gen.add_argument(
        "--no-watermark",
        action="store_true",
        help="plain sentence-by-sentence sampling with the same settings",
    )
    common(gen)

    det = sub.add_parser("detect", help="detect the watermark in texts")
    src = det.add_mutually_exclusive_group()
    src.add_argument("--text", help="one text")
    src.add_argument("--file", help="a plain-text file holding one text")
    src.add_argument("--input", help='JSONL with {"text": ..., ["prompt": ...]} per line')
    det.add_argument("--prompt", help="with --text/--file: the prompt the text continues")
    det.add_argument("--output", help="JSONL output (required with --input; resumable)")
    det.add_argument("--batch-size", type=_positive_int, default=64, help="texts per encoder pass")
    common(det)

    demo = sub.add_parser("demo", help="watermark a held-out news prompt, then detect it")
    demo.add_argument("--article", type=int, default=0, help="index of the test-split article")
    demo.add_argument(
        "--prompt-words",
        type=int,
        default=32,
        help="prompt length in words, cut back to a sentence end (paper: ~32)",
    )
    common(demo)

    cal = sub.add_parser(
        "calibrate",
        help="measure false-positive rates on held-out human text over many keys, with power",
    )
    cal.add_argument(
        "--output-dir", default="docs/calibration", help="JSON, report and PNG go here"
    )
    cal.add_argument("--max-texts", type=_positive_int, default=3000, help="human texts in all")
    cal.add_argument("--num-keys", type=_positive_int, default=50, help="random keyed tables")
    cal.add_argument(
        "--sources",
        default="news,parliament,tweets",
        help="comma-separated human sources (news, parliament, tweets)",
    )
    cal.add_argument(
        "--window-words", type=_positive_int, default=150, help="words per human text (~200 tokens)"
    )
    cal.add_argument(
        "--watermarked",
        action="append",
        default=[],
        help="JSONL written by `generate` under the configured key: real power beside the FPR "
        "(repeatable)",
    )
    cal.add_argument(
        "--simulated-per-key",
        type=int,
        default=200,
        help="simulated watermarked region sequences per key (0: none)",
    )
    cal.add_argument("--calibration-seed", type=int, default=0, help="keys and sampling seed")
    cal.add_argument(
        "--no-embedding-cache",
        dest="reuse_embeddings",
        action="store_false",
        help="embed every sentence afresh instead of reusing embeddings kept from earlier runs "
        "(kept under KSEMSTAMP_CACHE/embeddings, one file per encoder fingerprint)",
    )
    common(cal)

    srv = sub.add_parser("serve", help="a local web page: detect, batch and generate")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    srv.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    srv.add_argument(
        "--max-chars", type=_positive_int, help="longest text (default: the max_text_chars setting)"
    )
    srv.add_argument("--no-generate", action="store_true", help="detection only: no LM loaded")
    common(srv)

    from .evaluation.run import add_arguments as add_evaluate_arguments

    ev = sub.add_parser(
        "evaluate", help="paper evaluation: generate, attack, detect; AUC, TPR, quality"
    )
    add_evaluate_arguments(ev)
    # Its --config is an evaluation file, not watermark settings: keep _config() at defaults.
    ev.set_defaults(config=None, print_config=False)
    return parser


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


# ---------------------------------------------------------------------- generate


def _process_jsonl(
    args,
    *,
    name: str,
    unit: str,
    batch_size: int,
    check: Callable[[dict], str | None],
    process: Callable[[list[dict]], list[dict]],
    error_fields: dict[str, Any],
    counted_as_ok: str,
) -> int:
    """The JSONL loop shared by ``generate`` and ``detect``, resumable through ``ResumableWriter``.

    Records already in ``args.output`` are skipped; the rest go in input order, in chunks of
    ``batch_size``. ``check(data)`` returns why a record cannot be processed (or ``None``);
    ``process(datas)`` returns one output dict per valid record. Every input line yields one
    output line: the input fields, ``line``, and the result or ``status: error`` with ``error``.
    Returns the exit code: 1 when nothing succeeded and something failed, else 0.
    """
    failures = successes = 0
    with ResumableWriter(args.output) as out:
        records = list(read_jsonl(args.input))
        pending = [r for r in records if not out.is_done(r)]
        skipped = len(records) - len(pending)
        if skipped:
            print(f"resuming: {skipped} records already in {args.output}", file=sys.stderr)
        bar = tqdm(total=len(pending), unit=unit, desc=name, disable=args.quiet)
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            errors = {r.line: r.error or check(r.data) for r in chunk}
            ready = [r for r in chunk if errors[r.line] is None]
            results = process([r.data for r in ready]) if ready else []
            by_line = {r.line: res for r, res in zip(ready, results, strict=True)}
            for rec in chunk:
                row = {**(rec.data or {}), "line": rec.line}
                if errors[rec.line] is None:
                    row |= by_line[rec.line]
                else:
                    row |= {**error_fields, "status": "error", "error": errors[rec.line]}
                failures += row["status"] == "error"
                successes += row["status"] != "error"
                out.write(row)
                bar.update()
        bar.close()
    print(
        f"{name}: {successes} {counted_as_ok}, {failures} failed, {skipped} already done",
        file=sys.stderr,
    )
    return 1 if failures and not successes and not skipped else 0


def _generate_records(args, cfg: WatermarkConfig) -> int:
    watermarker = build_watermarker(cfg)
    fingerprint = None if args.no_watermark else watermarker.scheme.key_fingerprint

    def check(data: dict) -> str | None:
        prompt = data.get("prompt")
        if prompt is None:
            return "missing field 'prompt'"
        if not isinstance(prompt, str):
            return f"'prompt' must be a string, got {type(prompt).__name__}"
        return None

    def process(datas: list[dict]) -> list[dict]:
        results = watermarker.generate(
            [d["prompt"] for d in datas], watermark=not args.no_watermark
        )
        return [{**res.to_record(), "key_fingerprint": fingerprint} for res in results]

    return _process_jsonl(
        args,
        name="generate",
        unit="prompt",
        batch_size=cfg.prompt_batch,
        check=check,
        process=process,
        error_fields={},
        counted_as_ok="ok",
    )


def cmd_generate(args, cfg: WatermarkConfig) -> int:
    if args.input:
        if not args.output:
            raise SystemExit("generate: --input needs --output")
        return _generate_records(args, cfg)
    if args.prompt is None:
        raise SystemExit("generate: give --prompt TEXT or --input FILE.jsonl")
    watermarker = build_watermarker(cfg)
    res = watermarker.generate(
        [args.prompt], watermark=not args.no_watermark, progress=not args.quiet
    )[0]
    if res.status != "ok":
        print(f"error: {res.error}", file=sys.stderr)
        return 1
    print(res.text)
    notes = []
    if res.prompt_dropped_chars:
        notes.append(f"the LM saw the prompt without its first {res.prompt_dropped_chars:,} chars")
    if res.completion is not None:
        notes.append(f"completion (not watermarked): {res.completion!r}")
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
        short = result.seed if len(result.seed) <= 70 else result.seed[:67] + "..."
        lines.append(f"  {'':>3}  region {result.seed_region:>2}  {'seed':<8} {short}")
    for i, (sentence, region, verdict) in enumerate(
        zip(result.sentences, result.regions, result.verdicts, strict=True), start=1
    ):
        short = sentence if len(sentence) <= 70 else sentence[:67] + "..."
        lines.append(f"  {i:>3}  region {region:>2}  {verdict:<8} {short}")
    if result.status != "ok":
        lines.append(f"status: {result.status} ({result.error})")
        return "\n".join(lines)
    verdict = "WATERMARKED" if result.watermarked else "not watermarked"
    lines.append(
        f"scored {result.num_scored}, valid {result.num_valid}  |  z = {result.z_score:.2f} "
        f"(paper)  p = {result.p_value:.3g} ({result.statistic})  ->  {verdict}"
    )
    return "\n".join(lines)


def _detect_records(args, cfg: WatermarkConfig) -> int:
    detector = build_detector(cfg)
    fingerprint = detector.scheme.key_fingerprint

    def check(data: dict) -> str | None:
        if "text" not in data:
            return "missing field 'text'"
        if not isinstance(data["text"], str):
            return f"'text' must be a string, got {type(data['text']).__name__}"
        if data.get("key_fingerprint") not in (None, fingerprint):
            return (
                "this text was generated with a different key (fingerprint "
                f"{data['key_fingerprint']}, detector {fingerprint})"
            )
        return None

    def process(datas: list[dict]) -> list[dict]:
        # A chat answer (a record `generate --chat` wrote, or every record under --chat) is
        # not seeded by its instruction.
        prompts = [None if cfg.chat or d.get("chat") is True else d.get("prompt") for d in datas]
        results = detector.detect_batch(
            [d["text"] for d in datas], prompts, progress=not args.quiet
        )
        return [res.to_record() for res in results]

    return _process_jsonl(
        args,
        name="detect",
        unit="text",
        batch_size=args.batch_size,
        check=check,
        process=process,
        error_fields={"z_score": None, "p_value": None, "num_scored": 0, "num_valid": 0},
        counted_as_ok="scored",
    )


def cmd_detect(args, cfg: WatermarkConfig) -> int:
    if args.input:
        if not args.output:
            raise SystemExit("detect: --input needs --output")
        return _detect_records(args, cfg)
    if args.text is not None:
        text = args.text
    elif args.file:
        text = Path(args.file).read_text(encoding="utf-8-sig", errors="replace")
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
    prompt = news_prompt(args.article, args.prompt_words)
    scheme = build_scheme(cfg)
    watermarker = build_watermarker(cfg, scheme)
    detector = build_detector(cfg, scheme)
    print(f"prompt (held-out news article {args.article}):\n  {prompt}\n")
    res = watermarker.generate([prompt], progress=not args.quiet)[0]
    if res.status != "ok":
        print(f"error: {res.error}", file=sys.stderr)
        return 1
    print(
        f"watermarked continuation ({res.num_tokens} tokens, {res.seconds:.1f} s):\n  {res.text}\n"
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
    from .calibration import CalibrationSettings, run_calibration, write_outputs
    from .keys import DEMO_KEY, key_fingerprint

    settings = CalibrationSettings(
        sources=tuple(s.strip() for s in args.sources.split(",") if s.strip()),
        max_texts=args.max_texts,
        num_keys=args.num_keys,
        window_words=args.window_words,
        simulated_per_key=args.simulated_per_key,
        seed=args.calibration_seed,
        watermarked=tuple(args.watermarked),
        reuse_embeddings=args.reuse_embeddings,
    )
    scheme = build_scheme(cfg)
    shown = ("encoder", "partition", "centroids", "gamma", "valid_mode")
    describe = {
        "command": command_line(args.argv),
        "settings": {k: v for k, v in cfg.to_dict().items() if k in shown},
    }
    if cfg.partition == "kmeans":
        path = cfg.centroid_path().resolve()
        root = Path(__file__).resolve().parents[2]
        describe["settings"]["centroids"] = str(
            path.relative_to(root) if path.is_relative_to(root) else path
        )
    if scheme.key_fingerprint == key_fingerprint(DEMO_KEY):
        describe["key"] = "the public demo key (KSEMSTAMP_KEY unset)"
    result = run_calibration(scheme, settings, describe, progress=not args.quiet)
    paths = write_outputs(result, args.output_dir)
    overall = result["null"]["overall"]
    for stat in ("paper", "exact"):
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


def cmd_evaluate(args, cfg: WatermarkConfig) -> int:
    from .evaluation.run import main_from_args

    return main_from_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        cfg = _config(args)
    except (ValueError, OSError, TypeError) as err:
        parser.error(str(err))
    if args.print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    handler = {
        "generate": cmd_generate,
        "detect": cmd_detect,
        "demo": cmd_demo,
        "calibrate": cmd_calibrate,
        "evaluate": cmd_evaluate,
        "serve": cmd_serve,
    }[args.command]
    try:
        return handler(args, cfg)
    except (ValueError, FileNotFoundError, AssetError) as err:
        # Settings that only fail once objects are built (gamma * K, centroid files, encoders):
        # one line naming the problem, not a traceback. Messages never hold the key.
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
