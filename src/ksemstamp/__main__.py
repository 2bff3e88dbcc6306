"""``python -m ksemstamp``: the same commands as ``watermark.py`` (generate, detect, ...)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
