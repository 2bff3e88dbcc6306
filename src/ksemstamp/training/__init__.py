"""Fine-tuning a paraphrase-robust sentence encoder for k-SemStamp.
May import: ksemstamp core modules and scheme, settings, text; never cli, builders, watermarker or detector.

* ``loss``: the margin contrastive loss and the kernel objective as pure tensor functions;
* ``units``: windows of units (a passage and what else says the same) for the kernel objective;
* ``data``: paraphrase pairs or units from JSONL files as a ``LightningDataModule``;
* ``module``: ``EncoderModule``, the Lightning system around a sentence-transformers encoder;
* ``callbacks``: ``KMeansCallback``, which fits the k-means centroids after training;
* ``cli``: ``TrainCLI``, the LightningCLI behind ``train.py`` (two forced callbacks);
* ``pairs``: ``ksemstamp pairs`` builds pairs offline (WordNet, small LM);
* ``evaluate``: ``ksemstamp agreement`` measures region agreement on pairs.

Heavy imports (Lightning, sentence-transformers) stay inside the submodules.
"""
