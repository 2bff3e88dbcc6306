"""An installed package registers an engine, an attack and a mark through entry points, without
an edit to ksemstamp (``settings.plugins``); a broken one is named and left out."""

from __future__ import annotations

import logging

import pytest

from ksemstamp.settings import attacks, groups, marks, plugins
from ksemstamp.settings.attacks import AttackSettings
from ksemstamp.settings.groups import SamplingSettings

TOY = """
from dataclasses import dataclass, field

from ksemstamp.settings.marks import DirectionSettings


def build(settings, lm, encoder, splitter):
    return None


class ToyEngine:
    @classmethod
    def from_settings(cls, settings, splitter, lm=None):
        return cls()


@dataclass(frozen=True)
class ToyMarkSettings(DirectionSettings):
    kind: str = field(default="toy-mark", init=False)
"""


@pytest.fixture()
def installed(tmp_path, monkeypatch):
    """A package ``toy-plugin`` on the path, with its entry points, and fresh registries."""
    dist = tmp_path / "toy_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[ksemstamp.engines]\ntoy = toy_plugin:ToyEngine\n\n"
        "[ksemstamp.attacks]\ntoy-attack = toy_plugin:build\nbroken = toy_plugin:nothing\n\n"
        "[ksemstamp.marks]\ntoy-mark = toy_plugin:ToyMarkSettings\n"
    )
    (tmp_path / "toy_plugin.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(groups, "ENGINES", dict(groups.ENGINES))
    monkeypatch.setattr(attacks, "ATTACK_KINDS", dict(attacks.ATTACK_KINDS))
    monkeypatch.setattr(marks, "MARK_KINDS", dict(marks.MARK_KINDS))
    monkeypatch.setattr(groups, "MARK_KINDS", marks.MARK_KINDS)
    plugins.reload_plugins()
    yield
    plugins.reload_plugins()


def test_an_installed_engine_attack_and_mark_are_found_by_name(installed, caplog):
    from ksemstamp.generation.engine import engine_class
    from ksemstamp.settings import WatermarkSettings

    assert "toy" not in groups.ENGINES  # read only when a name is missing
    with caplog.at_level(logging.WARNING, logger="ksemstamp.settings.plugins"):
        assert SamplingSettings(engine="toy").engine == "toy"
    assert engine_class("toy").__name__ == "ToyEngine"
    assert AttackSettings(name="a", paraphraser="toy-attack").paraphraser == "toy-attack"
    settings = WatermarkSettings.from_dict({"mark": {"kind": "toy-mark"}})
    assert type(settings.mark).__name__ == "ToyMarkSettings"
    # The broken entry point is named once and left out; the others still load.
    assert "broken" not in attacks.ATTACK_KINDS
    assert any("broken" in r.getMessage() for r in caplog.records)


def test_a_built_in_name_is_not_taken_over(installed):
    groups.load_engine_plugins()
    assert groups.ENGINES["batched"] == "ksemstamp.generation.batched:BatchedEngine"
