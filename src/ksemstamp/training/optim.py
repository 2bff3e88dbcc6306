"""Optimisation helpers of ``EncoderModule``: the learning-rate schedule and the frozen pooler."""

from __future__ import annotations

import torch


def warmup_factor(step: int, warmup: int, total: int) -> float:
    """The share of the learning rate at optimizer step ``step`` (from 0) of ``total``.

    A linear warmup over ``warmup`` steps, then a linear decay to 0 at ``total``. Written here
    rather than taken from transformers' ``get_linear_schedule_with_warmup`` because the step
    semantics differ: that one gives step 0 a rate of 0 (``step / warmup``), so the first batch
    trains nothing; here warmup step ``s`` gets ``(s + 1) / (warmup + 1)``. After warmup the
    two are the same.
    """
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))


def freeze_unused_pooler(encoder: torch.nn.Module) -> list[str]:
    """Stop gradients to a BERT-style ``pooler`` that sentence-transformers pooling never uses.

    Unused trainable parameters make DDP fail (or need the slower ``find_unused_parameters``).
    Freezing, rather than deleting, keeps the weights in the exported folder, so the exported
    encoder reloads with exactly the weights (and fingerprint) it was saved with.

    Returns the names of the frozen parameters.
    """
    frozen = []
    for name, param in encoder.named_parameters():
        if ".pooler." in f".{name}":
            param.requires_grad_(False)
            frozen.append(name)
    return frozen
