"""k-SemStamp and SemStamp: sentence-level semantic watermarks for language-model text.

The nouns a user starts from, importable from here (loaded on first use, so ``import
ksemstamp`` loads no model library)::

    from ksemstamp import WatermarkSettings, build_watermarker, build_detector

    settings = WatermarkSettings(key=my_key)                   # defaults: configs/ksemstamp.yaml
    text = build_watermarker(settings).generate([prompt])[0].text
    print(build_detector(settings).detect(text, prompt).p_value)

* ``WatermarkSettings`` and its groups (``settings``), read from files by ``settings.files``;
* ``build_watermarker``, ``build_detector``, ``build_scheme`` (``builders``): settings in,
  ready objects out, with names or loaded models;
* ``Watermarker`` (``watermarker``), ``Detector`` (``detector``), ``WatermarkScheme``
  (``scheme``), and the results they return (``results``).

The subpackages: ``marks`` (the key's rules), ``generation`` (the sentence loop's machinery),
``detection`` (plans and exact tests), ``text`` (normalising, splitting, corpora),
``training``, ``calibration``, ``evaluation``, ``serve``. The command line is ``cli``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def _busy() -> bool:
    """Whether other work keeps half the cores this process may use or more busy (the load
    average; the cores counted as ``builders.usable_cores`` counts them)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] >= max(1, cores / 2) - 0.1
    except (AttributeError, OSError):
        return False


# OpenMP threads spin a while when they wait for work, holding their cores: beside another job
# they wait on each other and a generation took 4.7x its time alone, threads that sleep instead
# 2.1x; alone, sleeping costs 1.4x (benchmarks/results/threads.md). So on a busy machine the
# threads sleep. Read when torch loads: only where ksemstamp is imported first; an explicit
# OMP_WAIT_POLICY wins. The policy changes how threads wait, never what they compute.
if "OMP_WAIT_POLICY" not in os.environ and _busy():
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

_EXPORTS = {
    "WatermarkSettings": "settings",
    "ModelSettings": "settings",
    "PartitionSettings": "settings",
    "DirectionSettings": "settings",
    "RegionSettings": "settings",
    "SearchSettings": "settings",
    "DirectionSearch": "settings",
    "RegionSearch": "settings",
    "SamplingSettings": "settings",
    "DetectionSettings": "settings",
    "LimitSettings": "settings",
    "load_watermark_settings": "settings.files",
    "build_watermarker": "builders",
    "build_detector": "builders",
    "build_scheme": "builders",
    "Watermarker": "watermarker",
    "Detector": "detector",
    "WatermarkScheme": "scheme.core",
    "GenerationResult": "results",
    "DetectionResult": "results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
