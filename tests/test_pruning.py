"""The pruning rule of the direction mark, on plain numbers."""

import pytest
from test_watermarker import ScriptedEngine

from ksemstamp.generation.engine import Finished, Step
from ksemstamp.generation.pruning import PruneRule, rows_to_keep


def test_first_check_keeps_the_best_rows_finished_ones_included():
    rule = PruneRule(every=8, top=3, margin=None)
    partial = [0.1, 0.9, -0.5, 0.4, 0.9]
    # No row has finished: the three best partial scores go on (the earlier of a tie first).
    assert rows_to_keep(rule, 8, partial, []) == [False, True, False, True, True]
    # One candidate finished already: it takes one of the three places.
    assert rows_to_keep(rule, 8, partial, [-2.0]) == [False, True, False, False, True]
    # As many finished as places: every running row stops.
    assert rows_to_keep(rule, 8, partial, [0.0, 0.0, 0.0]) == [False] * 5


def test_later_checks_only_apply_the_margin():
    rule = PruneRule(every=8, top=1, margin=0.3)
    partial = [1.0, 0.75, 0.69, -1.0]
    # After the first check, `keep` no longer limits the rows; the margin below the best
    # finished candidate (1.0 - 0.3) does.
    assert rows_to_keep(rule, 16, partial, [1.0, -0.2]) == [True, True, False, False]
    # Nothing finished yet: nothing to compare with, every row goes on.
    assert rows_to_keep(rule, 16, partial, []) == [True] * 4
    assert rows_to_keep(PruneRule(margin=None), 24, partial, [5.0]) == [True] * 4


def test_both_parts_at_the_first_check():
    rule = PruneRule(every=4, top=3, margin=0.5)
    # Places for two running rows (one finished at 1.2); of those two, 0.6 is below 1.2 - 0.5.
    assert rows_to_keep(rule, 4, [0.6, 2.0, 0.1], [1.2]) == [False, True, False]
    assert rows_to_keep(rule, 4, [0.8, 2.0, 0.1], [1.2]) == [True, True, False]


@pytest.mark.parametrize(
    "kwargs", [{"every": 0}, {"top": 0}, {"margin": -0.1}], ids=["every", "top", "margin"]
)
def test_bad_rules_are_refused(kwargs):
    with pytest.raises(ValueError):
        PruneRule(**kwargs)


# ---------------------------------------------------------------------- in the sentence loop


class PruningEngine(ScriptedEngine):
    """A scripted engine whose rows the pruner sees once per round: each round is a list of rows
    ``(text after 8 tokens, whole sentence or "" for a row that makes none)``; rows the pruner
    stops come back pruned, the others finish (20 tokens) at the next step."""

    def __init__(self, *rounds):
        super().__init__(rounds)
        self.asked = []
        self.rows = []

    def open(self, request):
        script = self.script.pop(0)
        self.rows.append(list(request.rows))
        assert request.rows == [len(script)]
        return _PrunedRound(script, self.asked)


class _PrunedRound:
    def __init__(self, script, asked):
        self.script, self.asked = script, asked
        self.live = [(0, i) for i in range(len(script))]
        self.tokens = 0

    def advance(self, until):
        assert until == self.tokens + 8, "the pruner checks every 8 tokens"
        self.tokens = until
        if until == 8:
            return Step([], 8)
        return Step([Finished(p, self.script[p[1]][1], 20) for p in self.live], until)

    def partial_texts(self, rows):
        return [self.script[i][0] for _, i in rows]

    def tokens_of(self, row):
        return self.tokens

    def retain(self, rows):
        if self.tokens == 8:
            self.asked.append([place in rows for place in self.live])
        stopped = [(p, self.tokens) for p in self.live if p not in rows]
        self.live = [p for p in self.live if p in rows]
        return stopped

    def close(self):
        pass


def test_the_watermarker_keeps_the_best_finished_of_the_rows_the_rule_lets_run(hash_encoder):
    from test_direction import _pool, _scheme, _scored
    from test_watermarker import _watermarker

    scheme = _scheme(hash_encoder)
    prompt = "A prompt sentence."
    previous = int(scheme.regions([prompt])[0][0])
    pool = _pool(12)
    partial, whole = pool[:6], pool[6:]
    p_scores, w_scores = _scored(scheme, previous, partial), _scored(scheme, previous, whole)
    sampler = PruningEngine(list(zip(partial, whole, strict=True)))
    wm = _watermarker(
        scheme,
        sampler,
        max_candidates=6,
        max_new_tokens=5,
        threshold=None,
        prune=PruneRule(every=8, top=2, margin=None),
    )
    result = wm.generate([prompt])[0]
    # The two rows whose first tokens score best on the prompt's context go on ...
    kept = sorted(range(6), key=lambda i: -p_scores[i])[:2]
    assert sampler.asked == [[i in kept for i in range(6)]]
    # ... and the kept sentence is the better of their whole sentences, whatever the others
    # would have become.
    best = max(kept, key=lambda i: w_scores[i])
    record = result.sentences[0]
    assert record.text == whole[best] and record.score == pytest.approx(w_scores[best], abs=1e-5)
    assert record.candidates == 6 and record.pruned == 4 and not record.fallback
    assert result.to_record()["pruned"] == 4


@pytest.mark.parametrize("mark", ["direction", "region"])
def test_no_pruner_for_the_region_mark_or_a_threshold(hash_encoder, mark):
    from test_direction import _scheme
    from test_watermarker import _scheme as _region_scheme
    from test_watermarker import _watermarker

    # ScriptedEngine takes no pruner: these runs would fail if one were passed. The region
    # mark accepts the first valid candidate; the direction mark with a threshold the first
    # reaching it: neither waits for a best of many, so nothing is pruned.
    scheme = _scheme(hash_encoder) if mark == "direction" else _region_scheme(hash_encoder)
    pool = ["One sentence here.", "Two sentence here.", "Three sentence here."]
    wm = _watermarker(
        scheme,
        ScriptedEngine([pool]),
        max_candidates=3,
        candidate_batch=3,
        adaptive_batch=False,
        max_new_tokens=5,
        threshold=0.0 if mark == "direction" else None,
        prune=PruneRule(every=8, top=2),
    )
    assert wm.generate(["A prompt sentence."])[0].status == "ok"


def test_a_pruned_round_without_a_sentence_is_followed_by_another(hash_encoder):
    # The two rows let run make no sentence (the LM ran past the length cap): the budget counts
    # finished rows only, so the sentence is drawn again with the rest of it (6 - 2 rows).
    from test_direction import _pool, _scheme
    from test_watermarker import _watermarker

    scheme = _scheme(hash_encoder)
    pool = _pool(10)
    first = [(pool[i], "") for i in range(6)]
    second = [(pool[i], pool[i]) for i in range(6, 10)]
    sampler = PruningEngine(first, second)
    wm = _watermarker(
        scheme,
        sampler,
        max_candidates=6,
        max_new_tokens=5,
        threshold=None,
        prune=PruneRule(every=8, top=2, margin=None),
    )
    result = wm.generate(["A prompt sentence."])[0]
    assert sampler.rows == [[6], [4]]
    assert result.status == "ok" and not result.ended_by_model
    record = result.sentences[0]
    assert record.text in pool[6:] and record.candidates == 10 and record.pruned == 6
