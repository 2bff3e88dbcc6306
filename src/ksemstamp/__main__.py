"""``python -m ksemstamp``: the ``ksemstamp`` commands (generate, detect, ...; ``ksemstamp.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m ksemstamp"))
