"""Decoding settings and the next-token logits they give, shared by both candidate samplers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SamplingConfig:
    """Decoding settings. Defaults are the paper's: temperature 0.7, repetition penalty 1.05,
    no top-k and no nucleus truncation."""

    temperature: float = 0.7
    repetition_penalty: float = 1.05
    top_k: int = 0
    top_p: float = 1.0
    max_sentence_tokens: int = 64
    suppress_eos: bool = True

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_sentence_tokens < 1:
            raise ValueError(f"max_sentence_tokens must be >= 1, got {self.max_sentence_tokens}")


def warp_logits(
    logits: Tensor, seen: Tensor, config: SamplingConfig, suppress: Sequence[int] = ()
) -> Tensor:
    """Next-token logits ``(R, V)`` after the decoding settings, in transformers' order:
    repetition penalty on the ``seen`` tokens (``(R, V)`` bool), suppressed tokens, temperature,
    top-k, top-p. Equal to transformers' processors (tests check every branch); written out
    because the sampler keeps a seen-token mask per row instead of the full token history."""
    logits = logits.float()
    if config.repetition_penalty != 1.0:
        penalised = torch.where(
            logits > 0, logits / config.repetition_penalty, logits * config.repetition_penalty
        )
        logits = torch.where(seen, penalised, logits)
    if suppress:
        columns = torch.tensor(list(suppress), device=logits.device)
        logits = logits.index_fill(1, columns, float("-inf"))
    logits = logits / config.temperature
    if config.top_k > 0:
        kth = torch.topk(logits, min(config.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= config.top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits
