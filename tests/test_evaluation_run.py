"""The evaluation pipeline end to end on the real offline models, tiny settings."""

import json

import pytest

from ksemstamp.cli import main
from ksemstamp.evaluation.predict import (
    GeneratorFactory,
    merge_shards,
    predict_to_shards,
    read_records,
)
from ksemstamp.evaluation.run import (
    EvalSettings,
    build_prompts,
    cut_at_token,
    cut_to_tokens,
    split_article,
)
from ksemstamp.evaluation.scoring import exact_score

TINY = {
    "search": {"max_candidates": 4, "candidate_batch": 4},
    "mark": {"novelty_patience": 0},  # the region mark's; the direction mark has none
}


def _tiny(max_new_tokens: int):
    """The default watermark settings with TINY's search and a short text."""
    from ksemstamp.settings import WatermarkSettings

    search = {"search": TINY["search"], "sampling": {"max_new_tokens": max_new_tokens}}
    return WatermarkSettings().updated(search)


def test_exact_score_ranks_smaller_p_values_higher_and_missing_last():
    assert exact_score({"p_value": 1.0}) == 0.0
    assert exact_score({"p_value": 0.001}) == pytest.approx(3.0)
    assert exact_score({"p_value": 0.001}) > exact_score({"p_value": 0.3}) > 0.0
    # Too short to score: below every real p-value, including p = 1.
    assert exact_score({"p_value": None}) < exact_score({"p_value": 1.0})
    assert exact_score({"p_value": 0.0}) == pytest.approx(300.0)
    # The same p-value reached through a different sum ties instead of ranking at random.
    assert exact_score({"p_value": 0.36862244897959173}) == exact_score(
        {"p_value": 0.3686224489795918}
    )


def test_split_article_and_cut_to_tokens():
    sentences = ["One two three.", "Four five six seven.", "Eight nine.", "Ten."]
    assert split_article(sentences, 7) == (sentences[:2], sentences[2:])
    # The first sentence is always kept, even when longer than the budget.
    assert split_article(sentences, 1) == (sentences[:1], sentences[1:])
    assert (
        cut_to_tokens(sentences[1:], lambda s: len(s.split()), 5)
        == "Four five six seven. Eight nine."
    )


def _words(text: str) -> int:
    return len(text.split())


def _word_starts(text: str) -> list[int]:
    import re

    return [m.start() for m in re.finditer(r"\s*\S+", text)]


def test_token_prompts_are_cut_mid_sentence_with_a_matching_human_negative():
    from ksemstamp.text.splitter import continuation_sentences, get_splitter

    assert cut_at_token("One two three four.", _word_starts, 2) == ("One two", " three four.")
    assert cut_at_token("One two.", _word_starts, 2) is None
    settings = EvalSettings(num_prompts=6, prompt_tokens=32, max_new_tokens=60)
    rows = build_prompts(settings, _words, _word_starts)
    assert len(rows) == 6
    splitter = get_splitter()
    completed = 0
    for row in rows:
        assert _words(row["prompt"]) == 32
        seed, sentences, completion = continuation_sentences(splitter, row["prompt"], row["human"])
        assert len(sentences) >= 1 and seed is not None
        # the negative is the article's own continuation, verbatim up to its sentence ends
        if completion is not None:
            completed += 1
            assert row["human"].startswith(completion)
    assert completed >= 3  # most 32-word cuts fall inside a sentence
    # the default keeps whole sentences
    whole = build_prompts(EvalSettings(num_prompts=2), _words)
    assert all(splitter.ends_sentence(splitter.split(r["prompt"])[-1]) for r in whole)
    # another split gives other articles under its own ids
    val = build_prompts(EvalSettings(num_prompts=2), _words, split="val")
    assert all(r["id"].startswith("news-val-") for r in val)
    assert all(r["id"].startswith("news-test-") for r in whole)
    assert not {r["prompt"] for r in val} & {r["prompt"] for r in whole}
    with pytest.raises(ValueError, match="prompt_tokens"):
        EvalSettings(prompt_tokens=0)


def test_settings_reject_unknown_algorithm_and_duplicate_attack():
    with pytest.raises(ValueError, match="unknown algorithms"):
        EvalSettings(algorithms=["ksemstamp", "unigram"])
    with pytest.raises(ValueError, match="unique name"):
        EvalSettings(attacks=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="listed before it"):
        EvalSettings(attacks=[{"name": "b", "source": "a"}, {"name": "a"}])


