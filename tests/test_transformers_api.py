"""The generator runs on the cache API the installed transformers recommends: no deprecation
warning, which is how a release announces the next one that stops taking the old call.

Small random models (no download), so these run with the fast tests. ``make test-newest``
(which CI runs) repeats them against the newest transformers that pyproject.toml admits.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from test_kvcache import SIZES, VOCAB, CharTokenizer
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from ksemstamp.generation.kvcache import (
    CopiedCacheDecoder,
    PrefixStore,
    SharedPrefixDecoder,
    shared_prefix_attention,
)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def no_deprecation() -> Iterator[None]:
    """Fail on any deprecation transformers reports: a ``FutureWarning`` or
    ``DeprecationWarning``, or a warning of its loggers that says ``deprecated``."""
    # transformers logs some deprecations once per process: forget which were logged.
    if hasattr(logging.Logger.warning_once, "cache_clear"):
        logging.Logger.warning_once.cache_clear()
    collect = _Collect()
    logger = logging.getLogger("transformers")
    logger.addHandler(collect)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            yield
    finally:
        logger.removeHandler(collect)
    deprecated = [m for m in collect.messages if "deprecat" in m.lower()]
    assert not deprecated, deprecated


MODELS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=128),
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_prefixes_and_both_decoders_use_no_deprecated_call(kind):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MODELS[kind](), attn_implementation="sdpa").eval()
    with no_deprecation(), shared_prefix_attention(model) as shared:
        layouts = [CopiedCacheDecoder] + ([SharedPrefixDecoder] if shared else [])
        store = PrefixStore(model, CharTokenizer(), torch.device("cpu"))
        store.get(["A prefix."])
        prefixes = store.get(["A prefix. It grows.", "Another one."])  # extends a cached one
        for layout in layouts:
            decoder = layout(model, prefixes, [0, 0, 1], max_steps=3)
            with torch.inference_mode():
                for step in range(3):
                    logits = decoder.step(
                        torch.tensor([5, 6, 7][: 3 - step]), [0, 0, 1][: 3 - step]
                    )
                    decoder.keep(torch.arange(2 - step))
            assert logits.shape[-1] == VOCAB
    assert kind != "llama" or len(layouts) == 2
