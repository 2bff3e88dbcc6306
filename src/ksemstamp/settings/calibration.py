"""What a calibration run measures (``CalibrationSettings``): a module of its own, so that the
``calibrate`` command's options are known without loading the models the run needs."""

from __future__ import annotations

from dataclasses import dataclass

from ..text.corpora import SOURCES

ALPHAS = (0.001, 0.01, 0.05)


@dataclass(frozen=True)
class CalibrationSettings:
    """What to measure. ``max_texts`` human texts, ``num_keys`` keyed tables."""

    sources: tuple[str, ...] = SOURCES
    """Human sources: news (held-out val and test splits), parliament, tweets."""
    max_texts: int = 3000
    """Human texts in all, shared among the sources."""
    num_keys: int = 50
    """Random keyed tables; the rates are reported over them (at least 2)."""
    window_words: int = 150
    """Words per human text (about 200 tokens)."""
    simulated_per_key: int = 200
    """Simulated watermarked region sequences per key (0: none)."""
    seed: int = 0
    """Seed of the keys and of the sampling."""
    alphas: tuple[float, ...] = ALPHAS
    """Levels at which false-positive rates and power are reported."""
    watermarked: tuple[str, ...] = ()
    """JSONL files written by ``generate`` under the configured key (real power)."""
    reuse_embeddings: bool = True
    """Keep sentence embeddings on disk (``embedding_store``) and reuse them in later runs."""

    def __post_init__(self) -> None:
        problems = []
        if self.max_texts < 1:
            problems.append(f"max_texts must be >= 1, got {self.max_texts}")
        if self.num_keys < 2:
            problems.append(f"num_keys must be >= 2 (spread over keys), got {self.num_keys}")
        if self.window_words < 1:
            problems.append(f"window_words must be >= 1, got {self.window_words}")
        if self.simulated_per_key < 0:
            problems.append(f"simulated_per_key must be >= 0, got {self.simulated_per_key}")
        if not self.sources:
            problems.append("sources must name at least one source")
        if problems:
            raise ValueError("invalid calibration settings:\n  " + "\n  ".join(problems))
