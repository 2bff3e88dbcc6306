"""The settings of a watermark: small typed groups, each field documented once with its default.

``WatermarkSettings`` is what generation and detection are built from (``builders``): the
groups ``model`` (generator, encoder, device), ``partition`` (the regions), ``mark`` (what the
key asks of a sentence: ``DirectionSettings``, the default, or ``RegionSettings``, the paper's,
chosen by ``kind``, each with only its own fields), ``search`` (how a sentence's candidates are
drawn and pruned), ``sampling``, ``detection``, ``limits`` and ``engine`` (the served engines), and three fields of its own:
``key``, ``allow_weak_key``, ``chat``; the groups are ``groups``'s.

Every default lives here and nowhere else: the classes the builders make take these groups or
default each argument to the field it stands for, and ``tests/test_settings.py`` checks that
no public constructor's default differs. A settings file mirrors the groups
(``configs/ksemstamp.yaml``: ``search: {max_candidates: 32}``), a flag spells a field
``--search.max_candidates 32``; reading and layering files
is ``files``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import groups
from .checks import SettingsError, build_group
from .engines import EngineSettings
from .marks import default_kind, load_mark_plugins, search_of, search_owners
from .search import own_values


def merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` on top of ``base`` (both in the file's form): mappings merge key by key, other
    values are replaced, and a ``mark`` whose ``kind`` differs from ``base``'s replaces it whole.
    """
    out = dict(base)
    for key, value in layer.items():
        here = out.get(key)
        if key == "mark" and isinstance(value, dict) and isinstance(here, dict):
            kind = value.get("kind")
            if kind is not None and kind != here.get("kind", default_kind()):
                out[key] = dict(value)
                continue
        if isinstance(value, dict) and isinstance(here, dict):
            out[key] = merge(here, value)
        else:
            out[key] = value
    return out


GROUPS: dict[str, type] = {
    "model": groups.ModelSettings,
    "partition": groups.PartitionSettings,
    "mark": groups.DirectionSettings,
    "search": groups.DirectionSearch,
    "sampling": groups.SamplingSettings,
    "detection": groups.DetectionSettings,
    "limits": groups.LimitSettings,
    "engine": EngineSettings,
}
"""The groups of ``WatermarkSettings`` by name (``mark`` and ``search``: the default kind's; a
mark's settings class names its ``search`` class)."""


MOVED = {
    "search.strategy": "sampling.engine",
    "mark.threshold": "search.threshold",
    "mark.selection": "search.selection",
    "mark.scan": "detection.scan",
    "mark.novelty_patience": "search.novelty_patience",
    "mark.margin_patience": "search.margin_patience",
    "mark.margin": "search.margin",
    "mark.whiten": "mark.remove_components",
}
"""Settings of earlier versions that moved, and where they are now (a file naming one is told)."""


