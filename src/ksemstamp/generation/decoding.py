"""The next-token logits of the sampling settings (``SamplingSettings``), shared by both candidate
samplers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..settings.groups import SamplingSettings


def warp_logits(
    logits: Tensor,
    seen: Tensor,
    config: SamplingSettings,
    suppress: Sequence[int] = (),
    bias: Any = None,
) -> Tensor:
    """Next-token logits ``(R, V)`` after the decoding settings, in transformers' order:
    repetition penalty on the ``seen`` tokens (``(R, V)`` bool), suppressed tokens, the logit
    ``bias`` of steering (``(R, V)`` or a ``SteerBias``, optional: ``steer_logits`` with
    ``config.steer_plausible``), temperature, top-k, top-p. Equal to transformers' processors
    (tests check every branch); written out because the sampler keeps a seen-token mask per row
    instead of the full token history.

    The input is left alone; the work is done in place on one float32 copy, and the penalty
    touches only the seen entries (a few hundred per row, against a vocabulary of ~50k), since
    this runs for every row at every decoding step.
    """
    logits = logits.to(torch.float32, copy=True)
    if config.repetition_penalty != 1.0:
        rows, cols = seen.nonzero(as_tuple=True)
        hit = logits[rows, cols]
        logits[rows, cols] = torch.where(
            hit > 0, hit / config.repetition_penalty, hit * config.repetition_penalty
        )
    if suppress:
        logits[:, list(suppress)] = float("-inf")
    if bias is not None:
        logits = steer_logits(logits, bias, config.steer_plausible, config.temperature)
    logits.div_(config.temperature)
    if config.top_k > 0:
        kth = torch.topk(logits, min(config.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits.masked_fill_(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= config.top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def steer_logits(logits: Tensor, bias: Any, plausible: float, temperature: float) -> Tensor:
    """``logits`` ``(R, V)`` (float32, before the temperature) steered by ``bias`` (``(R, V)``,
    or a ``steering.SteerBias``, asked only for the entries plausible now) among the plausible
    entries only, as a new tensor.

    An entry is plausible at this step when, sampled at ``temperature``, it is at least
    ``plausible`` times as probable as the most likely entry (min-p's rule). The bias moves
    probability among the plausible entries and nowhere else: they get it, shifted so that
    together they keep the probability they had, and every other entry keeps its own. Steering
    then reorders what the LM would say anyway; it never lifts a fragment the LM did not
    consider into the text (a bias added everywhere does, one step in a few hundred, and one
    such token derails the rest of a unit). ``plausible`` 0: the bias is added everywhere.
    """
    if plausible <= 0:
        dense = bias if isinstance(bias, Tensor) else bias.dense()
        return logits + dense.to(logits.device)
    tempered = logits / temperature
    top = tempered.max(dim=-1, keepdim=True).values
    inside = tempered >= top + math.log(plausible)
    bias = bias.to(logits.device) if isinstance(bias, Tensor) else bias.among(inside)
    steered = torch.where(inside, bias, torch.zeros_like(bias))
    ninf = torch.tensor(float("-inf"), device=logits.device)
    before = torch.where(inside, tempered, ninf).logsumexp(dim=-1, keepdim=True)
    after = torch.where(inside, tempered + steered / temperature, ninf).logsumexp(
        dim=-1, keepdim=True
    )
    shift = torch.where(inside, temperature * (before - after), torch.zeros_like(bias))
    return logits + steered + shift


def sample_rows(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``probs`` ``(R, V)`` by inverting each row's cumulative
    distribution at one uniform draw.

    The same distribution as ``torch.multinomial(probs, 1)``, which draws one exponential number
    per vocabulary entry (~50k per row and step; about a tenth of a 32-row decoding step on CPU).
    The cumulative sums are float64, so that tokens far below float32's resolution of 1 keep
    their probability. The uniform numbers come from ``generator`` on its own device (the
    documents' generators are CPU ones) and move to the rows' device: the same seed draws the
    same numbers whatever device the LM is on.
    """
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    u = uniforms(probs.shape[0], generator, probs.device)
    ids = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    # u * total < total except by rounding at the very top (odds ~1e-16): then take the most
    # likely token rather than step past the last one or onto a token of probability 0.
    ids = ids.clamp_(max=probs.shape[-1] - 1)
    stray = probs.gather(1, ids[:, None])[:, 0] <= 0
    if stray.any():
        ids[stray] = probs[stray].argmax(dim=-1)
    return ids


def uniforms(rows: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """``(rows, 1)`` float64 uniform numbers on ``device``, drawn by ``generator`` on its own
    device (``None``: torch's global generator for ``device``)."""
    if generator is None:
        return torch.rand(rows, 1, dtype=torch.float64, device=device)
    u = torch.rand(rows, 1, generator=generator, dtype=torch.float64, device=generator.device)
    return u.to(device)
