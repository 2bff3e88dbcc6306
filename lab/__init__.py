"""The lab: the studies that are still open, beside the product.

It imports only ``ksemstamp``'s public API and ``ksemstamp.experimental`` (``tests/test_layout``
holds it to that), and nothing in ``src/`` or ``tests/`` imports it. Its commands run through
``ksemstamp``'s command line, with the same ``--group.field`` flags: ``python -m lab --help``.

* ``check``: a design's texts generated on held-out prompts, attacked, detected
  (``lab/check.py``);
* ``compare``: two checks paired by prompt; ``curve``: the candidate curve from the checks
  (``lab/curve.py``).
"""
