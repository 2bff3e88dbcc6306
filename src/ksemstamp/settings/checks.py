"""How a settings dataclass refuses values: one ``SettingsError`` that lists every problem, one
a line, each starting with the name of its field (``search.max_candidates`` once the group is
known: ``build_group``), so that a file or a command line can name the setting and its flag."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args, get_origin, get_type_hints


class SettingsError(ValueError):
    """Settings that cannot be used; ``problems`` lists each, one a line, each starting with the
    name of the field it is about."""

    def __init__(self, title: str, problems: list[str]) -> None:
        super().__init__(f"{title}:\n  " + "\n  ".join(problems))
        self.problems = problems


def check(group: object, problems: list[str]) -> None:
    """Raise ``SettingsError`` with ``problems`` and every ``Literal`` field of ``group`` whose
    value is not one of its choices."""
    hints = get_type_hints(type(group))
    for f in reversed(dataclasses.fields(group)):
        choices = get_args(hints[f.name]) if get_origin(hints[f.name]) is Literal else ()
        value = getattr(group, f.name)
        if choices and value not in choices:
            problems.insert(0, f"{f.name} must be one of {list(choices)}, not {value!r}")
    if problems:
        raise SettingsError(f"invalid {type(group).__name__}", problems)


def at_least(group: object, bound: int, *names: str, optional: bool = False) -> list[str]:
    """The problems of the fields ``names`` of ``group`` below ``bound`` (``None`` passes when
    ``optional``)."""
    problems = []
    for name in names:
        value = getattr(group, name)
        if not (optional and value is None) and value < bound:
            tail = " or null" if optional else ""
            problems.append(f"{name} must be >= {bound}{tail}, got {value}")
    return problems


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
