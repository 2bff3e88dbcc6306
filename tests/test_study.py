"""The design study's simulator on tiny hand-built ingredients (no models)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from ksemstamp.detection.stats import exact_p_value, subset_sum_pmf
from research.study.design import Design, DesignView, margin_for_pass_rate
from research.study.ingredients import Ingredients, displaced
from research.study.simulate import (
    _choose,
    exact_p,
    key_tables,
    simulate_text,
)


def test_subset_sum_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 8))
        values = rng.integers(0, 4, size=n) * (rng.random(n) < 0.5)
        size = int(rng.integers(1, n + 1))
        sums = [sum(values[list(s)]) for s in itertools.combinations(range(n), size)]
        brute = np.bincount(sums, minlength=int(values.sum()) + 1) / len(sums)
        np.testing.assert_allclose(subset_sum_pmf(values, size), brute, atol=1e-12)


def test_exact_p_matches_detector_statistic():
    rng = np.random.default_rng(1)
    for seed in range(10):
        table = key_tables(Design(k=6, gamma=0.5), 1, seed=seed)[0]
        counts = rng.integers(0, 3, size=(6, 6)) * (rng.random((6, 6)) < 0.3)
        assert exact_p(counts, table) == pytest.approx(exact_p_value(counts, table))


def test_key_tables_shape_and_size():
    prev = key_tables(Design(k=16, gamma=0.25), 3)
    fixed = key_tables(Design(k=16, gamma=0.25, context="fixed"), 3)
    assert all(t.shape == (16, 16) and (t.sum(1) == 4).all() for t in prev)
    assert all(t.shape == (1, 16) and t.sum() == 4 for t in fixed)
    assert not np.array_equal(prev[0], prev[1])


def test_margin_for_pass_rate():
    gaps = np.linspace(0.0, 0.1, 101)
    m = margin_for_pass_rate(gaps, 0.3)
    assert np.mean(gaps > m) == pytest.approx(0.3, abs=0.02)
    assert margin_for_pass_rate(gaps, 1.0) == 0.0
    with pytest.raises(ValueError):
        margin_for_pass_rate(gaps, 0.0)


# ---------------------------------------------------------------------- tiny ingredients


def _ingredients(regions_per_context: list[list[int]], tokens: int = 20) -> tuple:
    """One document whose context ``c`` holds candidates in the given regions (one sentence
    each, a distinct sentence per draw), with gap 1 (every margin passes)."""
    cand, region = [], [0]  # sentence 0: the seed, region 0
    for regs in regions_per_context:
        row = []
        for r in regs:
            row.append(len(region))
            region.append(r)
        cand.append(row)
    u = len(region)
    ing = Ingredients(
        encoder="test",
        sentences=[f"s{i}" for i in range(u)],
        embeddings=torch.zeros(u, 2),
        cand=np.array(cand),
        tokens=np.full((len(cand), len(cand[0])), tokens),
        doc_contexts=[np.arange(len(cand))],
        seeds=np.array([0]),
        attacked={},
        actual={},
        para_index={},
        human=[],
    )
    dv = DesignView(region=np.array(region), gap=np.ones(u), attacked={})
    return ing, dv


def test_every_candidate_valid_costs_one_draw():
    ing, dv = _ingredients([[1, 1, 1, 1]] * 5)
    table = np.ones((4, 4), dtype=bool)
    text = simulate_text(
        Design(k=4), dv, ing, 0, table, np.random.default_rng(0), max_new_tokens=1000
    )
    assert text.candidates == [1] * 5
    assert text.fallbacks == [False] * 5
    assert text.regions == [1] * 5
    assert text.p_clean == 1.0  # every region valid under every key: no evidence at all


def test_no_valid_candidate_falls_back_after_n_max():
    ing, dv = _ingredients([[2, 2, 3, 3]] * 3)
    table = np.zeros((4, 4), dtype=bool)
    table[:, 1] = True
    design = Design(k=4, max_candidates=7, gamma=0.25)
    text = simulate_text(design, dv, ing, 0, table, np.random.default_rng(0), 1000)
    assert text.candidates == [7, 7, 7]
    assert all(text.fallbacks)


def test_mean_draws_match_geometric_law():
    # A quarter of each context's candidates is valid: draws ~ Geometric(1/4), mean 4.
    ing, dv = _ingredients([[1, 0, 0, 0] * 8] * 400, tokens=1)
    table = np.zeros((4, 4), dtype=bool)
    table[:, 1] = True
    design = Design(k=4, max_candidates=1000)
    text = simulate_text(design, dv, ing, 0, table, np.random.default_rng(0), 10**6)
    assert np.mean(text.candidates) == pytest.approx(4.0, rel=0.1)


def test_token_budget_ends_the_text():
    ing, dv = _ingredients([[1]] * 20, tokens=30)
    table = np.ones((4, 4), dtype=bool)
    text = simulate_text(Design(k=4), dv, ing, 0, table, np.random.default_rng(0), 200)
    assert len(text.regions) == 7 and text.tokens == 210


def test_evidence_rule_never_accepts_invalid_before_n_max():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        ok = rng.random(n) < 0.2
        repeats = rng.integers(0, 3, size=n)
        design = Design(rule="evidence", patience=int(rng.integers(0, 12)), max_candidates=n)
        i, cost = _choose(design, ok, repeats)
        if i is None:
            assert not ok.any() and cost == n
        else:
            assert ok[i]
            assert i + 1 <= cost <= n


def test_evidence_rule_prefers_new_transition():
    ok = np.array([True, False, True, True])
    repeats = np.array([2, 0, 0, 1])
    i, cost = _choose(Design(rule="evidence", patience=10), ok, repeats)
    assert (i, cost) == (2, 3)
    i, cost = _choose(Design(rule="evidence", patience=2), ok, repeats)
    assert (i, cost) == (0, 2)  # only draw 0 seen in the patience window: the best seen
    i, cost = _choose(Design(rule="paper"), ok, repeats)
    assert (i, cost) == (0, 1)


def test_fixed_context_uses_one_valid_set():
    ing, dv = _ingredients([[1, 2, 3, 0]] * 6, tokens=1)
    table = np.zeros((1, 4), dtype=bool)
    table[0, 2] = True
    design = Design(k=4, context="fixed", max_candidates=200)
    text = simulate_text(design, dv, ing, 0, table, np.random.default_rng(0), 100)
    assert text.regions == [2] * 6


def test_displacement_moves_by_the_nearest_source():
    emb = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]), dim=1)
    sources = emb[[0, 2]]
    moves = torch.tensor([[0.0, 5.0], [5.0, 0.0]])
    out = displaced(emb, sources, moves)
    assert out[1, 1] > out[1, 0]  # moved like source 0 (towards +y)
    assert out[2, 0] > out[2, 1]  # moved like source 2 (towards +x)
    loo = displaced(emb[:2], emb[:2], torch.tensor([[0.0, 5.0], [0.0, -5.0]]), exclude_self=True)
    assert loo[0, 1] < 0  # row 0 uses row 1's move, not its own


def test_uniform_regions_accept_at_gamma_times_pass_rate():
    # Candidates spread evenly over 8 regions, half of each region's candidates past the
    # margin: a draw is accepted with chance gamma * 0.5 = 0.125, so 8 draws on average.
    k, per_region = 8, 4
    regions = [r for r in range(k) for _ in range(per_region)]
    ing, dv = _ingredients([regions] * 300, tokens=1)
    dv.gap[1:] = np.tile([1.0, 0.0], len(dv.gap[1:]) // 2)
    design = Design(k=k, gamma=0.25, margin=0.5, max_candidates=10_000)
    table = key_tables(design, 1, seed=4)[0]
    text = simulate_text(design, dv, ing, 0, table, np.random.default_rng(1), 10**6)
    assert np.mean(text.candidates) == pytest.approx(1 / (0.25 * 0.5), rel=0.12)


def test_one_region_text_is_flagged_at_gamma_over_keys():
    # A text that never leaves one region carries one coin flip: under random keys its exact
    # p-value is gamma (valid) or 1, so it is flagged at level gamma with chance gamma exactly.
    design = Design(k=8, gamma=0.25)
    tables = key_tables(design, 400, seed=9)
    counts = np.zeros((8, 8), dtype=np.int64)
    counts[3, 3] = 7
    p = np.array([exact_p(counts, t) for t in tables])
    assert set(np.round(p, 12)) <= {0.25, 1.0}
    assert np.mean(p <= 0.25) == pytest.approx(0.25, abs=3 * np.sqrt(0.25 * 0.75 / 400))
    assert np.mean(p <= 0.01) == 0.0


def test_frontier_keeps_only_undominated_points():
    from research.study.sweep import frontier

    pts = [(10, 0.5), (5, 0.2), (20, 0.4), (7, 0.6), (30, 0.9), (7, 0.1)]
    assert frontier(pts) == [1, 3, 4]


# ---------------------------------------------------------------------- direction designs


def _direction_ingredients(vectors_per_context: list[list[list[float]]], regions_per_context):
    """Like ``_ingredients``, with a vector for every candidate (unit norm, dimension 2)."""
    ing, dv = _ingredients(regions_per_context, tokens=1)
    vecs = [[1.0, 0.0]] + [v for ctx in vectors_per_context for v in ctx]
    dv.vectors = np.array(vecs, dtype=np.float64)
    dv.vectors /= np.linalg.norm(dv.vectors, axis=1, keepdims=True)
    dv.attacked_vectors = {}
    return ing, dv


def test_direction_best_of_n_keeps_the_best_scoring_draw():
    # One context, four candidates along known directions; the key's direction is +x for every
    # region. A round's rows are distinct draws: the best of 4 of these 4 candidates is always
    # the most +x one (10 degrees, region 2).
    angles = np.radians([170, 90, 10, 45])
    ctx = [[float(np.cos(a)), float(np.sin(a))] for a in angles]
    ing, dv = _direction_ingredients([ctx] * 200, [[0, 1, 2, 3]] * 200)
    directions = np.tile([[1.0, 0.0]], (4, 1))
    design = Design(mark="direction", k=4, threshold=float("inf"), max_candidates=4)
    text = simulate_text(design, dv, ing, 0, directions, np.random.default_rng(0), 10**6)
    assert text.candidates == [4] * 200 and not any(text.fallbacks)
    assert set(text.regions) == {2} and all(text.valid)
    # More draws than the pool holds are drawn with replacement: region 2 is kept whenever it
    # is among the 6 draws, 1 - (3/4)^6 of the time.
    design = Design(mark="direction", k=4, threshold=float("inf"), max_candidates=6)
    text = simulate_text(design, dv, ing, 0, directions, np.random.default_rng(0), 10**6)
    share = np.mean(np.array(text.regions) == 2)
    assert share == pytest.approx(1 - 0.75**6, abs=3 * np.sqrt(0.82 * 0.18 / 200))
    # One row per round costs one single-row step per token; four rows of one token cost
    # 1 + 3 * ROW_COST for that token.
    from research.study.simulate import ROW_COST

    assert text.step_cost[0] == pytest.approx(1 + 5 * ROW_COST) and text.decoded[0] == 6


def test_pruned_rounds_rank_running_rows_by_their_first_tokens():
    # Four candidates of 16 tokens; after 8 tokens only 2 go on. When the first tokens point
    # where the whole sentence does, pruning keeps the best; when they point the other way, it
    # loses it: the simulator ranks rows by their partial vectors, as the sampler does.
    from research.study.simulate import ROW_COST

    angles = np.radians([170, 90, 10, 45])
    ctx = [[float(np.cos(a)), float(np.sin(a))] for a in angles]
    ing, dv = _direction_ingredients([ctx] * 50, [[0, 1, 2, 3]] * 50)
    ing.tokens[:] = 16
    directions = np.tile([[1.0, 0.0]], (4, 1))
    design = Design(
        mark="direction", k=4, max_candidates=4, prune_tokens=8, prune_keep=2, prune_margin=None
    )
    for partial, kept in ((dv.vectors, 2), (-dv.vectors, 1)):
        dv.partial = {8: partial}
        text = simulate_text(design, dv, ing, 0, directions, np.random.default_rng(0), 10**6)
        assert set(text.regions) == {kept} and text.candidates == [4] * 50
        # The would-be best row (region 2) is stopped exactly when the first tokens mislead.
        assert text.best_dropped == [kept != 2] * 50
        # 4 rows for 8 tokens, then 2 rows for 8 more: 48 decoded tokens per sentence.
        assert text.decoded == [48] * 50
        steps = 8 * (1 + 3 * ROW_COST) + 8 * (1 + ROW_COST)
        assert text.step_cost[0] == pytest.approx(steps)
    with pytest.raises(ValueError):
        Design(mark="direction", k=4, threshold=1.0, prune_tokens=8)


def test_direction_threshold_accepts_the_first_draw_reaching_it():
    # Candidates alternate between a high and a low score; the threshold takes the first high
    # one, so a sentence costs a geometric number of draws with mean 2.
    ctx = [[1.0, 0.0], [-1.0, 0.0]] * 8
    ing, dv = _direction_ingredients([ctx] * 400, [[1, 0] * 8] * 400)
    directions = np.tile([[1.0, 0.0]], (2, 1))
    design = Design(mark="direction", k=2, threshold=0.5, max_candidates=1000)
    text = simulate_text(design, dv, ing, 0, directions, np.random.default_rng(2), 10**6)
    assert set(text.regions) == {1} and not any(text.fallbacks)
    assert np.mean(text.candidates) == pytest.approx(2.0, rel=0.12)


def test_direction_human_p_values_are_uniform_over_keys():
    # The simulator's human texts under 400 random keys: their exact p-values are uniform.
    from research.study.simulate import human_p_values, key_material

    rng = np.random.default_rng(5)
    u = 12
    ing, dv = _ingredients([[0]], tokens=1)
    ing.human = [np.arange(u)]
    dv.region = rng.integers(0, 3, size=u)
    dv.vectors = rng.normal(size=(u, 6)) + 2.0  # correlated sentences, as on one topic
    dv.vectors /= np.linalg.norm(dv.vectors, axis=1, keepdims=True)
    design = Design(mark="direction", k=3)
    ps = [human_p_values(design, dv, ing, d)[0] for d in key_material(design, 400, 1, dv)]
    for alpha in (0.05, 0.2, 0.5):
        assert np.mean(np.array(ps) <= alpha) == pytest.approx(
            alpha, abs=3.5 * np.sqrt(alpha * (1 - alpha) / 400)
        )


# ---------------------------------------------------------------------- attribution


def test_attribution_normaliser_and_tables():
    from ksemstamp.detection.stats import direction_z
    from research.study.attribution import _z, markdown

    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(6, 8))
    directions = rng.normal(size=(3, 8))
    contexts = [0, 2, 2, 1, 0, 1]
    onehot = np.eye(3)[contexts]
    total = float(((onehot @ directions) * vectors).sum())
    # With the text's own scores, the estimate's z is the exact statistic's.
    assert _z(vectors, onehot, total) == pytest.approx(direction_z(vectors, contexts, directions))
    result = {
        "eval_config": "run.yaml",
        "algorithm": "ksemstamp",
        "attacks": {
            "lm-paraphrase": {
                "texts": 10,
                "aligned": 7,
                "region_agreement_of_context": 0.8,
                "mean_sentence_score": {"clean": 1.5, "attacked_on_clean_context": 1.2},
                "power_at_1pct": {"attacked": 0.4, "attacked_on_clean_contexts": None},
                "temperatures": {
                    "0.05": {
                        "context_kept": 0.9,
                        "estimated_mean_z_clean": 3.0,
                        "estimated_mean_z_attacked": 2.5,
                        "estimated_power_clean": 0.8,
                        "estimated_power_attacked": 0.6,
                    }
                },
            }
        },
        "region_agreement": {
            "ksemstamp": {
                "lm-paraphrase": {
                    "sentences": 50,
                    "region_kept": 0.78,
                    "region_kept_margin_passing": 0.86,
                    "transition_kept": 0.63,
                }
            }
        },
    }
    text = markdown(result)
    assert "| lm-paraphrase | 10 (7) | 0.80 | 1.50 / 1.20 | 0.40 | - |" in text
    assert "| lm-paraphrase | 0.05 | 0.90 | 3.00 / 2.50 | 0.80 / 0.60 |" in text
    assert "| ksemstamp | lm-paraphrase | 50 | 0.78 / 0.86 | 0.63 |" in text
