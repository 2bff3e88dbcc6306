"""Generate and detect k-SemStamp / SemStamp watermarks: ``python watermark.py --help``.

The same commands as the ``ksemstamp`` console script (``ksemstamp.cli``).
"""

import sys

try:
    from ksemstamp.cli import main
except KeyboardInterrupt:  # Ctrl-C while the libraries load: nothing was started yet
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main(prog="watermark.py"))
