"""Progress bars that read as lines where stderr is not a terminal.

A terminal gets tqdm's bar, redrawn in place. A log file, a pipe or a CI job gets one plain line
when the work starts, one every ``LINE_SECONDS`` while it runs and one when it ends (the bar's
own text: done, total, rate, time left), instead of a single line of carriage returns that
shows nothing until the run is over.
"""

from __future__ import annotations

import sys
from typing import Any

LINE_SECONDS = 10.0
"""Seconds between two progress lines without a terminal."""


class _Lines:
    """A file for tqdm that writes each state it draws as one line on the current stderr."""

    def __init__(self) -> None:
        self.last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and line != self.last:
            self.last = line
            sys.stderr.write(line + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def bar(iterable: Any = None, **kwargs: Any) -> Any:
    """``tqdm(iterable, **kwargs)`` on stderr: redrawn on a terminal, else as lines (see the
    module docstring). ``disable=True`` shows nothing either way."""
    from tqdm.auto import tqdm

    if not kwargs.get("disable") and not _terminal():
        kwargs.setdefault("mininterval", LINE_SECONDS)
        kwargs |= {"file": _Lines(), "ascii": True, "ncols": 80, "leave": True}
    return tqdm(iterable, **kwargs)


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
