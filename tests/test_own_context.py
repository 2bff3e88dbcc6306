"""The direction mark scored on each sentence's own context, with whitened vectors and windowed
detection (stand-in encoder and scripted sampler, no real model)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_watermarker import ScriptedEngine, _watermarker

from ksemstamp.detection.stats import direction_z, normal_sf
from ksemstamp.detector import Detector
from ksemstamp.marks import build_mark
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.partition import KMeansPartition
from ksemstamp.settings import DirectionSettings, RegionSettings
from ksemstamp.text.splitter import get_splitter

PROMPT = "A prompt sentence."


def _scheme(hash_encoder, key="k", context="own", components=None, temperature=0.1):
    centroids = torch.nn.functional.normalize(
        torch.randn(8, 32, generator=torch.Generator().manual_seed(0)), dim=-1
    )
    mark = DirectionSettings(context=context, context_temperature=temperature)
    partition = KMeansPartition(centroids, margin=0.0)
    return WatermarkScheme(
        hash_encoder, partition, key, get_splitter(), mark, components=components
    )


def _pool(n: int) -> list[str]:
    return [f"Sentence number {i} is about thing {i % 7}." for i in range(n)]


def _best(scheme: WatermarkScheme, pool: list[str], count: int) -> list[str]:
    """The ``count`` pool sentences that score best on their own contexts."""
    emb = scheme.embed(pool)
    scores = build_mark(scheme).scores(
        build_mark(scheme).vectors(emb), build_mark(scheme).context_weights(emb)
    )
    return [pool[i] for i in scores.argsort(descending=True)[:count].tolist()]


def test_own_context_is_the_direction_marks(hash_encoder):
    # The region mark has no context of its own to choose: its valid set follows the
    # previous sentence's region.
    region = WatermarkScheme(
        hash_encoder, KMeansPartition(torch.eye(4, 32), 0.0), "k", get_splitter(), RegionSettings()
    )
    assert not build_mark(region).scores_first  # each sentence after the one before it
    with pytest.raises(TypeError):
        RegionSettings(context="own")
    with pytest.raises(ValueError, match="context must be one of"):
        _scheme(hash_encoder, context="next")


def test_whitened_vectors_have_no_part_along_the_components(hash_encoder):
    components = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    scheme = _scheme(hash_encoder, components=components)
    vectors = build_mark(scheme).vectors(scheme.embed(_pool(20)))
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(20), atol=1e-5)
    assert (vectors @ components.T).abs().max() < 1e-5
    plain = build_mark(_scheme(hash_encoder)).vectors(scheme.embed(_pool(20)))
    assert not torch.allclose(vectors, plain)


def test_every_sentence_is_scored_on_its_own_context_in_any_order(hash_encoder):
    scheme = _scheme(hash_encoder)
    marked = _best(scheme, _pool(80), 8)
    detector = Detector(scheme, scan=False)
    result = detector.detect(" ".join(marked))
    # no prompt needed: the first sentence is scored too
    assert result.num_scored == 8 and result.watermarked and result.p_value < 1e-4
    emb = scheme.embed(result.sentences)
    z = direction_z(
        build_mark(scheme).vectors(emb).double().numpy(),
        build_mark(scheme).context_weights(emb).numpy(),
        build_mark(scheme).directions.double().numpy(),
    )
    assert result.z_score == pytest.approx(z, rel=1e-6)
    shuffled = marked[:]
    random.Random(0).shuffle(shuffled)
    for text, prompt in ((" ".join(shuffled), None), (" ".join(marked), PROMPT)):
        again = detector.detect(text, prompt=prompt)
        # The same sentences embedded in another order: float32 products may round apart in
        # their last bits (about 1e-9 of z here), never more.
        assert again.z_score == pytest.approx(result.z_score, rel=1e-6)
    # the previous-sentence context scores the same text on other directions
    previous = Detector(_scheme(hash_encoder, context="previous"), scan=False).detect(
        " ".join(marked)
    )
    assert previous.num_scored == 7 and previous.z_score != pytest.approx(result.z_score)


def test_generation_keeps_the_candidate_that_scores_best_on_its_own_context(hash_encoder):
    scheme = _scheme(hash_encoder)
    pool = _pool(60)
    rounds = [pool[i : i + 6] for i in range(0, 48, 6)]
    wm = _watermarker(
        scheme,
        ScriptedEngine(rounds),
        max_candidates=6,
        candidate_batch=6,
        adaptive_batch=False,
        max_new_tokens=40,
        threshold=None,
        selection="sentence",
    )
    res = wm.generate([PROMPT])[0]
    assert res.num_sentences >= 5
    for record, options in zip(res.sentences, rounds, strict=False):
        assert record.text == _best(scheme, options, 1)[0]
    result = Detector(scheme, scan=False).detect(res.text)
    kept = [r.score for r in res.sentences]
    assert result.scores == pytest.approx(kept, abs=1e-5) and result.watermarked


def test_windowed_detection_finds_a_marked_passage_among_human_sentences(hash_encoder):
    scheme = _scheme(hash_encoder)
    pool = _pool(200)
    marked = _best(scheme, pool, 8)
    emb = scheme.embed(pool)
    scores = build_mark(scheme).scores(
        build_mark(scheme).vectors(emb), build_mark(scheme).context_weights(emb)
    )
    human = [s for s, v in zip(pool, scores.tolist(), strict=True) if abs(v) < 0.5][:24]
    text = " ".join(human[:12] + marked + human[12:])
    plain = Detector(scheme, scan=False).detect(text)
    windowed = Detector(scheme, scan=True).detect(text)
    tests = windowed.details
    assert plain.details == {} and plain.p_value == pytest.approx(normal_sf(plain.z_score))
    assert tests["span"] == pytest.approx([12, 20], abs=1)
    assert tests["text_p_value"] == pytest.approx(normal_sf(plain.z_score))
    smallest = min(
        tests["text_p_value"],
        tests["span_p_value"],
        tests["mixture_p_value"],
        tests["weighted_p_value"],
    )
    assert smallest <= windowed.p_value <= 4 * smallest + 1e-12 or windowed.p_value < 0.002
    assert tests["span_p_value"] < tests["text_p_value"] and windowed.watermarked
    record = windowed.to_record()
    assert record["span"] == tests["span"] and "span_p_value" in record
    # the same text detected twice gives the same p-value (the null draws are seeded)
    assert Detector(scheme, scan=True).detect(text).p_value == windowed.p_value


def test_windowed_p_values_are_calibrated_on_text_the_key_did_not_shape(hash_encoder):
    text = " ".join(_pool(14))
    p = np.array(
        [
            Detector(_scheme(hash_encoder, key=f"key {i}"), scan=True).detect(text).p_value
            for i in range(400)
        ]
    )
    # Bonferroni over two valid p-values: at most alpha (plus sampling error over 400 keys)
    for alpha in (0.05, 0.2):
        assert (p <= alpha).mean() <= alpha + 3 * np.sqrt(alpha / 400)
