"""``python -m lab COMMAND``: the lab's commands, read as ``ksemstamp``'s are."""

from __future__ import annotations

import sys
from pathlib import Path

from ksemstamp.experimental import main

from .check import check
from .curve import compare, curve
from .leakage import leakage
from .quality import quality
from .subset import subset

COMMANDS = {
    "check": check,
    "compare": compare,
    "curve": curve,
    "leakage": leakage,
    "quality": quality,
    "subset": subset,
}
CHECK_DEFAULTS = Path(__file__).with_name("check.yaml")
"""The check's settings under the command line's (``--config`` files and flags win)."""


def run(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        argv = ["check", "--config", str(CHECK_DEFAULTS), *argv[1:]]
    return main(argv, prog="python -m lab", commands=COMMANDS)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
