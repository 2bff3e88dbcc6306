"""What the commands show of their work: figures and progress bars.

Figures: matplotlib, an optional dependency (``pip install 'ksemstamp[plots]'``; ``make setup``
installs it). Only the commands that draw (``calibrate``, ``evaluate``, ``agreement``) load it,
through ``pyplot`` or ``pyplot_for``; detection and generation never do. Without it those
commands write everything but their figures, and say so once each.

Progress (``progress_bar``): a terminal gets tqdm's bar, redrawn in place. A log file, a pipe or
a CI job gets one plain line when the work starts, one every ``LINE_SECONDS`` while it runs and
one when it ends (the bar's own text: done, total, rate, time left), instead of a single line of
carriage returns that shows nothing until the run is over."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from .io import atomic_target

EXTRA = "plots"
"""The extra that installs what plots need."""

logger = logging.getLogger(__name__)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive backend, or a one-line ``ImportError``
    naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            f"plots need matplotlib: pip install 'ksemstamp[{EXTRA}]' (make setup installs it)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pyplot_for(path: str | Path) -> Any | None:
    """``pyplot()``, or ``None`` after a warning that the figure ``path`` is not drawn, when
    matplotlib is not installed (the command's other outputs do not need it)."""
    try:
        return pyplot()
    except ImportError as err:
        logger.warning("%s not drawn: %s", Path(path).name, err)
        return None


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """Save a matplotlib figure as a palette PNG (at most 256 colours), atomically. Plots hold a
    few flat colours and their anti-aliasing, so the palette keeps them as drawn at about a third
    of the file size of full-colour PNG."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    with atomic_target(path) as tmp:
        image.save(tmp, format="PNG", optimize=True)


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


def progress_bar(iterable: Any = None, **kwargs: Any) -> Any:
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
