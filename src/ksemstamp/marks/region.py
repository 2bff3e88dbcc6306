"""The region mark (k-SemStamp; SemStamp with an LSH partition): ordered first-valid.

A candidate is accepted when its region is in the valid set that the key draws for the
previous unit's region and it lies at least the margin from its region's border. The sampler
keeps the first accepted candidate in draw order; after ``max_candidates`` draws the loop keeps
the last one drawn (a fallback). The detector counts the valid transitions (the paper's z, and
the exact p-value of key randomisation). SemStamp differs only in the partition
(``LSHPartition``), so it is this mark too.

Novelty (an extension, ``search.novelty_patience > 0``; ``0`` is the paper's rule): a valid
candidate whose transition ``(previous region, region)`` already occurs in the document is only
accepted once ``novelty_patience`` candidates have been drawn for the unit. A repeated
transition adds nothing to the evidence of a key-randomisation test (its valid count moves with
the one already there), so texts that circle in one self-valid region are hard to tell from
human text on the same topic (the default patience's measurement: docs/design.md,
"Constants measured once").

Margin patience (an extension, ``search.margin_patience``; ``None`` is the paper's rule): after
that many candidates for a unit, a candidate in a valid region is accepted even when it lies
closer than the margin to its region's border. The margin makes a unit's region survive a
paraphrase more often, but where the LM's next units rarely reach a valid region far from a
border, insisting on it to ``max_candidates`` costs many draws and ends in a fallback that is
not valid at all.

The exact test: under uniformly random valid tables the count of valid transitions of a text
has a law fixed by its transition counts alone (``stats.null_count_pmf``); the p-value is its
upper tail at the observed count. Its presentation (the chart of that law, the report's words)
is ``region_view``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..detection.stats import (
    P_FLOOR,
    log_normal_sf,
    normal_sf,
    null_count_pmf,
    paper_z,
    reported_p,
)
from ..results import DetectionResult, Judgement, too_short
from ..scheme.keyed import num_valid, valid_table
from ..settings.groups import RegionSearch
from .base import Drawn, Mark, Verdict, plan_result
from .region_view import describe_region, region_view, simulate_watermarked

TINY = 5e-324
"""float64's least positive number: the bound of an exact p-value that underflows."""

if TYPE_CHECKING:
    from ..detection.plans import ScoringPlan

MARGIN_PASS_RATE = 0.74
"""Share of the domain's sentences at least the default margin from their region's border
(docs/design.md, "Constants measured once"): with the domain's chance of a valid region, the
prior acceptance rate of a candidate."""
DIAGNOSTIC = "exact_randomised"
"""The tie-randomised exact p-value: exactly uniform under the null, so its distance from
uniform checks the null law itself (calibration)."""


@dataclass
class Transitions:
    """The key-free part of a text's statistic: its scored transitions and their null law."""

    counts: np.ndarray
    """``(K, K)`` counts of the scored transitions ``(previous region, region)``."""
    law: np.ndarray
    """``law[s] = P(S = s)``: the valid count's law over uniformly random valid tables."""

    @property
    def num_scored(self) -> int:
        return int(self.counts.sum())


@dataclass
class TransitionBatch:
    """Many texts' transitions (``RegionMark.batch``)."""

    counts: np.ndarray
    """``(N, K, K)`` transition counts."""
    scored: np.ndarray
    """``(N,)`` scored units."""
    pmf: np.ndarray
    """``(N, Tmax + 1)`` the null laws, padded."""
    survival: np.ndarray
    """``(N, Tmax + 2)``: ``survival[i, s] = P(S >= s)``, the exact p-value at count ``s``."""


