"""Shared fixtures. The real offline models are loaded once per session."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform

# Pinned outputs (tests/golden) and single-text checks sample from the LM, and a sample can flip
# on the last bit of a logit. The x86 code paths of ATen, MKL and oneDNN differ between CPUs with
# and without AVX-512, so the tests run on the AVX2 paths, which every x86-64 CPU of this kind
# has: the same inputs then give the same texts on either. Set before torch is imported. Not for
# the vLLM tests (``make test-vllm``): vLLM's CPU kernels need the CPU's own bfloat16 paths.
VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE_VLLM = os.environ.get("KSEMSTAMP_REQUIRE_VLLM") == "1"
if platform.machine().lower() in ("x86_64", "amd64") and not REQUIRE_VLLM:
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    os.environ.setdefault("MKL_CBWR", "AVX2")
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("KSEMSTAMP_KEY", "test-suite-key")
# The suite's keys are short on purpose; tests of the key-strength rule unset this.
os.environ.setdefault("KSEMSTAMP_ALLOW_WEAK_KEY", "1")

import ksemstamp.builders  # noqa: E402

# The busy-machine note reads the load average, which the suite's own work raises: said as if
# once already, so that what a command prints does not depend on the load (its own test sets
# the load it reads).
ksemstamp.builders._NOTED = True


# Fixtures that load the real offline models: a test using one is an ``e2e`` test whether or not
# its module says so, so ``-m "not e2e"`` (``make test-fast``) never loads a model.
REAL_MODEL_FIXTURES = {"encoder", "lm", "default_scheme"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    # The ``vllm`` tests need vLLM, which lives in a venv of its own (``make setup-vllm``):
    # elsewhere they are deselected (and counted so), where it is required they must run.
    if VLLM or REQUIRE_VLLM:
        return
    served = [item for item in items if item.get_closest_marker("vllm")]
    if served:
        config.hook.pytest_deselected(items=served)
        items[:] = [item for item in items if not item.get_closest_marker("vllm")]


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
    from ksemstamp.builders import build_scheme
    from ksemstamp.settings import WatermarkSettings

    return build_scheme(WatermarkSettings.from_dict({"key": "test-suite-key"}), encoder=encoder)
