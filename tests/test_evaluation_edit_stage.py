"""The evaluation's edit stage on stand-in articles (no models)."""

import pytest

from ksemstamp.evaluation.edit_stage import edit_stage, human_pool
from ksemstamp.evaluation.predict import read_records
from ksemstamp.evaluation.stages import Run
from ksemstamp.settings.evaluation import EvalSettings

PROMPTS = [
    {"id": "p0", "article_id": "a0", "prompt": "Zero."},
    {"id": "p1", "article_id": "a1", "prompt": "One."},
    {"id": "p2", "article_id": "a0", "prompt": "Zero again."},  # same article as p0
    {"id": "p3", "article_id": "a3", "prompt": "Three."},
]


def article(prompt):
    """Six human sentences per article, named after it."""
    return [f"Human sentence {k} of article {prompt['article_id']}." for k in range(6)]


def test_human_pool_goes_backwards_over_other_articles_each_once_never_its_own():
    a0, a1, a3 = (article(PROMPTS[k]) for k in (0, 1, 3))
    assert human_pool(PROMPTS, 3, 8, article) == a0 + a1[:2]  # p2 holds article a0
    # p2 shares p0's article: its pool skips p0 and wraps round to p3.
    assert human_pool(PROMPTS, 2, 12, article) == a1 + a3
    # p1 meets article a0 twice (p0, then p2 after wrapping): it is taken once.
    assert human_pool(PROMPTS, 1, 12, article) == a0 + a3
    assert human_pool(PROMPTS, 0, 2, article) == a3[:2]
    assert human_pool(PROMPTS, 0, 0, article) == []
    with pytest.raises(ValueError, match="needs 13"):
        human_pool(PROMPTS, 2, 13, article)


TEXTS = {
    "p1": " Alpha rose today. Beta fell sharply. Gamma stayed flat. Delta was sold.",
    "p3": "Prices climbed again. Traders were calm. The market closed early.",
}


def test_edit_stage_edits_every_text_the_same_way_for_every_algorithm(tmp_path):
    edits = ["reorder", "merge", "interleave-75", "homoglyphs"]
    run = Run(EvalSettings(output_dir=str(tmp_path), edits=edits))
    first = edit_stage(run, "ksemstamp", TEXTS, PROMPTS, sentences_of=article)
    assert set(first) == set(edits) and all(set(v) == set(TEXTS) for v in first.values())
    # The same text under another algorithm gets the same edit (seeded by the prompt).
    second = edit_stage(run, "kgw", TEXTS, PROMPTS, sentences_of=article)
    assert {k: v["text"] for k, v in first["reorder"].items()} == {
        k: v["text"] for k, v in second["reorder"].items()
    }
    reordered = first["reorder"]["p1"]["text"]
    assert reordered.startswith(" ")  # the join to the prompt is kept
    assert reordered != TEXTS["p1"] and sorted(reordered.split()) == sorted(TEXTS["p1"].split())
    interleaved = first["interleave-75"]["p1"]["text"]
    # Three human sentences after each of the four own ones, none from the text's own article.
    assert first["interleave-75"]["p1"]["human_sentences"] == 12
    assert "article a1" not in interleaved and interleaved.count("Human sentence") == 12
    assert first["merge"]["p3"]["text"].count(", and") == 1
    assert first["homoglyphs"]["p3"]["text"] != TEXTS["p3"]
    assert len(read_records(tmp_path / "edits" / "kgw.reorder.jsonl")) == 2


def test_edit_stage_resumes_and_extends(tmp_path):
    run = Run(EvalSettings(output_dir=str(tmp_path), edits=["swap"]))
    path = tmp_path / "edits" / "ksemstamp.swap.jsonl"
    edit_stage(run, "ksemstamp", {"p1": TEXTS["p1"]}, PROMPTS, sentences_of=article)
    stored = path.read_text()
    out = edit_stage(run, "ksemstamp", TEXTS, PROMPTS, sentences_of=article)
    assert path.read_text().startswith(stored) and len(read_records(path)) == 2
    assert out["swap"]["p3"]["text"].startswith("Traders were calm.")
    # Asking for fewer texts returns only those.
    assert set(edit_stage(run, "ksemstamp", {"p3": TEXTS["p3"]}, PROMPTS, article)["swap"]) == {
        "p3"
    }


def test_settings_check_edit_names():
    assert EvalSettings().edits[0] == "reorder" and len(EvalSettings().edits) == 11
    with pytest.raises(ValueError, match="unknown edits"):
        EvalSettings(edits=["shuffle"])
    with pytest.raises(ValueError, match="share the names"):
        EvalSettings(edits=["swap"], attacks=[{"name": "swap", "paraphraser": "wordnet"}])
    assert EvalSettings(edits=[]).edits == []


def test_article_sentences_start_at_the_human_continuation():
    from ksemstamp.evaluation.edit_stage import ArticleSentences
    from ksemstamp.text.splitter import get_splitter

    sentences = ArticleSentences(get_splitter())
    sentences._texts = {
        "a": "Lead one. Lead two is the prompt. Human starts here. It goes on.\n\nAnd on.",
        "b": "Title words here. More text follows. Then the end.",
    }
    whole = {"article_id": "a", "human": "Human starts here. It goes on."}
    assert sentences(whole) == ["Human starts here.", "It goes on.", "And on."]
    # A continuation that first completes the prompt's sentence: found by its next sentence.
    cut = {"article_id": "b", "human": " words here. More text follows."}
    assert sentences(cut) == ["More text follows.", "Then the end."]
