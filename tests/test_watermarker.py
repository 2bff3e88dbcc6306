"""Round sizing and bookkeeping of the sentence loop, without a real LM."""

import dataclasses

import pytest
import torch

from ksemstamp.generation.engine import Finished, Step
from ksemstamp.marks import build_mark
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import (
    DirectionSearch,
    LimitSettings,
    RegionSearch,
    RegionSettings,
    SamplingSettings,
    SearchSettings,
)
from ksemstamp.text.splitter import get_splitter
from ksemstamp.watermarker import Watermarker, summarize


class ScriptedEngine:
    """An ``Engine`` that draws from a fixed script: each group of a round takes the next list
    of texts, one per row (every row finishes at the first ``advance``, 5 tokens long); a row
    past the script's texts finishes empty. A ``(text, fluency)`` pair gives the row its mean
    log-probability per token. Records each round's rows and request."""

    tokenizer = None
    context_length = None
    max_unit_tokens = 64
    vocab_size = 8
    model = None

    def __init__(self, script):
        self.script = list(script)
        self.rounds = []
        self.calls = []

    def open(self, request):
        self.rounds.append(list(request.rows))
        self.calls.append(
            {
                "prefixes": request.prefixes,
                "last_units": request.last_units,
                "heads": request.heads,
                "bias": request.bias,
            }
        )
        texts = [self.script.pop(0) for _ in request.prefixes]
        return _ScriptedRound(request.rows, texts)


class _ScriptedRound:
    def __init__(self, rows, texts):
        self.live = [(g, i) for g, n in enumerate(rows) for i in range(n)]
        self.texts = texts

    def advance(self, until=None):
        assert until is None, "a scripted round takes no pruner"
        finished = []
        for g, i in self.live:
            text = self.texts[g][i] if i < len(self.texts[g]) else ""
            text, fluency = text if isinstance(text, tuple) else (text, float("nan"))
            finished.append(Finished((g, i), text, 5, fluency=fluency))
        return Step(finished, None)

    def partial_texts(self, rows):
        raise AssertionError("nothing runs after the first step")

    tokens_of = steer = partial_texts

    def retain(self, rows):
        assert not rows, "every row finishes at the first step"
        stopped, self.live = [(place, 5) for place in self.live], []
        return stopped

    def close(self):
        pass


PAPER_RULE = RegionSettings()
PAPER_SEARCH = {"novelty_patience": 0, "margin_patience": None}
"""Algorithm 1's acceptance rule, the loop tests' default."""
SEARCH = {f.name for c in (DirectionSearch, RegionSearch) for f in dataclasses.fields(c)}


