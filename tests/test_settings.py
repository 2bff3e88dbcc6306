"""The settings: one source for every default, complete files, layering.

No model is loaded: these build settings and inspect signatures only.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import warnings
from pathlib import Path

import pytest
import yaml

import ksemstamp
from ksemstamp.settings import (
    GROUPS,
    MARK_KINDS,
    DetectionSettings,
    DirectionSearch,
    DirectionSettings,
    RegionSearch,
    RegionSettings,
    SearchSettings,
    SettingsError,
    WatermarkSettings,
)
from ksemstamp.settings.files import command_line_layers, load_watermark_settings, merge
from ksemstamp.settings.search import own_fields

CONFIGS = Path(__file__).parents[1] / "configs"
LAB_CONFIGS = Path(__file__).parents[1] / "lab" / "configs"
OWN = ("key", "allow_weak_key", "chat")


def _default(place: str):
    """The default of the setting at ``place`` (``search.max_candidates``, ``mark.threshold``
    of the direction mark, ``mark.gamma`` of the region mark, ``chat``)."""
    if "." not in place:
        return WatermarkSettings.__dataclass_fields__[place].default
    group, name = place.split(".")
    cls = next(c for c in _classes(group) if name in c.__dataclass_fields__)
    return cls.__dataclass_fields__[name].default


def _classes(group: str) -> list[type]:
    """The classes a group can be: every kind's for ``mark`` and ``search``."""
    if group == "mark":
        return list(MARK_KINDS.values())
    if group == "search":
        return [c.search for c in MARK_KINDS.values()]
    return [GROUPS[group]]


# ---------------------------------------------------------------------- one source


STANDS_FOR = {
    ("ksemstamp.detector", "Detector"): {
        "statistic": "detection.statistic",
        "alpha": "detection.alpha",
        "max_chars": "limits.max_text_chars",
        "scan": "detection.scan",
    },
    ("ksemstamp.watermarker", "Watermarker"): {"chat": "chat"},
    ("ksemstamp.generation.pruning", "PruneRule"): {
        "every": "search.prune_tokens",
        "top": "search.prune_keep",
        "margin": "search.prune_margin",
    },
    ("ksemstamp.scheme.partition", "KMeansPartition"): {"margin": "search.margin"},
    ("ksemstamp.scheme.partition", "LSHPartition"): {
        "bits": "partition.lsh_bits",
        "margin": "search.margin",
        "seed": "partition.lsh_seed",
    },
}
"""The constructor arguments that stand for a setting under another name, or a field of one
kind of mark, and the setting they stand for."""
NOT_SETTINGS = {
    ("ksemstamp.generation.prompts", "PromptStart"): {"kind", "seed"},
    ("ksemstamp.detection.plans", "ScoringPlan"): {"seed"},
}
"""Arguments that share a setting's name and mean something else (a prompt's kind, the sentence
before a text, the sentence that seeds it)."""
CORE = ("watermarker", "detector", "scheme", "partition", "marks", "generation", "detection")
"""The modules of the classes the builders make from the settings."""
SETTINGS_CLASSES = {
    *GROUPS.values(),
    *MARK_KINDS.values(),
    *(c.search for c in MARK_KINDS.values()),
    SearchSettings,
    WatermarkSettings,
}


def _core_classes():
    for info in pkgutil.walk_packages(ksemstamp.__path__, "ksemstamp."):
        if info.name.split(".")[1] not in CORE:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and name[0] != "_":
                yield (module.__name__, name), obj


def _setting_names() -> set[str]:
    names = set(OWN)
    for cls in [*GROUPS.values(), *MARK_KINDS.values(), *_classes("search")]:
        names |= {f.name for f in dataclasses.fields(cls) if f.init}
    return names


