"""What the ``Detector`` computes: key-free scoring plans and the exact tests on them.
May import: ksemstamp core modules and settings, text; never cli, builders, watermarker, detector or marks.

* ``plans``: ``ScoringPlan``, a text's sentences, regions and vectors before any key;
* ``stats``: the paper's z-test and the exact key-randomisation tests;
* ``spans``: the span, mixture and weighted statistics of a text's scores, and their null
  covariance;
* ``scan``: their null law and the tests for marked sentences inside human text, combined into
  one p-value.
"""
