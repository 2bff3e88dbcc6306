"""Settings for generation and detection, and the builders that turn them into objects.

The one import path for both: ``WatermarkConfig`` and the settings file are defined in
``settings``, the builders (``build_scheme``, ``build_watermarker``, ``build_detector``) in
``builders``.
"""

from __future__ import annotations

from .builders import (
    apply_threads,
    build_detector,
    build_scheme,
    build_watermarker,
    load_centroids,
    load_scheme_encoder,
)
from .settings import (
    DEFAULT_CENTROIDS,
    PACKAGE_DATA,
    PAPER_CENTROIDS,
    REPO_ROOT,
    WatermarkConfig,
    load_settings_file,
)

__all__ = [
    "DEFAULT_CENTROIDS",
    "PACKAGE_DATA",
    "PAPER_CENTROIDS",
    "REPO_ROOT",
    "WatermarkConfig",
    "apply_threads",
    "build_detector",
    "build_scheme",
    "build_watermarker",
    "load_centroids",
    "load_scheme_encoder",
    "load_settings_file",
]
