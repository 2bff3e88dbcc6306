"""Text handling shared by generation, detection and training: normalisation, sentences, corpora.
May import: ksemstamp core modules; never cli, builders, watermarker, detector or marks.

* ``normalize``: the normalised form every text is read in;
* ``reading``: what the sentence encoder reads of a sentence (web markup left out);
* ``splitter``: sentence splitting, and how a continuation of a prompt is cut;
* ``textcheck``: input that is not text, or in a script the models do not read;
* ``corpora``: the offline news corpus and its held-out prompts;
* ``corpusfile``: a user's domain corpus file, checked.
"""
