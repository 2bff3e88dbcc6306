"""The command line: every command of the project in one registry, ``COMMANDS``.
May import: ksemstamp core modules and calibration, detection, evaluation, generation, marks, scheme, serve, settings, text, training; never experimental.

``ksemstamp COMMAND`` (the console script), ``python watermark.py COMMAND`` and
``python -m ksemstamp COMMAND`` run the same commands; ``main`` reads any command table the
same way (the benchmarks' and the lab's). Each command is a function whose signature and
docstring are its options (``options``), which ``parser`` reads a command line into;
``console`` is what a command prints; ``commands`` holds the commands that generate and
detect, ``gpucheck`` the GPU self-check and ``train`` LightningCLI's command line for
``train.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from ..evaluation.run import evaluate
from ..scheme.centroids import centroids
from ..text.corpusfile import export, prompts
from ..training.evaluate import agreement
from ..training.pairs import pairs
from .commands import calibrate, demo, detect, generate, keygen, serve, train
from .console import call, print_err
from .gpucheck import gpucheck
from .parser import CommandLineError

# ---------------------------------------------------------------------- the registry

COMMANDS: dict[str, Callable | dict[str, Callable]] = {
    "generate": generate,
    "detect": detect,
    "demo": demo,
    "serve": serve,
    "keygen": keygen,
    "calibrate": calibrate,
    "evaluate": evaluate,
    "train": train,
    "pairs": pairs,
    "agreement": agreement,
    "centroids": centroids,
    "corpus": {"export": export, "prompts": prompts},
    "gpucheck": gpucheck,
}
"""Every command, by name; a mapping holds subcommands (``ksemstamp corpus export``)."""

RESUMABLE = ("evaluate",)
"""Commands without ``--input`` whose rerun resumes (their stages are kept as they finish)."""


Commands = dict[str, Callable | dict[str, Callable]]


def usage(prog: str, commands: Commands | None = None) -> str:
    """The list of commands, each with the first line of its docstring."""
    lines = [f"usage: {prog} COMMAND [OPTIONS]  ({prog} COMMAND --help lists a command's)", ""]
    for name, entry in (commands or COMMANDS).items():
        entries = entry.items() if isinstance(entry, dict) else [("", entry)]
        for sub, fn in entries:
            first = (fn.__doc__ or "").strip().split("\n")[0].rstrip(".")
            lines.append(f"  {(name + ' ' + sub).strip():<18} {first}")
    return "\n".join(lines)


def resolve(
    argv: Sequence[str], prog: str, commands: Commands | None = None
) -> tuple[Callable, str, list[str]]:
    """The command function ``argv`` names, its program name and the rest of ``argv``."""
    import difflib

    commands = commands or COMMANDS
    name = argv[0] if argv else ""
    entry = commands.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, list(commands), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CommandLineError(f"unknown command {name!r}{hint}; known: {', '.join(commands)}")
    if isinstance(entry, dict):
        sub = argv[1] if len(argv) > 1 else ""
        if sub not in entry:
            raise CommandLineError(f"{name}: give one of {', '.join(entry)}")
        return entry[sub], f"{prog} {name} {sub}", list(argv[2:])
    return entry, f"{prog} {name}", list(argv[1:])


def main(
    argv: Sequence[str] | None = None, prog: str = "ksemstamp", commands: Commands | None = None
) -> int:
    """Run a command of ``commands`` (``COMMANDS``; the benchmarks and the lab give theirs, read
    the same way); returns the exit status (a bad command line exits with 2, Ctrl-C 130)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if not argv or argv[0] in ("-h", "--help"):
            print(usage(prog, commands))
            return 0 if argv else 2
        try:
            fn, name, rest = resolve(argv, prog, commands)
        except CommandLineError as err:
            print_err(f"{prog}: error: {err}")
            raise SystemExit(2) from None
        return call(fn, rest, name)
    except KeyboardInterrupt as stop:
        # Ctrl-C: one line saying what was kept, not a traceback. Under the `ddp` strategy
        # every process gets it; the first one speaks for all.
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
            command = next((a for a in argv if a in RESUMABLE), None)
            detail = str(stop) or (
                "rerun the same command to resume" if command else "nothing was written"
            )
            print_err(f"interrupted: {detail}")
        return 130
