"""Steering among each step's plausible entries inside vLLM's sampler.

A served engine takes one logit bias per request, fixed before the first token, so it cannot do
what the Hugging Face engines do at every step: add the mark's bias only to the entries the LM
finds plausible at that step (``decoding.steer_logits``). vLLM in this process can: its V1
sampler runs batch-level logits processors, and ``PlausibleSteer`` is one. A request that is
steered carries a handle in ``SamplingParams.extra_args`` (``HANDLE``); the handle names a
``Steered`` entry here (``STEERED``: the row's ``steering.SteerBias``, the plausibility rule and
the temperature), and at each step the processor asks that bias for the step's plausible entries
only (embedding what is new, as the Hugging Face engines do) and applies ``steer_logits`` to the
steered rows of the batch.

The handle is looked up in this process's memory, so the sampler must run in this process: the
engine core in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and one worker
(``tensor_parallel_size`` 1). ``vllm_engine.build_llm`` builds such an LLM when asked to steer;
a step that finds a handle it does not know raises, rather than sampling unsteered in silence.

vLLM applies logits processors before its repetition penalty and temperature; the Hugging Face
engines steer after the penalty. The plausible set is then read from logits before a penalty of
1.05 on the tokens already used: the same set but for entries at its edge.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from .decoding import steer_logits
from .steering import SteerBias

try:
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates
except ImportError:  # vLLM is not installed: the module imports, nothing in it is used
    LogitsProcessor = object  # type: ignore[assignment,misc]

HANDLE = "ksemstamp_steer"
"""The key of ``SamplingParams.extra_args`` that names a request's ``Steered`` entry."""


@dataclass
class Steered:
    """What one steered request is steered by: a one-row ``SteerBias``, the share of the
    likeliest entry's probability that makes an entry plausible (``sampling.steer_plausible``)
    and the sampling temperature."""

    bias: SteerBias
    plausible: float
    temperature: float


STEERED: dict[str, Steered] = {}
"""The steered requests of this process, by handle (``register``, ``release``)."""
APPLIED = [0]
"""Rows steered so far in this process, one per row and step (a check that steering runs)."""

_HANDLES = itertools.count()


def register(steered: Steered) -> str:
    """A new handle for ``steered``: pass it as ``extra_args={HANDLE: handle}``."""
    handle = f"steer-{next(_HANDLES)}"
    STEERED[handle] = steered
    return handle


def release(handle: str) -> Steered | None:
    """Forget ``handle``'s entry (its request finished or stopped); the entry, if known."""
    return STEERED.pop(handle, None)


class PlausibleSteer(LogitsProcessor):
    """vLLM's logits processor for the steered rows of a batch (see the module docstring)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, str] = {}  # batch index -> handle

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """A handle must be a string (the entry itself is looked up when the row is sampled)."""
        handle = (sampling_params.extra_args or {}).get(HANDLE)
        if handle is not None and not isinstance(handle, str):
            raise ValueError(f"extra_args[{HANDLE!r}] must be a string, got {handle!r}")

    def is_argmax_invariant(self) -> bool:
        """Steering changes which entry is likeliest."""
        return False

    def update_state(self, batch_update: Any) -> None:
        """Follow requests added to, removed from and moved within the batch (a vLLM
        ``BatchUpdate`` or ``None``)."""
        process_dict_updates(
            self.rows, batch_update, lambda params, _, __: (params.extra_args or {}).get(HANDLE)
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(batch, V)`` with each steered row steered among its plausible
        entries."""
        if not self.rows:
            return logits
        groups: dict[tuple[int, float, float], list[tuple[int, Steered]]] = {}
        for index, handle in self.rows.items():
            steered = STEERED.get(handle)
            if steered is None:
                raise RuntimeError(
                    f"steered request {handle!r} is unknown to the sampler's process: vLLM must "
                    "run its engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) "
                    "with one worker to steer among plausible entries"
                )
            steering = steered.bias.steering
            groups.setdefault((id(steering), steered.plausible, steered.temperature), []).append(
                (index, steered)
            )
        for (_, plausible, temperature), members in groups.items():
            index = torch.tensor([i for i, _ in members], device=logits.device)
            weights = torch.cat([s.bias.weights for _, s in members])
            bias = SteerBias(members[0][1].bias.steering, weights)
            width = bias.shape[1]
            rows = logits[index, :width].float()
            logits[index, :width] = steer_logits(rows, bias, plausible, temperature).to(
                logits.dtype
            )
            APPLIED[0] += len(members)
        return logits
