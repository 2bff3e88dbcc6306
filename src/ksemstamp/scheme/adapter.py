"""Low-rank adapters (LoRA) for the sentence encoder: fine-tuned weights small enough to ship.

Fine-tuning all of all-MiniLM-L6-v2 moves 22M weights (90 MB); a rank-``r`` adapter on the
linear layers of its transformer blocks learns ``W + (alpha / r) B A`` with ``A`` ``(r, in)`` and
``B`` ``(out, r)``, a few hundred kilobytes at rank 8. ``B`` starts at zero, so training starts
from the base encoder exactly. The adapter is saved as plain tensors (``adapter_payload``) inside
a centroid file and merged into the base weights when it is loaded (``load_adapter``), so the
adapted encoder runs at the base encoder's speed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")
"""Name endings of the linear layers that get an adapter (BERT-style blocks: attention
projections, attention output, feed-forward in and out)."""


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) x A^T B^T`` with ``base`` frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.base = base
        for param in self.base.parameters():
            param.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale

    def merged(self) -> nn.Linear:
        """The base layer with the adapter added to its weight."""
        with torch.no_grad():
            self.base.weight += (self.b @ self.a) * self.scale
        return self.base


def _targets(model: nn.Module, targets: tuple[str, ...]) -> list[tuple[nn.Module, str, str]]:
    """``(parent, attribute, full name)`` of every linear layer inside a transformer block whose
    name ends with one of ``targets``."""
    found = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if (
                isinstance(child, nn.Linear)
                and ".layer." in f".{full}"
                and any(full.endswith(t) for t in targets)
            ):
                found.append((module, child_name, full))
    return found


def add_adapters(
    model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...] = TARGETS
) -> list[str]:
    """Freeze ``model`` and wrap its target layers in ``LoRALinear``; returns their names."""
    for param in model.parameters():
        param.requires_grad_(False)
    names = []
    for parent, attribute, full in _targets(model, targets):
        setattr(parent, attribute, LoRALinear(getattr(parent, attribute), rank, alpha))
        names.append(full)
    if not names:
        raise ValueError("no linear layer of the encoder matches the adapter targets")
    return names


def adapter_payload(model: nn.Module, rank: int, alpha: float) -> dict:
    """The adapters of ``model`` as plain tensors and numbers (``weights_only`` loading)."""
    state = {
        name: module.a.detach().cpu().clone()
        for name, module in model.named_modules()
        if isinstance(module, LoRALinear)
    }
    ups = {
        name: module.b.detach().cpu().clone()
        for name, module in model.named_modules()
        if isinstance(module, LoRALinear)
    }
    if not state:
        raise ValueError("the model holds no adapter")
    return {"kind": "lora", "rank": rank, "alpha": float(alpha), "down": state, "up": ups}


def merge_adapters(model: nn.Module) -> None:
    """Replace every ``LoRALinear`` of ``model`` by its base layer with the adapter merged."""
    for _, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, child_name, child.merged())


def base_fingerprint(model: nn.Module) -> str:
    """The ``assets.encoder_fingerprint`` of the base encoder under ``model``'s adapters: its
    state without the adapters, under the names the plain encoder gives it."""
    from ..assets import state_fingerprint

    adapted = {name for name, module in model.named_modules() if isinstance(module, LoRALinear)}
    state = {}
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if owner in adapted and leaf in ("a", "b"):
            continue
        parent, _, part = owner.rpartition(".")
        if part == "base" and parent in adapted:
            name = f"{parent}.{leaf}"
        state[name] = tensor
    return state_fingerprint(state)


def adapter_id(payload: dict) -> str:
    """A short hash of an adapter payload's tensors and scale."""
    from ..assets import state_fingerprint

    state = {f"down.{k}": v for k, v in payload["down"].items()}
    state |= {f"up.{k}": v for k, v in payload["up"].items()}
    return f"{payload['rank']}-{payload['alpha']}-{state_fingerprint(state)}"


def load_adapter(model: nn.Module, payload: dict) -> nn.Module:
    """Merge the adapters of ``payload`` (``adapter_payload``) into ``model``'s weights; the
    model remembers which (``ksemstamp_adapter``), so it is never adapted twice."""
    if payload.get("kind") != "lora":
        raise ValueError(f"unknown adapter kind {payload.get('kind')!r}")
    scale = float(payload["alpha"]) / int(payload["rank"])
    modules = dict(model.named_modules())
    missing = sorted(set(payload["down"]) - set(modules))
    if missing:
        raise ValueError(f"the encoder has no layers named {missing[:3]}: another architecture")
    with torch.no_grad():
        for name, down in payload["down"].items():
            layer = modules[name]
            up = payload["up"][name]
            if layer.weight.shape != (up.shape[0], down.shape[1]):
                raise ValueError(f"adapter for {name} does not fit its layer")
            layer.weight += (up.to(layer.weight) @ down.to(layer.weight)) * scale
    model.ksemstamp_adapter = adapter_id(payload)
    return model
