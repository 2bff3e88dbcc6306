"""Key/value caches for decoding many candidate rows after a few shared prefixes.

A sampling round decodes ``R`` rows that continue ``G`` prefixes (one per document, ``G <= R``).
This module holds what the batched sampler needs for that, apart from sampling itself:

* ``PrefixStore`` runs each document's prefix through the LM once and keeps its cache between
  rounds: a round that draws more candidates for the same sentence reuses it, and a prefix that
  grew by the accepted sentence only runs the new tokens (when its tokens extend the cached ones,
  which they do unless the tokenizer merges across the join).
* ``SharedPrefixDecoder`` (the default, for the model types in ``SHARED_PREFIX_MODELS``) keeps
  each prefix's keys and values once: a row stores only its own new tokens, in buffers allocated
  once per round. An attention function registered with transformers' ``AttentionInterface``
  attends each row's query to its group's prefix (one matrix product for all rows of the group)
  and to its own tokens, with one softmax over both.
* ``CopiedCacheDecoder`` (any other model) copies the prefix cache to every row, left-padded, and
  lets transformers grow it by concatenation at every step, as plain ``generate`` does.

Caches go in and out under transformers' ``cache`` name where the installed release has it (5.24
renamed ``past_key_values``, which 5.40 drops), else under ``past_key_values``: a vLLM install pins
an older transformers (``cache_kwarg``, ``output_cache``).

Why the shared layout: a copied cache holds the prefix once per row, which transformers
concatenates anew at every step and attention reads row by row; copying it to the rows and
pruning finished rows copies it again (the measurement: docs/design.md, "Constants measured
once"). Shared, the prefix is read once per group and step. Numerically the
two layouts agree to float rounding (the test suite compares them), not bit for bit: the shared
softmax runs over the prefix and the row's tokens in one piece, SDPA in blocks.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

ATTENTION = "ksemstamp_shared_prefix"
"""Name under which the shared-prefix attention is registered with transformers."""

# Model types whose attention goes through transformers' attention interface with rotary or
# learned positions taken from ``position_ids`` and no sliding window, checked against the copied
# layout in tests/test_kvcache.py on small random models of each type.
SHARED_PREFIX_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})

_KV_KWARG = "ksemstamp_kv"


def _shared_prefix_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention for the registered implementation: the shared-prefix path when a decoder is
    passed along (``ksemstamp_kv``), transformers' SDPA otherwise (prefill, plain generate)."""
    kv = kwargs.pop(_KV_KWARG, None)
    if kv is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    for name in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"shared-prefix attention does not support {name}")
    return kv.attend(module.layer_idx, query, key, value, kwargs.get("scaling"))


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _shared_prefix_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def supports_shared_prefix(model) -> bool:
    """Whether ``model`` can decode with ``SharedPrefixDecoder``: a verified model type whose
    attention is SDPA (or already this module's), with no sliding window."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or []
    return bool(
        getattr(model, "_supports_attention_backend", False)
        and config.model_type in SHARED_PREFIX_MODELS
        and getattr(config, "_attn_implementation", None) in ("sdpa", ATTENTION)
        and not getattr(config, "sliding_window", None)
        and all(kind == "full_attention" for kind in layer_types)
    )


@contextmanager
def shared_prefix_attention(model) -> Iterator[bool]:
    """Within the block, ``model`` attends with the shared-prefix attention if it supports it
    (yields whether it does); afterwards its attention implementation is the one it had.

    Calls without a ``SharedPrefixDecoder`` (prefill, ``generate``) still run transformers' SDPA,
    so the model behaves as before everywhere inside the block too. A switch costs about 0.3 ms.
    """
    if not supports_shared_prefix(model):
        yield False
        return
    previous = model.config._attn_implementation
    if previous != ATTENTION:
        _register()
        model.set_attn_implementation(ATTENTION)
    try:
        yield True
    finally:
        if previous != ATTENTION:
            model.set_attn_implementation(previous)


def cache_kwarg(model) -> str:
    """The name ``model.forward`` takes its key/value cache by: ``cache`` (transformers 5.24
    and later), else ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out) -> object:
    """The cache a forward pass returned, under either of transformers' names."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


# ---------------------------------------------------------------------- prefixes


@dataclass
class Prefix:
    """A prefix run through the LM: its token ids, its cache (batch 1) and its last logits."""

    ids: list[int]
    cache: object  # transformers DynamicCache holding the prefix (batch 1)
    logits: Tensor  # (V,) next-token logits after the prefix

    def __len__(self) -> int:
        return len(self.ids)

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Keys and values of layer ``i``, ``(heads, length, head_dim)`` each."""
        layer = self.cache.layers[i]
        return layer.keys[0], layer.values[0]

    @property
    def num_layers(self) -> int:
        return len(self.cache.layers)