class RegionMark(Mark):
    """The valid-region rule (see the module docstring)."""

    kind = "region"
    rejections = ("region", "margin", "repeat")

    def configure(self, key: str | None, search: RegionSearch, steering: Any) -> None:
        """The key's valid table and the generation effort's patience (no steering)."""
        scheme, settings = self.scheme, self.settings
        self.gamma = float(settings.gamma)
        self.valid_mode = settings.valid_mode
        self.keyed = settings.valid_mode == "keyed"
        self.size = num_valid(scheme.num_regions, self.gamma)
        self.novelty_patience = search.novelty_patience
        self.margin_patience = search.margin_patience
        # Detection reads the table entry by entry, in Python: from a copy on the host.
        self.host_table = self.material(key)
        self.table = self.host_table.to(scheme.device)

    # ------------------------------------------------------------------ the key
    def material(self, key: str | None):
        """The ``(K, K)`` bool valid table of ``key`` (``valid_mode``'s rule)."""
        return valid_table(self.scheme.num_regions, self.gamma, key, self.valid_mode)

    @property
    def own_material(self):
        return self.host_table

    # ------------------------------------------------------------------ generation
    def new_state(self) -> set[tuple[int, int]]:
        """The transitions the document has made (for novelty)."""
        return set()

    def prior(self, previous: int) -> float:
        return self.acceptance_rate(previous) * MARGIN_PASS_RATE

    def acceptance_rate(self, previous: int) -> float:
        """Estimated chance that the LM's next unit lands in a valid region after
        ``previous``: from the domain transition counts (add-one smoothed) when the partition
        came with them, else ``gamma`` (regions taken as independent and equally likely)."""
        transition = self.scheme.transition
        if transition is None:
            return self.gamma
        row = transition[previous].double().cpu() + 1.0
        return float((row / row.sum())[self.host_table[previous]].sum())

    def judge(self, drawn: Drawn) -> list[Verdict]:
        # A completing document has no previous region yet (-1): its verdicts are not used.
        previous = [drawn.docs[g].previous for g, _ in drawn.rows]
        valid = self.table[
            _on(previous, self.table.device), _on(drawn.regions, self.table.device)
        ].tolist()
        out = []
        for (g, i), r, v, m in zip(
            drawn.rows, drawn.regions.tolist(), valid, drawn.margin_ok.tolist(), strict=True
        ):
            doc = drawn.docs[g]
            draw = doc.drawn + i + 1
            m = m or (self.margin_patience is not None and draw > self.margin_patience)
            novel = (
                self.novelty_patience == 0
                or (doc.previous, r) not in doc.state
                or draw >= self.novelty_patience
            )
            reason = None if v and m and novel else ("region" if not v else "margin")
            if v and m and not novel:
                reason = "repeat"
            verdict = Judgement(int(r), bool(v), novel, reason=reason)
            out.append((reason is None, verdict))
        return out

    def commit(self, state, previous: int, kept: Judgement, scored: bool):
        if scored:
            state.add((previous, kept.region))
        return state

    # ------------------------------------------------------------------ detection
    def evidence(self, plans: Sequence[ScoringPlan], scan: bool = False) -> list[Transitions]:
        out = []
        for plan in plans:
            counts = plan.transition_counts(self.scheme.num_regions)
            out.append(Transitions(counts, null_count_pmf(counts, self.size)))
        return out

    def batch(self, evidence: Sequence[Transitions]) -> TransitionBatch:
        """Texts' transition counts stacked, with their laws' tails (``tail_arrays``)."""
        counts = np.stack([e.counts for e in evidence]).astype(np.int64)
        pmf, survival = tail_arrays([e.law for e in evidence])
        return TransitionBatch(counts, counts.sum(axis=(1, 2)), pmf, survival)

    def p_values(
        self, batch: TransitionBatch, materials: Sequence[Any], rng=None
    ) -> list[dict[str, np.ndarray]]:
        """Per valid table, each text's paper z, its normal tail (``paper``) and the exact
        p-value (``exact``), all from one table look-up per text; with ``rng`` also the
        tie-randomised exact p-value (``DIAGNOSTIC``)."""
        if not isinstance(batch, TransitionBatch):
            batch = self.batch(batch)
        rows = np.arange(len(batch.counts))
        out = []
        for material in materials:
            valid = np.einsum("nij,ij->n", batch.counts, np.asarray(material, dtype=np.int64))
            z = np.array(
                [
                    paper_z(int(v), int(t), self.gamma)
                    for v, t in zip(valid, batch.scored, strict=True)
                ]
            )
            one = {
                "z": z,
                "paper": np.array([normal_sf(float(x)) for x in z]),
                "exact": batch.survival[rows, valid],
            }
            if rng is not None:
                u = rng.random(len(rows))
                one[DIAGNOSTIC] = batch.survival[rows, valid + 1] + u * batch.pmf[rows, valid]
            out.append(one)
        return out

    def test_batch(
        self, plans: Sequence[ScoringPlan], statistic: str, alpha: float, scan: bool
    ) -> list[DetectionResult]:
        """Each plan's verdicts (valid or not under the table) and the paper's z; its
        ``p_value`` under ``statistic`` (``exact``: key randomisation over the text's
        transitions). The region mark has no windowed tests (``scan`` is not read)."""
        results, scored = [], []
        table = self.host_table
        for plan in plans:
            verdicts = [
                ("valid" if bool(table[prev, region]) else "invalid") if counted else role
                for prev, region, counted, role in zip(
                    plan.previous, plan.regions, plan.scored, plan.roles, strict=True
                )
            ]
            results.append(plan_result(plan, statistic, verdicts, plan.num_scored))
            if plan.num_scored == 0:
                too_short(results[-1])
            else:
                scored.append(len(results) - 1)
        if scored:
            (tested,) = self.p_values(self.evidence([plans[i] for i in scored]), [table])
            for n, i in enumerate(scored):
                z = float(tested["z"][n])
                p = float(tested[statistic][n])
                # The paper's normal tail in log space; the exact null's survival, which is 0
                # only below float64's least number (about 500 scored units, all valid).
                log_p = log_normal_sf(z) if statistic == "paper" else math.log(max(p, TINY))
                results[i].z_score = z
                results[i].p_value, results[i].log10_p_value = (
                    reported_p(log_p) if p < P_FLOOR else (p, None)
                )
                results[i].watermarked = results[i].p_value <= alpha
        return results

    def simulated_power(
        self, materials: Sequence[Any], lengths: np.ndarray, count: int, rng: np.random.Generator
    ) -> dict[str, Any] | None:
        """Per valid table, the p-values of ``count`` simulated watermarked texts
        (``simulate_watermarked``: region sequences moving by the domain's transitions
        restricted to the valid sets), their scored units drawn from ``lengths``; ``None``
        without the domain's transition counts."""
        if self.scheme.transition is None:
            return None
        transition = self.scheme.transition.cpu().numpy()
        per_key = []
        for table in materials:
            drawn = rng.choice(lengths, size=count)
            counts = simulate_watermarked(transition, np.asarray(table), drawn, rng)
            evidence = [Transitions(c, null_count_pmf(c, self.size)) for c in counts]
            (p,) = self.p_values(evidence, [table])
            p.pop("z")
            per_key.append(p)
        return {
            "what": (
                "simulated region sequences, not generated text: the first region from the "
                "domain's region frequencies, each next one from the domain transition matrix "
                "(centroid file) restricted to the valid set; no fallbacks, no margin"
            ),
            "p_values": per_key,
        }

    # ------------------------------------------------------------------ presentation
    def describe(self, scan: bool = False) -> dict[str, Any]:
        return describe_region(self)

    def view(self, result: DetectionResult, alpha: float, unit: str) -> dict[str, Any]:
        return region_view(self, result, alpha, unit)


def _on(values, device):
    import torch

    return torch.as_tensor(values, device=device)


def tail_arrays(laws: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Pad per-text laws into ``pmf`` ``(N, Tmax + 1)`` and ``survival`` ``(N, Tmax + 2)``:
    ``survival[i, s] = P(S >= s)``, zero past the text's scored count."""
    width = max((len(law) for law in laws), default=1)
    pmf = np.zeros((len(laws), width))
    for i, law in enumerate(laws):
        pmf[i, : len(law)] = law
    tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]
    survival = np.concatenate([tail, np.zeros((len(laws), 1))], axis=1)
    return pmf, np.minimum(survival, 1.0)
