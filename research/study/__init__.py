"""Design study: which partition, valid-set rule and acceptance rule detect best at honest
p-values, at what generation cost, clean and after paraphrase.

The study has three layers, each its own module:

* ``pool`` and ``pairs`` measure the *ingredients* once, as text: candidate next sentences
  sampled by the generator at real contexts of held-out news, and paraphrases of generated
  sentences under the evaluation's attacks. Embeddings are derived per encoder, so the regions,
  margins and validity of any design point are computed offline from them.
* ``simulate`` is a region-level simulator: for a design point and a random key it replays
  rejection sampling on the measured candidates, applies the measured paraphrase behaviour to
  the accepted sentences, and scores clean and attacked region sequences with the detector's
  exact test.
* ``runner`` drives the simulator for one design point at a time and summarises it; ``sweep``
  runs it over a grid of design points and writes the table and the frontier plot
  (``diagnostics`` and ``prune`` report beside it); ``validate`` compares its predictions with
  real generations.

It imports the installed ``ksemstamp`` package and its own modules; nothing imports it. Run its
commands from the repository root: ``python -m research.study --help``.
"""
