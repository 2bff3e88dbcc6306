"""The machinery of the sentence loop behind ``Watermarker``: sampling, decoding, documents.
May import: ksemstamp core modules and settings, text; never cli, builders, watermarker, detector or marks.

* ``engine``: the ``Engine`` protocol (open a round, advance it, retain rows) and a round's data;
* ``draw``: one round over any engine: judging, ordered acceptance and pruning between steps;
* ``cutter``: where a unit ends in a row's tokens, one rule (and one count) for every engine;
* ``batched``: ``BatchedEngine``, a Hugging Face LM decoding many rows at a time (the default);
* ``stream``: ``StreamEngine``, an engine over a backend that only samples tokens;
* ``vllm_engine``, ``openai_engine``: vLLM in process, an OpenAI-compatible server;
* ``sequential``: ``SequentialEngine``, one ``generate`` call per candidate (the baseline);
* ``hf``: what the Hugging Face engines read of an LM and its tokenizer;
* ``kvcache``: the prompt's key/value cache shared by a round's rows;
* ``decoding``: the next-token logits of the sampling settings;
* ``rounds``: how many rows a round draws;
* ``pruning``: when running rows of a round stop early (the direction mark's rule);
* ``documents``: one document's state through the loop;
* ``prompts``: the kinds of prompt and how each starts a text;
* ``steering``: the logit bias toward the key.
"""
