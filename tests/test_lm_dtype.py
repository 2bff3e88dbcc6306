"""The generator's weight format (``lm_dtype``) and torch threads (``threads``) settings."""

from __future__ import annotations

import pytest
import torch

import ksemstamp.assets as assets
from ksemstamp.assets import LM_DTYPES, load_lm, resolve_lm_dtype
from ksemstamp.builders import apply_threads, build_watermarker
from ksemstamp.settings import WatermarkSettings


def test_auto_follows_native_bf16(monkeypatch):
    monkeypatch.setattr(assets, "native_bf16", lambda device="cpu": True)
    assert resolve_lm_dtype("auto") == "bf16"
    monkeypatch.setattr(assets, "native_bf16", lambda device="cpu": False)
    assert resolve_lm_dtype("auto") == "fp32"
    for explicit in ("fp32", "bf16", "int8"):
        assert resolve_lm_dtype(explicit) == explicit
    with pytest.raises(ValueError, match="lm_dtype"):
        resolve_lm_dtype("fp16")


def test_config_checks_lm_dtype_and_threads():
    assert set(LM_DTYPES) == {"auto", "fp32", "bf16", "int8"}
    with pytest.raises(ValueError) as err:
        WatermarkSettings.from_dict({"model": {"lm_dtype": "float16", "threads": 0}})
    assert "lm_dtype" in str(err.value) and "threads" in str(err.value)
    assert (
        WatermarkSettings().model.lm_dtype == "auto" and WatermarkSettings().model.threads is None
    )


def test_build_watermarker_loads_the_lm_in_the_configured_format(monkeypatch, hash_encoder):
    seen = {}

    class Stop(Exception):
        pass

    def fake_load_lm(spec, device="cpu", dtype="fp32"):
        seen.update(spec=spec, device=device, dtype=dtype)
        raise Stop

    monkeypatch.setattr(assets, "load_lm", fake_load_lm)
    cfg = WatermarkSettings.from_dict(
        {"partition": {"kind": "lsh"}, "model": {"lm_dtype": "int8"}, "key": "k"}
    )
    from ksemstamp.builders import build_scheme

    scheme = build_scheme(cfg, encoder=hash_encoder)
    with pytest.raises(Stop):
        build_watermarker(cfg, scheme)
    assert seen["dtype"] == "int8"


def test_threads_setting_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        apply_threads(WatermarkSettings.from_dict({"model": {"threads": 1}}))
        assert torch.get_num_threads() == 1
        apply_threads(WatermarkSettings())  # None: left as it is
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.e2e
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_reduced_formats_load_and_sample_sentences(dtype):
    from test_batched_engine import draw

    from ksemstamp.generation.batched import BatchedEngine
    from ksemstamp.settings import SamplingSettings
    from ksemstamp.text.splitter import get_splitter

    model, tokenizer = load_lm(dtype=dtype)
    if dtype == "bf16":
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    else:
        layer = model.model.layers[0]
        quantized = torch.ao.nn.quantized.dynamic.Linear
        assert isinstance(layer.self_attn.q_proj, quantized)
        assert isinstance(model.get_output_embeddings(), quantized)
        assert isinstance(layer.mlp.down_proj, torch.nn.Linear)  # the MLP stays in float
    prompt = "The city council approved a new budget on Monday. The plan raises school spending."
    splitter = get_splitter()
    engine = BatchedEngine(model, tokenizer, splitter, SamplingSettings())
    result = draw(
        engine,
        [prompt],
        [3],
        lambda g, t: [(False, None)] * len(t),
        torch.Generator().manual_seed(0),
        [splitter.split(prompt)[-1]],
    )[0]
    texts = [c.text for c in result.candidates]
    assert len(texts) == 3 and any(texts)
    for text in filter(None, texts):
        assert splitter.split(text) == [text]


def test_a_busy_machine_is_said_once_in_one_line(monkeypatch, caplog):
    import ksemstamp.builders as builders
    from ksemstamp.builders import busy_note

    assert busy_note(0.2, 2, 2) is None and busy_note(1.9, 2, 1) is None
    assert busy_note(1.0, 8, 4) is None  # room enough
    note = busy_note(1.9, 2, 2)
    assert note is not None and "load average 1.9 on 2 cores" in note and "\n" not in note
    assert "--model.threads 1" in note
    monkeypatch.setattr(builders, "_NOTED", False)
    monkeypatch.setattr(builders, "machine_load", lambda: 2.0)
    monkeypatch.setattr(builders, "usable_cores", lambda: 2)
    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="ksemstamp"):
            apply_threads(WatermarkSettings.from_dict({"model": {"threads": 2}}))
            apply_threads(WatermarkSettings.from_dict({"model": {"threads": 2}}))
    finally:
        torch.set_num_threads(before)
    assert [r.getMessage() for r in caplog.records].count(busy_note(2.0, 2, 2)) == 1


def test_on_a_busy_machine_importing_ksemstamp_first_makes_openmp_threads_sleep():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = (
        "import os, sys; os.getloadavg = lambda: (float(sys.argv[1]), 0.0, 0.0); "
        "os.sched_getaffinity = lambda pid: {0, 1}; import ksemstamp; "
        "print(os.environ.get('OMP_WAIT_POLICY', 'unset'))"
    )

    def policy(load: str, **extra: str) -> str:
        run = [sys.executable, "-c", code, load]
        done = subprocess.run(run, env={**env, **extra}, capture_output=True, text=True)
        return done.stdout.strip()

    assert policy("1.9") == "PASSIVE"  # another job keeps a core of two busy
    assert policy("0.2") == "unset"  # alone: OpenMP's own policy, the faster one there
    assert policy("1.9", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"  # an explicit setting wins
