"""Shared fixtures. The real offline models are loaded once per session."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("KSEMSTAMP_KEY", "test-suite-key")


# Fixtures that load the real offline models: a test using one is an ``e2e`` test whether or not
# its module says so, so ``-m "not e2e"`` (``make test-fast``) never loads a model.
REAL_MODEL_FIXTURES = {"encoder", "lm", "default_scheme"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


class HashEncoder:
    """A stand-in sentence encoder: a fixed pseudo-random unit vector per distinct sentence."""

    def __init__(self, dim: int = 32) -> None:
        self.dim = dim
        self.calls = 0

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, sentences, batch_size=32, convert_to_tensor=True, show_progress_bar=False):
        self.calls += 1
        rows = []
        for s in sentences:
            seed = int(hashlib.sha256(s.encode()).hexdigest()[:8], 16)
            rows.append(torch.randn(self.dim, generator=torch.Generator().manual_seed(seed)))
        return torch.nn.functional.normalize(torch.stack(rows), dim=-1)


@pytest.fixture
def ten_second_clock(monkeypatch):
    """The watermarker's clock, advanced 10 s at every reading (for ``sentence_time_budget``)."""
    import ksemstamp.watermarker as module

    readings = iter(range(0, 100_000, 10))

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return float(next(readings))

    monkeypatch.setattr(module, "time", Clock)


@pytest.fixture
def hash_encoder() -> HashEncoder:
    return HashEncoder()


@pytest.fixture(scope="session")
def encoder():
    from ksemstamp.assets import load_encoder

    return load_encoder()


@pytest.fixture(scope="session")
def lm():
    from ksemstamp.assets import load_lm

    return load_lm()


@pytest.fixture(scope="session")
def default_scheme(encoder):
    from ksemstamp.config import WatermarkConfig, build_scheme

    return build_scheme(WatermarkConfig(key="test-suite-key"), encoder=encoder)
