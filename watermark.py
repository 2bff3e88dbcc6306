"""Generate and detect k-SemStamp / SemStamp watermarks: ``python watermark.py --help``."""

import sys

from ksemstamp.cli import main

if __name__ == "__main__":
    sys.exit(main())
