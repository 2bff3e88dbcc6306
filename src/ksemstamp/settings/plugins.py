"""Engines, marks and attacks offered by installed packages, through Python entry points.

A package registers without editing ksemstamp by declaring, in its own ``pyproject.toml``::

    [project.entry-points."ksemstamp.engines"]
    myengine = "mypackage.engine:MyEngine"          # an Engine class with from_settings

    [project.entry-points."ksemstamp.marks"]
    mymark = "mypackage.mark:MyMarkSettings"        # a settings class, as register_mark takes

    [project.entry-points."ksemstamp.attacks"]
    myattack = "mypackage.attack:ATTACK"            # an AttackKind, or a builder function

They are read the first time a name is looked up that the built-in registries lack
(``--sampling.engine myengine``, ``mark: {kind: mymark}``, ``paraphraser: myattack``), so an
unused plugin is never imported. An engine is registered by its path (imported when first used); a mark's settings class and an
attack are imported then (``register_mark`` checks the class; an attack's ``AttackKind`` says
whether it needs the evaluation's LM, a bare builder does not).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

logger = logging.getLogger(__name__)

ENGINES = "ksemstamp.engines"
MARKS = "ksemstamp.marks"
ATTACKS = "ksemstamp.attacks"
_read: set[str] = set()


def register_plugins(group: str, register: Callable[[EntryPoint], None]) -> None:
    """``register`` each entry point of ``group`` the first time the group is asked for (once
    per process, until ``reload_plugins``); one that fails is named in a warning and left out,
    the others still register."""
    if group in _read:
        return
    _read.add(group)
    for point in entry_points(group=group):
        try:
            register(point)
        except Exception as err:  # a broken plugin must not stop the others
            logger.warning(
                "plugin %s = %s (%s) not loaded: %s", point.name, point.value, group, err
            )


def reload_plugins() -> None:
    """Read the entry points again at the next lookup (after installing a package)."""
    _read.clear()
