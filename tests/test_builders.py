"""The builders take loaded models as well as names (no real model is loaded here)."""

from __future__ import annotations

import pytest

import ksemstamp.assets as assets
from ksemstamp.builders import build_detector, build_scheme, build_watermarker
from ksemstamp.generation import hf
from ksemstamp.settings import ENGINES, WatermarkSettings

SETTINGS = WatermarkSettings.from_dict(
    {"partition": {"kind": "lsh"}, "mark": {"kind": "region"}, "key": "builders-test-key"}
)


def test_a_loaded_encoder_is_used_as_it_is_and_a_name_is_loaded(monkeypatch, hash_encoder):
    loaded = []
    monkeypatch.setattr(
        assets, "load_encoder", lambda spec, device="cpu": loaded.append(spec) or hash_encoder
    )
    assert build_scheme(SETTINGS, encoder=hash_encoder).encoder is hash_encoder
    assert build_detector(SETTINGS, encoder=hash_encoder).scheme.encoder is hash_encoder
    assert loaded == []
    build_scheme(SETTINGS, encoder="my-encoder")
    build_scheme(SETTINGS)
    assert loaded == ["my-encoder", SETTINGS.model.encoder]


class _Engine:
    """Stands in for ``BatchedEngine``: records the model it was given."""

    context_length, max_unit_tokens, vocab_size = None, 64, 8

    def __init__(self, model, tokenizer, config):
        self.model, self.tokenizer, self.config = model, tokenizer, config

    @classmethod
    def from_settings(cls, settings, splitter, lm=None):
        return cls(*hf.load(lm, settings.model), settings.sampling)


def test_a_loaded_lm_is_used_as_it_is_and_a_name_is_loaded(monkeypatch, hash_encoder):
    monkeypatch.setitem(ENGINES, "batched", _Engine)
    loaded = []

    def load_lm(spec, device="cpu", dtype="auto"):
        loaded.append((spec, dtype))
        return "model", "tokenizer"

    monkeypatch.setattr(assets, "load_lm", load_lm)
    held = ("my model", "my tokenizer")
    watermarker = build_watermarker(SETTINGS, lm=held, encoder=hash_encoder)
    assert (watermarker.engine.model, watermarker.engine.tokenizer) == held and loaded == []
    assert watermarker.engine.config is SETTINGS.sampling
    build_watermarker(SETTINGS, lm="gpt2", encoder=hash_encoder)
    build_watermarker(SETTINGS, encoder=hash_encoder)
    assert loaded == [("gpt2", "auto"), (SETTINGS.model.lm, "auto")]


@pytest.mark.parametrize(
    ("per_step", "plausible", "warned"),
    [(False, 0.1, True), (True, 0.1, False), (False, 0.0, False)],
)
def test_a_served_engine_that_cannot_steer_among_plausible_entries_does_not_steer(
    monkeypatch, hash_encoder, caplog, per_step, plausible, warned
):
    """Steering among the entries plausible at each step needs the logits of every step; an
    engine taking one bias per request is not steered then (said in one line), unless every
    entry is to be steered (``steer_plausible 0``)."""
    from ksemstamp.marks.direction import DirectionMark

    served = type("_Served", (_Engine,), {"steers_per_step": per_step})
    monkeypatch.setitem(ENGINES, "batched", served)
    monkeypatch.setattr(DirectionMark, "steer", lambda self, *a: setattr(self, "steering", 1))
    settings = WatermarkSettings.from_dict(
        {
            "partition": {"kind": "lsh"},
            "mark": {"kind": "direction", "context_temperature": 0.0},
            "sampling": {"steer_plausible": plausible},
            "search": {"steer": 0.5},
            "key": "builders-test-key",
        }
    )
    with caplog.at_level("WARNING", logger="ksemstamp"):
        wm = build_watermarker(settings, lm=("model", "tokenizer"), encoder=hash_encoder)
    said = [r.getMessage() for r in caplog.records if "steer_plausible" in r.getMessage()]
    assert len(said) == int(warned)
    assert (getattr(wm.mark, "steering", None) is None) == warned
