"""A new mark plugs into the sentence loop through ``marks.Mark`` alone, without a real LM."""

import ast
from pathlib import Path

import pytest
import torch
from test_watermarker import ScriptedSampler

from ksemstamp.marks import DirectionMark, Mark, RegionMark, make_mark
from ksemstamp.results import Judgement
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import DirectionSettings, RegionSettings, SamplingSettings, SearchSettings
from ksemstamp.text.splitter import get_splitter
from ksemstamp.watermarker import Watermarker

ROOT = Path(__file__).resolve().parents[1]


class FirstCoordinate(Mark):
    """A toy mark: a sentence's score is its embedding's first coordinate. With ``bar`` it
    accepts the first candidate above it (ordered first-valid); without, it ranks (best of
    the budget)."""

    name = "first-coordinate"

    def __init__(self, scheme, bar=None):
        super().__init__(scheme)
        self.bar = bar
        self.judged = 0

    @property
    def turns_down(self):
        return self.bar is not None

    def prior(self, previous):
        return 0.5

    def judge(self, drawn):
        self.judged += len(drawn.rows)
        out = []
        for r, score in zip(drawn.regions.tolist(), drawn.emb[:, 0].tolist(), strict=True):
            ok = self.bar is not None and score > self.bar
            out.append((ok, Judgement(int(r), ok, True, True, float(score))))
        return out

    def test(self, plan, statistic, alpha, scan):
        raise NotImplementedError("a toy mark for generation only")


def _scheme(hash_encoder):
    return WatermarkScheme(
        hash_encoder, LSHPartition(32, bits=3), "k", get_splitter(), RegionSettings()
    )


def _first(scheme, texts):
    return scheme.embed(texts)[:, 0].tolist()


TEXTS = [f"Candidate number {i} is here." for i in range(6)]


def test_a_ranking_mark_keeps_the_best_of_the_budget(hash_encoder):
    scheme = _scheme(hash_encoder)
    mark = FirstCoordinate(scheme)
    sampler = ScriptedSampler([TEXTS[:3], TEXTS[3:]])
    wm = Watermarker(
        scheme,
        sampler,
        SearchSettings(max_candidates=6, candidate_batch=3, adaptive_batch=False),
        SamplingSettings(max_new_tokens=5),
        mark=mark,
        max_sentences=1,
    )
    res = wm.generate(["A prompt sentence."])[0]
    scores = _first(scheme, TEXTS)
    best = max(range(6), key=scores.__getitem__)
    record = res.sentences[0]
    assert res.status == "ok" and record.text == TEXTS[best]
    assert record.candidates == 6 and not record.fallback and record.rejected_region == 0
    assert record.score == pytest.approx(scores[best])
    assert mark.judged == 6 and sampler.rounds == [[3], [3]]


def test_a_first_valid_mark_keeps_the_first_accepted(hash_encoder):
    scheme = _scheme(hash_encoder)
    scores = _first(scheme, TEXTS)
    bar = sorted(scores)[-2] - 1e-6  # exactly two candidates pass
    first = next(i for i, s in enumerate(scores) if s > bar)
    sampler = ScriptedSampler([TEXTS])
    wm = Watermarker(
        scheme,
        sampler,
        SearchSettings(candidate_batch=6, adaptive_batch=False),
        SamplingSettings(max_new_tokens=5),
        mark=FirstCoordinate(scheme, bar),
        max_sentences=1,
    )
    record = wm.generate(["A prompt sentence."])[0].sentences[0]
    assert record.text == TEXTS[first] and record.candidates == first + 1
    assert record.rejected_region == first and not record.fallback


def test_the_scheme_names_its_mark(hash_encoder):
    scheme = _scheme(hash_encoder)
    patient = make_mark(scheme, settings=RegionSettings(novelty_patience=3))
    assert isinstance(patient, RegionMark) and patient.novelty_patience == 3
    assert isinstance(Watermarker(scheme, None).mark, RegionMark)
    with pytest.raises(ValueError, match="novelty_patience"):
        RegionSettings(novelty_patience=-1)
    hard = DirectionSettings(context_temperature=0.0)  # an LSH partition has no centroids
    direction = WatermarkScheme(hash_encoder, LSHPartition(32, bits=3), "k", get_splitter(), hard)
    with pytest.raises(ValueError, match="the scheme's mark is direction"):
        make_mark(direction, settings=RegionSettings())
    mark = make_mark(direction, settings=DirectionSettings(threshold=0.5))
    assert isinstance(mark, DirectionMark) and mark.turns_down
    assert not make_mark(direction).turns_down
    assert mark.start_context().shape == (direction.num_regions,)
    assert torch.isclose(torch.tensor(mark.prior(0)), torch.tensor(0.3085375), atol=1e-6)


def test_the_loop_never_branches_on_the_mark():
    for name in ("watermarker.py", "generation/documents.py"):
        tree = ast.parse((ROOT / "src" / "ksemstamp" / name).read_text())
        reads = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr == "mark"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "scheme"
        ]
        assert not reads, f"{name} reads scheme.mark"