class PrefixStore:
    """Prefix caches kept from one round to the next.

    ``get`` returns one ``Prefix`` per requested text: the same object again for a text seen in
    the previous call, an extension of a previous prefix whose tokens begin the new ones (only the
    new tokens run through the LM), else a fresh prefill. Prefixes not requested are dropped, so
    the store holds at most one round's prefixes.
    """

    def __init__(self, model, tokenizer, device: torch.device) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.entries: dict[str, Prefix] = {}
        params = inspect.signature(model.forward).parameters
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._cache_kwarg = cache_kwarg(model)

    def clear(self) -> None:
        self.entries = {}

    def get(self, texts: Sequence[str]) -> list[Prefix]:
        wanted = set(texts)
        kept: dict[str, Prefix] = {}
        for text in texts:
            if text in kept:
                continue
            if text in self.entries:
                kept[text] = self.entries[text]
                continue
            ids = self.tokenizer(text)["input_ids"]
            base = self._base_for(ids, wanted, kept)
            kept[text] = self._run(ids, base)
        self.entries = kept
        return [kept[t] for t in texts]

    def _base_for(self, ids: list[int], wanted: set[str], kept: dict[str, Prefix]) -> str | None:
        """The longest stored prefix that ``ids`` extend, if no one else needs it as it is."""
        best, best_len = None, 0
        for text, entry in self.entries.items():
            if text in wanted or text in kept or not 0 < len(entry) < len(ids):
                continue
            if len(entry) > best_len and ids[: len(entry)] == entry.ids:
                best, best_len = text, len(entry)
        return best

    @torch.inference_mode()
    def _run(self, ids: list[int], base: str | None) -> Prefix:
        if base is None:
            start, cache = 0, None
        else:
            # The base's cache grows in place: take it out of the store first.
            entry = self.entries.pop(base)
            start, cache = len(entry), entry.cache
        new = torch.tensor([ids[start:]], device=self.device)
        out = self.model(
            input_ids=new,
            position_ids=torch.arange(start, len(ids), device=self.device)[None],
            use_cache=True,
            **{self._cache_kwarg: cache},
            **self._last_only,
        )
        return Prefix(ids, output_cache(out), out.logits[0, -1])


# ---------------------------------------------------------------------- decoders


def _group_ranges(live_group: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, stop, group)`` of each group's rows; rows stay ordered by group."""
    ranges, start = [], 0
    for r in range(1, len(live_group) + 1):
        if r == len(live_group) or live_group[r] != live_group[start]:
            ranges.append((start, r, live_group[start]))
            start = r
    return ranges


