"""A new mark is one settings class and one ``Mark``: this file defines a third, toy mark and
runs generation, detection, calibration under two keys and the web page's detection view with
it, through the product's own code (stand-in encoder and scripted sampler, no real model)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import pytest
import torch
from conftest import HashEncoder
from fastapi.testclient import TestClient
from test_watermarker import ScriptedEngine

from ksemstamp.detection.stats import log_normal_sf, reported_p
from ksemstamp.marks import Mark, build_mark
from ksemstamp.marks.base import plan_result
from ksemstamp.results import Judgement, too_short
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.keyed import keyed_directions
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import (
    DirectionSearch,
    RegionSearch,
    RegionSettings,
    SamplingSettings,
    SearchSettings,
    WatermarkSettings,
)
from ksemstamp.settings.groups import MARK_KINDS, register_mark
from ksemstamp.text.splitter import get_splitter
from ksemstamp.watermarker import Watermarker

# ---------------------------------------------------------------------- a third mark


class OneDirection(Mark):
    """The toy mark: the key draws one Gaussian direction ``u``; a unit scores ``u . e`` (its
    unit embedding's projection), and a text's ``z = sum_t u . e_t / |sum_t e_t|`` is exactly
    standard normal over keys. Generation keeps the best of its candidates."""

    kind = "one-direction"

    def configure(self, key, search, steering):
        self.direction = self.material(key)

    def material(self, key):
        dim = int(self.scheme.encoder.get_embedding_dimension())
        return keyed_directions(1, dim, key).double().numpy()[0]

    @property
    def own_material(self):
        return self.direction

    @property
    def rejects_candidates(self):
        return False

    def prior(self, previous):
        return 0.0

    def judge(self, drawn):
        scores = drawn.emb.double().numpy() @ self.direction
        return [
            (False, Judgement(int(r), True, True, float(s)))
            for r, s in zip(drawn.regions.tolist(), scores, strict=True)
        ]

    def annotate(self, plans, emb, regions):
        row = 0
        for plan in plans:
            row += plan.seed_sentence is not None
            plan.data = emb[row : row + len(plan.sentences)].double().numpy()
            row += len(plan.sentences)

    def evidence(self, plans, scan=False):
        return [
            plan.data[[t for t, s in enumerate(plan.scored) if s]].sum(axis=0) for plan in plans
        ]

    def p_values(self, batch, materials, rng=None):
        sums = np.stack(batch)
        out = []
        for u in materials:
            z = sums @ u / np.linalg.norm(sums, axis=1)
            p = np.array([reported_p(log_normal_sf(float(x)))[0] for x in z])
            out.append({"z": z, "exact": p} | ({"exact_randomised": p} if rng is not None else {}))
        return out

    def test_batch(self, plans, statistic, alpha, scan):
        results = []
        for plan in plans:
            scored = [t for t, s in enumerate(plan.scored) if s]
            scores = [None] * len(plan.sentences)
            for t in scored:
                scores[t] = float(plan.data[t] @ self.direction)
            verdicts = [
                ("valid" if scores[t] > 0 else "invalid") if scores[t] is not None else role
                for t, role in enumerate(plan.roles)
            ]
            result = plan_result(plan, statistic, verdicts, len(scored), scores)
            if not scored:
                results.append(too_short(result))
                continue
            ((z,), _) = (lambda d: (d["z"], d["exact"]))(
                self.p_values(self.evidence([plan]), [self.direction])[0]
            )
            result.z_score = float(z)
            # An exact p-value is never 0: below the floor, the floor and its log10.
            result.p_value, result.log10_p_value = reported_p(log_normal_sf(float(z)))
            result.watermarked = result.p_value <= alpha
            results.append(result)
        return results

    def describe(self, scan=False):
        return {
            "kind": self.kind,
            "short": "one-direction mark",
            "keys": "keys (one keyed direction)",
            "drawn": "keyed directions",
            "counted": "positive",
            "z": "exact",
            "summary": "Mark: one keyed direction for every unit",
            "statistic": {"exact": "normal tail of the summed projections' exact z"},
            "first": "prompt; every sentence is scored on its own.",
            "uniformity": ["gets over random keys."],
            "fallbacks": "{n} fallbacks",
            "settings": {},
        }

    def view(self, result, alpha, unit):
        return {
            "expected": 0.5 * result.num_scored,
            "expected_label": "half",
            "counted": "positive / scored",
            "z_label": "exact",
            "previous": False,
            "null": {"kind": "normal", "z": result.z_score, "tail": result.p_value},
            "explanation": f"p = {result.p_value:.3g} over random keys.",
        }


@dataclass(frozen=True)
class OneDirectionSettings:
    """``mark: {kind: one-direction}``: the toy mark's settings (it has none of its own)."""

    kind: Literal["one-direction"] = field(default="one-direction", init=False)
    mark: ClassVar[Any] = OneDirection
    keyed: ClassVar[bool] = True
    search: ClassVar[type] = SearchSettings
    options: ClassVar[tuple[str, ...]] = ()
    statistics: ClassVar[tuple[str, ...]] = ("exact",)
    scores_first: ClassVar[bool] = True

    def partition_margin(self, search):
        return 0.0

    def domain_needs(self):
        return {}

    def splitting(self):
        return "sentences", 4

    def without_centroids(self):
        return self

    def units_needed(self, detection):
        return 1, 3

    def identity(self):
        return dataclasses.asdict(self)


@pytest.fixture
def toy_kind():
    register_mark(OneDirectionSettings)
    yield OneDirectionSettings
    MARK_KINDS.pop("one-direction")


KEY = "toy-mark-test-key-5d2c8e"
POOL = [f"Candidate number {i} is here." for i in range(48)]


def _settings():
    return WatermarkSettings.from_dict(
        {"mark": {"kind": "one-direction"}, "partition": {"kind": "lsh"}, "key": KEY}
    )


def test_a_third_mark_generates_detects_calibrates_and_shows_without_product_change(
    toy_kind, tmp_path
):
    from ksemstamp.builders import build_detector, build_scheme
    from ksemstamp.calibration import CalibrationSettings, render_report, run_calibration
    from ksemstamp.cli.console import format_detection
    from ksemstamp.serve import create_app

    settings = _settings()
    encoder = HashEncoder(dim=64)
    scheme = build_scheme(settings, encoder=encoder)
    assert isinstance(build_mark(scheme), OneDirection)
    # generation: the product's sentence loop keeps the best of each round
    sampler = ScriptedEngine([POOL[i : i + 8] for i in range(0, 48, 8)])
    watermarker = Watermarker(
        scheme,
        sampler,
        SearchSettings(max_candidates=8, candidate_batch=8),
        SamplingSettings(max_new_tokens=30),
    )
    res = watermarker.generate(["A prompt sentence."])[0]
    assert res.status == "ok" and res.num_sentences == 6
    assert all(s.score > 0 for s in res.sentences)
    # detection: exact z, watermarked under the key, not under another
    detector = build_detector(settings, scheme)
    found = detector.detect(res.text, "A prompt sentence.")
    assert found.status == "ok" and found.num_scored == 6 and found.watermarked
    assert found.z_score > 2 and all(v == "valid" for v in found.verdicts)
    other = build_detector(
        dataclasses.replace(settings, key=KEY + "-other"), scheme=None, encoder=encoder
    )
    assert not other.detect(res.text, "A prompt sentence.").watermarked
    shown = format_detection(found, detector.mark, "sentence")
    assert "z = " in shown and "(exact)" in shown and "positive 6" in shown
    # calibration under two keys, through the mark's own statistic
    result = run_calibration(
        scheme,
        CalibrationSettings(max_texts=30, num_keys=2, simulated_per_key=20),
        {"command": "test"},
        progress=False,
    )
    assert result["calibration"]["mark"] == "one-direction"
    assert result["calibration"]["statistics"] == ["exact"]
    assert "power" in result and "simulated" not in result["power"]  # it cannot simulate
    fpr = result["null"]["overall"]["exact"]["fpr"]["0.05"]["mean"]
    assert 0 <= fpr <= 0.3
    assert "one keyed direction" in render_report(result)
    # the web page's detection view
    app = create_app(settings, encoder=encoder, generation=False)
    client = TestClient(app)
    info = client.get("/api/info").json()
    assert info["mark"] == "one-direction" and info["mark_summary"] == "one-direction mark"
    view = client.post("/api/detect", json={"text": res.text, "prompt": "A prompt sentence."})
    body = view.json()
    assert view.status_code == 200 and body["decision"] == "watermarked"
    assert body["counted"] == "positive / scored" and body["null"]["kind"] == "normal"
    assert [s["verdict"] for s in body["sentences"]] == ["valid"] * 6


def test_a_mark_s_settings_are_checked_when_registered():
    @dataclass(frozen=True)
    class Nameless:
        size: int = 1

    with pytest.raises(TypeError, match="kind field"):
        register_mark(Nameless)

    @dataclasses.dataclass(frozen=True)
    class Half:  # a kind, and only some of what a mark's settings must say
        kind: str = dataclasses.field(default="half", init=False)
        mark = search = options = statistics = keyed = identity = None

    with pytest.raises(TypeError) as refused:
        register_mark(Half)
    said = str(refused.value)
    assert said.count("\n") == 0 and "'partition_margin'" in said and "'splitting'" in said
    assert "'units_needed'" in said and "'identity'" not in said


# ---------------------------------------------------------------------- the loop and the marks


class FirstCoordinate(Mark):
    """A toy mark for the loop alone: a unit's score is its embedding's first coordinate.
    With ``bar`` it accepts the first candidate above it (ordered first-valid); without, it
    ranks (best of the budget)."""

    kind = "first-coordinate"
    rejections = ("score",)

    def __init__(self, scheme, bar=None):
        self.bar = bar
        self.judged = 0
        super().__init__(scheme, RegionSettings(), None)

    def configure(self, key, search, steering):
        pass  # no key: the first coordinate is public

    material = own_material = evidence = p_values = test_batch = describe = view = None

    @property
    def rejects_candidates(self):
        return self.bar is not None

    def prior(self, previous):
        return 0.5

    def judge(self, drawn):
        self.judged += len(drawn.rows)
        out = []
        for r, score in zip(drawn.regions.tolist(), drawn.emb[:, 0].tolist(), strict=True):
            ok = self.bar is not None and score > self.bar
            reason = None if ok or self.bar is None else "score"
            out.append((ok, Judgement(int(r), ok, True, float(score), reason=reason)))
        return out


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
    sampler = ScriptedEngine([TEXTS[:3], TEXTS[3:]])
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
    assert record.candidates == 6 and not record.fallback and record.rejected == {"score": 0}
    assert record.score == pytest.approx(scores[best])
    assert mark.judged == 6 and sampler.rounds == [[3], [3]]


def test_a_first_valid_mark_keeps_the_first_accepted(hash_encoder):
    scheme = _scheme(hash_encoder)
    scores = _first(scheme, TEXTS)
    bar = sorted(scores)[-2] - 1e-6  # exactly two candidates pass
    first = next(i for i, s in enumerate(scores) if s > bar)
    sampler = ScriptedEngine([TEXTS])
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
    assert record.rejected == {"score": first} and not record.fallback


def test_the_scheme_s_settings_name_its_mark(hash_encoder):
    from ksemstamp.marks.direction import DirectionMark
    from ksemstamp.marks.region import RegionMark
    from ksemstamp.settings import DirectionSettings

    scheme = _scheme(hash_encoder)
    patient = build_mark(scheme, RegionSearch(novelty_patience=3))
    assert isinstance(patient, RegionMark) and patient.novelty_patience == 3
    assert isinstance(Watermarker(scheme, ScriptedEngine([])).mark, RegionMark)
    with pytest.raises(ValueError, match="novelty_patience"):
        RegionSearch(novelty_patience=-1)
    hard = DirectionSettings(context_temperature=0.0)  # an LSH partition has no centroids
    direction = WatermarkScheme(hash_encoder, LSHPartition(32, bits=3), "k", get_splitter(), hard)
    mark = build_mark(direction, DirectionSearch(threshold=0.5))
    assert isinstance(mark, DirectionMark) and mark.rejects_candidates
    assert not build_mark(direction).rejects_candidates
    region, state = mark.start(mark.new_state())
    assert region == direction.start_region and state.weights.shape == (direction.num_regions,)
    assert math.isclose(mark.prior(0), 0.3085375, abs_tol=1e-6)
    # the key material is the mark's: another key, other directions
    assert not torch.equal(build_mark(direction, key="another").directions, mark.directions)
