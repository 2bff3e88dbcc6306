"""The steering table's cache on disk: the token vectors embedded so far, with a checksum.

A file holds ``ids`` (the vocabulary entries known) and their fp16 ``vectors``. One that does
not load or does not match is set aside with one warning and the table starts again; a cache
that cannot be written is warned about once per folder and the table kept in memory.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger("ksemstamp.generation.steering")

_UNWRITABLE: set[str] = set()


def read_rows(path: Path, vocab: int, dim: int, quiet: bool = False) -> tuple[Tensor, Tensor]:
    """``(ids, vectors)`` cached at ``path``: long ``(n,)`` and fp16 ``(n, dim)``; none when
    there is no file, or when it does not load or does not match (then one warning says so,
    unless ``quiet``)."""
    nothing = torch.zeros(0, dtype=torch.long), torch.zeros(0, dim, dtype=torch.float16)
    if not path.exists():
        return nothing
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        ids = saved.get("ids") if isinstance(saved, dict) else None
        vectors = saved.get("vectors") if isinstance(saved, dict) else None
        problem = None
        if not isinstance(ids, Tensor) or ids.dtype != torch.long or ids.ndim != 1:
            problem = "no entry ids"
        elif not isinstance(vectors, Tensor) or vectors.dtype != torch.float16:
            problem = "no fp16 vectors"
        elif tuple(vectors.shape) != (len(ids), dim):
            problem = f"vectors of shape {tuple(vectors.shape)}, not ({len(ids)}, {dim})"
        elif len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            problem = f"entries outside a vocabulary of {vocab}"
        elif len(ids.unique()) != len(ids):
            problem = "an entry twice"
        elif not bool(torch.isfinite(vectors).all()):
            problem = "values that are not finite"
        elif saved.get("sha256") != _digest(ids, vectors):
            problem = "a checksum that does not match its values"
    except Exception as err:  # truncated, empty, random bytes, another layout
        problem = f"unreadable ({type(err).__name__})"
    if problem is None:
        return ids, vectors
    if not quiet:
        logger.warning("steering table %s is damaged (%s): building it again", path, problem)
    return nothing


def write_rows(path: Path, ids: Tensor, vectors: Tensor) -> None:
    """Store ``ids`` and their fp16 ``vectors`` at ``path`` with a checksum, atomically."""
    ids, vectors = ids.long().cpu().contiguous(), vectors.half().cpu().contiguous()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"ids": ids, "vectors": vectors, "sha256": _digest(ids, vectors)}, tmp)
        tmp.replace(path)
    except OSError as err:
        if str(path.parent) not in _UNWRITABLE:
            _UNWRITABLE.add(str(path.parent))
            logger.warning(
                "cannot write the steering table to %s (%s): it is used from memory and "
                "built again next run (KSEMSTAMP_CACHE moves the cache)",
                path.parent, err.strerror or err,
            )  # fmt: skip


def _digest(ids: Tensor, vectors: Tensor) -> str:
    digest = hashlib.sha256(ids.contiguous().numpy().tobytes())
    digest.update(vectors.contiguous().numpy().tobytes())
    return digest.hexdigest()
