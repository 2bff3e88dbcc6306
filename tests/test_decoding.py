"""The sampler's logits processing equals transformers' processors on every branch."""

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ksemstamp.generation.decoding import sample_rows, warp_logits
from ksemstamp.settings import SamplingSettings

VOCAB = 64


def _reference(logits, history, config, suppress):
    """transformers' processors in the order ``generate`` applies them."""
    procs = LogitsProcessorList()
    if config.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if suppress:
        procs.append(SuppressTokensLogitsProcessor(list(suppress), device="cpu"))
    procs.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k > 0:
        procs.append(TopKLogitsWarper(config.top_k))
    if config.top_p < 1.0:
        procs.append(TopPLogitsWarper(config.top_p))
    return procs(history, logits.clone())


@pytest.mark.parametrize("penalty", [1.0, 1.05, 1.5])
@pytest.mark.parametrize("top_k", [0, 1, 5, VOCAB + 3])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.3, 0.01])
@pytest.mark.parametrize("suppress", [(), (0,), (3, 7)])
def test_warp_logits_matches_transformers(penalty, top_k, top_p, suppress):
    gen = torch.Generator().manual_seed(hash((penalty, top_k, top_p, suppress)) % 2**31)
    config = SamplingSettings(temperature=0.7, repetition_penalty=penalty, top_k=top_k, top_p=top_p)
    logits = torch.randn(6, VOCAB, generator=gen) * 3
    history = torch.randint(0, VOCAB, (6, 20), generator=gen)
    seen = torch.zeros(6, VOCAB, dtype=torch.bool).scatter_(1, history, True)
    before = logits.clone()
    got = warp_logits(logits, seen, config, suppress)
    want = _reference(logits, history, config, suppress)
    assert torch.equal(logits, before)  # the input is left alone
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(got).any(dim=-1).all()  # at least one token stays possible


def test_sample_rows_draws_from_each_rows_distribution():
    gen = torch.Generator().manual_seed(5)
    probs = torch.rand(3, VOCAB, generator=gen) ** 4
    probs[:, ::3] = 0  # never to be drawn
    probs[2] = 0
    probs[2, 7] = 1.0  # a certain draw
    probs = probs / probs.sum(-1, keepdim=True)
    draws = 20000
    counts = torch.zeros(3, VOCAB)
    for _ in range(draws // 1000):
        ids = torch.stack([sample_rows(probs, gen) for _ in range(1000)], dim=1)
        counts += torch.zeros(3, VOCAB).scatter_add_(1, ids, torch.ones(3, 1000))
    freq = counts / draws
    assert counts[:, ::3].sum() == 0 and counts[2, 7] == draws
    sd = (probs * (1 - probs) / draws).sqrt()
    assert ((freq - probs).abs() <= 4.5 * sd + 1e-4).all()
    again = torch.Generator().manual_seed(11)
    first = sample_rows(probs, again)
    assert torch.equal(first, sample_rows(probs, torch.Generator().manual_seed(11)))