def fields_of(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _table(scheme):
    """The valid table the region mark of ``scheme`` draws from its key."""
    return build_mark(scheme).host_table


def _scheme(hash_encoder):
    return WatermarkScheme(hash_encoder, LSHPartition(32, bits=3), "k", get_splitter(), PAPER_RULE)


def _watermarker(scheme, engine, chat=False, mark=None, max_sentences=None, table=None, **given):
    """A ``Watermarker`` with the settings named by their fields: search's (the mark's
    generation rule among them: region: patience; direction: threshold, selection),
    ``max_new_tokens`` and ``seed``, ``max_prompt_chars`` (``limits.max_text_chars``),
    ``prune`` (a ``PruneRule``) and ``table`` (a valid table the region mark uses instead of
    its key's). As the loop's tests expect: the paper's N_max (100) and acceptance rule, and no
    pruning unless given."""
    prune = given.pop("prune", None)
    pruning = {"prune_tokens": None}
    if prune is not None:
        pruning = {
            "prune_tokens": prune.every,
            "prune_keep": prune.top,
            "prune_margin": prune.margin,
        }
    paper = PAPER_SEARCH if scheme.settings.kind == "region" else {}
    search_class = type(scheme.settings).search
    search = {
        "max_candidates": 100,
        **paper,
        **pruning,
        **{k: given[k] for k in SEARCH & set(given)},
    }
    search = search_class(**{k: v for k, v in search.items() if k in fields_of(search_class)})
    sampling = SamplingSettings(**{k: given[k] for k in ("max_new_tokens", "seed") if k in given})
    chars = {"max_text_chars": given["max_prompt_chars"]} if "max_prompt_chars" in given else {}
    if mark is None:
        mark = build_mark(scheme, search)
    if table is not None:
        mark.table = mark.host_table = table
    return Watermarker(
        scheme,
        engine,
        search,
        sampling,
        LimitSettings(**chars),
        chat=chat,
        mark=mark,
        max_sentences=max_sentences,
    )


def test_round_size_grows_as_acceptance_falls(hash_encoder):
    wm = _watermarker(_scheme(hash_encoder), ScriptedEngine([]), candidate_batch=32)
    sizes = []
    for p in (0.9, 0.5, 0.2, 0.05, 0.01):
        stats = {0: [p * 1000, 1000.0]}
        sizes.append(wm.rows_for(0, 0, stats))
    assert sizes == sorted(sizes) and sizes[0] <= 2 and sizes[-1] == 32
    assert wm.rows_for(0, 95, {0: [10.0, 1000.0]}) == 5  # never beyond the candidate budget
    assert wm.rows_for(0, 0, {}, watermark=False) == 1
    fixed = _watermarker(
        _scheme(hash_encoder), ScriptedEngine([]), candidate_batch=6, adaptive_batch=False
    )
    assert fixed.rows_for(0, 0, {}) == 6


def _margin_free(hash_encoder):
    """A scheme without margin, a prompt, and the prompt's region."""
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    prompt = "A prompt sentence."
    return scheme, prompt, int(scheme.regions([prompt])[0][0])


def _valid_after(scheme, previous, want):
    """A sentence whose region is (or is not) valid after ``previous``."""
    for i in range(500):
        text = f"Candidate sentence {i}."
        region = int(scheme.regions([text])[0][0])
        if bool(_table(scheme)[previous, region]) == want:
            return text
    raise AssertionError("no such sentence")


def test_fallback_after_max_candidates_and_counts(hash_encoder):
    scheme, prompt, seed_region = _margin_free(hash_encoder)
    bad = _valid_after(scheme, seed_region, False)
    sampler = ScriptedEngine([[bad, bad], [bad, bad]])
    wm = _watermarker(
        scheme, sampler, max_candidates=4, candidate_batch=2, adaptive_batch=False, max_new_tokens=5
    )
    res = wm.generate([prompt])[0]
    assert res.status == "ok" and res.num_sentences == 1
    record = res.sentences[0]
    assert record.fallback and record.candidates == 4 and record.rejected["region"] == 4
    assert sampler.rounds == [[2], [2]]
    assert summarize([res])["fallbacks"] == 1


def test_accepts_first_valid_and_chains_regions(hash_encoder):
    scheme, prompt, first_prev = _margin_free(hash_encoder)
    good = _valid_after(scheme, first_prev, True)
    bad = _valid_after(scheme, first_prev, False)
    # The second sentence is judged after the first one's region, not after the prompt's.
    # good2 is valid only after the first sentence, bad2 only after the prompt.
    second_prev = int(scheme.regions([good])[0][0])
    table = _table(scheme)

    def find(valid_after_second):
        for i in range(500):
            text = f"Next sentence {i}."
            region = int(scheme.regions([text])[0][0])
            after_second, after_prompt = table[second_prev, region], table[first_prev, region]
            if bool(after_second) == valid_after_second and bool(after_prompt) != after_second:
                return text
        raise AssertionError("no such sentence")

    good2, bad2 = find(True), find(False)
    sampler = ScriptedEngine([[bad, good, bad], [bad2, good2, bad2]])
    wm = _watermarker(scheme, sampler, candidate_batch=3, adaptive_batch=False, max_new_tokens=10)
    res = wm.generate([prompt])[0]
    assert [s.text for s in res.sentences] == [good, good2]
    assert [s.candidates for s in res.sentences] == [2, 2]
    assert [s.region for s in res.sentences] == [second_prev, int(scheme.regions([good2])[0][0])]
    assert not any(s.fallback for s in res.sentences)
    assert sampler.rounds == [[3], [3]]


def _with_region(scheme, region, same):
    for i in range(500):
        text = f"Another sentence {i}."
        if (int(scheme.regions([text])[0][0]) == region) == same:
            return text
    raise AssertionError("no such sentence")


def test_novelty_rejects_repeated_transitions_until_patience(hash_encoder):
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    table = torch.ones(8, 8, dtype=torch.bool)  # every transition valid
    prompt = "A prompt sentence."
    s = int(scheme.regions([prompt])[0][0])
    same = [
        t for t in (f"Same region {i}." for i in range(400)) if int(scheme.regions([t])[0][0]) == s
    ]
    other = _with_region(scheme, s, False)
    assert len(same) >= 4

    def run(patience, second):
        script = [[same[0]], second, [same[3]], [same[3]]]
        wm = _watermarker(
            scheme,
            ScriptedEngine(script),
            candidate_batch=2,
            adaptive_batch=False,
            max_new_tokens=10,
            novelty_patience=patience,
            table=table,
        )
        return wm.generate([prompt])[0]

    # the paper's rule: the first valid candidate, repeated transition or not
    paper = run(0, [same[1], other])
    assert [x.text for x in paper.sentences][:2] == [same[0], same[1]]
    # (s, s) is used by the first sentence, so the second must move on
    novel = run(10, [same[1], other])
    assert [x.text for x in novel.sentences][:2] == [same[0], other]
    assert novel.sentences[1].rejected["repeat"] == 1 and novel.sentences[1].candidates == 2
    # patience reached at the second candidate: a repeat is accepted there
    patient = run(2, [same[1], same[2]])
    assert patient.sentences[1].text == same[2] and patient.sentences[1].rejected["repeat"] == 1


def test_text_ended_by_the_model_is_kept_and_an_empty_one_is_an_error(hash_encoder):
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    prompt = "A prompt sentence."
    good = _valid_after(scheme, int(scheme.regions([prompt])[0][0]), True)

    def run(script):
        sampler = ScriptedEngine(script)
        wm = _watermarker(
            scheme,
            sampler,
            max_candidates=4,
            candidate_batch=2,
            adaptive_batch=False,
            max_new_tokens=100,
            novelty_patience=0,
        )
        return wm.generate([prompt])[0]

    # One accepted sentence, then only empty candidates until the budget is spent.
    ended = run([[good], ["", ""], ["", ""]])
    assert ended.status == "ok" and ended.text == good and ended.num_sentences == 1
    assert ended.ended_by_model and ended.to_record()["ended_by_model"] is True
    assert summarize([ended])["ended_by_model"] == 1
    empty = run([["", ""], ["", ""]])
    assert empty.status == "error" and "no usable sentence" in empty.error
    assert not empty.ended_by_model and "ended_by_model" not in empty.to_record()


def test_margin_patience_drops_the_margin_after_that_many_candidates(hash_encoder):
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 10.0  # no candidate is ever far enough from a border
    table = torch.ones(8, 8, dtype=torch.bool)  # every region valid
    prompt = "A prompt sentence."
    cands = [f"Candidate number {i}." for i in range(6)]

    def run(patience):
        wm = _watermarker(
            scheme,
            ScriptedEngine([cands[:2], cands[2:4], cands[4:6]]),
            max_candidates=6,
            candidate_batch=2,
            adaptive_batch=False,
            max_new_tokens=5,
            margin_patience=patience,
            table=table,
        )
        return wm.generate([prompt])[0].sentences[0]

    paper = run(None)  # the margin holds to N_max: the last draw, as a fallback
    assert paper.fallback and paper.candidates == 6 and paper.text == cands[5]
    assert paper.rejected["margin"] == 6
    patient = run(3)  # draws 1-3 need the margin, draw 4 does not
    assert not patient.fallback and patient.candidates == 4 and patient.text == cands[3]
    assert patient.rejected["margin"] == 3
    with pytest.raises(ValueError, match="margin_patience"):
        _watermarker(scheme, ScriptedEngine([]), margin_patience=-1)


def test_progress_is_reported_after_every_round(hash_encoder):
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    prompt = "A prompt sentence."
    first_prev = int(scheme.regions([prompt])[0][0])
    good = _valid_after(scheme, first_prev, True)
    bad = _valid_after(scheme, first_prev, False)
    sampler = ScriptedEngine([[bad, bad], [bad, good]])
    wm = _watermarker(scheme, sampler, candidate_batch=2, adaptive_batch=False, max_new_tokens=5)
    seen = []
    res = wm.generate([prompt], on_progress=seen.append)[0]
    assert [(p.sentences, p.candidates, p.drawn_for_current) for p in seen] == [
        (0, 2, 2),
        (1, 4, 0),
    ]
    assert seen[-1].texts == [res.text] and seen[-1].tokens == 5 and seen[-1].max_tokens == 5


def test_sentence_time_budget_falls_back_between_rounds(hash_encoder, ten_second_clock):
    scheme, prompt, seed_region = _margin_free(hash_encoder)
    bad = _valid_after(scheme, seed_region, False)
    sampler = ScriptedEngine([[bad, bad]] * 10)
    wm = _watermarker(
        scheme,
        sampler,
        max_candidates=100,
        candidate_batch=2,
        adaptive_batch=False,
        max_new_tokens=5,
        sentence_time_budget=15.0,
    )
    res = wm.generate([prompt])[0]
    record = res.sentences[0]
    # Started at 0; after round 1 the clock reads 10 (< 15), after round 2 it reads 20: the
    # second round's last candidate is kept, long before 100 draws.
    assert record.fallback and record.timed_out and record.candidates == 4
    assert len(sampler.rounds) == 2
    untimed = _watermarker(
        scheme,
        ScriptedEngine([[bad, bad]] * 2),
        max_candidates=4,
        candidate_batch=2,
        adaptive_batch=False,
        max_new_tokens=5,
    )
    assert not untimed.generate([prompt])[0].sentences[0].timed_out
    with pytest.raises(ValueError):
        _watermarker(scheme, sampler, sentence_time_budget=0)


# ---------------------------------------------------------------------- kinds of prompt


def _detector(scheme):
    from ksemstamp.detector import Detector

    return Detector(scheme)


def test_a_prompt_ending_mid_sentence_is_completed_then_seeds(hash_encoder):
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    prompt = "The storm hit the coast. The council met on"
    straddling = "The council met on Monday."
    seed = int(scheme.regions([straddling])[0][0])
    good, bad = _valid_after(scheme, seed, True), _valid_after(scheme, seed, False)
    # A draw that does not continue the open sentence is refused; the next one completes it.
    sampler = ScriptedEngine([["Something else."], [straddling], [bad, good]])
    wm = _watermarker(scheme, sampler, candidate_batch=2, adaptive_batch=False, max_new_tokens=9)
    res = wm.generate([prompt])[0]
    assert res.status == "ok", res.error
    assert res.completion == " Monday." and res.text == " Monday. " + good
    assert (prompt + res.text).startswith(prompt + " Monday. ")
    assert [s.text for s in res.sentences] == [good] and res.sentences[0].candidates == 2
    assert res.num_tokens == 10 and res.to_record()["completion"] == " Monday."
    # one unwatermarked row per completion draw; the head is the open sentence, after its context
    assert sampler.rounds == [[1], [1], [2]]
    assert sampler.calls[0]["heads"] == [" The council met on"]
    assert sampler.calls[0]["last_units"] == ["The storm hit the coast."]
    assert sampler.calls[2]["heads"] == [""] and sampler.calls[2]["last_units"] == [straddling]
    # detection with the prompt cuts the same sentences: the straddling one seeds
    found = _detector(scheme).detect(res.text, prompt)
    assert found.seed_sentence == straddling and found.seed_region == seed
    assert found.completion == " Monday." and found.to_record()["completion"] == " Monday."
    assert found.sentences == [good] and found.verdicts == ["valid"]


def test_a_completion_that_never_comes_is_an_error(hash_encoder):
    scheme = _scheme(hash_encoder)
    sampler = ScriptedEngine([["Other words."], ["More words."]])
    wm = _watermarker(scheme, sampler, max_candidates=2, max_new_tokens=9)
    res = wm.generate(["The council met on"])[0]
    assert res.status == "error" and "could not be completed in 2 draws" in res.error
    assert res.completion is None and res.text == ""


def test_an_empty_prompt_is_seeded_by_the_keyed_start_value(hash_encoder):
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    start = scheme.start_region
    good, bad = _valid_after(scheme, start, True), _valid_after(scheme, start, False)
    for prompt in ("", "  \n "):
        sampler = ScriptedEngine([[bad, good]])
        wm = _watermarker(
            scheme, sampler, candidate_batch=2, adaptive_batch=False, max_new_tokens=5
        )
        res = wm.generate([prompt])[0]
        assert res.status == "ok" and res.text == good and res.completion is None
        assert res.sentences[0].rejected["region"] == 1 and res.prompt_for_detection == prompt
        assert sampler.calls[0]["last_units"] == [""]
    # no prompt sentence seeds the answer: detection scores from its second sentence on
    assert _detector(scheme).detect(good + " " + bad, "").verdicts[0] == "seed"


def test_the_start_value_is_keyed(hash_encoder):
    from ksemstamp.scheme.keyed import start_region

    starts = {start_region(64, f"key {i}") for i in range(40)}
    assert len(starts) > 20  # spread over the regions, not one fixed value
    assert start_region(64, "k") == start_region(64, "k")  # a function of the key alone
    assert start_region(8, None, "paper") == start_region(8, None, "paper")
    with pytest.raises(ValueError, match="needs a key"):
        start_region(8, None)


def test_chat_needs_a_chat_template(hash_encoder):
    with pytest.raises(ValueError, match="no chat template"):
        _watermarker(_scheme(hash_encoder), ScriptedEngine([]), chat=True)


def test_bad_prompts_cost_nothing(hash_encoder):
    sampler = ScriptedEngine([])
    wm = _watermarker(_scheme(hash_encoder), sampler, max_prompt_chars=50)
    binary = bytes(range(40)).decode("latin-1")  # control characters, as binary files hold
    results = wm.generate([5, "x" * 51, binary])
    assert [r.status for r in results] == ["error"] * 3
    assert "must be a string" in results[0].error
    assert "51 characters; the limit is 50" in results[1].error
    assert "not text" in results[2].error
    assert sampler.rounds == []  # nothing was sampled


def test_a_lone_surrogate_in_a_prompt_is_dropped_not_raised_on(hash_encoder):
    # JSON's "\ud800" gives a string no tokenizer can read; the prompt is cleaned instead.
    scheme = _scheme(hash_encoder)
    scheme.partition.margin = 0.0
    prompt = "The storm hit\ud800 the coast."
    seed = int(scheme.regions(["The storm hit the coast."])[0][0])
    good = _valid_after(scheme, seed, True)
    sampler = ScriptedEngine([[good]])
    wm = _watermarker(scheme, sampler, candidate_batch=1, adaptive_batch=False, max_new_tokens=5)
    res = wm.generate([prompt])[0]
    assert res.status == "ok" and res.text == good
    assert sampler.calls[0]["last_units"] == ["The storm hit the coast."]
    assert "\ud800" not in res.prompt_for_detection


class DrawingEngine(ScriptedEngine):
    """Each document's one candidate a round is a sentence numbered by its own generator."""

    def __init__(self):
        super().__init__([])

    def open(self, request):
        for g in range(len(request.prefixes)):
            number = int(torch.randint(0, 10**9, (1,), generator=request.generator_of(g)))
            self.script.append([f"Sentence {number} here."])
        return super().open(request)


def test_sampling_is_fresh_each_call_unless_a_seed_is_set(hash_encoder):
    prompt = "The council met on Monday. It approved the budget."

    def generate(seed, prompts=(prompt, prompt)):
        wm = _watermarker(_scheme(hash_encoder), DrawingEngine(), max_new_tokens=10, seed=seed)
        return wm.generate(list(prompts), watermark=False)

    # By default two users, or two clicks, asking the same prompt get different texts...
    assert SamplingSettings().seed is None
    first, second = generate(None), generate(None)
    texts = [r.text for r in first + second]
    assert len(set(texts)) == 4
    # ...and each record says the seed it drew, which gives that text again.
    seeds = [r.seed for r in first]
    assert all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
    assert first[0].to_record()["seed"] == seeds[0]
    assert generate(seeds[0], [prompt])[0].text == first[0].text
    # A seed set makes every call the same, and then no record carries one.
    fixed = generate(7)
    assert [r.text for r in fixed] == [r.text for r in generate(7)]
    assert fixed[0].text == fixed[1].text and "seed" not in fixed[0].to_record()


def _clause_watermarker(hash_encoder, script, max_new_tokens=10, max_sentence_tokens=64):
    scheme = WatermarkScheme(
        hash_encoder, LSHPartition(32, bits=3), "k", get_splitter("clauses", 3), PAPER_RULE
    )
    sampler = ScriptedEngine([[text] for text in script])  # 5 tokens a candidate
    sampling = SamplingSettings(
        max_new_tokens=max_new_tokens, max_sentence_tokens=max_sentence_tokens, seed=0
    )
    return Watermarker(scheme, sampler, SearchSettings(max_candidates=4), sampling), sampler


def test_a_text_finishes_the_sentence_its_budget_falls_in(hash_encoder):
    script = [
        "The storm hit the coast,",
        "and thousands lost power,",  # the budget (10 tokens) falls here, inside a sentence
        "while the roads stayed closed.",  # past it: the sentence is finished
        "A new sentence never starts.",
    ]
    wm, sampler = _clause_watermarker(hash_encoder, script)
    res = wm.generate(["A prompt sentence."], watermark=False)[0]
    assert res.text.endswith("while the roads stayed closed.") and res.num_sentences == 3
    assert res.num_tokens == 15 and not res.ended_inside_sentence
    assert sampler.script == [["A new sentence never starts."]]
    # A text whose budget falls at a sentence's end is as it was: no overrun.
    wm, _ = _clause_watermarker(hash_encoder, ["The storm hit the coast.", "Power was cut."])
    assert wm.generate(["A prompt sentence."], watermark=False)[0].num_tokens == 10


def test_the_overrun_past_the_budget_is_bounded(hash_encoder):
    script = [f"and then clause number {i}," for i in range(10)]
    wm, _ = _clause_watermarker(hash_encoder, script, max_new_tokens=10, max_sentence_tokens=8)
    res = wm.generate(["A prompt sentence."], watermark=False)[0]
    # 10 tokens reached inside a sentence; more clauses while fewer than 8 tokens over
    assert res.num_tokens == 20 and res.ended_inside_sentence
    assert res.to_record()["ended_inside_sentence"] is True
