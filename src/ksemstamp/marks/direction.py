"""The direction mark: the key draws a direction per region; a unit scores its projection.

Key material: ``K`` directions with independent standard normal components
(``scheme.keyed.keyed_directions``). What is scored of a unit is its processed vector (``vectors``:
the domain mean removed, ``remove_components`` principal components projected out, unit length), and the
direction it meets is the blend of the key's directions that its *context* gives
(``context_weights``): its own embedding's soft weights over the regions (``context: own``) or
the unit before it (``previous``). A text's score sum over random keys is exactly normal
(``direction_stats``), so its z's p-value is exact for any text written without the key.

Generation keeps the best-scoring candidate of ``search.max_candidates`` (by rule: a ranking
mark), or with ``search.threshold`` the first reaching it; ``search.selection: text`` ranks by
what a candidate adds to the text's z (``direction_stats.text_gains``). Pruning stops running
rows whose partial text scores low (``generation.pruning``), and steering biases the rows'
logits toward the key (``generation.steering``). Detection sums the scores into the exact z,
with the windowed tests beside it (``detection.scan``). How results read is
``direction_view``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..detection.stats import normal_sf
from ..generation.cutter import vocabulary_pieces
from ..generation.engine import Candidate, Pruner, PruneVerdict
from ..generation.pruning import PruneRule, prune_rule, rows_to_keep
from ..generation.steering import Steering, token_table, word_tokens
from ..results import DetectionResult, Judgement, rank_of, too_short
from ..scheme.core import soft_context_weights
from ..scheme.keyed import keyed_directions
from ..settings.groups import DirectionSearch
from ..text.normalize import repeats_itself, said_grams, sentence_key
from .base import Drawn, Mark, SentenceState, Verdict, plan_result
from .direction_stats import (
    DirectionBatch,
    DirectionPlan,
    DirectionState,
    Scored,
    direction_p_values,
    fill_result,
    stack_evidence,
    text_evidence,
    text_gains,
)
from .direction_view import describe_direction, direction_lines, direction_view

if TYPE_CHECKING:
    from ..detection.plans import ScoringPlan

SELECTIONS = ("text", "sentence")


def fluent_candidates(candidates: list[Candidate], share: float) -> list[Candidate]:
    """The ``share`` of ``candidates`` with the highest ``fluency`` (rounded up, at least one),
    in their order; all of them when ``share`` is 1 or some candidate has no fluency."""
    fluency = [c.fluency for c in candidates]
    if share >= 1 or any(math.isnan(f) for f in fluency):
        return list(candidates)
    count = max(1, math.ceil(share * len(candidates)))
    top = sorted(range(len(candidates)), key=lambda i: -fluency[i])[:count]
    return [candidates[i] for i in sorted(top)]


DIAGNOSTIC = "exact_randomised"


class DirectionMark(Mark):
    """Keyed directions per context (see the module docstring)."""

    kind = "direction"
    rejections = ("score", "repeat")

    def configure(
        self, key: str | None, search: DirectionSearch, steering: Steering | None
    ) -> None:
        """The key's directions, the scored components, and the generation effort's rules."""
        scheme, settings = self.scheme, self.settings
        if search.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, not {search.selection!r}")
        self.context = settings.context
        self.temperature = float(settings.context_temperature)
        if self.temperature > 0 and not hasattr(scheme.partition, "centroids"):
            raise ValueError("a context temperature needs a k-means partition (centroids)")
        self.directions = torch.from_numpy(self.material(key)).float().to(scheme.device)
        self.center = scheme.center
        self.basis = None
        components = scheme.components
        if components is not None and settings.remove_components and len(components):
            # Orthonormal rows, so the projection is v - (v C^T) C; factored on the CPU, so that
            # every device scores on the same components.
            picked = components[: settings.remove_components].float().cpu()
            self.basis = torch.linalg.qr(picked.T).Q.T.contiguous().to(scheme.device)
        self.threshold = math.inf if search.threshold is None else float(search.threshold)
        self.prune: PruneRule | None = prune_rule(search)
        self.selection = search.selection
        self.skip_repeating = search.skip_repeating
        self.fluent_share = float(search.fluent_share)
        self.steering = steering if steering is not None and steering.strength > 0 else None
        self.strength = search.steer

    def steer(self, tokenizer: Any, vocab: int, cache: Any = None, pieces: Any = None) -> None:
        """Build the key's logit bias (``generation.steering``) from the generator's vocabulary
        read by this mark's encoder and processing, at ``search.steer`` (0: none)."""
        if self.strength <= 0:
            return
        pieces = pieces if pieces is not None else vocabulary_pieces(tokenizer, vocab)
        table = token_table(tokenizer, vocab, self.scheme, self, cache, pieces)
        words = word_tokens(tokenizer, vocab, pieces)
        self.steering = Steering(table, self.directions, self.strength, words)

    # ------------------------------------------------------------------ the key
    def material(self, key: str | None) -> np.ndarray:
        """``(K, D)`` float64 directions of ``key`` (float32-rounded, as scored)."""
        dim = int(self.scheme.encoder.get_embedding_dimension())
        return keyed_directions(self.scheme.num_regions, dim, key).double().numpy()

    @property
    def own_material(self) -> np.ndarray:
        return self.directions.double().cpu().numpy()

    # ------------------------------------------------------------------ scoring
    def vectors(self, emb: Tensor) -> Tensor:
        """``(N, D)`` what is scored: embeddings minus the domain mean, with the ``remove_components``
        principal components projected out, unit norm (key-free)."""
        emb = emb.float()
        if self.center is not None:
            emb = emb - self.center
        if self.basis is not None:
            emb = emb - (emb @ self.basis.T) @ self.basis
        return torch.nn.functional.normalize(emb, dim=-1)

    def context_weights(self, emb: Tensor, regions: Tensor | None = None) -> Tensor:
        """``(N, K)`` float64 context weights of ``(N, D)`` embeddings (key-free): the one-hot
        region at temperature 0 (``regions``, when already located), else the soft weights
        (``scheme.core.soft_context_weights``)."""
        if self.temperature == 0:
            if regions is None:
                regions, _ = self.scheme.locate(emb.float())
            return self.region_weights(regions)
        return soft_context_weights(emb, self.scheme.partition.centroids, self.temperature)

    def region_weights(self, regions: Tensor | Sequence[int]) -> Tensor:
        """``(N, K)`` one-hot context weights of ``regions``."""
        index = torch.as_tensor(regions, dtype=torch.long, device=self.scheme.device).reshape(-1)
        return torch.nn.functional.one_hot(index, self.scheme.num_regions).double()

    def scores(self, vectors: Tensor, contexts: Tensor | Sequence[int]) -> Tensor:
        """``(N,)`` scores of ``vectors`` on the directions of their ``(N, K)`` context weights
        (or ``(N,)`` regions), float32 as generation ranks them."""
        contexts = torch.as_tensor(contexts, device=vectors.device)
        if contexts.ndim == 1:
            contexts = self.region_weights(contexts)
        directions = contexts.float() @ self.directions
        return (directions * vectors.float()).sum(dim=-1)

    # ------------------------------------------------------------------ generation
    @property
    def rejects_candidates(self) -> bool:
        return math.isfinite(self.threshold)

    def new_state(self) -> DirectionState:
        return DirectionState()

    def seed(self, states, emb: Tensor, regions: Tensor) -> list[DirectionState]:
        for state, context in zip(states, self.context_weights(emb, regions), strict=True):
            state.weights = context
        return list(states)

    def start(self, state: DirectionState) -> tuple[int, DirectionState]:
        state.weights = self.region_weights([self.scheme.start_region])[0]
        return self.scheme.start_region, state

    def prior(self, previous: int) -> float:
        # A unit vector's projection on a standard normal direction is N(0, 1).
        return normal_sf(self.threshold)

    def judge(self, drawn: Drawn) -> list[Verdict]:
        """Each candidate's score; one that repeats a unit its document already holds (which
        detection does not score) or repeats itself (``normalize.repeats_itself``: a run-away
        list, a word piece over and over) is not ``novel`` and is neither accepted nor
        ranked."""
        own = list(self.context_weights(drawn.emb, drawn.regions))
        scores, contexts, vectors, ranks = self._score_rows(drawn.docs, drawn.rows, drawn.emb, own)
        texts = drawn.texts or [""] * len(drawn.rows)
        # Each document's earlier 3-grams once per round, not once per candidate.
        said = {g: said_grams(drawn.docs[g].seen) for g in {g for g, _ in drawn.rows}}
        out = []
        for i, ((g, _), text, r) in enumerate(
            zip(drawn.rows, texts, drawn.regions.tolist(), strict=True)
        ):
            doc = drawn.docs[g]
            novel = not text or (
                sentence_key(text) not in doc.seen
                and not (
                    self.skip_repeating
                    and repeats_itself(
                        text,
                        getattr(doc, "last_sentence", ""),
                        said=said[g],
                        earlier=getattr(doc, "before_last", ""),
                    )
                )
            )
            score = float(scores[i])
            valid = score >= self.threshold
            reason = None if valid and novel else ("score" if not valid else "repeat")
            data = Scored(own[i], (contexts[i], vectors[i]))
            verdict = Judgement(int(r), valid, novel, score, float(ranks[i]), reason, data)
            out.append((reason is None, verdict))
        return out

    def _score_rows(self, docs, rows, emb: Tensor, own) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Scores ``(R,)`` of candidates ``rows`` with embeddings ``emb``, each on its ``own``
        context under ``context: own``, else on its document's previous unit's (zeros while a
        document has none); with the ``(R, K)`` contexts and ``(R, D)`` vectors they were
        scored on, and the ``(R,)`` values they rank by (``selection``)."""
        if self.context == "own":
            contexts = torch.stack(own)
        else:
            none = torch.zeros(self.scheme.num_regions, dtype=torch.float64)
            contexts = torch.stack(
                [none if docs[g].state.weights is None else docs[g].state.weights for g, _ in rows]
            )
        vectors = self.vectors(emb)
        scores = self.scores(vectors, contexts)
        ranks = scores
        if self.selection == "text":
            evidence = [(docs[g].state.evidence, docs[g].state.score) for g, _ in rows]
            ranks = text_gains(scores, contexts, vectors, evidence)
        return scores, contexts, vectors, ranks

    def pick(self, candidates: list[Candidate]) -> Candidate:
        """The best-ranked of the ``fluent_share`` most fluent ``candidates`` (mean log-probability
        per token; every candidate where one has none: ``fluent_candidates``)."""
        return super().pick(fluent_candidates(candidates, self.fluent_share))

    def commit(self, state: DirectionState, previous: int, kept: Judgement, scored: bool):
        data = kept.data
        if isinstance(data, Scored):
            state.weights = data.hands_on
            if scored:
                context, vector = data.evidence
                part = torch.outer(context.double(), vector.double())
                state.evidence = part if state.evidence is None else state.evidence + part
                state.score += float(kept.score)
        return state

    def round_bias(self, docs: Sequence[SentenceState]) -> Tensor | None:
        """``(docs, V)`` logit bias of a round under ``steering``: toward the context each
        document's last unit handed on (none for a document completing its prompt's sentence,
        or with no context yet)."""
        if self.steering is None:
            return None
        none = torch.zeros(self.scheme.num_regions, dtype=torch.float64)
        weights = [
            none if d.completing or d.state.weights is None else d.state.weights.double().cpu()
            for d in docs
        ]
        return self.steering.bias(torch.stack(weights))

    def pruner(self, docs: Sequence[SentenceState]) -> Pruner | None:
        if self.prune is None or self.rejects_candidates:
            return None
        return Pruner(self.prune.every, partial(self._prune_rows, docs))

    def _prune_rows(self, docs, tokens: int, rows, texts, finished) -> list[bool] | PruneVerdict:
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
        own = list(self.context_weights(emb)) if self.context == "own" else None
        bias = None
        if self.steering is not None and own is not None:
            weights = torch.zeros(len(rows), self.scheme.num_regions, dtype=torch.float64)
            weights[order] = torch.stack(own).double().cpu()
            bias = self.steering.bias(weights)
        values = self._score_rows(docs, [rows[i] for i in order], emb, own)[3].tolist()
        scores = dict(zip(order, values, strict=True))
        for i in order:
            # A row that so far repeats the start of a kept unit word for word is on its way
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

    # ------------------------------------------------------------------ detection
    def annotate(self, plans: Sequence[ScoringPlan], emb: Tensor, regions: Tensor) -> None:
        vectors, weights = self.vectors(emb), self.context_weights(emb, regions)
        row = 0
        for plan in plans:
            has_seed = plan.seed_sentence is not None
            first = weights[row : row + 1] if has_seed else torch.zeros_like(weights[:1])
            row += has_seed
            count = len(plan.sentences)
            plan.data = DirectionPlan(
                vectors[row : row + count],
                torch.cat([first, weights[row : row + count]]),
                own=self.context == "own",
            )
            row += count

    def _scored(self, plan: ScoringPlan) -> tuple[list[int], Tensor, Tensor]:
        """The scored sentences of a plan, their vectors and the contexts they are scored on
        (their own, else the sentence's or seed's before each)."""
        rows = [t for t, scored in enumerate(plan.scored) if scored]
        data: DirectionPlan = plan.data
        index = torch.tensor(rows, dtype=torch.long, device=data.vectors.device)
        return rows, data.vectors[index], data.weights[index + int(data.own)]

    def evidence(self, plans: Sequence[ScoringPlan], scan: bool = False) -> list:
        picked = [self._scored(plan) for plan in plans]
        return text_evidence(
            [v for _, v, _ in picked],
            [w for _, _, w in picked],
            [
                [plan.sentences[t] for t in rows]
                for plan, (rows, _, _) in zip(plans, picked, strict=True)
            ],
            scan,
        )

    def batch(self, evidence) -> DirectionBatch:
        return stack_evidence(evidence)

    def p_values(self, batch, materials, rng=None) -> list[dict[str, np.ndarray]]:
        """Per key's directions, each text's exact z and p-value (``direction_stats``); the
        p-value is continuous, so its tie-randomised diagnostic is itself."""
        if not isinstance(batch, DirectionBatch):
            batch = self.batch(batch)
        out = direction_p_values(batch, materials)
        return [one | ({DIAGNOSTIC: one["exact"]} if rng is not None else {}) for one in out]

    def test_batch(
        self, plans: Sequence[ScoringPlan], statistic: str, alpha: float, scan: bool
    ) -> list[DetectionResult]:
        """Each scored unit's projection on its context's keyed direction, summed into the
        exact z; with ``scan`` the windowed tests too, combined into one p-value."""
        results: list[DetectionResult] = []
        scored = []
        for plan in plans:
            rows, vectors, contexts = self._scored(plan)
            shown: list[float | None] = [None] * len(plan.sentences)
            result = plan_result(plan, statistic, list(plan.roles), len(rows), shown)
            results.append(result)
            if not rows:
                too_short(result)
                continue
            for t, value in zip(rows, self.scores(vectors, contexts).tolist(), strict=True):
                result.scores[t] = float(value)
                result.verdicts[t] = "valid" if value > 0 else "invalid"
            result.num_valid = result.verdicts.count("valid")
            scored.append(len(results) - 1)
        if not scored:
            return results
        evidence = self.evidence([plans[i] for i in scored], scan)
        (tested,) = direction_p_values(stack_evidence(evidence), [self.own_material], details=True)
        for n, i in enumerate(scored):
            fill_result(results[i], plans[i], tested, n, alpha)
        return results

    # ------------------------------------------------------------------ presentation
    def describe(self, scan: bool = False) -> dict[str, Any]:
        return describe_direction(self, scan)

    def report_lines(self, result: DetectionResult, unit: str) -> list[str]:
        return direction_lines(result, unit)

    def view(self, result: DetectionResult, alpha: float, unit: str) -> dict[str, Any]:
        return direction_view(self, result, alpha, unit)
