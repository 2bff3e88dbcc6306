"""Key material: what the marks draw from the key, the same on every platform and device.

The valid-region table ``G`` (the ``region`` mark): for each previous region, the ``gamma * K``
regions that are valid. Default: keyed. Row ``q`` ranks the ``K`` regions by
``HMAC-SHA256(key, "q|j")`` and keeps the first ``gamma * K``; without the key the table cannot
be rebuilt, and the result is the same on every platform and device (no framework RNG involved).

Keyed directions (the ``direction`` mark): for each context region ``c``, a vector ``n_c`` of
``D`` independent standard normal components, expanded from ``HMAC-SHA256(key, c)`` with
SHAKE-256 and mapped to normals by the Box-Muller transform in float64 (numpy), so every
platform rebuilds the same directions and nothing depends on a framework's random generator.

Compatibility: ``mode="paper"`` is the reference code's table: row ``q`` keeps the first
``gamma * K`` of ``torch.randperm(K)`` drawn on the GPU by a CUDA generator seeded with
``q * 15485863``, recomputed on the CPU (``cudarand.cuda_randperm``), so the same table comes out
on every machine. It is public: anyone holding the partition can rebuild it and forge or strip
the mark.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

from .cudarand import cuda_randperm

if TYPE_CHECKING:
    from torch import Tensor

PAPER_PRIME = 15485863
"""The reference code's seed multiplier of its public table (``mode="paper"``)."""


def num_valid(num_regions: int, gamma: float) -> int:
    """``gamma * K`` as an integer; raises unless it is a whole number in ``[1, K)``."""
    count = gamma * num_regions
    if abs(count - round(count)) > 1e-9 or not 1 <= round(count) < num_regions:
        raise ValueError(
            f"gamma * K must be a whole number in [1, K): gamma={gamma}, K={num_regions} gives "
            f"{count:g}; pick gamma as a multiple of 1/K (e.g. {1 / num_regions:g})"
        )
    return int(round(count))


def start_region(num_regions: int, key: str | None, mode: str = "keyed") -> int:
    """The keyed start value: the region that stands before the first sentence of a text that
    continues no sentence (an empty prompt, a chat answer), so that sentence is drawn under the
    key like every other. ``keyed``: from an HMAC of the key, under a label no table entry uses;
    ``paper``: a public value, as the paper's table is public."""
    if mode == "keyed":
        if not key:
            raise ValueError("keyed start value needs a key")
        digest = hmac.new(key.encode(), f"start|{num_regions}".encode(), "sha256").digest()
    else:
        digest = hashlib.sha256(f"ksemstamp-paper-start|{num_regions}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % num_regions


def valid_table(num_regions: int, gamma: float, key: str | None, mode: str = "keyed") -> Tensor:
    """``(K, K)`` bool table: ``table[q, j]`` is True when region ``j`` is valid after region ``q``.

    Every row has exactly ``gamma * K`` True entries.
    """
    import torch  # here: checking a key (at every command's start) needs no torch

    n_valid = num_valid(num_regions, gamma)
    table = torch.zeros(num_regions, num_regions, dtype=torch.bool)
    for q in range(num_regions):
        if mode == "keyed":
            if not key:
                raise ValueError("keyed valid table needs a key")
            scores = [
                hmac.new(key.encode(), f"valid|{num_regions}|{q}|{j}".encode(), "sha256").digest()
                for j in range(num_regions)
            ]
            chosen = sorted(range(num_regions), key=lambda j: scores[j])[:n_valid]
            table[q, chosen] = True
        elif mode == "paper":
            table[q, cuda_randperm(num_regions, q * PAPER_PRIME)[:n_valid]] = True
        else:
            raise ValueError(f"valid-table mode must be 'keyed' or 'paper', not {mode!r}")
    return table


def keyed_directions(num_contexts: int, dim: int, key: str) -> Tensor:
    """``(num_contexts, dim)`` float32 directions with i.i.d. standard normal components.

    Row ``c`` depends only on the key, ``c`` and the shape, and is the same on every platform.
    Over uniformly random keys the rows are independent Gaussian vectors: the ``direction``
    detector's exact null law rests on this (see ``stats.direction_z``).
    """
    import numpy as np
    import torch

    if not key:
        raise ValueError("keyed directions need a key")
    if num_contexts < 1 or dim < 1:
        raise ValueError(f"need num_contexts >= 1 and dim >= 1, got {num_contexts}, {dim}")
    half = (dim + 1) // 2
    rows = []
    for c in range(num_contexts):
        seed = hmac.new(key.encode(), f"direction|{num_contexts}|{dim}|{c}".encode(), "sha256")
        words = np.frombuffer(hashlib.shake_256(seed.digest()).digest(16 * half), dtype="<u8")
        # 53-bit uniforms in (0, 1]: the logarithm below never sees zero.
        u = ((words >> np.uint64(11)).astype(np.float64) + 1.0) / 2.0**53
        radius = np.sqrt(-2.0 * np.log(u[:half]))
        angle = 2.0 * np.pi * u[half:]
        rows.append(np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:dim])
    return torch.from_numpy(np.stack(rows)).float()
