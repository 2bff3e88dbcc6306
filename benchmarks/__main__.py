"""``python -m benchmarks COMMAND``: the benchmarks' commands, read as ``ksemstamp``'s are
(``--group.field`` flags, ``--config FILE``, ``--print_config``; ``--help`` lists them)."""

from __future__ import annotations

import sys

from ksemstamp.experimental import main

from .bench import bench
from .detection import detection
from .generation import generation
from .precision import precision
from .steering import steering
from .threads import threads
from .throughput import throughput
from .training import training
from .vllm import vllm

PROG = "python -m benchmarks"
COMMANDS = {
    "bench": bench,
    "generation": generation,
    "detection": detection,
    "training": training,
    "throughput": throughput,
    "precision": precision,
    "threads": threads,
    "steering": steering,
    "vllm": vllm,
}
"""Every benchmark, by name."""


def run(argv: list[str]) -> int:
    return main(argv, prog=PROG, commands=COMMANDS)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
