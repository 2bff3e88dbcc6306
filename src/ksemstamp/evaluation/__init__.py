"""Evaluation as in the paper: generate, attack, detect, and score detection and text quality.
May import: ksemstamp core modules and scheme, settings, text, training; never cli or serve.

``run`` holds the pipeline behind ``ksemstamp evaluate`` (its ``stages``, its ``settings`` and
its ``report`` beside it); ``attacks``, ``metrics`` and
``baselines`` are usable on their own; ``predict`` spreads generation over processes.
"""
