"""The machinery of the sentence loop behind ``Watermarker``: sampling, decoding, documents.
May import: ksemstamp core modules and settings, text; never cli, builders, watermarker, detector or marks.

* ``sampler``: ``CandidateSampler``, candidate sentences sampled many rows at a time;
* ``batch``: a round's data and bookkeeping (candidates, group results, the live rows);
* ``sequential``: the one-``generate``-call-per-candidate baseline with the same interface;
* ``kvcache``: the prompt's key/value cache shared by a round's rows;
* ``decoding``: the next-token logits of the sampling settings;
* ``rounds``: how many rows a round draws;
* ``pruning``: when running rows of a round stop early (the direction mark's rule);
* ``documents``: one document's state through the loop;
* ``prompts``: the kinds of prompt and how each starts a text.
"""
