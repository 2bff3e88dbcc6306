"""What the research commands' flags share, in the style of ``benchmarks.harness`` and
``watermark.py``: jsonargparse parsers with dashed flags, settings dataclasses as flags through
``ksemstamp.settings_flags.SettingsGroup`` (``--contexts-per-doc``), ``--config FILE`` (YAML,
field names as keys: ``contexts_per_doc: 14``; repeatable: later files win, and flags win over
every file wherever they stand, as in ``watermark.py``) and ``--print-config``.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Collection, Sequence

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace

from ksemstamp.settings_flags import SettingsFile, SettingsGroup, normalise_argv


class HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, with the description's lines (command examples) kept as written."""


def parser(description: str | None = None, **kwargs: typing.Any) -> ArgumentParser:
    """A research command's parser with ``--config`` and ``--print-config``."""
    p = ArgumentParser(
        description=description,
        env_prefix=False,
        print_config="--print-config",
        formatter_class=HelpFormatter,
        **kwargs,
    )
    p.add_argument(
        "--config",
        action=SettingsFile,
        help="YAML settings file, flag names with underscores as keys (repeatable: later files "
        "win, flags win over every file)",
    )
    return p


def parse_args(
    p: ArgumentParser, argv: Sequence[str] | None, commands: Collection[str] = ()
) -> Namespace:
    """Parse ``argv`` (None: ``sys.argv[1:]``) with the ``--config`` files moved to the front
    (after the subcommand, the first of ``commands`` given), so that flags win over them."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if a in commands), None)
    return p.parse_args(normalise_argv(argv, {}, command))


def build(p: ArgumentParser, group: SettingsGroup, args: Namespace) -> typing.Any:
    """``group``'s dataclass from ``args``; a value the dataclass refuses is a usage error
    (exit status 2, the flag named)."""
    try:
        return group.build(args)
    except ValueError as err:
        p.error(str(err))
