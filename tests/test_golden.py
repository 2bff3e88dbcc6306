"""Golden outputs: generation, detection and calibration give the recorded results.

The fixtures under ``tests/golden/`` were recorded with the real offline models, a fixed key and a
fixed seed. A refactoring that changes none of the algorithms must reproduce them; a change that
means to alter the outputs re-records them with ``KSEMSTAMP_RECORD_GOLDEN=1 pytest
tests/test_golden.py`` and says why in its commit.

What is pinned, for the paper's region mark: three short watermarked generations (text, regions,
candidate counts), the detection of 50 texts (the three generations with their prompts, and 47
human news windows) under both statistics, and a two-key calibration on 100 human texts with
simulated and real power. For the default direction mark: two short generations and the
detection of them and of 20 human windows (scores, span and p-values).
Floats are compared to 1e-9 relative (they come from the same arithmetic; the tolerance only
absorbs printing), everything else exactly; the default mark's floats to 1e-4 relative or 5e-6
absolute, because its float32 projections come out a few units in the sixth digit apart on
CPUs with other vector units (a change to the mark moves them by far more). The tests run
torch on one thread: float32 sums split over another number of threads differ in their last
bits, and a test run before these may have changed torch's thread count.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from ksemstamp.builders import build_detector, build_scheme, build_watermarker
from ksemstamp.detector import Detector
from ksemstamp.settings import PAPER_CENTROIDS, WatermarkSettings

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).parent / "golden"
RECORD = os.environ.get("KSEMSTAMP_RECORD_GOLDEN", "") not in ("", "0")
VARIANT = os.environ.get("KSEMSTAMP_RECORD_GOLDEN", "") if RECORD else ""
VARIANT = "" if VARIANT == "1" else VARIANT
"""``KSEMSTAMP_RECORD_GOLDEN=1`` re-records the fixtures; ``=NAME`` records a variant beside
them (``generate.NAME.json``). The region mark's short generations sample fp32 logits, whose
last bits differ between CPU families (their vector units sum in other orders): one token in
about two thousand can come out otherwise, and the text goes on from there. The second
prompt's fallback sentence does so ('... man to death, Lt.' on Intel Xeon, '... woman to
death.' on AMD EPYC), so both machines' outputs are recorded (``*.intel.json``); code that
changes no algorithm reproduces one of them exactly."""
KEY = "golden-key"
NUM_PROMPTS = 3
NUM_DETECT = 50
VOLATILE = {"seconds", "command"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _clean(value):
    """Drop run-time fields and turn tuples into lists, as JSON would."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


UNPINNED_WHEN_NULL = frozenset({"decoded_tokens"})
"""Counts a fixture may leave unpinned (null): decoded tokens are counted once for every engine
(one more per pruned or truncated row before), and the Intel fixtures' two texts that differ
from the AMD ones could not be recounted on an AMD machine; re-recording on an Intel CPU pins
them again."""