class SharedPrefixDecoder:
    """Decodes rows after shared prefixes: each row stores only its own tokens' keys and values.

    Args:
        model: the LM, switched with ``enable_shared_prefix``.
        prefixes: one ``Prefix`` per group.
        group_of: each row's group, rows ordered by group.
        max_steps: most forward steps a row can take (buffers are allocated once for them).
    """

    def __init__(
        self, model, prefixes: Sequence[Prefix], group_of: Sequence[int], max_steps: int
    ) -> None:
        self.model = model
        self.prefixes = prefixes
        self.layers = prefixes[0].num_layers
        k0, _ = prefixes[0].layer(0)
        heads, _, dim = k0.shape
        shape = (self.layers, len(group_of), heads, max(1, max_steps), dim)
        self.keys = k0.new_empty(shape)
        self.values = k0.new_empty(shape)
        self.lengths = torch.tensor([len(p) for p in prefixes], device=k0.device)
        self.steps = 0
        self.ranges: list[tuple[int, int, int]] = []

    def step(self, next_ids: Tensor, live_group: Sequence[int]) -> Tensor:
        """Feed one token per live row; returns the next logits ``(rows, V)``."""
        groups = torch.tensor(live_group, device=next_ids.device)
        positions = (self.lengths[groups] + self.steps)[:, None]
        self.ranges = _group_ranges(live_group)
        out = self.model(
            input_ids=next_ids[:, None],
            position_ids=positions,
            use_cache=False,
            **{_KV_KWARG: self},
        )
        self.steps += 1
        return out.logits[:, -1, :]

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (positions in the live batch, ascending) for the next steps."""
        t = self.steps
        n = len(rows)
        self.keys[:, :n, :, :t] = self.keys[:, rows, :, :t]
        self.values[:, :n, :, :t] = self.values[:, rows, :, :t]

    def attend(
        self, layer: int, query: Tensor, key: Tensor, value: Tensor, scaling: float | None
    ) -> tuple[Tensor, None]:
        """Attention of one layer: ``query`` ``(R, H, 1, D)`` and this step's ``key``/``value``
        ``(R, Hkv, 1, D)``; returns ``(R, 1, H, D)`` as transformers' attention functions do."""
        rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        rep = heads // kv_heads
        t = self.steps
        own_k, own_v = self.keys[layer], self.values[layer]
        own_k[:rows, :, t] = key[:, :, 0]
        own_v[:rows, :, t] = value[:, :, 0]
        scale = dim**-0.5 if scaling is None else scaling
        q = query[:, :, 0].reshape(rows, kv_heads, rep, dim)
        outs = []
        for a, b, g in self.ranges:
            pk, pv = self.prefixes[g].layer(layer)  # (Hkv, Lp, D)
            n, lp = b - a, pk.shape[1]
            # All rows of the group against the shared prefix: one product per kv head.
            qg = q[a:b].permute(1, 0, 2, 3).reshape(kv_heads, n * rep, dim)
            to_prefix = (qg @ pk.transpose(1, 2)).view(kv_heads, n, rep, lp).permute(1, 0, 2, 3)
            to_own = q[a:b] @ own_k[a:b, :, : t + 1].transpose(-1, -2)  # (n, Hkv, rep, t + 1)
            weights = torch.cat([to_prefix, to_own], dim=-1).float().mul_(scale).softmax(-1)
            weights = weights.to(query.dtype)
            wp = weights[..., :lp].permute(1, 0, 2, 3).reshape(kv_heads, n * rep, lp)
            out = (wp @ pv).view(kv_heads, n, rep, dim).permute(1, 0, 2, 3)
            out = out + weights[..., lp:] @ own_v[a:b, :, : t + 1]
            outs.append(out.reshape(n, 1, heads, dim))
        return (outs[0] if len(outs) == 1 else torch.cat(outs)), None


class CopiedCacheDecoder:
    """Decodes rows with the prefix cache copied to every row (left-padded): transformers'
    default cache, for models the shared layout is not verified for. Same interface as
    ``SharedPrefixDecoder``."""

    def __init__(
        self, model, prefixes: Sequence[Prefix], group_of: Sequence[int], max_steps: int
    ) -> None:
        from transformers import DynamicCache

        self.model = model
        device = prefixes[0].logits.device
        width = max(len(p) for p in prefixes)
        index = torch.tensor(list(group_of), device=device)
        layers = []
        for i in range(prefixes[0].num_layers):
            padded = []
            for states in zip(*(p.layer(i) for p in prefixes), strict=True):
                batch = states[0].new_zeros(
                    (len(prefixes), *states[0].shape[:1], width, states[0].shape[-1])
                )
                for g, s in enumerate(states):
                    batch[g, :, width - s.shape[1] :] = s
                padded.append(batch[index])
            layers.append(tuple(padded))
        self.cache = DynamicCache(layers)
        mask = torch.zeros(len(prefixes), width, dtype=torch.long, device=device)
        for g, p in enumerate(prefixes):
            mask[g, width - len(p) :] = 1
        self.mask = mask[index]
        self.lengths = torch.tensor([len(p) for p in prefixes], device=device)
        self.steps = 0

    def step(self, next_ids: Tensor, live_group: Sequence[int]) -> Tensor:
        groups = torch.tensor(live_group, device=next_ids.device)
        positions = (self.lengths[groups] + self.steps)[:, None]
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(live_group), 1)], dim=1)
        out = self.model(
            input_ids=next_ids[:, None],
            attention_mask=self.mask,
            position_ids=positions,
            use_cache=True,
            **{cache_kwarg(self.model): self.cache},
        )
        self.cache = output_cache(out)
        self.steps += 1
        return out.logits[:, -1, :]

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
