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

# OpenMP threads that spin while they wait for work hold their cores: on a machine another job
# is using they wait on each other, and a run takes 2 to 20 times as long (measured:
# benchmarks/results/threads.md). Threads that sleep instead cost little alone. Read when torch
# loads, so only where ksemstamp is imported first; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_EXPORTS = {
    "WatermarkSettings": "settings",
    "ModelSettings": "settings",
    "PartitionSettings": "settings",
    "DirectionSettings": "settings",
    "RegionSettings": "settings",
    "SearchSettings": "settings",
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
