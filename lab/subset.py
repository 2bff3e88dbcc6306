"""``python -m lab subset``: a check made of another check's first texts.

    python -m lab subset --subset.source d075 --subset.name d012 --subset.prompts 12
    python -m lab check --run.name d012 --run.prompts 12 --run.stage detect

copies the generations, attacked texts and perplexities of ``source``'s first ``prompts``
``val`` prompts into ``runs/lab/check-NAME``, so that a 12-prompt check (another engine's, say)
is compared with the same 12 prompts of a 48-prompt one without generating them again;
``check --run.stage detect`` then writes its summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .check import ATTACKS, RUNS, val_prompts

FILES = ("generations.jsonl", "perplexity.jsonl", *(file for _, _, file, _ in ATTACKS.values()))
"""A check's per-text files (those ``source`` has are copied)."""


@dataclass(frozen=True)
class SubsetSettings:
    """Which check's first texts, under which name."""

    source: str = "d075"
    """The check whose texts are taken."""
    name: str = "d012"
    """The new check's name."""
    prompts: int = 12
    """Its first this many ``val`` prompts."""


def subset(subset: SubsetSettings | None = None) -> int:
    """Copy ``source``'s texts of the first ``prompts`` prompts (see the module docstring)."""
    subset = subset or SubsetSettings()
    source, target = RUNS / f"check-{subset.source}", RUNS / f"check-{subset.name}"
    if not (source / "generations.jsonl").exists():
        raise SystemExit(f"no check {subset.source!r} in {RUNS}")
    wanted = {q["id"] for q in val_prompts(subset.prompts)}
    target.mkdir(parents=True, exist_ok=True)
    for file in FILES:
        if (source / file).exists():
            lines = (source / file).read_text().splitlines(keepends=True)
            kept = [line for line in lines if json.loads(line)["id"] in wanted]
            (target / file).write_text("".join(kept))
            print(f"{file}: {len(kept)} of {len(lines)}")
    return 0
