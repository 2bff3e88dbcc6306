"""Internals that the lab (``lab/``, the studies still open) uses, named in one place.

Nothing here is promised to stay as it is: the public API is ``ksemstamp``'s own. The lab
imports only that and this module, so what the lab needs of the inside is listed here and
nowhere else.
"""

from __future__ import annotations

from .assets import load_encoder, load_lm
from .cli import main
from .evaluation.attacks import build_attack
from .evaluation.baselines import KGWDetector, KGWGenerator
from .evaluation.metrics import Oracle
from .evaluation.prompt_set import build_prompts
from .plots import save_figure
from .settings.evaluation import EvalSettings
from .text.corpora import news_articles
from .text.edits import EDITS, apply_edit, needs_human
from .text.splitter import get_splitter

__all__ = [
    "EDITS",
    "EvalSettings",
    "KGWDetector",
    "KGWGenerator",
    "Oracle",
    "apply_edit",
    "build_attack",
    "build_prompts",
    "get_splitter",
    "load_encoder",
    "load_lm",
    "main",
    "needs_human",
    "news_articles",
    "save_figure",
]
