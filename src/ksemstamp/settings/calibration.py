"""What a calibration run measures (``CalibrationSettings``): a module of its own, so that the
``calibrate`` command's options are known without loading the models the run needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ..text.corpora import SOURCES
from .checks import SEED, Range, bound_problems

ALPHAS = (0.001, 0.01, 0.05)


@dataclass(frozen=True)
class CalibrationSettings:
    """What to measure. ``max_texts`` human texts, ``num_keys`` keyed tables."""

    sources: tuple[str, ...] = SOURCES
    """Human sources: news (held-out val and test splits), parliament, tweets."""
    max_texts: Annotated[int, Range(1, 10_000_000)] = 3000
    """Human texts in all, shared among the sources."""
    num_keys: Annotated[int, Range(2, 100_000)] = 50
    """Random keyed tables; the rates are reported over them (at least 2)."""
    window_words: Annotated[int, Range(1, 100_000)] = 150
    """Words per human text (about 200 tokens)."""
    simulated_per_key: Annotated[int, Range(0, 1_000_000)] = 200
    """Simulated watermarked region sequences per key (0: none)."""
    seed: Annotated[int, SEED] = 0
    """Seed of the keys and of the sampling."""
    alphas: tuple[float, ...] = ALPHAS
    """Levels at which false-positive rates and power are reported."""
    watermarked: tuple[str, ...] = ()
    """JSONL files written by ``generate`` under the configured key (real power)."""
    reuse_embeddings: bool = True
    """Keep sentence embeddings on disk (``embedding_store``) and reuse them in later runs."""

    def __post_init__(self) -> None:
        problems = bound_problems(self)
        if not self.sources:
            problems.append("sources must name at least one source")
        if problems:
            raise ValueError("invalid calibration settings:\n  " + "\n  ".join(problems))
