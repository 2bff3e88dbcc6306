"""Every setting of the project, each a field of a small typed group, documented once.
May import: ksemstamp core modules and text; names by path: evaluation, generation, marks; never cli, builders, watermarker, detector or marks.

* ``watermark``: ``WatermarkSettings``; ``groups``: its groups (``model``, ``partition``,
  ``search``, ``sampling``, ``detection``, ``limits``), the default centroid files, the engines;
  ``marks``: the ``mark`` group, one class per kind, each kind's ``search`` class, and the
  registry of kinds; ``search``: the ``search`` fields every kind shares;
* ``files``: settings files, read and layered; ``checks``: the checks every group runs;
* ``devices``: ``--parallel.*``, how an input file is spread over devices;
* ``calibration``, ``evaluation``, ``training``: the groups of those commands.

The watermark's groups are importable from here (``from ksemstamp.settings import
WatermarkSettings``).
"""

from .checks import SettingsError
from .groups import (
    DEFAULT_CENTROIDS,
    ENGINES,
    MARK_KINDS,
    PACKAGE_DATA,
    PAPER_CENTROIDS,
    REPO_ROOT,
    DetectionSettings,
    DirectionSearch,
    DirectionSettings,
    LimitSettings,
    MarkSettings,
    ModelSettings,
    PartitionSettings,
    RegionSearch,
    RegionSettings,
    SamplingSettings,
    SearchSettings,
    register_engine,
    register_mark,
)
from .watermark import GROUPS, WatermarkSettings, merge

__all__ = [
    "DEFAULT_CENTROIDS",
    "ENGINES",
    "GROUPS",
    "MARK_KINDS",
    "PACKAGE_DATA",
    "PAPER_CENTROIDS",
    "REPO_ROOT",
    "DetectionSettings",
    "DirectionSearch",
    "DirectionSettings",
    "LimitSettings",
    "MarkSettings",
    "ModelSettings",
    "PartitionSettings",
    "RegionSearch",
    "RegionSettings",
    "SamplingSettings",
    "SearchSettings",
    "SettingsError",
    "WatermarkSettings",
    "register_engine",
    "register_mark",
    "merge",
]