def test_merge_shards_keeps_first_record_per_id_in_prompt_order(tmp_path):
    def write(name, ids):
        (tmp_path / name).write_text("".join(json.dumps({"id": i, "n": name}) + "\n" for i in ids))

    write("g.jsonl", ["p1", "old"])  # from an earlier, interrupted or larger run
    write("g.shard0.jsonl", ["p0", "p1"])
    write("g.shard1.jsonl", ["p2"])
    with (tmp_path / "g.shard1.jsonl").open("a") as handle:
        handle.write('{"id": "p3", "n": ')  # a line cut by a crash: p3 is redone
    shards = sorted(tmp_path.glob("g.shard*.jsonl"))
    merged = merge_shards(shards, tmp_path / "g.jsonl", ["p0", "p1", "p2", "p3"])
    assert [(r["id"], r["n"]) for r in merged] == [
        ("p0", "g.shard0.jsonl"),
        ("p1", "g.jsonl"),
        ("p2", "g.shard1.jsonl"),
        ("old", "g.jsonl"),
    ]
    assert read_records(tmp_path / "g.jsonl") == merged
    assert not list(tmp_path.glob("g.shard*"))


def test_generation_batches_hold_one_key_and_records_keep_prompt_order(tmp_path, monkeypatch):
    # A batch is generated in one call under one key: prompts reach the devices grouped by key
    # (input order within a key), and the merged records come back in prompt order.
    from ksemstamp.evaluation import predict
    from ksemstamp.evaluation.stages import Run

    seen = []

    def fake_predict(factory, rows, folder, name, **kwargs):
        seen.extend(rows)
        shard = folder / f"{name}.shard0.jsonl"
        shard.write_text("".join(json.dumps({"id": r["id"]}) + "\n" for r in rows))

    monkeypatch.setattr(predict, "predict_to_shards", fake_predict)
    run = Run(EvalSettings(output_dir=str(tmp_path), num_keys=3))
    prompts = [{"id": f"p{i}", "prompt": "A."} for i in range(7)]
    run.key_index = {p["id"]: i % 3 for i, p in enumerate(prompts)}
    records = run.generate("none", prompts)
    assert [r["id"] for r in seen] == ["p0", "p3", "p6", "p1", "p4", "p2", "p5"]
    assert [r["key_index"] for r in seen] == [0, 0, 0, 1, 1, 2, 2]
    assert list(records) == [p["id"] for p in prompts]


def test_a_smaller_run_in_a_larger_runs_folder_reports_only_its_own_prompts(tmp_path):
    # A larger run stored five prompts' records in the folder; this run has two of them.
    from ksemstamp.evaluation.stages import Run

    run = Run(EvalSettings(output_dir=str(tmp_path)), progress=False)
    for stage, name in (("attacks", "ksemstamp.wordnet"), ("detections", "ksemstamp.wordnet")):
        (tmp_path / stage).mkdir(exist_ok=True)
        rows = [{"id": f"p{i}", "text": f"t{i}", "z_score": 1.0} for i in range(5)]
        (tmp_path / stage / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "quality").mkdir()
    (tmp_path / "quality" / "ksemstamp.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "perplexity": 9.0}) + "\n" for i in range(5))
    )
    gens = {"p0": {"text": "a", "status": "ok"}, "p1": {"text": "b", "status": "ok"}}
    texts = {"p0": "t0", "p1": "t1"}
    spec = {"name": "wordnet", "paraphraser": "wordnet", "num_candidates": 2}
    # Nothing is pending, so nothing is attacked, detected or scored again: only read back.
    assert list(run.attack("ksemstamp", spec, gens)) == ["p0", "p1"]
    assert list(run.detect("ksemstamp", "wordnet", texts, {})) == ["p0", "p1"]
    assert list(run.quality("ksemstamp", texts, {})) == ["p0", "p1"]


