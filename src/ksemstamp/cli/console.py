"""Running a command in a terminal: what it shows, and never the key.

``call`` parses a command line for a command function (``commandline``) and calls it, or prints
its settings (``--print_config``). A command line that cannot be used is one line on stderr and
exit status 2; settings that fail only once objects are built (gamma * K, a centroid file, an
encoder) and unusable files are one line and status 2 as well. No value that may be the key is
repeated in a message (``hide_secrets``) or in the command line a run records (``command_line``).
While a command runs, the library's log shows on stderr one plain line a record, and a warning
(a deprecated spelling, the demo key) as one ``warning:`` line (``console_output``). Every such
line is one write (``print_err``), so the processes of a multi-device run, which share stderr,
never splice their lines together. A detection is shown as ``format_detection`` writes it.
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..results import shown_p
from ..text.textcheck import printable
from .options import options_of
from .parser import CommandLineError, parse

ARGV: list[str] = []
"""The command being run, its name first and then its arguments (``calibrate`` records it as
``ksemstamp calibrate ...``, the key hidden: ``command_line``)."""


def call(fn: Callable, argv: Sequence[str], prog: str) -> int:
    """Parse ``argv`` for command ``fn`` and call it, or print its settings (``--print_config``).

    A bad command line is one line on stderr and ``SystemExit(2)``; settings that fail only
    once objects are built (gamma * K, centroid files, encoders) and unusable files are one line
    and status 2. The library's log and warnings show on stderr while it runs
    (``console_output``).
    """
    from ..assets import AssetError

    argv = list(argv)
    if getattr(fn, "takes_argv", False):
        return fn(argv)
    with console_output():
        try:
            invocation = parse(fn, argv, prog)
        except CommandLineError as err:
            flags = {o.flag for o in options_of(fn, command_line_kind(argv))}
            known = sorted(flags | {"--config", "--print_config"})
            message = hide_secrets(one_line(err), argv, known, other_kinds_flags(fn, known))
            print_err(f"{prog}: error: {message}")
            raise SystemExit(2) from None
        if invocation.print_config:
            print(invocation.printed_config(), end="")
            return 0
        quiet_model_loading()  # every command: a model's loading bar is noise, quiet or not
        ARGV[:] = [*prog.split()[1:], *argv]  # the command's name and its arguments
        try:
            return fn(**invocation.kwargs)
        except (ValueError, FileNotFoundError, AssetError) as err:
            # Messages never hold the key; the key's value is blanked all the same.
            print_err("error: " + hide_secrets(" ".join(str(err).split()), argv))
            return 2
        except OSError as err:
            # An output that is read-only, a folder, or on a full disk: what and where.
            where = f"{err.filename}: " if err.filename else ""
            print_err(f"error: {where}{err.strerror or err}")
            return 2


def print_err(text: str = "") -> None:
    """``text`` and its line break on ``sys.stderr`` in one write. ``print(..., file=sys.stderr)``
    writes the break separately, and on the unbuffered stderr the other processes of a
    multi-device run can write between the two: their line then ends up on the end of this one."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def quiet_model_loading() -> None:
    """No progress bars while models load (transformers' "Loading weights", the Hugging Face
    Hub's downloads). Said through ``HF_HUB_DISABLE_PROGRESS_BARS`` (unless the environment
    sets it), which transformers reads when it loads: a command that loads no model never
    imports it. A generation's or a detection's own bars are not these."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "0":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


class _StderrHandler(logging.Handler):
    """Log records as plain lines on the current ``sys.stderr`` (tests capture it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print_err(self.format(record))


@contextmanager
def console_output() -> Iterator[None]:
    """While a command runs: the library's log on stderr, one plain line each, and warnings
    as one ``warning:`` line each (a deprecated spelling, the demo key)."""
    package = logging.getLogger("ksemstamp")
    if any(isinstance(h, _StderrHandler) for h in package.handlers):
        yield  # already set up by an outer command
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = package.level, package.propagate
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print_err(f"warning: {message}")

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
        package.removeHandler(handler)
        package.setLevel(level)
        package.propagate = propagate


# ---------------------------------------------------------------------- without secrets

UNRECOGNIZED = "unrecognized arguments:"


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
    return "ksemstamp " + shlex.join(shown)


def command_line_kind(argv: Sequence[str]) -> str | None:
    """The kind of mark a command line asks for (its files and ``--mark.kind``); ``None``
    where its files cannot be read."""
    from ..settings.files import command_line_layers

    try:
        return command_line_layers(list(argv), True)[1]
    except Exception:  # a file that cannot be read: the error already says so
        return None


def other_kinds_flags(fn: Callable, known: Sequence[str]) -> dict[str, str]:
    """The flags of ``fn`` that only a mark of another kind has (``--mark.gamma``,
    ``--search.margin`` under the direction mark), and that kind."""
    from ..settings.groups import MARK_KINDS

    found: dict[str, str] = {}
    for kind in MARK_KINDS:
        for option in options_of(fn, kind):
            if option.flag not in known:
                found.setdefault(option.flag, kind)
    return found


def hide_secrets(
    message: str,
    argv: Sequence[str],
    known: Sequence[str] = (),
    elsewhere: dict[str, str] | None = None,
) -> str:
    """``message`` without any value that may be the key.

    Arguments the parser did not know are named by their flags only, each with the closest
    flag of ``known`` (or, for a flag of another kind of mark, ``elsewhere``: flag to kind, that
    kind): the value after a mistyped ``--kye`` is most likely the key. The value of
    ``--key`` and ``$KSEMSTAMP_KEY`` are blanked wherever else they appear (a key given under
    another flag by mistake is quoted in that flag's message).
    """
    import os

    from ..keys import KEY_ENV

    head, found, listed = message.partition(UNRECOGNIZED)
    if found:
        message = head + UNRECOGNIZED + " " + _unrecognized(listed.strip(), argv, known, elsewhere)
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


def _unrecognized(
    listed: str, argv: Sequence[str], known: Sequence[str], elsewhere: dict[str, str] | None
) -> str:
    """The unknown arguments ``listed`` (space-separated, in command-line order): their flags
    with a suggestion each, and how many values went with them, none shown."""
    import difflib

    taken, pos = [], 0
    for token in argv:
        end = pos + len(token)
        if listed.startswith(token, pos) and (end == len(listed) or listed[end] == " "):
            taken.append(token)
            pos = end + 1
    if pos < len(listed):  # not the tokens of this command line: show none of it
        return "(not shown: one may be the key)"
    parts, values = [], 0
    for token in taken:
        name, eq, _ = token.partition("=")
        if not name.startswith("-"):
            values += 1
            continue
        values += bool(eq)
        kind = (elsewhere or {}).get(name)
        close = difflib.get_close_matches(name, list(known), n=1)
        if kind:
            parts.append(f"{name} (a setting of the {kind} mark: --mark.kind {kind})")
        else:
            parts.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    if values:
        parts.append(f"{values} value{'s' if values > 1 else ''}")
    return ", ".join(parts) + "; values are not shown, as one may be the key"


def one_line(err: BaseException) -> str:
    """``err``'s message on one line, each setting named by its place and its flag.

    jsonargparse's messages span lines, name a setting ``Parser key "sampling.seed"`` and a type
    ``<class 'float'>``; the settings list one problem a line.
    """
    message = ""
    for line in (" ".join(line.split()) for line in str(err).splitlines()):
        if line:
            message += ("" if not message else " " if message.endswith(":") else "; ") + line
    message = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    return re.sub(r'Parser key "([\w.]+)":', lambda m: f"{m[1]} (--{m[1]}):", message)


# ---------------------------------------------------------------------- a detection


VERDICTS = {"valid": "valid", "invalid": "blocked", "seed": "seed", "repeat": "repeat"}
"""The detector's verdicts as the report names them, as the web page does (``serve.present``):
``blocked`` is a scored unit that does not carry the mark (the region mark: not in a valid
region; the direction mark: a score that is not positive)."""


def format_detection(result, mark, unit: str = "sentence") -> str:
    """A readable report of one ``DetectionResult`` of ``mark`` (``Mark.describe``, its
    further tests ``Mark.report_lines``) whose scored pieces are each a ``unit``."""
    scored = result.scores is not None
    lines = [f"  {'#':>4}  {'region':>6}  {'score' if scored else '':>7}  {'verdict':<8} {unit}"]
    seed = result.seed_sentence
    if seed is not None:
        short = printable(seed if len(seed) <= 70 else seed[:67] + "...")
        lines.append(f"  {'-':>4}  {result.seed_region:>6}  {'':>7}  {'seed':<8} {short}")
    scores = result.scores or [None] * len(result.sentences)
    for i, (sentence, region, verdict, score) in enumerate(
        zip(result.sentences, result.regions, result.verdicts, scores, strict=True), start=1
    ):
        short = printable(sentence if len(sentence) <= 70 else sentence[:67] + "...")
        shown = "" if score is None else f"{score:+7.2f}"
        label = VERDICTS.get(verdict, verdict)
        lines.append(f"  {i:>4}  {region:>6}  {shown:>7}  {label:<8} {short}")
    shown = {VERDICTS.get(v, v) for v in result.verdicts} | (
        {"seed"} if result.seed_sentence else set()
    )
    legend = {
        "valid": "carries the mark",
        "blocked": "scored, does not carry it",
        "seed": f"the prompt's last sentence, which the first {unit} follows; not scored",
        "repeat": f"repeats an earlier {unit}; not scored",
    }
    if shown:
        lines.append("  " + "; ".join(f"{k}: {v}" for k, v in legend.items() if k in shown))
    if result.status != "ok":
        lines.append(f"status: {result.status} ({result.error})")
        return "\n".join(lines)
    verdict = "WATERMARKED" if result.watermarked else "not watermarked"
    described = mark.describe()
    kind, counted = described["z"], described["counted"]
    tests = mark.report_lines(result, unit)
    if tests:
        lines.append("tests: " + "; ".join(tests))
    if result.normalized:
        changed = ", ".join(
            f"{n} {kind.replace('_', '-')}" for kind, n in sorted(result.normalized.items())
        )
        lines.append(f"normalised before scoring (characters): {changed}")
    combined = f", the {len(tests)} tests above combined" if tests else ""
    lines.append(
        f"scored {result.num_scored}, {counted} {result.num_valid}  |  z = {result.z_score:.2f} "
        f"({kind})  p = {shown_p(result.p_value, result.log10_p_value)} "
        f"({result.statistic}{combined})  ->  {verdict}"
    )
    return "\n".join(lines)
