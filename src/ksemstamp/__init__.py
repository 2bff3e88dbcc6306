"""k-SemStamp: paraphrase-robust semantic watermarks for language-model text."""