def test_no_public_constructor_default_differs_from_the_settings():
    """The single-source rule: every constructor argument of the classes built from the
    settings that stands for a setting defaults to that setting's default; one that takes a
    settings group defaults to ``None`` (the group's defaults) or to the group's defaults."""
    names = _setting_names()
    checked = set()
    for where, cls in _core_classes():
        if cls in SETTINGS_CLASSES:
            continue
        for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
            if p.default is inspect.Parameter.empty:
                continue
            # Annotations are strings here (``from __future__ import annotations``).
            hint = str(p.annotation).replace("|", " ").split()
            group = [c for c in SETTINGS_CLASSES if c.__name__ in hint]
            if "MarkSettings" in hint:  # either kind: None is the default mark's
                assert p.default is None, (where, p.name)
                checked.add((where, p.name))
                continue
            if group:
                assert p.default is None or p.default == group[0](), (where, p.name)
                continue
            place = STANDS_FOR.get(where, {}).get(p.name)
            if place is None and p.name in names and p.name not in NOT_SETTINGS.get(where, ()):
                place = next(f"{g}.{p.name}" for g in GROUPS if p.name in _group_fields(g))
            if place is None:
                continue
            assert p.default == _default(place), f"{where[1]}({p.name}={p.default!r}): {place}"
            checked.add((where, p.name))
    # Every argument listed above exists and was checked (a rename would skip it silently).
    listed = {(w, n) for w, args in STANDS_FOR.items() for n in args}
    listed.add((("ksemstamp.scheme.core", "WatermarkScheme"), "mark"))
    assert listed <= checked, listed - checked


def _group_fields(group: str) -> set[str]:
    return {f.name for c in _classes(group) for f in dataclasses.fields(c)}


def test_the_rule_catches_a_default_of_its_own(monkeypatch):
    from ksemstamp.detector import Detector

    original = Detector.__init__

    def own_default(self, scheme, statistic="exact", alpha=0.05, max_chars=None, scan=True):
        original(self, scheme, statistic, alpha, max_chars, scan)

    monkeypatch.setattr(Detector, "__init__", own_default)
    with pytest.raises(AssertionError, match="alpha"):
        test_no_public_constructor_default_differs_from_the_settings()


# ---------------------------------------------------------------------- complete files


def test_every_setting_is_in_the_default_file_with_its_default():
    """``configs/ksemstamp.yaml`` lists every field of every group, each at its default (the
    region mark's fields are in ``lab/configs/ksemstamp-region.yaml``, the other kind's file)."""
    data = yaml.safe_load((CONFIGS / "ksemstamp.yaml").read_text())
    assert data == WatermarkSettings().to_dict()
    region = yaml.safe_load((LAB_CONFIGS / "ksemstamp-region.yaml").read_text())
    assert region["mark"] == dataclasses.asdict(RegionSettings())
    own = {n: RegionSearch.__dataclass_fields__[n].default for n in own_fields(RegionSearch)}
    assert own == {k: v for k, v in region["search"].items() if k in own}
    # ... and every field of every group is one of them.
    for name, cls in GROUPS.items():
        if name != "mark":
            assert set(data[name]) == {f.name for f in dataclasses.fields(cls)}, name
    assert set(data) == {*GROUPS, "allow_weak_key", "chat"}  # the key is never in a file


