"""Key-free scoring of many texts, then their p-values under any number of keys.

The detector's scoring plans (``Detector.plan_batch``) give each text's scored transitions,
which do not depend on the key. Region mark: under a valid table only the valid count changes,
so both p-values of every text come from one table look-up: the paper's normal tail of the
z-score, and the exact key-randomisation p-value, whose null law (``stats.null_count_pmf``,
computed once per text) does not depend on the table at all. Direction mark: each text keeps
the sums of its scored sentences' vectors per context and their squared norm; under a key's
directions the exact z is one dot product per context (``stats.direction_z``). With the
scan (``ksemstamp.detection.scan``), each text also keeps its scored sentences' vectors and context
weights and the null draws of the span, mixture and weighted statistics, drawn once (they do
not depend on the key); a key's p-value is then the detector's combined p-value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from ..detection.plans import ScoringPlan
from ..detection.scan import NullLaw, combined_test, null_law, scan_seed
from ..detection.spans import score_covariance
from ..detection.stats import context_sums, normal_sf, null_count_pmf, paper_z
from ..detector import Detector
from ..keys import keyed_directions, valid_table
from ..scheme.core import WatermarkScheme
from .embeddings import with_cached_encoder

STATS = ("paper", "exact")
"""Statistics of the region mark; the direction mark has ``exact`` only (see ``stats_of``)."""
# The randomised exact p-value breaks ties uniformly; under the null it is exactly uniform, so
# its distance from uniform checks the null law itself. The detector reports the plain one.
DIAGNOSTIC = "exact_randomised"


@dataclass
class ScoredTexts:
    """What the detector scores in each text, independent of the key.

    Attributes:
        labels: source label of each text.
        counts: ``(N, K, K)`` counts of scored transitions ``(previous region, region)``.
        num_scored: ``(N,)`` scored sentences ``T``.
        survival: ``(N, Tmax + 2)``; ``survival[i, s]`` is ``P(S >= s)`` for text ``i`` over
            uniformly random valid tables (zero past ``T``), i.e. its exact p-value at count ``s``.
        pmf: ``(N, Tmax + 1)``; ``pmf[i, s] = P(S = s)`` under the same law.
        too_short: how many texts had nothing to score (left out of ``counts``).
        direction: for the direction mark, the key-free part of each text's statistic
            (``DirectionSums``); ``None`` for the region mark (``survival`` and ``pmf`` are
            then empty).
    """

    labels: list[str]
    counts: np.ndarray
    num_scored: np.ndarray
    survival: np.ndarray
    pmf: np.ndarray
    too_short: dict[str, int]
    direction: DirectionSums | None = None
    scans: list[TextScan | None] | None = None
    """Direction mark with the scan: per text, what its scan needs (``None``: too short)."""
    groups: list[str] | None = None
    """Per text, the document, speech or account it was cut from (``score_texts``'s
    ``groups``), for false positives that cluster by topic."""

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, label: str) -> np.ndarray:
        """Indices of the texts with ``label``."""
        return np.array([i for i, x in enumerate(self.labels) if x == label], dtype=np.int64)


@dataclass
class DirectionSums:
    """Per text and context, the sum of the scored sentences' vectors (``stats.context_sums``),
    stacked over texts: row ``r`` belongs to text ``text[r]`` and context ``context[r]``."""

    text: np.ndarray
    """``(R,)`` text index of each row."""
    context: np.ndarray
    """``(R,)`` context (region whose direction the row's sum meets) of each row."""
    sums: np.ndarray
    """``(R, D)`` the vector sums."""
    variance: np.ndarray
    """``(N,)`` per text, the null variance of its total score (sum of squared row norms)."""

    def z(self, directions: np.ndarray) -> np.ndarray:
        """``(N,)`` exact z of every text under ``(K, D)`` directions."""
        dots = np.einsum("rd,rd->r", self.sums, np.asarray(directions, np.float64)[self.context])
        total = np.bincount(self.text, weights=dots, minlength=len(self.variance))
        return total / np.sqrt(self.variance)


@dataclass
class TextScan:
    """One text's key-free part of the scan: its scored sentences' ``vectors`` ``(T, D)``,
    their context ``weights`` ``(T, K)``, the scores' null covariance and the null draws of
    the largest span z."""

    vectors: np.ndarray
    weights: np.ndarray
    cov: np.ndarray
    null: NullLaw

    def p_value(self, directions: np.ndarray, p_text: float) -> float:
        """The detector's combined p-value under a key's ``(K, D)`` directions, for the whole
        text's ``p_text`` under the same key."""
        scores = np.einsum("td,td->t", self.weights @ directions, self.vectors)
        return combined_test(scores, self.cov, p_text, null=self.null).p_value


def stats_of(scored: ScoredTexts) -> tuple[str, ...]:
    """The statistics ``p_values`` gives for these texts."""
    return ("exact",) if scored.direction is not None else STATS


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
    """Run the detector's scoring rules once and keep each text's key-free transition counts.

    Regions, seeding by the prompt and the repeat rule are the detector's own scoring plans
    (``Detector.plan_batch``), which do not depend on the key. ``scan`` (direction mark): keep
    what the detector's windowed detection needs too (``TextScan``). ``groups``: each text's
    group, kept for the scored texts.
    """
    scheme = with_cached_encoder(scheme)
    prompts = list(prompts) if prompts is not None else [None] * len(texts)
    _embed_every_sentence(scheme, texts, prompts, progress)
    detector = Detector(scheme, statistic="exact")
    direction = scheme.mark == "direction"
    size = 0 if direction else int(scheme.table[0].sum().item())
    kept = _Kept(scheme.num_regions, size, direction, scan)
    group_of = list(groups) if groups is not None else [""] * len(texts)
    bar = tqdm(total=len(texts), unit="text", desc="score", disable=not progress)
    for start in range(0, len(texts), batch):
        chunk = slice(start, start + batch)
        plans = detector.plan_batch(list(texts[chunk]), prompts[chunk])
        for label, group, plan in zip(labels[chunk], group_of[chunk], plans, strict=True):
            bar.update()
            kept.add(plan, label, group)
    bar.close()
    dim = int(scheme.directions.shape[1]) if direction else 0
    return kept.scored(dim, keep_groups=groups is not None)


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
    size: int
    """The valid set's size (region mark; 0 under the direction mark)."""
    direction: bool
    scan: bool
    labels: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)
    num_scored: list[int] = field(default_factory=list)
    laws: list[np.ndarray] = field(default_factory=list)
    """Region mark: each text's null law of its valid count."""
    rows_text: list[int] = field(default_factory=list)
    rows_context: list[int] = field(default_factory=list)
    rows_sum: list[np.ndarray] = field(default_factory=list)
    variance: list[float] = field(default_factory=list)
    scans: list[TextScan | None] = field(default_factory=list)
    too_short: dict[str, int] = field(default_factory=dict)

    def add(self, plan: ScoringPlan, label: str, group: str) -> None:
        """Keep what a text's scoring ``plan`` gives, or count the text as too short."""
        if plan.error is not None or plan.num_scored == 0:
            self.too_short[label] = self.too_short.get(label, 0) + 1
            return
        matrix = plan.transition_counts(self.num_regions)
        if self.direction:
            self._add_direction(plan)
        else:
            self.laws.append(null_count_pmf(matrix, self.size))
        self.labels.append(label)
        self.groups.append(group)
        self.counts.append(matrix)
        self.num_scored.append(plan.num_scored)

    def _add_direction(self, plan: ScoringPlan) -> None:
        """The direction mark's part of a text: its sums per context (``DirectionSums``) and,
        with the scan, what the scan needs (``TextScan``)."""
        rows, _ = plan.scored_contexts()
        vectors = plan.vectors[rows].double().cpu().numpy()
        weights = plan.context_weights(rows).cpu().numpy()
        distinct, sums = context_sums(vectors, weights)
        if self.scan:
            self.scans.append(_text_scan(vectors, weights, [plan.sentences[t] for t in rows]))
        self.rows_text += [len(self.labels)] * len(distinct)
        self.rows_context += distinct.tolist()
        self.rows_sum.append(sums)
        self.variance.append(float((sums**2).sum()))

    def scored(self, dim: int, keep_groups: bool) -> ScoredTexts:
        """The kept texts as ``ScoredTexts`` (``dim``: the directions' dimension)."""
        k = self.num_regions
        pmf, survival = _tail_arrays(self.laws)
        sums_of = None
        if self.direction:
            sums_of = DirectionSums(
                text=np.array(self.rows_text, dtype=np.int64),
                context=np.array(self.rows_context, dtype=np.int64),
                sums=np.concatenate(self.rows_sum) if self.rows_sum else np.zeros((0, dim)),
                variance=np.array(self.variance, dtype=np.float64),
            )
        return ScoredTexts(
            labels=self.labels,
            counts=np.stack(self.counts) if self.counts else np.zeros((0, k, k), dtype=np.int64),
            num_scored=np.array(self.num_scored, dtype=np.int64),
            survival=survival,
            pmf=pmf,
            too_short=self.too_short,
            direction=sums_of,
            scans=self.scans if self.direction and self.scan else None,
            groups=self.groups if keep_groups else None,
        )