@dataclass(frozen=True)
class WatermarkSettings:
    """Everything that defines a watermark and how text is generated and scored.

    The key is never written anywhere: ``to_dict`` leaves it out and ``repr`` never shows it.
    """

    model: groups.ModelSettings = field(default_factory=groups.ModelSettings)
    partition: groups.PartitionSettings = field(default_factory=groups.PartitionSettings)
    mark: groups.MarkSettings = field(default_factory=groups.DirectionSettings)
    search: groups.SearchSettings = field(default_factory=groups.DirectionSearch)
    """How hard generation tries: the mark's own ``search`` class (``DirectionSearch``,
    ``RegionSearch``); search settings of another kind become it (their shared fields kept)."""
    sampling: groups.SamplingSettings = field(default_factory=groups.SamplingSettings)
    detection: groups.DetectionSettings = field(default_factory=groups.DetectionSettings)
    limits: groups.LimitSettings = field(default_factory=groups.LimitSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    key: str | None = field(default=None, repr=False)
    """Secret key; falls back to ``$KSEMSTAMP_KEY``, then to a public demo key (with a warning).
    Make one with ``ksemstamp keygen``."""
    allow_weak_key: bool = False
    """Accept a guessable key (a test key): one that zxcvbn estimates to take under 2^128
    guesses. Otherwise such a key is refused, as its fingerprint in every record lets anyone
    recover it by trying guesses. ``KSEMSTAMP_ALLOW_WEAK_KEY=1`` allows it too."""
    chat: bool = False
    """Prompts are instructions: each is wrapped in the LM's chat template and the answer is
    generated from its first sentence, which a keyed start value seeds (no region of the
    instruction). Detection of an answer takes no prompt; its first sentence only seeds."""

    def __post_init__(self) -> None:
        problems = []
        if self.model.checkpoint is not None and self.partition.centroids is not None:
            problems.append(
                "model.checkpoint holds the centroids: give either model.checkpoint or "
                "partition.centroids, not both"
            )
        offered = type(self.mark).statistics
        if self.detection.statistic not in offered:
            problems.append(
                f"detection.statistic {self.detection.statistic!r} is not a statistic of the "
                f"{self.mark.kind} mark; it offers {list(offered)}"
            )
        try:
            object.__setattr__(self, "search", search_of(self.mark, self.search))
        except SettingsError as err:
            problems += err.problems
        problems += self._detection_of_other_marks()
        if problems:
            raise SettingsError("invalid settings", problems)

    def _detection_of_other_marks(self) -> list[str]:
        """A ``detection`` setting that only another kind of mark reads
        (``MarkSettings.options``), given a value other than its default."""
        mine = type(self.mark).options
        problems = []
        others = {n for cls in groups.MARK_KINDS.values() for n in cls.options} - set(mine)
        defaults = GROUPS["detection"]()
        for name in sorted(others):
            if getattr(self.detection, name) != getattr(defaults, name):
                kinds = [k for k, cls in groups.MARK_KINDS.items() if name in cls.options]
                problems.append(
                    f"detection.{name} is read by the {' and '.join(kinds)} mark only, not "
                    f"the {self.mark.kind} mark"
                )
        return problems

    # ------------------------------------------------------------------ dicts
    def to_dict(self) -> dict[str, Any]:
        """The settings as a settings file holds them (groups as mappings), without the key."""
        out = dataclasses.asdict(self)
        out.pop("key")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WatermarkSettings:
        """Settings from a mapping in the file's form (``{"search": {"max_candidates": 8}}``);
        missing fields keep their defaults. ``mark`` takes its ``kind`` (default ``direction``)
        and that kind's fields only. Raises one ``SettingsError`` naming every problem by its
        place (``search.max_candidates must be >= 1, got 0``)."""
        known = [f.name for f in dataclasses.fields(cls)]
        problems = [f"{k} is not a setting; known: {known}" for k in data if k not in known]
        values = {k: v for k, v in data.items() if k in known and k not in GROUPS}
        kind = default_kind()
        for name, group in GROUPS.items():
            given = data.get(name) or {}
            if not isinstance(given, dict):
                problems.append(f"{name} must be a mapping of its settings, got {given!r}")
                continue
            given = dict(given)
            if name == "mark":
                kind = given.pop("kind", default_kind())
                if kind not in groups.MARK_KINDS:
                    load_mark_plugins()
                if kind not in groups.MARK_KINDS:
                    problems.append(
                        f"mark.kind must be one of {list(groups.MARK_KINDS)}, not {kind!r}"
                    )
                    continue
                group = groups.MARK_KINDS[kind]
            if name == "search":
                if kind not in groups.MARK_KINDS:
                    continue  # its fields depend on the kind, already refused
                group = groups.MARK_KINDS[kind].search
                given, refused = own_values(group, given, kind, search_owners())
                problems += refused
            owner = f"the {kind} mark" if name == "mark" else name
            fields = {f.name for f in dataclasses.fields(group)}
            for moved in [k for k in given if f"{name}.{k}" in MOVED and k not in fields]:
                given.pop(moved)
                problems.append(f"{name}.{moved} is now {MOVED[f'{name}.{moved}']}")
            built, refused = build_group(group, given, name, owner)
            problems += refused
            if not refused:
                values[name] = built
        if problems:
            raise SettingsError("invalid settings", problems)
        return cls(**values)

    def updated(self, layer: dict[str, Any]) -> WatermarkSettings:
        """These settings with ``layer`` (the file's form) on top, as a later settings file
        would be: groups merge field by field, and a ``mark`` of another ``kind`` replaces the
        mark whole. The key is kept."""
        return dataclasses.replace(
            WatermarkSettings.from_dict(merge(self.to_dict(), layer)),
            key=layer.get("key", self.key),
        )

    def __repr__(self) -> str:
        return f"WatermarkSettings({self.to_dict()})"

    @property
    def unit(self) -> str:
        """What the mark scores one at a time: ``clause`` or ``sentence``."""
        return "clause" if self.mark.splitting()[0] == "clauses" else "sentence"

    # ------------------------------------------------------------------ files
    def centroid_path(self) -> Path:
        """The centroid file of ``partition.kind: kmeans`` without a checkpoint."""
        if self.partition.centroids:
            path = Path(self.partition.centroids)
            # A shipped file named relative to the checkout (configs/ksemstamp-paper.yaml names
            # checkpoints/...-k8.pt) is found from any working directory, and in a wheel install.
            if not path.is_absolute() and not path.exists():
                for candidate in (groups.REPO_ROOT / path, groups.PACKAGE_DATA / path.name):
                    if candidate.exists():
                        return candidate
            return path
        if self.model.encoder in groups.DEFAULT_CENTROIDS:
            return groups.DEFAULT_CENTROIDS[self.model.encoder]
        raise ValueError(
            f"no default centroids for encoder {self.model.encoder!r}: fit them with "
            f"`ksemstamp centroids --encoder {self.model.encoder} --output FILE` and pass "
            "`partition.centroids: FILE`"
        )
