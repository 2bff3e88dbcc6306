"""The ``search`` group's shared part: how many candidates a unit may draw, in what batches, for
how long. Every kind of mark extends it with the knobs only it reads (``settings.marks``:
``DirectionSearch``, ``RegionSearch``; a mark's settings class names its own as ``search``), so
that a new mark adds its knobs in its own module; ``search_for`` turns search settings of one
kind into another's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

from .checks import Range, SettingsError, check


@dataclass(frozen=True)
class SearchSettings:
    """How the candidates of a unit are drawn: the part every mark reads."""

    max_candidates: Annotated[int, Range(1, 10_000)] = 32
    """Candidates per sentence before giving up on the rule: the region mark then keeps the
    last one drawn (paper: 100), the direction mark the best-scoring one (of those that pruning
    lets finish; a pruned candidate does not count against the budget)."""
    candidate_batch: Annotated[int, Range(1, 4096)] = 32
    """Most candidate rows per document in one batched decode (a round's cost per row:
    ``generation.rounds.ROW_COST``)."""
    adaptive_batch: bool = True
    """Size each round from the expected acceptance of the current valid set (a mark that
    turns candidates down: the region mark); ``false``: always ``candidate_batch`` rows."""
    sentence_time_budget: float | None = None
    """Seconds after which the search for one sentence falls back as at ``max_candidates``,
    checked between rounds (a sentence can overrun it by one round). ``None``: no limit (the
    paper's rule). With a budget, the text depends on the machine's speed, not only the seed."""
    prompt_batch: Annotated[int, Range(1, 4096)] = 4
    """Prompts generated together in one batch."""

    def __post_init__(self) -> None:
        check(self, self.problems())

    def problems(self) -> list[str]:
        """What is wrong with these values beyond their types and bounds."""
        if self.sentence_time_budget is not None and self.sentence_time_budget <= 0:
            return [f"sentence_time_budget must be > 0 or null, got {self.sentence_time_budget}"]
        return []


SHARED = tuple(f.name for f in dataclasses.fields(SearchSettings))
"""The ``search`` fields every kind of mark reads."""


def own_fields(search: type) -> tuple[str, ...]:
    """The fields of the search class ``search`` that only its kind of mark reads."""
    return tuple(f.name for f in dataclasses.fields(search) if f.name not in SHARED)


def own_values(
    cls: type, values: dict[str, Any], kind: str, owners: dict[str, type]
) -> tuple[dict[str, Any], list[str]]:
    """``values`` (a ``search`` group in the file's form) for ``cls``, the ``kind`` mark's search
    class: a field another kind's class reads (``owners``: search class by kind) is dropped at
    its default (files layered over another kind's keep working) and refused with one line
    naming its mark otherwise. Names no class has are kept, for ``cls`` to refuse."""
    mine = {f.name for f in dataclasses.fields(cls)}
    kept, problems = {}, []
    for name, value in values.items():
        readers = [k for k, c in owners.items() if name in own_fields(c)]
        if name in mine or not readers:
            kept[name] = value
        elif any(value != _default(owners[k], name) for k in readers):
            problems.append(
                f"search.{name} is read by the {' and '.join(readers)} mark only, "
                f"not the {kind} mark"
            )
    return kept, problems


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def search_for(cls: type, search: Any, kind: str, owners: dict[str, type]) -> Any:
    """``search`` (``SearchSettings`` of any kind, or ``None``: the defaults) as ``cls``, the
    ``kind`` mark's search class (``own_values``); raises one ``SettingsError`` for another
    kind's field given another value than its default."""
    if search is None:
        return cls()
    if type(search) is cls:
        return search
    if type(search) not in owners.values():  # an unregistered class: named by itself
        owners = {**owners, type(search).__name__: type(search)}
    kept, problems = own_values(cls, dataclasses.asdict(search), kind, owners)
    if problems:
        raise SettingsError("invalid settings", problems)
    return cls(**kept)
