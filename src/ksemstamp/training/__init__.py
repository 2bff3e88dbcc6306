"""Fine-tuning a paraphrase-robust sentence encoder for k-SemStamp.
May import: ksemstamp core modules and text; never cli, config, builders, watermarker or detector.

* ``loss``: the margin contrastive loss as a pure tensor function;
* ``data``: paraphrase pairs from JSONL files as a ``LightningDataModule``;
* ``module``: ``EncoderModule``, the Lightning system around a sentence-transformers encoder;
* ``callbacks``: ``KMeansCallback``, which fits the k-means centroids after training;
* ``cli``: ``TrainCLI``, the LightningCLI behind ``train.py`` (two forced callbacks);
* ``pairs``: ``ksemstamp pairs`` builds pairs offline (WordNet, small LM);
* ``evaluate``: ``ksemstamp agreement`` measures region agreement on pairs.

Heavy imports (Lightning, sentence-transformers) stay inside the submodules.
"""
