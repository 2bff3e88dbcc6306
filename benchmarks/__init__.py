"""Benchmarks of the installed ``ksemstamp`` package, one command per thing measured, each run
from the repository root as ``python -m benchmarks NAME`` with ``--group.field`` flags, read by
the package's command line (``__main__``; see ``benchmarks/README.md``):

* ``generation``: watermarked generation against plain sampling, and the sequential engine
  (``generation``, its runs in ``generation_runs``, its tables in ``generation_report``);
* ``detection``: batched detection against the bare encoder;
* ``training``: the encoder's training step against sentence-transformers' trainer;
* ``bench``: the three in one run, the benchmark of record (``results/latest.*``);
* ``throughput``: many prompts in one call, watermarked against plain ``generate``;
* ``precision``: how far the encoder's device and weight format move a text's z.

Each module holds its benchmark's settings (a frozen dataclass, the command's group), its
measurement, targets and tables, and its command. They share ``harness`` (timing, peak memory,
distributions, the report and its files, the ``run`` settings every benchmark takes). Nothing in
``ksemstamp`` imports them.
"""

import os

# Before anything imports transformers: the offline models only, no tokenizer thread pools.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
