"""The model cache: a GGUF file is converted once per content, whatever path it is found at."""

from __future__ import annotations

import json

import pytest


class _Converted:
    """Stands in for a loaded model or tokenizer: ``save_pretrained`` writes its folder."""

    conversions: list[str] = []

    def __init__(self, folder: str, name: str) -> None:
        self.source = f"{folder}/{name}"
        self.config = type("Config", (), {})()

    @classmethod
    def from_pretrained(cls, folder, gguf_file=None, **kwargs):
        cls.conversions.append(f"{folder}/{gguf_file}")
        return cls(folder, gguf_file)

    def save_pretrained(self, path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps({"from": self.source}))


@pytest.fixture
def fake_conversion(monkeypatch, tmp_path):
    import transformers

    monkeypatch.setenv("KSEMSTAMP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers, "AutoModelForCausalLM", _Converted)
    monkeypatch.setattr(transformers, "AutoTokenizer", _Converted)
    _Converted.conversions = []
    return _Converted.conversions


def _gguf(path, content: bytes = b"GGUF weights"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_one_conversion_serves_every_checkout_holding_the_same_file(tmp_path, fake_conversion):
    from ksemstamp.assets import cache_dir, convert_gguf

    first = convert_gguf(_gguf(tmp_path / "venv-a" / "model.gguf"))
    assert len(fake_conversion) == 2  # the model and its tokenizer, once
    # Another checkout or virtual environment: another path, the same bytes.
    second = convert_gguf(_gguf(tmp_path / "venv-b" / "model.gguf"))
    assert second == first and len(fake_conversion) == 2
    assert [p.name for p in (cache_dir() / "converted").iterdir()] == [first.name]
    # Other content under the same name is another model: converted on its own.
    third = convert_gguf(_gguf(tmp_path / "venv-c" / "model.gguf", b"other weights"))
    assert third != first and len(fake_conversion) == 4


def test_another_transformers_conversion_is_kept_while_used_and_goes_once_stale(
    tmp_path, fake_conversion, monkeypatch
):
    """Two environments on one cache (the project's, vLLM's older transformers) each keep
    their conversion; one unused for ``STALE_DAYS`` goes when another is made."""
    import os
    import time

    import transformers

    from ksemstamp.assets import STALE_DAYS, cache_dir, convert_gguf

    gguf = _gguf(tmp_path / "model.gguf")

    def made(version: str):
        monkeypatch.setattr(transformers, "__version__", version)
        return convert_gguf(gguf)

    old, new = made("0.0.1"), made("0.0.2")
    assert made("0.0.1") == old and len(fake_conversion) == 4  # both kept, neither made again
    assert sorted(p.name for p in (cache_dir() / "converted").iterdir()) == [old.name, new.name]
    long_ago = time.time() - (STALE_DAYS + 1) * 86400
    os.utime(old, (long_ago, long_ago))
    newest = made("0.0.3")  # the stale one goes, the one in use stays
    assert sorted(p.name for p in (cache_dir() / "converted").iterdir()) == [new.name, newest.name]


def test_a_damaged_conversion_is_made_again_not_returned(tmp_path, fake_conversion):
    from ksemstamp.assets import convert_gguf

    gguf = _gguf(tmp_path / "model.gguf")
    first = convert_gguf(gguf)
    (first / "config.json").unlink()  # a clean-up cut short left the tokenizer's files only
    (first / "tokenizer.json").write_text("{}")
    again = convert_gguf(gguf)
    assert again == first and (again / "config.json").exists() and len(fake_conversion) == 4


def test_a_file_is_hashed_once_while_it_stays_as_it_is(tmp_path, monkeypatch):
    import hashlib

    from ksemstamp import assets

    monkeypatch.setenv("KSEMSTAMP_CACHE", str(tmp_path / "cache"))
    gguf = _gguf(tmp_path / "model.gguf")
    reads = []
    real = hashlib.sha256
    monkeypatch.setattr(assets.hashlib, "sha256", lambda *a: reads.append(1) or real(*a))
    digest = assets.file_sha256(gguf)
    assert digest == real(b"GGUF weights").hexdigest()
    assert assets.file_sha256(gguf) == digest and len(reads) == 1
    gguf.write_bytes(b"GGUF weights, changed")
    assert assets.file_sha256(gguf) == real(b"GGUF weights, changed").hexdigest()


def test_generate_help_names_every_offline_alias(capsys):
    """The README says any Hub id or folder works in place of the defaults: ``--help`` names the
    offline aliases a user without the Hub can pick."""
    from ksemstamp import cli
    from ksemstamp.assets import _OFFLINE_ENCODERS, _OFFLINE_LMS

    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # the help wraps lines at hyphens
    for alias in [*_OFFLINE_LMS, *_OFFLINE_ENCODERS, "all-mpnet-base-v2"]:
        assert alias in shown, alias
