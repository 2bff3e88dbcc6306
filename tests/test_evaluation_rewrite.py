"""The document-level rewrite: windows, the choice among candidates and the fallback (no models)."""

import random

import pytest
import torch

from ksemstamp.evaluation.attacks import Attack, Recursive, build_attack
from ksemstamp.evaluation.rewrite import Rewrite, attack_summary, select_window, windows
from ksemstamp.settings.attacks import ATTACK_KINDS, AttackKind, AttackSettings
from ksemstamp.text.splitter import get_splitter


@pytest.mark.parametrize("count", range(0, 30))
def test_windows_cover_the_text_in_order_with_two_to_four_sentences(count):
    for seed in range(5):
        plan = windows(count, random.Random(seed))
        assert [a for a, _ in plan] == ([0] + [b for _, b in plan[:-1]] if plan else [])
        assert (plan[-1][1] if plan else 0) == count
        sizes = [b - a for a, b in plan]
        if count >= 2:
            assert all(2 <= n <= 4 for n in sizes)
        else:
            assert sizes == ([count] if count else [])


def test_window_sizes_vary_with_the_stream():
    sizes = {tuple(b - a for a, b in windows(12, random.Random(seed))) for seed in range(20)}
    assert len(sizes) > 5
    with pytest.raises(ValueError):
        windows(5, random.Random(0), 3, 2)


ORIGINAL = "The council met on Monday. It approved the budget. Taxes will rise in May."


def test_select_window_keeps_the_most_similar_candidate_that_qualifies():
    cands = [
        "The council met on Monday. It approved the budget. Taxes will rise in May.",  # copy
        "On Monday the council approved the budget, so taxes rise in May.",  # good
        "Meeting on Monday, councillors passed the budget; May brings higher taxes.",  # good
        "On Monday the council approved the budget, so taxes rise in",  # unfinished
        "The council met on Monday. It approved the budget. Taxes will rise in June.",  # ~copy
        "On Monday the council approved the budget. " * 4,  # far longer
        "Football is popular.",  # drifted
    ]
    sims = [1.0, 0.90, 0.85, 0.97, 0.99, 0.95, 0.30]
    complete = [True, True, True, False, True, True, True]
    assert select_window(ORIGINAL, cands, sims, complete) == 1
    # Without the better one, the next most similar that qualifies.
    assert select_window(ORIGINAL, cands[2:], sims[2:], complete[2:]) == 0
    # A tighter bound than any good candidate meets: no candidate, the window stays.
    assert select_window(ORIGINAL, cands, sims, complete, similarity_bound=0.95) is None
    # A looser overlap bound admits the near-copy, which is the most similar then.
    assert select_window(ORIGINAL, cands, sims, complete, max_overlap=1.0) == 4
    assert select_window(ORIGINAL, [], [], []) is None