@pytest.mark.e2e
def test_evaluate_writes_json_table_and_plot(tmp_path, capsys):
    config = tmp_path / "eval.yaml"
    settings = {
        "num_prompts": 2,
        "max_new_tokens": 20,
        "algorithms": ["ksemstamp", "kgw", "none"],
        "watermark_overrides": TINY,
        "attacks": [
            {"name": "wordnet", "paraphraser": "wordnet", "num_candidates": 3, "select": "best"},
            {
                "name": "wordnet-bigram",
                "paraphraser": "wordnet",
                "num_candidates": 3,
                "select": "bigram",
                "similarity_bound": 0.5,
            },
            # A second pass over the first attack's texts.
            {
                "name": "wordnet-2",
                "source": "wordnet",
                "paraphraser": "wordnet",
                "num_candidates": 3,
                "select": "best",
            },
        ],
        "edits": ["swap", "interleave-50"],
        # The small generator as oracle keeps the test fast; the run's default is Gemma.
        "oracle": "smollm2-135m-instruct",
        "sem_ent_k": 50,
    }
    config.write_text(json.dumps(settings))  # JSON is YAML
    out = tmp_path / "run"
    argv = ["evaluate", "--config", str(config), "--output_dir", str(out), "--quiet"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert (out / "roc.png").stat().st_size > 1000
    table = (out / "results.md").read_text()
    assert "| k-SemStamp | no attack |" in table and "wordnet-bigram" in table
    assert "| KGW | no attack |" in table and "Human text" in table
    assert set(results["detection"]) == {"ksemstamp", "kgw"}
    for algorithm in ("ksemstamp", "kgw"):
        rows = results["detection"][algorithm]
        assert set(rows) == {
            "none", "wordnet", "wordnet-bigram", "wordnet-2", "swap", "interleave-50"
        }  # fmt: skip
        assert rows["swap"]["kind"] == "edit" and rows["wordnet"]["kind"] == "attack"
        assert set(rows["swap"]["at_alpha"]) == {"0.01", "0.05"}
        size = results["size"][algorithm]
        assert size["texts"] == 2 and 0 <= size["never"] <= 2
        for m in rows.values():
            assert 0.0 <= m["auroc"] <= 1.0 and m["positives"] == 2 and m["negatives"] == 2
        assert 0.0 < rows["wordnet"]["similarity"] <= 1.0
    q = results["quality"]["ksemstamp"]
    assert q["perplexity"] > 1 and q["ent3"] > 0 and q["sem_ent_k"] == 1  # two texts: one cluster
    assert q["candidates_per_sentence"] >= 1
    ppl = sorted(r["perplexity"] for r in read_records(out / "quality" / "ksemstamp.jsonl"))
    assert q["perplexity_median"] == pytest.approx((ppl[0] + ppl[1]) / 2)
    for block in (out / "results.md").read_text().split("\n\n"):
        md_rows = [line for line in block.splitlines() if line.startswith("|")]
        assert len({line.count("|") for line in md_rows}) <= 1, "ragged markdown table"
    # k-SemStamp's texts are also ranked by the exact p-value; KGW's are not.
    exact = results["detection"]["ksemstamp"]["none"]["exact"]
    assert 0.0 <= exact["auroc"] <= 1.0 and exact["positives"] == 2
    assert "exact" not in results["detection"].get("kgw", {}).get("none", {})
    assert "ranked by their exact p-value" in table
    assert "| interleave-50 (edit) |" in table and "human (FPR)" in table
    assert "KGW's z-test" in results["statistics"]["kgw"]
    # The interleaved text holds the other prompt's human sentences, never its own article's.
    from ksemstamp.text.splitter import get_splitter

    human = {p["id"]: p["human"] for p in read_records(out / "prompts.jsonl")}
    for mixed in read_records(out / "edits" / "ksemstamp.interleave-50.jsonl"):
        assert mixed["human_sentences"] >= 1
        other = next(h for i, h in human.items() if i != mixed["id"])
        assert get_splitter().split(other)[0] in mixed["text"]
        assert not any(s in mixed["text"] for s in get_splitter().split(human[mixed["id"]]))
    # The second pass attacked the first pass's texts; its similarity is to the original.
    once = {r["id"]: r for r in read_records(out / "attacks" / "ksemstamp.wordnet.jsonl")}
    for twice in read_records(out / "attacks" / "ksemstamp.wordnet-2.jsonl"):
        assert twice["sentence_similarity"] <= once[twice["id"]]["sentence_similarity"] + 1e-9
    sizes = read_records(out / "sizes" / "kgw.jsonl")
    assert [len(r["p_values"]) for r in sizes] == [len(r["prefix_tokens"]) for r in sizes]
    gens = read_records(out / "generations" / "ksemstamp.jsonl")
    assert [g["id"] for g in gens] == [p["id"] for p in read_records(out / "prompts.jsonl")]
    # A second run resumes: nothing is generated, attacked or scored again; same results.
    capsys.readouterr()
    assert main(argv) == 0
    assert "generate ksemstamp" not in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["detection"] == results["detection"]
    assert len(read_records(out / "generations" / "ksemstamp.jsonl")) == 2
    assert len(read_records(out / "attacks" / "ksemstamp.wordnet.jsonl")) == 2


@pytest.mark.slow
@pytest.mark.e2e
def test_ddp_spawn_predict_shards_merge_without_loss_or_duplicates(tmp_path):
    prompts = [
        {"id": f"p{i}", "prompt": f"Story {i} begins here. The town council met on Monday."}
        for i in range(5)
    ]
    factory = GeneratorFactory(
        "ksemstamp", [{**_tiny(max_new_tokens=8).to_dict(), "key": "test-suite-key"}]
    )
    shards = predict_to_shards(
        factory,
        prompts,
        tmp_path,
        "ksemstamp",
        devices=2,
        accelerator="cpu",
        strategy="ddp_spawn",
        batch_size=2,
        progress=False,
    )
    assert [p.name for p in shards] == ["ksemstamp.shard0.jsonl", "ksemstamp.shard1.jsonl"]
    per_rank = [[r["id"] for r in read_records(p)] for p in shards]
    assert all(per_rank) and not set(per_rank[0]) & set(per_rank[1])
    merged = merge_shards(shards, tmp_path / "ksemstamp.jsonl", [p["id"] for p in prompts])
    assert [r["id"] for r in merged] == [p["id"] for p in prompts]
    assert all(r["status"] == "ok" and r["text"] for r in merged)
    assert not list(tmp_path.glob("*.shard*.jsonl"))


SLOW_PREDICT = """
import sys, time
from ksemstamp.evaluation.predict import predict_to_shards
from ksemstamp.parallel import Job

class SlowFactory:
    def __call__(self, device):
        def generate(rows):
            time.sleep(0.3)
            return [{"id": r["id"], "text": r["prompt"], "status": "ok"} for r in rows]
        return Job(generate)

prompts = [{"id": f"p{i}", "prompt": f"prompt {i}"} for i in range(200)]
predict_to_shards(SlowFactory(), prompts, sys.argv[1], "slow", batch_size=1, progress=False)
"""


@pytest.mark.slow  # two processes
def test_sigterm_stops_generation_after_the_current_batch(tmp_path):
    import json
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "slow.py"
    script.write_text(SLOW_PREDICT)
    shard = tmp_path / "out" / "slow.shard0.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out")])
    try:
        deadline = time.monotonic() + 120
        while not (shard.exists() and shard.read_text().count("\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, "no records written"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        # Without the stop, the remaining ~190 batches would take about a minute.
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    assert code != 0
    records = [json.loads(line) for line in shard.read_text().splitlines()]
    assert 3 <= len(records) < 200
    assert [r["id"] for r in records] == [f"p{i}" for i in range(len(records))]


def test_evaluation_records_name_what_a_detector_must_share_with_the_generator():
    """As every generated record: the key's fingerprint and the identity settings with their
    fingerprint (``identity_fields``); an unwatermarked record has neither."""
    from types import SimpleNamespace

    from ksemstamp.detection.inputs import identity_fields
    from ksemstamp.evaluation.predict import _watermark_generate
    from ksemstamp.settings import WatermarkSettings
    from ksemstamp.settings.identity import identity_of

    identity = identity_of(WatermarkSettings(), "enc", "c1")
    result = SimpleNamespace(to_record=lambda: {"text": "One. Two."})
    watermarker = SimpleNamespace(
        scheme=SimpleNamespace(key_fingerprint="kf", identity=identity),
        generate=lambda prompts, watermark: [result for _ in prompts],
    )
    (marked,) = _watermark_generate(watermarker, True)(["p"])
    assert marked["key_fingerprint"] == "kf"
    assert {k: marked[k] for k in identity_fields(identity)} == identity_fields(identity)
    (plain,) = _watermark_generate(watermarker, False)(["p"])
    assert plain["key_fingerprint"] is None and not set(identity_fields(identity)) & set(plain)
