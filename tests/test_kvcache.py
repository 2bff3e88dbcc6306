"""Decoding after shared prefixes: the shared layout equals the copied one and a plain forward.

Small random models of every type in ``SHARED_PREFIX_MODELS`` (no download, no real weights), so
these run with the fast tests; tests/test_sampler.py covers the real LM.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from ksemstamp.generation.kvcache import (
    ATTENTION,
    SHARED_PREFIX_MODELS,
    CopiedCacheDecoder,
    PrefixStore,
    SharedPrefixDecoder,
    shared_prefix_attention,
    supports_shared_prefix,
)

VOCAB = 96
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "mistral": lambda: MistralConfig(**SIZES, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**SIZES),
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=8),
}


class CharTokenizer:
    """One token per character: enough for the prefix store, which only needs ``input_ids``."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [3 + ord(c) % (VOCAB - 3) for c in text]}


def _model(kind: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation="sdpa")
    return model.eval()


def _plain_logits(model, ids: list[int]) -> torch.Tensor:
    """Last-position logits of one uncached forward pass: the reference."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_every_listed_type_is_tested():
    assert set(CONFIGS) == SHARED_PREFIX_MODELS


@pytest.mark.parametrize("kind", sorted(SHARED_PREFIX_MODELS))
def test_shared_and_copied_layouts_decode_alike(kind):
    model = _model(kind)
    with shared_prefix_attention(model) as shared:
        assert shared and model.config._attn_implementation == ATTENTION
        _decode_alike(model)
    assert model.config._attn_implementation == "sdpa"  # as it was


def _decode_alike(model):
    store = PrefixStore(model, CharTokenizer(), torch.device("cpu"))
    texts = ["A short one.", "A longer prefix that needs padding in the copied layout."]
    prefixes = store.get(texts)
    group_of = [0, 0, 1, 1, 1]
    shared = SharedPrefixDecoder(model, prefixes, group_of, max_steps=6)
    copied = CopiedCacheDecoder(model, prefixes, group_of, max_steps=6)
    gen = torch.Generator().manual_seed(1)
    history = [[] for _ in group_of]
    live = list(range(len(group_of)))
    with torch.inference_mode():
        for step in range(5):
            ids = torch.randint(3, VOCAB, (len(live),), generator=gen)
            for r, tok in zip(live, ids.tolist(), strict=True):
                history[r].append(tok)
            groups = [group_of[r] for r in live]
            a, b = shared.step(ids, groups), copied.step(ids, groups)
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
            for pos, r in enumerate(live):
                want = _plain_logits(model, prefixes[group_of[r]].ids + history[r])
                assert torch.allclose(a[pos], want, atol=1e-5, rtol=1e-4)
            if step in (1, 3):  # rows finish: drop one from each end, as the sampler does
                keep = list(range(1, len(live) - 1)) if step == 1 else list(range(len(live) - 1))
                keep_t = torch.tensor(keep)
                shared.keep(keep_t)
                copied.keep(keep_t)
                live = [live[k] for k in keep]


def test_prefix_store_reuses_and_extends():
    model = _model("llama")
    store = PrefixStore(model, CharTokenizer(), torch.device("cpu"))
    first = store.get(["The first sentence."])[0]
    assert store.get(["The first sentence."])[0] is first  # same prefix: reused as it is
    longer = "The first sentence. And a second one."
    grown = store.get([longer])[0]
    assert grown.ids == CharTokenizer()(longer)["input_ids"]
    assert grown.cache.get_seq_length() == len(grown.ids)
    assert torch.allclose(grown.logits, _plain_logits(model, grown.ids), atol=1e-5, rtol=1e-4)
    assert list(store.entries) == [longer]  # what was not asked for is dropped
    # A prefix wanted as it is in the same round is not extended in place.
    a, b = store.get([longer, longer + " Third."])
    assert a is grown and a.cache.get_seq_length() == len(a.ids)
    assert b.cache.get_seq_length() == len(b.ids)


def test_unverified_models_use_the_copied_layout():
    gpt2 = AutoModelForCausalLM.from_config(
        GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=128),
        attn_implementation="sdpa",
    ).eval()
    assert not supports_shared_prefix(gpt2)
    with shared_prefix_attention(gpt2) as shared:
        assert not shared
    store = PrefixStore(gpt2, CharTokenizer(), torch.device("cpu"))
    prefixes = store.get(["Some text.", "Other text here."])
    decoder = CopiedCacheDecoder(gpt2, prefixes, [0, 1], max_steps=3)
    with torch.inference_mode():
        logits = decoder.step(torch.tensor([5, 6]), [0, 1])
    assert torch.allclose(logits[1], _plain_logits(gpt2, prefixes[1].ids + [6]), atol=1e-5)


def test_sliding_windows_are_not_shared():
    model = AutoModelForCausalLM.from_config(
        MistralConfig(**SIZES, sliding_window=16), attn_implementation="sdpa"
    )
    assert not supports_shared_prefix(model)
