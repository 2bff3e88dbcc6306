"""The direction mark: a score per sentence, best of ``max_candidates`` (or first over a threshold).

A candidate's score is the projection of its whitened embedding on the key's direction for its
context (``WatermarkScheme.scores``). With a ``threshold`` the first candidate that reaches it is
accepted and, after ``max_candidates`` draws, the best-scoring one is kept (a fallback that
still carries most of the evidence a sentence can). Without one (the default) no candidate is
accepted: the mark ranks, and the loop keeps the best of the budget, by rule. The detector sums
the scores into an exact z (``stats.direction_z``), with the windowed ``scan`` beside it.

Pruning (an option, ``prune``; the default without a threshold, see ``pruning``): a round draws
``max_candidates`` rows and every ``prune.every`` tokens the rows still running are scored on
their text so far; the rule stops the ones unlikely to become the best. A stopped row counts as
a drawn candidate (``pruned``) but not against ``max_candidates``: a round whose finished rows
hold no usable sentence is followed by another for the rest of the budget, as an unpruned one
would be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..detection.scan import combined_tests, scan_seed
from ..detection.spans import score_covariance
from ..detection.stats import P_FLOOR, log_normal_sf, normal_sf
from ..generation.pruning import PruneRule, rows_to_keep
from ..generation.sampler import Candidate, Pruner, PruneVerdict
from ..generation.steering import Steering
from ..results import DetectionResult, Judgement, rank_of, too_short
from ..settings.groups import DirectionSettings
from ..text.normalize import sentence_key
from .base import Mark, Round, SentenceState, Verdict, plan_result

if TYPE_CHECKING:
    from ..detection.plans import ScoringPlan
    from ..scheme.core import WatermarkScheme


SELECTIONS = ("text", "sentence")


def text_gains(
    scores: Tensor,
    contexts: Tensor,
    vectors: Tensor,
    evidence: Sequence[tuple[Tensor | None, float]],
) -> Tensor:
    """``(R,)`` each candidate's score less what it repeats of its text's evidence so far.

    The detector's z of a text is ``S / sqrt(V)``: ``S`` the sum of its sentences' scores and
    ``V = |E|^2`` the null variance, ``E`` the sum of each sentence's scored context (x) vector.
    Adding a candidate with score ``s`` and covariance ``c = a^T E u`` with the text moves the
    z, to first order, by ``(s - (S / V) c) / sqrt(V)`` (and a term common to all candidates).
    A candidate that says again what the text has said scores high for the same reason the
    earlier sentence did, and adds variance as fast as evidence: ranked by its own score it is
    kept often, and a text of such sentences counts like a few (the effective number of
    sentences, ``N^2 / V``). Ranked by this gain, the kept sentence is the one that raises
    the text's z most.

    Args:
        scores: ``(R,)`` the candidates' scores.
        contexts: ``(R, K)`` the contexts they were scored on.
        vectors: ``(R, D)`` their scored vectors.
        evidence: per candidate, its text's ``(K, D)`` evidence ``E`` (``None``: no sentence
            kept yet) and score sum ``S``.
    """
    gains = scores.double().clone()
    for r, (total, score_sum) in enumerate(evidence):
        if total is None or score_sum <= 0:
            continue
        variance = float((total**2).sum())
        overlap = contexts[r].double() @ total @ vectors[r].double()
        gains[r] -= score_sum / variance * overlap
    return gains


class DirectionMark(Mark):
    """Keyed directions per context; ``threshold``, ``prune`` and ``selection`` as in the module
    docstring."""

    name = "direction"

    def __init__(
        self,
        scheme: WatermarkScheme,
        threshold: float | None = DirectionSettings.threshold,
        prune: PruneRule | None = None,
        selection: str = DirectionSettings.selection,
        steering: Steering | None = None,
    ) -> None:
        super().__init__(scheme)
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, not {selection!r}")
        self.threshold = math.inf if threshold is None else float(threshold)
        self.prune = prune
        self.selection = selection
        self.steering = steering if steering is not None and steering.strength > 0 else None

    def round_bias(self, docs: Sequence[SentenceState]) -> Tensor | None:
        """``(docs, V)`` logit bias of a round under ``steering``: toward the context each
        document's last unit handed on (none for a document completing its prompt's sentence,
        or with no context yet)."""
        if self.steering is None:
            return None
        none = torch.zeros(self.scheme.num_regions, dtype=torch.float64)
        weights = [
            none if d.completing or d.weights is None else d.weights.double().cpu() for d in docs
        ]
        return self.steering.bias(torch.stack(weights))

    @property
    def turns_down(self) -> bool:
        return math.isfinite(self.threshold)

    def prior(self, previous: int) -> float:
        # A unit vector's projection on a standard normal direction is N(0, 1).
        return normal_sf(self.threshold)

    def contexts(self, emb: Tensor, regions: Tensor) -> list[Tensor | None]:
        return list(self.scheme.context_weights(emb, regions))

    def start_context(self) -> Tensor | None:
        return self.scheme.region_weights([self.scheme.start_region])[0]

    def judge(self, drawn: Round) -> list[Verdict]:
        """Each candidate's score; one that repeats a sentence its document already holds is
        not ``novel`` (detection does not score a repeat) and is neither accepted nor ranked."""
        own = self.contexts(drawn.emb, drawn.regions)
        scored = self._score_rows(drawn.docs, drawn.rows, drawn.emb, own)
        scores, ranks = scored[0].tolist(), scored[3].tolist()
        novel = [
            not text or sentence_key(text) not in drawn.docs[g].seen
            for (g, _), text in zip(drawn.rows, drawn.texts or [""] * len(drawn.rows), strict=True)
        ]
        out = []
        contexts, vectors = scored[1], scored[2]
        for i, (r, score, context, new) in enumerate(
            zip(drawn.regions.tolist(), scores, own, novel, strict=True)
        ):
            valid = score >= self.threshold
            verdict = Judgement(
                int(r), valid, True, new, float(score), context, ranks[i], (contexts[i], vectors[i])
            )
            out.append((valid and new, verdict))
        return out

    def _score_rows(
        self,
        docs: Sequence[SentenceState],
        rows: Sequence[tuple[int, int]],
        emb: Tensor,
        own: list[Tensor | None] | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Scores ``(R,)`` of candidates ``rows`` with embeddings ``emb``, each on its ``own``
        context under ``context: own``, else on its document's previous sentence's (zeros
        while a document has none); with the ``(R, K)`` contexts and ``(R, D)`` vectors they
        were scored on, and the ``(R,)`` values they rank by (``selection``)."""
        if self.scheme.context == "own":
            contexts = torch.stack(own)
        else:
            none = torch.zeros(self.scheme.num_regions, dtype=torch.float64)
            contexts = torch.stack(
                [none if docs[g].weights is None else docs[g].weights for g, _ in rows]
            )
        vectors = self.scheme.vectors(emb)
        scores = self.scheme.scores(vectors, contexts)
        ranks = scores
        if self.selection == "text":
            ranks = text_gains(
                scores,
                contexts,
                vectors,
                [(docs[g].evidence, docs[g].evidence_score) for g, _ in rows],
            )
        return scores, contexts, vectors, ranks

    def pruner(self, docs: Sequence[SentenceState]) -> Pruner | None:
        if self.prune is None or self.turns_down:
            return None
        return Pruner(self.prune.every, partial(self._prune_rows, docs))

    def _prune_rows(
        self,
        docs: Sequence[SentenceState],
        tokens: int,
        rows: list[tuple[int, int]],
        texts: list[str],
        finished: list[list[Candidate]],
    ) -> list[bool] | PruneVerdict:
        """The pruner's decision: score the running rows' partial texts on their documents'
        contexts (one encoder pass) and apply ``pruning.rows_to_keep`` per document. Rows
        completing a prompt's sentence always go on. Under ``steering`` with own contexts, the
        rows are steered from now on toward their partial texts' own contexts."""
        flags = [True] * len(rows)
        groups: dict[int, list[int]] = {}
        for i, (g, _) in enumerate(rows):
            if not docs[g].completing:
                groups.setdefault(g, []).append(i)
        order = [i for ids in groups.values() for i in ids]
        if not order:
            return flags
        emb = self.scheme.embed([texts[i] for i in order])
        own = list(self.scheme.context_weights(emb)) if self.scheme.context == "own" else None
        bias = None
        if self.steering is not None and own is not None:
            # From here on each row is steered toward the context its own text is heading to.
            weights = torch.zeros(len(rows), self.scheme.num_regions, dtype=torch.float64)
            weights[order] = torch.stack(own).double().cpu()
            bias = self.steering.bias(weights)
        values = self._score_rows(docs, [rows[i] for i in order], emb, own)[3].tolist()
        scores = dict(zip(order, values, strict=True))
        for i in order:
            # A row that so far repeats the start of a kept sentence word for word is on its way
            # to a repeat, which detection would not score: it ranks last.
            head = sentence_key(texts[i])
            if head and any(s.startswith(head) for s in docs[rows[i][0]].seen):
                scores[i] = -math.inf
        assert self.prune is not None  # pruner() checked it
        for g, ids in groups.items():
            done = [
                rank_of(c.info)
                for c in finished[g]
                if c.text and c.info is not None and c.info.novel and not math.isnan(c.info.score)
            ]
            keep = rows_to_keep(self.prune, tokens, [scores[i] for i in ids], done)
            for i, go_on in zip(ids, keep, strict=True):
                flags[i] = go_on
        return flags if bias is None else PruneVerdict(flags, bias)

    def test(self, plan: ScoringPlan, statistic: str, alpha: float, scan: bool) -> DetectionResult:
        return self.test_batch([plan], statistic, alpha, scan)[0]

    def test_batch(
        self, plans: Sequence[ScoringPlan], statistic: str, alpha: float, scan: bool
    ) -> list[DetectionResult]:
        """Each scored sentence's projection on its context's keyed direction, summed into the
        exact z of ``stats.direction_z``; with ``scan`` the best span too. Batched: texts with
        as many scored sentences are scored together, on the scheme's device."""
        results: list[DetectionResult] = []
        scored: dict[int, list[int]] = {}
        for i, plan in enumerate(plans):
            rows, _ = plan.scored_contexts()
            none: list[float | None] = [None] * len(plan.sentences)
            results.append(plan_result(plan, statistic, list(plan.roles), len(rows), none))
            if rows:
                scored.setdefault(len(rows), []).append(i)
            else:
                too_short(results[-1])
        directions = self.scheme.directions.double()
        texts, covs, values = [], [], []
        for ids in scored.values():
            rows = [plans[i].scored_contexts()[0] for i in ids]
            vectors = torch.stack([plans[i].vectors[r] for i, r in zip(ids, rows, strict=True)])
            contexts = torch.stack(
                [plans[i].context_weights(r) for i, r in zip(ids, rows, strict=True)]
            )
            # The reported scores in float32 (as in generation), the statistic in float64.
            shown = self.scheme.scores(vectors.flatten(0, 1), contexts.flatten(0, 1))
            exact = ((contexts.double() @ directions) * vectors.double()).sum(dim=-1)
            cov = score_covariance(contexts, vectors)
            variance = cov.sum(dim=(-1, -2))
            if bool((variance <= 0).any()):
                raise ValueError(
                    "the direction statistic needs at least one non-zero scored vector"
                )
            z = (exact.sum(dim=-1) / variance.sqrt()).tolist()
            shown = shown.reshape(exact.shape)
            for i, r, text_z, text_scores in zip(ids, rows, z, shown.tolist(), strict=True):
                self._fill(results[i], r, text_scores, text_z, alpha)
            texts += ids
            covs += list(cov)
            values += list(shown.double())
        if scan and texts:
            seeds = [scan_seed(_scored_sentences(plans[i])) for i in texts]
            p_texts = [results[i].text_p_value for i in texts]
            logs = [log_normal_sf(results[i].z_score) for i in texts]
            tested = combined_tests(values, covs, p_texts, seeds, log_p_texts=logs)
            for i, combined in zip(texts, tested, strict=True):
                self._combine(results[i], plans[i], combined, alpha)
        return results

    @staticmethod
    def _fill(
        result: DetectionResult, rows: list[int], scores: list[float], z: float, alpha: float
    ) -> None:
        """A text's scores, verdicts and whole-text test."""
        for t, value in zip(rows, scores, strict=True):
            result.scores[t] = float(value)
            result.verdicts[t] = "valid" if value > 0 else "invalid"
        result.num_valid = result.verdicts.count("valid")
        result.z_score = float(z)
        p = float(normal_sf(z))
        if p < P_FLOOR:  # an exact p-value is never 0: the bound, and its value in log space
            p, result.log10_p_value = P_FLOOR, log_normal_sf(z) / math.log(10.0)
        result.text_p_value = result.p_value = p
        result.watermarked = result.p_value <= alpha

    @staticmethod
    def _combine(result: DetectionResult, plan: ScoringPlan, combined, alpha: float) -> None:
        """The scan's tests (``detection.scan.combined_tests``) into a text's result."""
        if combined is None:
            return
        rows, _ = plan.scored_contexts()
        best = combined.span
        result.span = [rows[best.start], rows[best.stop - 1] + 1]
        result.span_z, result.span_p_value = best.z, best.p_value
        result.mixture_p_value = combined.mixture_p_value
        result.weighted_p_value = combined.weighted_p_value
        if combined.weighted_p_value is not None and combined.weighted_p_value < P_FLOOR:
            result.weighted_p_value = P_FLOOR
        result.p_value, result.log10_p_value = combined.p_value, None
        if combined.p_value < P_FLOOR:
            result.p_value = P_FLOOR
            result.log10_p_value = combined.log_p_value / math.log(10.0)
        result.watermarked = result.p_value <= alpha


def _scored_sentences(plan: ScoringPlan) -> list[str]:
    rows, _ = plan.scored_contexts()
    return [plan.sentences[t] for t in rows]