def _text_scan(vectors: np.ndarray, weights: np.ndarray, sentences: list[str]) -> TextScan | None:
    cov = score_covariance(weights, vectors)
    null = null_law(cov, scan_seed(sentences))
    return None if null is None else TextScan(vectors, weights, cov, null)


def _tail_arrays(laws: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Pad per-text laws into ``pmf`` ``(N, Tmax + 1)`` and ``survival`` ``(N, Tmax + 2)``."""
    width = max((len(law) for law in laws), default=1)
    pmf = np.zeros((len(laws), width))
    for i, law in enumerate(laws):
        pmf[i, : len(law)] = law
    # survival[:, s] = sum_{j >= s} pmf[:, j]; one extra zero column for counts past T.
    tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]
    survival = np.concatenate([tail, np.zeros((len(laws), 1))], axis=1)
    return pmf, np.minimum(survival, 1.0)


def p_values(
    scored: ScoredTexts, table: np.ndarray, gamma: float, rng: np.random.Generator | None = None
) -> dict[str, np.ndarray]:
    """Every text's p-values under one key: for the region mark, under its valid ``table``,
    ``paper``, ``exact`` and, with ``rng``, the tie-randomised exact p-value (a diagnostic that
    is exactly uniform under the null); for the direction mark, ``table`` holds the key's
    ``(K, D)`` directions and the exact p-value is continuous (its diagnostic is itself),
    combined with the scan's when the texts were scored with it."""
    if scored.direction is not None:
        z = scored.direction.z(table)
        exact = np.array([normal_sf(float(v)) for v in z])
        if scored.scans is not None:
            directions = np.asarray(table, np.float64)
            exact = np.array(
                [
                    p if s is None else s.p_value(directions, p)
                    for p, s in zip(exact, scored.scans, strict=True)
                ]
            )
        return {"exact": exact, **({DIAGNOSTIC: exact} if rng is not None else {})}
    observed = np.einsum("nij,ij->n", scored.counts, np.asarray(table, dtype=np.int64))
    rows = np.arange(len(scored))
    out = {
        "paper": np.array(
            [
                normal_sf(paper_z(int(v), int(t), gamma))
                for v, t in zip(observed, scored.num_scored, strict=True)
            ]
        ),
        "exact": scored.survival[rows, observed],
    }
    if rng is not None:
        u = rng.random(len(scored))
        out[DIAGNOSTIC] = scored.survival[rows, observed + 1] + u * scored.pmf[rows, observed]
    return out


def calibration_tables(num_regions: int, gamma: float, num_keys: int, seed: int) -> list:
    """``num_keys`` keyed valid tables built exactly as real keys build them (HMAC ranking)."""
    return [
        valid_table(num_regions, gamma, f"calibration|{seed}|{i}").numpy() for i in range(num_keys)
    ]


def calibration_keys(scheme: WatermarkScheme, num_keys: int, seed: int) -> list[np.ndarray]:
    """Per calibration key, what ``p_values`` takes: the valid table (region mark) or the
    ``(K, D)`` directions (direction mark), built exactly as real keys build them."""
    if scheme.mark == "region":
        return calibration_tables(scheme.num_regions, scheme.gamma, num_keys, seed)
    dim = int(scheme.directions.shape[1])
    return [
        keyed_directions(scheme.num_regions, dim, f"calibration|{seed}|{i}").double().numpy()
        for i in range(num_keys)
    ]


def own_key(scheme: WatermarkScheme) -> np.ndarray:
    """The configured key's table or directions, as ``p_values`` takes them."""
    if scheme.mark == "region":
        return scheme.table.cpu().numpy()
    return scheme.directions.double().cpu().numpy()


def simulate_watermarked(
    transition: np.ndarray,
    table: np.ndarray,
    lengths: Sequence[int],
    rng: np.random.Generator,
) -> np.ndarray:
    """``(N, K, K)`` scored-transition counts of simulated watermarked texts.

    The first region is drawn from the domain's region frequencies; each next region from the
    domain's transitions out of the previous region, restricted to its valid set (uniform over
    the valid set if the domain never made such a move). One text per entry of ``lengths``,
    each with that many scored sentences.
    """
    transition = np.asarray(transition, dtype=np.float64)
    k = transition.shape[0]
    start = transition.sum(axis=1) + 1e-12
    start /= start.sum()
    moves = []
    for q in range(k):
        w = transition[q] * table[q]
        if w.sum() <= 0:
            w = table[q].astype(np.float64)
        moves.append(w / w.sum())
    out = np.zeros((len(lengths), k, k), dtype=np.int64)
    for i, length in enumerate(lengths):
        q = rng.choice(k, p=start)
        for _ in range(int(length)):
            nxt = rng.choice(k, p=moves[q])
            out[i, q, nxt] += 1
            q = nxt
    return out


def scored_from_counts(counts: np.ndarray, size: int, label: str) -> ScoredTexts:
    """``ScoredTexts`` for given ``(N, K, K)`` transition counts (no text behind them)."""
    pmf, survival = _tail_arrays([null_count_pmf(c, size) for c in counts])
    return ScoredTexts(
        labels=[label] * len(counts),
        counts=counts,
        num_scored=counts.sum(axis=(1, 2)),
        survival=survival,
        pmf=pmf,
        too_short={},
    )
