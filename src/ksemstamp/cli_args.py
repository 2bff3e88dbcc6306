"""The parser of ``watermark.py``: jsonargparse subcommands built from the settings dataclasses.

Each subcommand takes ``--config FILE`` (YAML, repeatable), ``--print-config``, ``--quiet``, its
own options (``--prompt``, ``--input``, ...) and one flag per field of its settings dataclasses
(``ksemstamp.settings_flags``): ``WatermarkConfig`` for every command but ``evaluate``,
``CalibrationSettings`` as well for ``calibrate``, ``DeviceSettings`` as well for ``generate``
and ``detect``, ``EvalSettings`` for ``evaluate``. A field
added to one of them is a flag and a file key with no edit here.

Settings are merged in this order: the defaults of the dataclasses, then the ``--config`` files
(later files win), then flags, wherever they stand on the line. ``--print-config`` prints the
merged settings, never the key, in the form ``--config`` reads. A problem with the settings,
found by jsonargparse (an unknown key, a value of the wrong type) or by a dataclass itself (a
value out of range), is one line on stderr and exit status 2.

What each command does with its settings (the handlers) is in ``ksemstamp.cli``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from jsonargparse import ArgumentParser, Namespace
from jsonargparse.typing import PositiveInt

from .calibration.run import CalibrationSettings
from .config import WatermarkConfig
from .evaluation.settings import EvalSettings
from .keys import KEY_ENV
from .parallel import DeviceSettings
from .settings_flags import SettingsFile, SettingsGroup, normalise_argv, one_line

PROG = "watermark.py"

WATERMARK = SettingsGroup(WatermarkConfig, "watermark settings (WatermarkConfig)")
CALIBRATION = SettingsGroup(
    CalibrationSettings,
    "calibration settings (CalibrationSettings)",
    rename={"seed": "calibration_seed", "reuse_embeddings": "embedding_cache"},
)
EVALUATION = SettingsGroup(EvalSettings, "evaluation settings (EvalSettings)")
PARALLEL = SettingsGroup(DeviceSettings, "devices for --input files (Trainer.predict)")


# ---------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Command:
    """One subcommand: its options, the settings its handler receives, and extra settings.

    The handler is called as ``handler(args, settings.build(args))``; each ``extra`` group is
    built into ``args.<name>`` (``args.calibration`` for ``calibrate``).
    """

    help: str
    options: Callable[[ArgumentParser], None]
    settings: SettingsGroup | None = WATERMARK
    """``None``: the command takes no settings (``keygen``); its handler gets ``None``."""
    extra: Mapping[str, SettingsGroup] = field(default_factory=dict)
    list_options: Mapping[str, type] = field(default_factory=dict)
    """List-valued ``options`` (flag -> item type), read as the list settings are."""

    def groups(self) -> list[SettingsGroup]:
        return [g for g in (self.settings, *self.extra.values()) if g is not None]

    def list_flags(self) -> dict[str, type]:
        flags = {k: v for g in self.groups() for k, v in g.list_flags().items()}
        return {**flags, **self.list_options}


def _add_jsonl_output(parser: ArgumentParser) -> None:
    """``--output`` of the commands that read ``--input`` JSONL (see the README's contract)."""
    parser.add_argument(
        "--output", type=str, help="JSONL output (required with --input; resumable)"
    )


def _generate_options(parser: ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", type=str, help="one prompt")
    source.add_argument("--input", type=str, help='JSONL with {"id": ..., "prompt": ...} per line')
    _add_jsonl_output(parser)
    parser.add_argument(
        "--no-watermark",
        action="store_true",
        help="plain sentence-by-sentence sampling with the same settings",
    )


def _detect_options(parser: ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--text", type=str, help="one text")
    source.add_argument("--file", type=str, help="a plain-text file holding one text")
    source.add_argument(
        "--input", type=str, help='JSONL with {"text": ..., ["prompt": ...]} per line'
    )
    parser.add_argument(
        "--prompt", type=str, help="with --text/--file: the prompt the text continues"
    )
    _add_jsonl_output(parser)
    parser.add_argument("--batch-size", type=PositiveInt, default=64, help="texts per encoder pass")


def _demo_options(parser: ArgumentParser) -> None:
    parser.add_argument("--article", type=int, default=0, help="index of the test-split article")
    parser.add_argument(
        "--prompt-words",
        type=int,
        default=32,
        help="prompt length in words, cut back to a sentence end (paper: ~32)",
    )


def _calibrate_options(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", type=str, default="docs/calibration", help="JSON, report and PNG go here"
    )


def _serve_options(parser: ArgumentParser) -> None:
    parser.add_argument("--host", type=str, default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    parser.add_argument(
        "--max-chars",
        type=PositiveInt,
        default=None,
        help="longest text (default: the max_text_chars setting)",
    )
    parser.add_argument("--no-generate", action="store_true", help="detection only: no LM loaded")


def _evaluate_options(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--only-attacks",
        type=list[str] | None,
        default=None,
        help="run only these of the configured attacks (names, comma-separated)",
    )


def _no_options(parser: ArgumentParser) -> None:
    """A command with no options of its own."""


COMMANDS: dict[str, Command] = {
    "generate": Command(
        "generate watermarked continuations", _generate_options, extra={"parallel": PARALLEL}
    ),
    "detect": Command(
        "detect the watermark in texts", _detect_options, extra={"parallel": PARALLEL}
    ),
    "demo": Command("watermark a held-out news prompt, then detect it", _demo_options),
    "calibrate": Command(
        "measure false-positive rates on held-out human text over many keys, with power",
        _calibrate_options,
        extra={"calibration": CALIBRATION},
    ),
    "serve": Command("a local web page: detect, batch and generate", _serve_options),
    "keygen": Command(
        "print a new random key (256 bits) for KSEMSTAMP_KEY", _no_options, settings=None
    ),
    "evaluate": Command(
        "paper evaluation: generate, attack, detect; AUC, TPR, quality",
        _evaluate_options,
        settings=EVALUATION,
        list_options={"--only-attacks": str},
    ),
}


def build_parser() -> ArgumentParser:
    """The ``watermark.py`` parser; errors raise ``argparse.ArgumentError`` (see ``parse``)."""
    parser = ArgumentParser(
        prog=PROG,
        description="k-SemStamp / SemStamp semantic watermarks: generate and detect.",
        exit_on_error=False,
        print_config=None,
        env_prefix=False,
    )
    subcommands = parser.add_subcommands(required=True, dest="command")
    for name, command in COMMANDS.items():
        subcommands.add_subcommand(name, build_subparser(command), help=command.help)
    return parser


def build_subparser(command: Command) -> ArgumentParser:
    """The parser of one subcommand: the common options, its own, and its settings' flags."""
    sub = ArgumentParser(description=command.help, exit_on_error=False, print_config=None)
    sub.add_argument(
        "--config",
        action=SettingsFile,
        help="YAML settings file (repeatable: later files win, flags win over files)",
    )
    sub.add_argument(
        "--print-config", action="store_true", help="print the settings and exit (no key)"
    )
    sub.add_argument("--quiet", action="store_true", help="no progress bars")
    command.options(sub)
    for group in command.groups():
        group.add_to(sub)
    return sub


# ---------------------------------------------------------------------- parsing


@dataclass
class Invocation:
    """A parsed command line: the command, its options and its built settings."""

    command: str
    args: Namespace
    """The subcommand's values; ``args.argv`` is the command line as given."""
    settings: Any
    """What the handler takes: ``WatermarkConfig`` (``EvalSettings`` for ``evaluate``)."""

    def printed_config(self) -> str:
        """The merged settings as YAML, in the form ``--config`` reads; never the key."""
        spec = COMMANDS[self.command]
        data = spec.settings.dump(self.settings) if spec.settings else {}
        for name, group in spec.extra.items():
            data |= group.dump(self.args[name])
        return yaml.safe_dump(data, sort_keys=False)


def parse(argv: Sequence[str]) -> Invocation:
    """Parse ``argv`` (without the program name) and build the settings.

    A bad command line or bad settings print one line naming the problem and exit with
    status 2; ``--help`` prints the help and exits with 0.
    """
    argv = list(argv)
    command = next((a for a in argv if a in COMMANDS), None)
    try:
        flags = COMMANDS[command].list_flags() if command else {}
        parsed = build_parser().parse_args(normalise_argv(argv, flags, command))
        command = parsed.command
        spec = COMMANDS[command]
        args = parsed[command]
        for name, group in spec.extra.items():
            args[name] = group.build(args)
        settings = spec.settings.build(args) if spec.settings else None
    except (argparse.ArgumentError, ValueError, TypeError, OSError) as err:
        usage_error(command, err, argv)
    args.argv = argv
    return Invocation(command, args, settings)


def usage_error(
    command: str | None, err: BaseException, argv: Sequence[str] = ()
) -> typing.NoReturn:
    """Print ``err`` on one line of stderr, with no key in it (``hide_secrets``), and exit
    with status 2."""
    prog = f"{PROG} {command}" if command else PROG
    print(f"{prog}: error: {hide_secrets(one_line(err), argv, command)}", file=sys.stderr)
    raise SystemExit(2)


UNRECOGNIZED = "unrecognized arguments:"


def hide_secrets(message: str, argv: Sequence[str], command: str | None) -> str:
    """``message`` without any value that may be the key.

    Arguments the parser did not know are named by their flags only, each with the closest
    known flag of the command: the value after a mistyped ``--kye`` is most likely the key.
    The value of ``--key`` and ``$KSEMSTAMP_KEY`` are blanked wherever else they appear (a key
    given under another flag by mistake is quoted in that flag's message).
    """
    head, found, listed = message.partition(UNRECOGNIZED)
    if found:
        message = head + UNRECOGNIZED + " " + _unrecognized(listed.strip(), argv, command)
    secrets = {os.environ.get(KEY_ENV) or ""}
    for i, token in enumerate(argv):
        if token == "--key" and i + 1 < len(argv):
            secrets.add(argv[i + 1])
        elif token.startswith("--key="):
            secrets.add(token.removeprefix("--key="))
    # A short key is refused as weak anyway; blanking a letter or two would garble messages.
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        message = message.replace(secret, "***")
    return message


def _unrecognized(listed: str, argv: Sequence[str], command: str | None) -> str:
    """The unknown arguments ``listed`` (space-separated, in command-line order): their flags
    with a suggestion each, and how many values went with them, none shown."""
    taken, pos = [], 0
    for token in argv:
        end = pos + len(token)
        if listed.startswith(token, pos) and (end == len(listed) or listed[end] == " "):
            taken.append(token)
            pos = end + 1
    if pos < len(listed):  # not the tokens of this command line: show none of it
        return "(not shown: one may be the key)"
    known = sorted(build_subparser(COMMANDS[command])._option_string_actions) if command else []
    parts, values = [], 0
    for token in taken:
        name, eq, _ = token.partition("=")
        if not name.startswith("-"):
            values += 1
            continue
        values += bool(eq)
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    if values:
        parts.append(f"{values} value{'s' if values > 1 else ''}")
    return ", ".join(parts) + "; values are not shown, as one may be the key"