@pytest.mark.parametrize(
    "path", sorted([*CONFIGS.glob("*.yaml"), *LAB_CONFIGS.glob("*.yaml")]), ids=lambda p: p.name
)
def test_every_shipped_file_loads_on_the_defaults_without_a_warning(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = load_watermark_settings([CONFIGS / "ksemstamp.yaml", path])
    assert settings.search.max_candidates >= 1


# ---------------------------------------------------------------------- groups and checks


def test_every_problem_is_named_by_its_place():
    data = {
        "partition": {"kind": "grid"},
        "search": {"candidate_batch": 0, "margin": -1},
        "mark": {"kind": "region", "gamma": 1.5},
    }
    with pytest.raises(SettingsError) as err:
        WatermarkSettings.from_dict(data)
    problems = err.value.problems
    assert {p.split(" ")[0] for p in problems} == {
        "partition.kind",
        "search.candidate_batch",
        "search.margin",
        "mark.gamma",
    }


def test_a_mark_has_only_its_own_fields():
    with pytest.raises(TypeError):
        DirectionSettings(gamma=0.3)
    with pytest.raises(SettingsError, match="mark.gamma is not a setting of the direction mark"):
        WatermarkSettings.from_dict({"mark": {"gamma": 0.3}})
    region = WatermarkSettings.from_dict({"mark": {"kind": "region", "gamma": 0.5}})
    assert isinstance(region.mark, RegionSettings) and region.mark.gamma == 0.5
    assert (
        region.to_dict()["mark"]["kind"] == "region"
        and "remove_components" not in region.to_dict()["mark"]
    )
    with pytest.raises(SettingsError, match="'paper' is not a statistic of the direction mark"):
        WatermarkSettings(
            detection=dataclasses.replace(WatermarkSettings().detection, statistic="paper")
        )


def test_identity_and_effort_are_apart_and_another_mark_s_effort_is_refused():
    # What a detector must share with the generator is the mark's; how hard generation tries
    # is search's: the shared fields and, in the mark's own search class, the knobs only that
    # mark reads. A search setting only another kind reads is refused when given.
    assert {f.name for f in dataclasses.fields(DirectionSettings)} == {
        "kind", "context", "context_temperature", "remove_components", "units", "clause_words"
    }  # fmt: skip
    assert DirectionSettings.search is DirectionSearch and RegionSettings.search is RegionSearch
    assert {"threshold", "selection", "steer", "prune_tokens"} <= set(own_fields(DirectionSearch))
    assert set(own_fields(RegionSearch)) == {"margin", "novelty_patience", "margin_patience"}
    assert not {"threshold", "margin"} & set(SearchSettings.__dataclass_fields__)
    assert type(WatermarkSettings().search) is DirectionSearch
    assert "scan" in DetectionSettings.__dataclass_fields__
    with pytest.raises(SettingsError, match="search.margin is read by the region mark only"):
        WatermarkSettings.from_dict({"search": {"margin": 0.02}})
    with pytest.raises(SettingsError, match="search.threshold is read by the direction mark only"):
        WatermarkSettings.from_dict({"mark": {"kind": "region"}, "search": {"threshold": 1.0}})
    # their defaults are harmless, so files layered over another kind's keep working
    region = WatermarkSettings.from_dict(
        {"mark": {"kind": "region"}, "search": {"threshold": None, "max_candidates": 9}}
    )
    assert region.search == RegionSearch(max_candidates=9)
    # search settings of another kind become the mark's own, shared fields kept
    built = WatermarkSettings(mark=RegionSettings(), search=DirectionSearch(max_candidates=5))
    assert built.search == RegionSearch(max_candidates=5)
    with pytest.raises(SettingsError, match="search.steer is read by the direction mark only"):
        WatermarkSettings(mark=RegionSettings(), search=DirectionSearch(steer=0.25))


def test_the_key_is_never_in_a_dict_or_repr():
    settings = WatermarkSettings(key="super-secret-value")
    assert "super-secret-value" not in repr(settings)
    assert "key" not in settings.to_dict()
    assert settings.updated({"search": {"max_candidates": 3}}).key == "super-secret-value"


def test_layers_merge_field_by_field_and_another_kind_replaces_the_mark():
    base = WatermarkSettings().to_dict()
    direction = merge(base, {"mark": {"context": "previous"}, "search": {"max_candidates": 7}})
    assert (
        direction["mark"]["context"] == "previous" and direction["mark"]["remove_components"] == 64
    )
    assert direction["search"]["max_candidates"] == 7 and direction["search"]["prune_keep"] == 12
    region = merge(direction, {"mark": {"kind": "region", "gamma": 0.5}})
    assert region["mark"] == {"kind": "region", "gamma": 0.5}
    assert WatermarkSettings.from_dict(region).mark == RegionSettings(gamma=0.5)
    settings = WatermarkSettings().updated({"mark": {"kind": "region"}})
    assert settings.mark == RegionSettings()


def test_a_grouped_file_that_gives_the_other_kinds_field_is_an_error_not_dropped(tmp_path):
    grouped = tmp_path / "new.yaml"
    grouped.write_text("mark:\n  gamma: 0.3\n")
    layers, kind, _ = command_line_layers(["--config", str(grouped)], True)
    assert kind == "direction" and layers[0]["mark"] == {"gamma": 0.3}
    with pytest.raises(SettingsError, match="gamma"):
        WatermarkSettings.from_dict(layers[0])


def test_clause_units_are_the_default_and_one_file_gives_whole_sentences() -> None:
    # The sentence-unit files keep what was measured with them: the former default
    # (texts generated before clause units detect best with it) and the trained adapter.
    assert WatermarkSettings().mark.units == "clauses"
    base = CONFIGS / "ksemstamp.yaml"
    assert load_watermark_settings([base]).mark.units == "clauses"
    for layer in ("ksemstamp-sentences.yaml", "ksemstamp-trained.yaml"):
        assert load_watermark_settings([base, CONFIGS / layer]).mark.units == "sentences"
    assert WatermarkSettings().unit == "clause"
    region = load_watermark_settings([CONFIGS / "ksemstamp-paper.yaml"])
    assert region.unit == "sentence"  # the region mark always reads sentences


def test_settings_are_immutable_once_built():
    """Every settings class is frozen, a group included: a change is a new object
    (``updated``, ``dataclasses.replace``), so settings handed to a scheme or a run cannot move
    under it."""
    from ksemstamp.settings import calibration, devices, evaluation, groups, marks, watermark

    classes = [
        cls
        for module in (calibration, devices, evaluation, groups, marks, watermark)
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and dataclasses.is_dataclass(cls)
        and cls.__module__ == module.__name__
    ]
    assert len(classes) >= 13
    for cls in classes:
        assert cls.__dataclass_params__.frozen, cls.__name__
    settings = WatermarkSettings(key="k" * 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.key = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.search.max_candidates = 8
    changed = settings.updated({"search": {"max_candidates": 8}})
    assert changed.search.max_candidates == 8 and settings.search.max_candidates != 8
    assert changed.key == settings.key


def test_a_key_given_twice_in_a_settings_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("search:\n  max_candidates: 8\n  steer: 0.5\n  max_candidates: 16\n")
    with pytest.raises(ValueError) as refused:
        load_watermark_settings([path])
    said = str(refused.value)
    assert str(path) in said and "'max_candidates' is given twice" in said and "line 4" in said
    path.write_text("search:\n  max_candidates: 8\nsampling:\n  max_candidates: 8\n")
    with pytest.raises(Exception, match="max_candidates") as other:  # not a duplicate: a typo
        load_watermark_settings([path])
    assert "twice" not in str(other.value)


@pytest.mark.parametrize("temperature", [1e-300, 0.0, 1e9, -1.0])
def test_an_unusable_temperature_is_refused_where_it_is_read(temperature):
    with pytest.raises(SettingsError, match=r"temperature must be in \[1e-06, 100\]"):
        WatermarkSettings.from_dict({"sampling": {"temperature": temperature}})


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--search.steer", "-inf", "Expected a float. Got value: -inf"),
        ("--search.steer", "-1e-3", "search.steer (--search.steer) must be >= 0, got -0.001"),
        ("--search.steer", "12", "search.steer (--search.steer) must be <= 10.0, got 12.0"),
        ("--sampling.steer_plausible", "1.5", "steer_plausible) must be <= 1, got 1.5"),
        ("--search.fluent_share", "1.5", "fluent_share) must be <= 1, got 1.5"),
        ("--search.fluent_share", "0", "fluent_share) must be in (0, 1], got 0.0"),
    ],
)
def test_a_negative_or_out_of_range_number_reaches_its_setting_s_check(flag, value, said, capsys):
    from ksemstamp.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["generate", "--prompt", "x", flag, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "expected one argument" not in err and err.count("\n") == 1


def test_a_float_range_refuses_nan_and_shows_in_the_help(capsys):
    from ksemstamp.cli import main
    from ksemstamp.settings.checks import Range

    assert Range(0, 1).problems("x", float("nan")) == ["x must be a number in [0, 1], got nan"]
    assert Range(0, 1).problems("x", 0.5) == [] and Range(0, 1).problems("x", True) == []
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "(0 to 10.0)" in " ".join(capsys.readouterr().out.split())