def _assert_same(
    actual, expected, where: str = "$", rel: float = 1e-9, abs_: float = 1e-12
) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert sorted(actual) == sorted(expected), f"{where}: keys differ"
        for key in expected:
            if key in UNPINNED_WHEN_NULL and expected[key] is None:
                continue
            _assert_same(actual[key], expected[key], f"{where}.{key}", rel, abs_)
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: length"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_same(a, e, f"{where}[{i}]", rel, abs_)
    elif isinstance(expected, float) and not isinstance(actual, bool):
        if math.isnan(expected):
            assert isinstance(actual, float) and math.isnan(actual), where
        else:
            assert actual == pytest.approx(expected, rel=rel, abs=abs_), where
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def golden_text(value) -> str:
    """``value`` as a fixture file: each entry of a top-level list (or value of a top-level
    mapping) compact on a line of its own, so a re-record's diff shows which entries moved."""

    def compact(v) -> str:
        return json.dumps(v, sort_keys=True, separators=(",", ":"))

    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(compact(v) for v in value) + "\n]\n"
    if not isinstance(value, dict):
        return compact(value) + "\n"
    parts = []
    for key in sorted(value):
        inner = value[key]
        if isinstance(inner, list):
            body = ",\n".join(compact(v) for v in inner)
            parts.append(f"{json.dumps(key)}: [\n{body}\n]")
        else:
            parts.append(f"{json.dumps(key)}: {compact(inner)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def test_a_fixture_file_reads_back_as_what_was_recorded():
    value = {"b": [{"x": 1.5, "y": [1, 2]}, {"x": None}], "a": {"k": "v"}, "c": []}
    assert json.loads(golden_text(value)) == value
    lines = golden_text(value).splitlines()
    assert '{"x":1.5,"y":[1,2]},' in lines and '{"x":null}' in lines
    assert json.loads(golden_text([1, 2])) == [1, 2]
    assert golden_text([{"x": 1}, None]).splitlines() == ["[", '{"x":1},', "null", "]"]
    assert json.loads(golden_text([])) == []


def _check(name: str, actual, rel: float = 1e-9, abs_: float = 1e-12) -> None:
    """``actual`` equals the fixture ``name.json`` or one of its recorded variants
    (``name.VARIANT.json``, see ``VARIANT``)."""
    actual = json.loads(json.dumps(_clean(actual)))
    path = GOLDEN / (f"{name}.json" if not VARIANT else f"{name}.{VARIANT}.json")
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(golden_text(actual))
    recorded = [GOLDEN / f"{name}.json", *sorted(GOLDEN.glob(f"{name}.*.json"))]
    misses = []
    for fixture in recorded:
        try:
            _assert_same(actual, json.loads(fixture.read_text()), name, rel, abs_)
            return
        except AssertionError as miss:
            misses.append(f"{fixture.name}: {miss}")
    raise AssertionError("matches no recorded output:\n" + "\n".join(misses))


@pytest.fixture(scope="module")
def cfg():
    # Every setting that shapes the outputs is named, so a change of the defaults does not
    # move the pinned outputs (they were recorded with the K = 8 centroids).
    return WatermarkSettings.from_dict(
        {
            "key": KEY,
            "model": {"lm_dtype": "fp32"},
            "partition": {"centroids": str(PAPER_CENTROIDS)},
            "mark": {"kind": "region"},
            "search": {"max_candidates": 12, "margin_patience": None, "novelty_patience": 10},
            "sampling": {"max_new_tokens": 40, "seed": 7},
        }
    )


@pytest.fixture(scope="module")
def scheme(cfg, encoder):
    return build_scheme(cfg, encoder=encoder)


def _prompts() -> list[str]:
    from ksemstamp.text.corpora import news_prompt

    return [news_prompt(i) for i in range(NUM_PROMPTS)]


def _human_windows(splitter, count: int) -> list[str]:
    from ksemstamp.calibration import human_texts

    texts, _ = human_texts(splitter, ("news",), max_texts=count, seed=3)
    return [t.text for t in texts]


@pytest.fixture(scope="module")
def generations(cfg, scheme, lm):
    prompts = _prompts()
    results = build_watermarker(cfg, scheme, lm=lm).generate(prompts)
    return prompts, [r.to_record() for r in results]


def test_generation_is_unchanged(generations):
    prompts, records = generations
    _check("generate", {"prompts": prompts, "records": records})


def test_detection_is_unchanged(cfg, scheme, generations):
    prompts, records = generations
    human = _human_windows(scheme.splitter, NUM_DETECT - NUM_PROMPTS)
    texts = [r["text"] for r in records] + human
    with_prompts = prompts + [None] * len(human)
    out = {"texts": texts}
    for statistic in ("exact", "paper"):
        detector = Detector(scheme, statistic=statistic, alpha=cfg.detection.alpha)
        out[statistic] = [r.to_record() for r in detector.detect_batch(texts, with_prompts)]
    # The same texts through the configured detector, one by one.
    one = build_detector(cfg, scheme)
    pairs = zip(texts[:5], with_prompts[:5], strict=True)
    out["single"] = [one.detect(t, p).to_record() for t, p in pairs]
    _check("detect", out)


def test_calibration_is_unchanged(scheme, generations, tmp_path):
    from ksemstamp.calibration import CalibrationSettings, render_report, run_calibration

    prompts, records = generations
    fingerprint = scheme.key_fingerprint
    generated = tmp_path / "generated.jsonl"
    generated.write_text(
        "".join(
            json.dumps({"id": i, "prompt": p, **r, "key_fingerprint": fingerprint}) + "\n"
            for i, (p, r) in enumerate(zip(prompts, records, strict=True))
        )
    )
    settings = CalibrationSettings(
        max_texts=100,
        num_keys=2,
        simulated_per_key=20,
        watermarked=(str(generated),),
        reuse_embeddings=False,
    )
    result = run_calibration(scheme, settings, progress=False)
    power = result["power"]
    for name in [n for n in power if n.startswith("generated")]:
        power[name]["file"] = Path(power[name]["file"]).name
    result["seconds"] = 0.0
    report = render_report(result)
    _check("calibrate", {"result": result, "report": report})


@pytest.fixture(scope="module")
def default_cfg():
    # The default mark, with the settings that shape outputs named where a test needs them
    # small; the rest are the defaults (context, temperature, components, scan, pruning).
    # Unsteered, and every candidate ranked (``fluent_share: 1``): these texts were recorded on
    # two CPU families before either changed the default, and a re-recorded text would be one
    # CPU family's only. Steering's arithmetic is pinned by tests/test_steering.py; the fluency
    # rule by test_direction (which candidates it keeps) and test_batched_engine (each
    # candidate's log-probability against a forward pass).
    return WatermarkSettings.from_dict(
        {
            "key": KEY,
            "model": {"lm_dtype": "fp32"},
            "sampling": {"max_new_tokens": 40, "seed": 7},
            "search": {"steer": 0.0, "fluent_share": 1.0},
        }
    )


def test_default_mark_is_unchanged(default_cfg, encoder, lm):
    scheme = build_scheme(default_cfg, encoder=encoder)
    prompts = _prompts()[:2]
    records = [
        r.to_record() for r in build_watermarker(default_cfg, scheme, lm=lm).generate(prompts)
    ]
    human = _human_windows(scheme.splitter, 20)
    texts = [r["text"] for r in records] + human
    detected = build_detector(default_cfg, scheme).detect_batch(texts, prompts + [None] * 20)
    _check(
        "default",
        {"prompts": prompts, "records": records, "detect": [r.to_record() for r in detected]},
        rel=1e-4,
        abs_=5e-6,
    )
