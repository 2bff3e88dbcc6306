"""A region-level simulator of watermarked generation and detection.

For a design point, a key (a random valid table built as real keys build theirs) and a held-out
document, ``simulate_text`` replays the sentence loop on the measured candidate pool: at the
``t``-th sentence it draws candidates i.i.d. from the ``M`` candidates the generator produced at
that document's ``t``-th context, judges each with the design's partition, margin, valid set and
acceptance rule, and keeps the accepted one, until the text holds ``max_new_tokens`` tokens. The
accepted sentences' regions after each attack come from the attacked embeddings of the
ingredients. Clean and attacked region sequences are then scored with the exact
key-randomisation test, as the detector scores them (with the prompt: its last sentence seeds
the first generated sentence; repeated sentences are not scored). A ``direction`` design is
replayed the same way with the key's directions in place of the valid table: each draw is scored
as the watermarker scores it (on its previous sentence's region's direction, or its soft
context), and texts are scored with ``stats.direction_z``. A direction design draws its
``max_candidates`` candidates of a context without replacement when the pool has that many (a
batched round's rows are distinct samples), and a pruned design (``pruning``) ranks a running
candidate by the vector of its first ``n`` tokens at each check. Its cost is counted in decoded
tokens and in *step cost*: a decoding step of ``r`` rows costs ``1 + ROW_COST * (r - 1)``
single-row steps (the watermarker's measured cost model), summed over the round's steps, per
token of the kept sentence; plain sampling costs 1.

What it cannot know: the context of a generated sentence is the plain continuation's context,
not the watermarked text's own (the generator's next-sentence distribution is assumed to depend
on the watermark's earlier choices only through the previous region); acceptance chances below
``1 / M`` look like zero. ``validate`` compares its predictions with real generations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ksemstamp.detection.stats import direction_z, normal_sf, null_count_pmf
from ksemstamp.generation.pruning import rows_to_keep
from ksemstamp.keys import keyed_directions, valid_table

from .design import Design, DesignView
from .ingredients import Ingredients

ROW_COST = 0.065
"""Cost of one more row in a batched decoding step, in single-row steps (as ``Watermarker``)."""

# ---------------------------------------------------------------------- the exact test


def exact_p(counts: np.ndarray, table: np.ndarray) -> float:
    """Key-randomisation p-value of ``(S, K)`` transition counts under a ``(S, K)`` valid table
    (the detector's null law, ``stats.null_count_pmf``)."""
    observed = int(counts[table].sum())
    return float(min(1.0, null_count_pmf(counts, int(table[0].sum()))[observed:].sum()))


def key_tables(design: Design, num_keys: int, seed: int = 0) -> list[np.ndarray]:
    """``num_keys`` valid tables built exactly as keyed tables are (``(K, K)``, or ``(1, K)`` for
    a ``fixed`` valid set)."""
    tables = []
    for i in range(num_keys):
        table = valid_table(design.k, design.gamma, f"study|{seed}|{i}").numpy()
        tables.append(table[:1] if design.context == "fixed" else table)
    return tables


def key_material(
    design: Design, num_keys: int, seed: int = 0, dv: DesignView | None = None
) -> list[np.ndarray]:
    """Per key, the valid table (``region`` designs, ``key_tables``) or the ``(K, D)`` keyed
    directions (``direction`` designs, built exactly as real keys build them)."""
    if design.mark == "region":
        return key_tables(design, num_keys, seed)
    dim = dv.vectors.shape[1]
    return [
        keyed_directions(design.k, dim, f"study|{seed}|{i}").double().numpy()
        for i in range(num_keys)
    ]


# ---------------------------------------------------------------------- one text


@dataclass
class SimText:
    """One simulated watermarked text and its scores."""

    regions: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    fallbacks: list[bool] = field(default_factory=list)
    valid: list[bool] = field(default_factory=list)
    tokens: int = 0
    p_clean: float = 1.0
    p_attacked: dict[str, float] = field(default_factory=dict)
    valid_clean: int = 0
    valid_attacked: dict[str, int] = field(default_factory=dict)
    scored: int = 0
    agreement: dict[str, float] = field(default_factory=dict)
    decoded: list[int] = field(default_factory=list)
    """``direction`` designs: tokens decoded for each sentence, over all its candidates."""
    step_cost: list[float] = field(default_factory=list)
    """``direction`` designs: each sentence's round in single-row decoding steps."""
    best_dropped: list[bool] = field(default_factory=list)
    """Pruned ``direction`` designs: for each sentence, whether the candidate that would have
    scored best had every row finished was stopped by the pruning rule (a false drop)."""
    scores: list[float] = field(default_factory=list)
    """``direction`` designs: each kept sentence's score on its context."""


def _first(mask: np.ndarray) -> int | None:
    hit = np.flatnonzero(mask)
    return int(hit[0]) if len(hit) else None


def _choose(design: Design, ok: np.ndarray, repeats: np.ndarray) -> tuple[int | None, int]:
    """Index of the accepted draw and the draws it cost, or ``(None, N_max)``.

    ``ok``: draws that pass region and margin; ``repeats``: how often each draw's transition
    already occurs in the text.
    """
    draw = np.arange(1, len(ok) + 1)
    if design.rule == "paper" or design.patience == 0:
        i = _first(ok)
    elif design.rule == "novelty":
        i = _first(ok & ((repeats == 0) | (draw >= design.patience)))
    else:  # evidence
        early = ok & (draw <= design.patience)
        i = _first(early & (repeats == 0))
        if i is None and early.any():
            seen = np.flatnonzero(early)
            best = seen[np.argmin(repeats[seen])]
            return int(best), min(design.patience, len(ok))
        if i is None:
            i = _first(ok & (draw > design.patience))
    return (i, i + 1) if i is not None else (None, len(ok))


def simulate_text(
    design: Design,
    dv: DesignView,
    ing: Ingredients,
    doc: int,
    table: np.ndarray,
    rng: np.random.Generator,
    max_new_tokens: int = 200,
) -> SimText:
    """Generate one watermarked text for document ``doc`` under ``table`` (the valid table, or
    the directions of a ``direction`` design) and score it."""
    if design.mark == "direction":
        return _simulate_direction(design, dv, ing, doc, table, rng, max_new_tokens)
    fixed = design.context == "fixed"
    k = design.k
    counts = np.zeros((1 if fixed else k, k), dtype=np.int64)
    seed_region = int(dv.region[ing.seeds[doc]])
    prev = seed_region
    out = SimText()
    accepted: list[int] = []
    width = ing.cand.shape[1]
    for ctx in ing.doc_contexts[doc]:
        if out.tokens >= max_new_tokens:
            break
        draws = rng.integers(width, size=design.max_candidates)
        sid = ing.cand[ctx, draws]
        ntok = ing.tokens[ctx, draws]
        usable = (sid >= 0) & (ntok <= design.max_tokens)
        safe = np.where(usable, sid, 0)
        reg = dv.region[safe]
        row = 0 if fixed else prev
        valid = usable & table[row, reg]
        ok = valid & (dv.gap[safe] > design.margin)
        if design.margin_patience is not None:
            ok[design.margin_patience :] = valid[design.margin_patience :]
        i, cost = _choose(design, ok, counts[row, reg])
        fallback = i is None
        if fallback:
            pick = _first(valid) if design.fallback == "valid" else None
            if pick is None:
                hits = np.flatnonzero(usable)
                pick = int(hits[-1]) if len(hits) else None
            if pick is None:
                break  # nothing usable in N_max draws: the text ends here
            i = pick
        q = int(reg[i])
        counts[row, q] += 1
        accepted.append(int(sid[i]))
        out.regions.append(q)
        out.candidates.append(cost)
        out.fallbacks.append(fallback)
        out.valid.append(bool(valid[i]))
        out.tokens += int(ntok[i])
        prev = q

    out.p_clean, out.valid_clean, out.scored = _score(
        out.regions, accepted, seed_region, table, fixed, k
    )
    for name, regions in dv.attacked.items():
        attacked = [int(regions[s]) for s in accepted]
        p, v, _ = _score(attacked, accepted, seed_region, table, fixed, k)
        out.p_attacked[name], out.valid_attacked[name] = p, v
        out.agreement[name] = (
            float(np.mean([a == b for a, b in zip(attacked, out.regions, strict=True)]))
            if attacked
            else float("nan")
        )
    return out


def _simulate_direction(
    design: Design,
    dv: DesignView,
    ing: Ingredients,
    doc: int,
    directions: np.ndarray,
    rng: np.random.Generator,
    max_new_tokens: int,
) -> SimText:
    """``simulate_text`` for a ``direction`` design: the first draw scoring at least the
    threshold, else the best of ``max_candidates`` draws (of those a pruned design lets
    finish)."""
    prev = int(ing.seeds[doc])  # the sentence whose context the next one is scored on
    out = SimText()
    accepted: list[int] = []
    width = ing.cand.shape[1]
    n = design.max_candidates
    for ctx in ing.doc_contexts[doc]:
        if out.tokens >= max_new_tokens:
            break
        draws = (
            rng.choice(width, size=n, replace=False) if n <= width else rng.integers(width, size=n)
        )
        sid = ing.cand[ctx, draws]
        ntok = ing.tokens[ctx, draws]
        usable = (sid >= 0) & (ntok <= design.max_tokens)
        if not usable.any():
            break  # nothing usable in N_max draws: the text ends here
        safe = np.where(usable, sid, 0)
        direction = _context_direction(dv, directions, prev)
        score = np.where(usable, dv.vectors[safe] @ direction, -np.inf)
        stop = np.minimum(ntok, design.max_tokens)  # tokens each row decodes
        if design.prune_tokens is not None:
            alive = _prune(design, dv, safe, usable, stop, score, direction)
            out.best_dropped.append(not alive[int(np.argmax(score))])
            score = np.where(alive, score, -np.inf)
            if not np.isfinite(score).any():
                break  # no kept row is a sentence (the generator would draw again)
        i = _first(score >= design.threshold)
        # Without a threshold the best of max_candidates is the rule, not a fallback.
        fallback = i is None and np.isfinite(design.threshold)
        if i is None:
            i = int(np.argmax(score))
        accepted.append(int(sid[i]))
        out.regions.append(int(dv.region[sid[i]]))
        out.candidates.append(i + 1 if np.isfinite(design.threshold) and not fallback else n)
        out.fallbacks.append(fallback)
        out.valid.append(bool(score[i] > 0))
        out.scores.append(float(score[i]))
        out.tokens += int(ntok[i])
        rows = stop[: out.candidates[-1]]
        out.decoded.append(int(rows.sum()))
        live = (rows[None, :] > np.arange(int(rows.max()))[:, None]).sum(axis=1)
        out.step_cost.append(float((1 + ROW_COST * (live - 1)).sum()))
        prev = int(sid[i])

    seed = int(ing.seeds[doc])
    out.p_clean, out.valid_clean, out.scored = _score_direction(
        accepted, seed, dv.vectors, directions, dv.weights, dv.region
    )
    for name, regions in dv.attacked.items():
        attacked = [int(regions[s]) for s in accepted]
        weights = None if dv.weights is None else dv.attacked_weights[name]
        p, v, _ = _score_direction(
            accepted, seed, dv.attacked_vectors[name], directions, weights, regions
        )
        out.p_attacked[name], out.valid_attacked[name] = p, v
        out.agreement[name] = (
            float(np.mean([a == b for a, b in zip(attacked, out.regions, strict=True)]))
            if attacked
            else float("nan")
        )
    return out


def _context_direction(dv: DesignView, directions: np.ndarray, sentence: int) -> np.ndarray:
    """The direction a sentence following ``sentence`` is scored on: its region's (hard
    contexts) or its soft context's."""
    if dv.weights is None:
        return directions[dv.region[sentence]]
    return dv.weights[sentence] @ directions


def _prune(
    design: Design,
    dv: DesignView,
    sid: np.ndarray,
    usable: np.ndarray,
    stop: np.ndarray,
    score: np.ndarray,
    direction: np.ndarray,
) -> np.ndarray:
    """Which rows of a pruned round finish (``pruning.rows_to_keep`` at every check); ``stop``
    is cut to the tokens a stopped row decoded."""
    rule = design.prune_rule()
    alive = np.ones(len(sid), dtype=bool)
    for tokens in range(rule.every, int(stop.max()), rule.every):
        running = np.flatnonzero(alive & (stop > tokens))
        if not len(running):
            break
        done = alive & (stop <= tokens) & usable
        partial = dv.partial[tokens][sid[running]] @ direction
        keep = rows_to_keep(rule, tokens, partial.tolist(), score[done].tolist())
        dropped = running[~np.array(keep, dtype=bool)]
        alive[dropped] = False
        stop[dropped] = tokens
    return alive


def _score_direction(
    sentence_ids: list[int],
    seed: int,
    vectors: np.ndarray,
    directions: np.ndarray,
    weights: np.ndarray | None,
    regions: np.ndarray,
) -> tuple[float, int, int]:
    """Exact p-value, positive-score count and scored count of a ``direction`` text, with the
    detector's rules (the prompt's last sentence ``seed`` seeds; repeated sentences are not
    scored); contexts are soft when ``weights`` are given, else the previous regions."""
    rows, contexts, seen = [], [], set()
    prev = seed
    for s in sentence_ids:
        if s not in seen:
            seen.add(s)
            rows.append(s)
            contexts.append(weights[prev] if weights is not None else int(regions[prev]))
        prev = s
    if not rows:
        return 1.0, 0, 0
    vec = vectors[rows]
    contexts = np.array(contexts)
    own = contexts @ directions if weights is not None else directions[contexts]
    positive = int(((vec * own).sum(axis=1) > 0).sum())
    return normal_sf(direction_z(vec, contexts, directions)), positive, len(rows)


def _score(
    regions: list[int],
    sentence_ids: list[int],
    seed_region: int,
    table: np.ndarray,
    fixed: bool,
    k: int,
) -> tuple[float, int, int]:
    """Exact p-value, valid count and scored count, with the detector's rules."""
    counts = np.zeros((1 if fixed else k, k), dtype=np.int64)
    seen: set[int] = set()
    prev = seed_region
    for q, s in zip(regions, sentence_ids, strict=True):
        if s not in seen:
            seen.add(s)
            counts[0 if fixed else prev, q] += 1
        prev = q
    if counts.sum() == 0:
        return 1.0, 0, 0
    return exact_p(counts, table), int(counts[table].sum()), int(counts.sum())


def human_p_values(
    design: Design, dv: DesignView, ing: Ingredients, table: np.ndarray, max_sentences: int = 10
) -> list[float]:
    """Exact p-values of the documents' human continuations (seeded by the prompt) under
    ``table`` (or a direction design's directions): a null check, since human text does not
    depend on the key."""
    out = []
    for seq in ing.human:
        regions = [int(r) for r in dv.region[seq[: max_sentences + 1]]]
        if len(regions) < 2:
            continue
        ids = [int(s) for s in seq[1 : max_sentences + 1]]
        if design.mark == "direction":
            scored = _score_direction(ids, int(seq[0]), dv.vectors, table, dv.weights, dv.region)
            out.append(scored[0])
            continue
        out.append(
            _score(regions[1:], ids, regions[0], table, design.context == "fixed", design.k)[0]
        )
    return out