class WindowParaphraser:
    """Scripted candidates for each window's text; records the windows it was asked for."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    def candidates(self, texts):
        self.calls.append(list(texts))
        return [list(self.table.get(t, [])) for t in texts]


class TableEncoder:
    """2-d unit vectors: the cosine of ``(s, sqrt(1 - s^2))`` with ``(1, 0)`` is ``s``."""

    def __init__(self, sims):
        self.sims = sims

    def encode(self, texts, convert_to_tensor=True, show_progress_bar=False):
        return torch.stack(
            [torch.tensor([s, (1 - s * s) ** 0.5]) for s in (self.sims.get(t, 1.0) for t in texts)]
        )


def test_rewrite_replaces_whole_windows_and_counts_fallbacks():
    splitter = get_splitter()
    sentences = [f"Sentence number {w} says something new." for w in "ABCDEFGHIJ"]
    text = " " + " ".join(sentences)  # a leading space (a completed prompt) is kept
    plan = windows(len(sentences), random.Random(f"rewrite|{text}"))
    originals = [" ".join(sentences[a:b]) for a, b in plan]
    assert len(plan) >= 3
    # The first window gets a good rewrite, the second only a drifted one, the rest nothing.
    good = "A single merged sentence tells all of that in other words."
    table = {originals[0]: [good], originals[1]: ["Something else entirely happened."]}
    sims = {good: 0.9, "Something else entirely happened.": 0.2}
    paraphraser = WindowParaphraser(table)
    rewrite = Rewrite(paraphraser, TableEncoder(sims), splitter)
    (res,) = rewrite([text])
    assert paraphraser.calls == [originals]  # every window of every text in one call
    assert res.text == " " + " ".join([good, *originals[1:]])
    assert (res.windows, res.rewritten, res.fallbacks) == (len(plan), 1, len(plan) - 1)
    assert res.sentences == 10
    assert res.rewritten_similarity == pytest.approx(0.9)
    assert res.window_similarity == pytest.approx((0.9 + len(plan) - 1) / len(plan))
    # The same text is cut into the same windows again.
    assert rewrite([text])[0].text == res.text


def test_every_window_takes_a_changed_candidate_below_the_bounds():
    splitter = get_splitter()
    sentences = [f"Sentence number {w} says something new." for w in "ABCDEFGH"]
    text = " ".join(sentences)
    plan = windows(len(sentences), random.Random(f"rewrite|{text}"))
    originals = [" ".join(sentences[a:b]) for a, b in plan]
    drifted = "Something else entirely happened."
    table = {originals[0]: [drifted, originals[0], "An unfinished rewrite of"], originals[1]: []}
    encoder = TableEncoder({drifted: 0.2})
    # Under the bounds the drifted candidate does not qualify: every window stays.
    (kept,) = Rewrite(WindowParaphraser(table), encoder, splitter)([text])
    assert kept.rewritten == 0
    # Rewriting every window, the drifted (complete, changed) one replaces the first window;
    # a copy and an unfinished candidate never do, and a window with no candidate stays.
    (res,) = Rewrite(WindowParaphraser(table), encoder, splitter, every_window=True)([text])
    assert res.text == " ".join([drifted, *originals[1:]])
    assert (res.rewritten, res.fallbacks) == (1, len(plan) - 1)
    assert res.rewritten_similarity == pytest.approx(0.2)


class SwapParaphraser:
    """Candidates that swap the words "red" and "blue": two passes give the original back."""

    def candidates(self, sentences):
        swap = {"red": "blue", "blue": "red"}
        return [[" ".join(swap.get(w, w) for w in s.split())] for s in sentences]


def test_recursive_attack_runs_each_pass_on_the_last_output():
    text = "The red car stopped. A blue bird sang."
    once = Attack(SwapParaphraser(), TableEncoder({}), get_splitter())
    (first,) = once([text])
    assert first.text == "The blue car stopped. A red bird sang."
    (twice,) = Recursive(once, 2)([text])
    assert twice.text == text and twice.changed == 2
    built = build_attack(
        {"name": "p2", "paraphraser": "wordnet", "num_candidates": 2, "passes": 2},
        (None, None),
        TableEncoder({}),
        get_splitter(),
    )
    assert isinstance(built, Recursive) and built.passes == 2
    with pytest.raises(ValueError):
        Recursive(once, 0)


def test_rewrite_without_any_candidate_keeps_the_text():
    text = "One thing happened. Then another thing happened. Finally it ended."
    (res,) = Rewrite(WindowParaphraser({}), TableEncoder({}), get_splitter())([text])
    assert res.text == text and res.rewritten == 0 and res.rewritten_similarity is None
    assert res.window_similarity == 1.0 and res.fallbacks == res.windows >= 1


def test_build_attack_by_kind_and_summary():
    lm = (None, None)
    rewrite = build_attack(
        {"name": "r", "paraphraser": "lm-rewrite", "window": [3, 4], "num_candidates": 2},
        lm,
        TableEncoder({}),
        get_splitter(),
    )
    assert isinstance(rewrite, Rewrite) and rewrite.window == (3, 4)
    assert rewrite.paraphraser.prompts.label == "Rewrite"
    assert rewrite.paraphraser.num_candidates == 2 and rewrite.paraphraser.max_new_tokens == 200
    sentence = build_attack(
        {"name": "p", "paraphraser": "wordnet", "num_candidates": 2},
        lm,
        TableEncoder({}),
        get_splitter(),
    )
    assert isinstance(sentence, Attack)
    rewritten = [
        {"similarity": 0.8, "window_similarity": 0.9, "rewritten_similarity": 0.8,
         "rewritten": 1, "fallbacks": 1, "windows": 2},
        {"similarity": 0.6, "window_similarity": 0.7, "rewritten_similarity": 0.7,
         "rewritten": 2, "fallbacks": 0, "windows": 2},
    ]  # fmt: skip
    summary = attack_summary(rewritten)
    assert summary["similarity"] == pytest.approx(0.7)
    assert summary["rewritten_window_similarity"] == pytest.approx((0.8 + 2 * 0.7) / 3)
    assert summary["fallbacks"] == 1 and summary["fallback_share"] == pytest.approx(0.25)
    per_sentence = attack_summary(
        [{"similarity": 0.9, "sentence_similarity": 0.95, "changed": 1, "sentences": 4}]
    )
    assert per_sentence["changed_sentence_share"] == 0.25 and "fallbacks" not in per_sentence


def test_an_attack_entry_is_checked_field_by_field():
    from ksemstamp.settings.evaluation import EvalSettings

    with pytest.raises(ValueError, match=r"attacks.p.num_cadidates is not a setting of an attack"):
        EvalSettings(attacks=[{"name": "p", "paraphraser": "wordnet", "num_cadidates": 2}])
    with pytest.raises(ValueError, match="paraphraser must be one of"):
        EvalSettings(attacks=[{"name": "p", "paraphraser": "pegasus"}])
    with pytest.raises(ValueError, match="window must be"):
        AttackSettings("r", "lm-rewrite", window=(4, 2))
    # An entry that spells out a default is the same attack as one that leaves it out.
    assert AttackSettings("p", select="best") == AttackSettings("p")


def test_a_new_kind_of_attack_is_one_builder_and_one_registration(monkeypatch):
    monkeypatch.setitem(ATTACK_KINDS, "upper", AttackKind(f"{__name__}:_upper_attack"))
    built = build_attack({"name": "u", "paraphraser": "upper"}, None, None, get_splitter())
    assert built(["Quiet words."]) == ["QUIET WORDS."]


def _upper_attack(settings, lm, encoder, splitter):
    return lambda texts: [t.upper() for t in texts]


@pytest.mark.slow
@pytest.mark.e2e
def test_gemma_rewrites_a_window_of_news(encoder):
    from ksemstamp.assets import load_lm

    rewrite = build_attack(
        {"name": "r", "paraphraser": "lm-rewrite", "num_candidates": 2, "similarity_bound": 0.5},
        load_lm("gemma3-270m"),
        encoder,
        get_splitter(),
    )
    text = (
        "The city council voted on Monday to close the old library. The building will be sold "
        "next year. Officials said the money would fund a new school."
    )
    (res,) = rewrite([text])
    assert (res.windows, res.sentences) == (1, 3)
    assert res.rewritten == 1 and res.fallbacks == 0
    assert res.text != text and res.rewritten_similarity >= 0.5
    assert get_splitter().ends_sentence(get_splitter().split(res.text)[-1])
