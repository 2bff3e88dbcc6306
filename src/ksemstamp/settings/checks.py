"""How a settings dataclass refuses values: one ``SettingsError`` that lists every problem, one
a line, each starting with the name of its field (``search.max_candidates`` once the group is
known: ``build_group``), so that a file or a command line can name the setting and its flag.

Every integer setting declares its bounds beside its type, ``Annotated[int, Range(1, 4096)]``
(a command's own integer options too): an upper bound that a real run could use, so that an
absurd value (``--search.max_candidates 99999999999999999999``) is refused in one line before
any model loads instead of a run that makes no progress while it fills memory. A float setting
must be a finite number."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

SEED_BOUNDS = (-(2**63), 2**63 - 1)
"""What a 64-bit seed holds."""


@dataclass(frozen=True)
class Range:
    """The bounds of a number setting, declared with its type:
    ``Annotated[int, Range(1, 4096)]``, ``Annotated[float, Range(0, 10)]`` (``None`` passes
    where the type allows it; the command line's help shows them)."""

    low: int | float
    high: int | float

    def problems(self, name: str, value: Any, optional: bool = False) -> list[str]:
        """Why ``value`` of the setting ``name`` is out of bounds (none when it is within, is
        not a number, or is ``None``; NaN is never within)."""
        if not isinstance(value, int | float) or isinstance(value, bool):
            return []
        tail = " or null" if optional else ""
        if value != value:
            return [f"{name} must be a number in [{self.low:g}, {self.high:g}]{tail}, got nan"]
        if value < self.low:
            return [f"{name} must be >= {self.low}{tail}, got {value}"]
        if value > self.high:
            return [f"{name} must be <= {self.high:,}{tail}, got {value}"]
        return []


SEED = Range(*SEED_BOUNDS)


def range_of(hint: Any) -> tuple[Range | None, bool]:
    """The ``Range`` an ``Annotated`` type hint declares (in a union too: ``Annotated[int,
    Range(1, 9)] | None``), and whether ``None`` is allowed."""
    optional = False
    candidates = [hint]
    if get_origin(hint) in (typing.Union, types.UnionType):
        candidates = list(get_args(hint))
        optional = type(None) in candidates
    for candidate in candidates:
        if get_origin(candidate) is typing.Annotated:
            found = [m for m in candidate.__metadata__ if isinstance(m, Range)]
            if found:
                return found[0], optional
    return None, optional


def bound_problems(group: object) -> list[str]:
    """The problems of ``group``'s integer fields outside their declared ``Range`` (those that
    declare none: outside what a 64-bit integer holds) and of its float fields that are not
    finite numbers."""
    hints = get_type_hints(type(group), include_extras=True)
    problems = []
    for f in dataclasses.fields(group):
        value = getattr(group, f.name)
        bounds, optional = range_of(hints[f.name])
        problems += (bounds or SEED).problems(f.name, value, optional)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{f.name} must be a finite number, got {value}")
    return problems


class SettingsError(ValueError):
    """Settings that cannot be used; ``problems`` lists each, one a line, each starting with the
    name of the field it is about."""

    def __init__(self, title: str, problems: list[str]) -> None:
        super().__init__(f"{title}:\n  " + "\n  ".join(problems))
        self.problems = problems


def check(group: object, problems: list[str]) -> None:
    """Raise ``SettingsError`` with ``problems``, every ``Literal`` field of ``group`` whose
    value is not one of its choices and every field out of its bounds (``bound_problems``)."""
    problems = bound_problems(group) + problems
    hints = get_type_hints(type(group))
    for f in reversed(dataclasses.fields(group)):
        choices = get_args(hints[f.name]) if get_origin(hints[f.name]) is Literal else ()
        value = getattr(group, f.name)
        if choices and value not in choices:
            problems.insert(0, f"{f.name} must be one of {list(choices)}, not {value!r}")
    if problems:
        raise SettingsError(f"invalid {type(group).__name__}", problems)


def build_group(
    group: type, given: dict[str, Any], place: str, owner: str
) -> tuple[Any, list[str]]:
    """``group(**given)`` and no problems, or ``None`` and the problems that refuse ``given``,
    each named by its place under ``place``, the group's name (``search.max_candidates must be
    >= 1, got 0``): the fields that ``owner`` (the group as a message calls it: ``the region
    mark``) does not have, else the values out of bounds or of the wrong type."""
    fields = {f.name for f in dataclasses.fields(group) if f.init}
    stray = sorted(set(given) - fields)
    if stray:
        return None, [f"{place}.{s} is not a setting of {owner}" for s in stray]
    try:
        return group(**given), []
    except SettingsError as err:
        return None, [f"{place}.{p}" for p in err.problems]
    except TypeError as err:  # a value of the wrong type compared with a bound
        return None, [f"{place}: {err}"]
