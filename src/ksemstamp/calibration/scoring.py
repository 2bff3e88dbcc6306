"""Key-free scoring of many texts, then their p-values under any number of keys.

The detector's scoring plans (``Detector.plan_batch``) give each text what its mark scores,
which does not depend on the key; the mark keeps the key-free part of its statistic of each
text (``Mark.evidence``) and applies keys to it (``Mark.p_values``): the detector's own code,
under as many keys as calibration draws (the region mark: the valid count's exact law per
text, one table look-up per key; the direction mark: the per-context sums of the scored
vectors, one dot product per context and key, and the windowed tests' null draws, drawn once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..detection.plans import ScoringPlan
from ..detector import Detector
from ..plots import progress_bar
from ..scheme.core import WatermarkScheme
from .embeddings import with_cached_encoder

STATS = ("paper", "exact")
"""The statistics reports list first, in this order (a mark's others after them)."""
# The randomised exact p-value breaks ties uniformly; under the null it is exactly uniform, so
# its distance from uniform checks the null law itself. The detector reports the plain one.
DIAGNOSTIC = "exact_randomised"


@dataclass
class ScoredTexts:
    """What the detector scores in each text, independent of the key.

    Attributes:
        labels: source label of each text.
        counts: ``(N, K, K)`` counts of scored transitions ``(previous region, region)``.
        num_scored: ``(N,)`` scored units ``T``.
        too_short: how many texts had nothing to score (left out of the rest).
        evidence: the mark's key-free evidence of the texts, stacked (``Mark.batch``).
        items: the same, one per text (``Mark.evidence``).
        mark: the mark that scored them (it applies keys to ``evidence``).
        groups: per text, the document, speech or account it was cut from (``score_texts``'s
            ``groups``), for false positives that cluster by topic.
    """

    labels: list[str]
    counts: np.ndarray
    num_scored: np.ndarray
    too_short: dict[str, int]
    evidence: Any = None
    mark: Any = None
    groups: list[str] | None = None
    items: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, label: str) -> np.ndarray:
        """Indices of the texts with ``label``."""
        return np.array([i for i, x in enumerate(self.labels) if x == label], dtype=np.int64)


def stats_of(scored: ScoredTexts) -> tuple[str, ...]:
    """The statistics ``p_values`` gives for these texts (their mark's), in report order."""
    offered = tuple(scored.mark.statistics)
    return tuple(s for s in STATS if s in offered) + tuple(s for s in offered if s not in STATS)


def score_texts(
    scheme: WatermarkScheme,
    texts: Sequence[str],
    labels: Sequence[str],
    prompts: Sequence[str | None] | None = None,
    progress: bool = False,
    batch: int = 256,
    scan: bool = False,
    groups: Sequence[str] | None = None,
) -> ScoredTexts:
    """Run the detector's scoring rules once and keep each text's key-free evidence.

    Regions, seeding by the prompt and the repeat rule are the detector's own scoring plans
    (``Detector.plan_batch``), which do not depend on the key; the mark keeps its evidence of
    each text (``scan``: what its windowed tests need too). ``groups``: each text's group,
    kept for the scored texts.
    """
    scheme = with_cached_encoder(scheme)
    prompts = list(prompts) if prompts is not None else [None] * len(texts)
    _embed_every_sentence(scheme, texts, prompts, progress)
    detector = Detector(scheme, statistic="exact")
    mark = detector.mark
    kept = _Kept(scheme.num_regions)
    group_of = list(groups) if groups is not None else [""] * len(texts)
    bar = progress_bar(total=len(texts), unit="text", desc="score", disable=not progress)
    for start in range(0, len(texts), batch):
        chunk = slice(start, start + batch)
        plans = detector.plan_batch(list(texts[chunk]), prompts[chunk])
        usable = []
        for label, group, plan in zip(labels[chunk], group_of[chunk], plans, strict=True):
            bar.update()
            if kept.add(plan, label, group):
                usable.append(plan)
        if usable:
            kept.evidence += mark.evidence(usable, scan)
    bar.close()
    return kept.scored(mark, keep_groups=groups is not None)


def _embed_every_sentence(
    scheme: WatermarkScheme, texts: Sequence[str], prompts: Sequence[str | None], progress: bool
) -> None:
    """Embed every distinct sentence of ``texts`` and the last of each prompt in one pass of
    ``scheme``'s cached encoder, so that scoring the texts embeds nothing more."""
    splitter = scheme.splitter
    sentences = [s for t in texts for s in splitter.split(t)]
    sentences += [s for p in prompts if p for s in splitter.split(p)[-1:]]
    scheme.encoder.prefill(sentences, progress=progress)


@dataclass
class _Kept:
    """What ``score_texts`` keeps of each text, one text after the other, until ``scored``
    stacks it into ``ScoredTexts``."""

    num_regions: int
    labels: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)
    num_scored: list[int] = field(default_factory=list)
    evidence: list[Any] = field(default_factory=list)
    too_short: dict[str, int] = field(default_factory=dict)

    def add(self, plan: ScoringPlan, label: str, group: str) -> bool:
        """Keep what a text's scoring ``plan`` gives, or count the text as too short; returns
        whether it was kept."""
        if plan.error is not None or plan.num_scored == 0:
            self.too_short[label] = self.too_short.get(label, 0) + 1
            return False
        self.labels.append(label)
        self.groups.append(group)
        self.counts.append(plan.transition_counts(self.num_regions))
        self.num_scored.append(plan.num_scored)
        return True

    def scored(self, mark: Any, keep_groups: bool) -> ScoredTexts:
        """The kept texts as ``ScoredTexts``."""
        k = self.num_regions
        return ScoredTexts(
            labels=self.labels,
            counts=np.stack(self.counts) if self.counts else np.zeros((0, k, k), dtype=np.int64),
            num_scored=np.array(self.num_scored, dtype=np.int64),
            too_short=self.too_short,
            evidence=mark.batch(self.evidence) if self.evidence else None,
            mark=mark,
            groups=self.groups if keep_groups else None,
            items=self.evidence,
        )


def p_values(
    scored: ScoredTexts, material: Any, rng: np.random.Generator | None = None
) -> dict[str, np.ndarray]:
    """Every text's p-values under one key's ``material`` (``Mark.material``): each of the
    mark's statistics and, with ``rng``, the tie-randomised exact p-value (``DIAGNOSTIC``, a
    diagnostic exactly uniform under the null)."""
    (out,) = scored.mark.p_values(scored.evidence, [material], rng)
    out.pop("z", None)
    return out


def calibration_keys(mark: Any, num_keys: int, seed: int) -> list[Any]:
    """Per calibration key, its key material (``Mark.material``), built exactly as real keys
    build theirs, from the keys ``calibration|SEED|i``."""
    return [mark.material(f"calibration|{seed}|{i}") for i in range(num_keys)]


def own_key(mark: Any) -> Any:
    """The configured key's material, as ``p_values`` takes it."""
    return mark.own_material
