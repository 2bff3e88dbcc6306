"""Benchmarks of the installed ``ksemstamp`` package, one module per thing measured, each run from
the repository root as ``python -m benchmarks.NAME`` (see ``benchmarks/README.md``):

* ``generation``: watermarked generation against plain sampling, and the sequential strategy;
* ``detection``: batched detection against the bare encoder;
* ``training``: the encoder's training step against sentence-transformers' trainer;
* ``bench``: the three in one run, the benchmark of record (``results/latest.*``);
* ``levers``: one speed setting at a time (weight format, threads, early rejection).

They share ``harness`` (timing, peak memory, distributions, the report and its files, common
flags). Nothing in ``ksemstamp`` imports them.
"""

import os

# Before anything imports transformers: the offline models only, no tokenizer thread pools.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
