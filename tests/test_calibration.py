"""The calibration measurement: its pieces on exact cases, then the command on real text."""

import json
import math

import numpy as np
import pytest
import torch

from ksemstamp.calibration import (
    CalibrationSettings,
    human_texts,
    ks_distance,
    p_values,
    score_texts,
    tpr_at_fpr,
)
from ksemstamp.cli import main
from ksemstamp.detection.stats import exact_p_value, normal_sf, paper_z
from ksemstamp.detector import Detector
from ksemstamp.marks import build_mark
from ksemstamp.marks.region_view import simulate_watermarked
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.keyed import valid_table
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import DirectionSettings, RegionSettings
from ksemstamp.text.splitter import get_splitter


def _bound(alpha: float, n: int) -> float:
    # 3.5 standard deviations of a rate over n independent draws each flagged with
    # probability at most alpha: a calibrated test exceeds it with probability ~2e-4.
    return alpha + 3.5 * math.sqrt(alpha * (1 - alpha) / n)


# ---------------------------------------------------------------------- pieces


def test_region_p_values_under_a_key_are_the_exact_law_s_tail():
    # The mark's own statistic, computed once per text and reused for every table, against
    # its definitions: the exact law's tail and the paper's normal tail.
    from ksemstamp.marks.region import Transitions

    scheme = WatermarkScheme(
        __import__("conftest").HashEncoder(),
        LSHPartition(32, bits=3),
        "k",
        get_splitter(),
        RegionSettings(),
    )
    mark = build_mark(scheme)
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.3, size=(40, 8, 8))
    counts[0] = 0
    counts[0, 2, 2] = 5  # a text that never leaves one region
    counts[1] = 0
    counts[1, 3, 4] = 1  # one scored sentence
    from ksemstamp.detection.stats import null_count_pmf

    batch = mark.batch([Transitions(c, null_count_pmf(c, 2)) for c in counts])
    tables = [mark.material(f"calibration|1|{i}") for i in range(5)]
    tested = mark.p_values(batch, tables, np.random.default_rng(0))
    for table, got in zip(tables, tested, strict=True):
        for i, c in enumerate(counts):
            observed = int(c[table.numpy()].sum())
            assert got["exact"][i] == pytest.approx(exact_p_value(c, table), abs=1e-12)
            want = normal_sf(paper_z(observed, int(c.sum()), 0.25))
            assert got["paper"][i] == pytest.approx(want)
            # the randomised p-value lies between P(S > s) and P(S >= s)
            assert got["exact"][i] - batch.pmf[i, observed] - 1e-12 <= got["exact_randomised"][i]
            assert got["exact_randomised"][i] <= got["exact"][i] + 1e-12


@pytest.fixture
def hash_scheme(hash_encoder):
    return WatermarkScheme(
        hash_encoder, LSHPartition(32, bits=3), "k", get_splitter(), RegionSettings()
    )


def test_score_texts_follows_the_detector_rules(hash_scheme):
    # Seeding by the prompt, repeats and too-short texts: the key-free counts scored by the
    # calibration must give the detector's own p-values under the scheme's table.
    sentences = [f"Sentence {i} is about topic {i * 5 % 11}." for i in range(30)]
    texts = [
        " ".join(sentences[:8]),
        " ".join(sentences[5:9] + sentences[5:7] + sentences[10:13]),  # repeats
        sentences[20],  # one sentence: too short without a prompt
        " ".join(sentences[14:19]),
        sentences[25],
    ]
    prompts = [None, None, None, sentences[13], sentences[24]]
    scored = score_texts(hash_scheme, texts, ["t"] * len(texts), prompts)
    assert scored.too_short == {"t": 1} and len(scored) == 4
    table = build_mark(hash_scheme).own_material
    got = p_values(scored, table)
    for statistic in ("exact", "paper"):
        results = Detector(hash_scheme, statistic=statistic).detect_batch(texts, prompts)
        want = [r.p_value for r in results if r.status == "ok"]
        assert got[statistic] == pytest.approx(want)
    assert list(scored.num_scored) == [
        r.num_scored for r in Detector(hash_scheme).detect_batch(texts, prompts) if r.num_scored
    ]


def test_embedding_store_is_reused_by_a_second_run(hash_encoder, tmp_path):
    from ksemstamp.calibration import CachedEncoder

    store = tmp_path / "emb" / "enc.pt"
    first = CachedEncoder(hash_encoder, store=store)
    first.prefill(["A cat sat.", "A dog ran."])
    want = first.encode(["A dog ran."])
    assert store.is_file() and hash_encoder.calls == 1

    second = CachedEncoder(hash_encoder, store=store)  # a later run: nothing to embed
    assert torch.equal(second.encode(["A dog ran."]), want) and hash_encoder.calls == 1
    second.prefill(["A cat sat.", "A bird sang."])  # only the new sentence is embedded
    assert hash_encoder.calls == 2
    assert len(CachedEncoder(hash_encoder, store=store).cache) == 3


def test_embedding_store_names_the_encoder_weights(monkeypatch, tmp_path):
    from ksemstamp.calibration import embedding_store

    monkeypatch.setenv("KSEMSTAMP_CACHE", str(tmp_path))
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert embedding_store(a).parent == tmp_path / "embeddings"
    assert embedding_store(a) == embedding_store(a) != embedding_store(b)
    assert embedding_store(object()) is None  # a stand-in encoder is not cached on disk


def test_ks_distance_and_tpr_at_fpr():
    grid = (np.arange(1000) + 0.5) / 1000
    ks, excess = ks_distance(grid)
    assert ks == pytest.approx(0.0005) and excess == pytest.approx(0.0005)
    ks, excess = ks_distance(np.ones(50))  # maximally conservative: never too many small p
    assert ks == pytest.approx(1.0) and excess == 0.0
    ks, excess = ks_distance(np.zeros(50))  # maximally anti-conservative
    assert ks == pytest.approx(1.0) and excess == pytest.approx(1.0)
    null = np.array([0.001, 0.02, 0.02, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.0])
    alt = np.array([0.0001, 0.001, 0.01, 0.02, 0.5])
    assert tpr_at_fpr(alt, null, 0.0) == pytest.approx(0.2)  # only below 0.001
    assert tpr_at_fpr(alt, null, 0.1) == pytest.approx(0.6)  # below the tied 0.02
    assert tpr_at_fpr(alt, null, 0.3) == pytest.approx(0.8)


def test_simulated_watermark_only_moves_to_valid_regions():
    table = valid_table(8, 0.25, "sim")
    transition = np.random.default_rng(0).integers(0, 50, size=(8, 8)).astype(float)
    counts = simulate_watermarked(transition, table.numpy(), [9, 3, 12], np.random.default_rng(1))
    assert list(counts.sum(axis=(1, 2))) == [9, 3, 12]
    assert counts[:, ~table.numpy()].sum() == 0


def test_calibration_settings_name_the_bad_setting():
    for name, value in [("num_keys", 1), ("max_texts", 0), ("window_words", 0)]:
        with pytest.raises(ValueError, match=name):
            CalibrationSettings(**{name: value})


# ---------------------------------------------------------------------- real text


@pytest.mark.e2e
def test_exact_test_flags_at_most_alpha_of_key_independent_human_text(encoder):
    # The region mark (k-SemStamp's valid tables, K = 64, gamma 0.25). Each text gets its own
    # keys, so every (text, key) flag is an independent draw with probability at most alpha
    # under the exact test: the pooled rate obeys a binomial bound.
    from ksemstamp.builders import build_scheme
    from ksemstamp.settings import WatermarkSettings

    settings = {"key": "test-suite-key", "mark": {"kind": "region", "gamma": 0.25}}
    scheme = build_scheme(WatermarkSettings.from_dict(settings), encoder=encoder)
    texts, _ = human_texts(scheme.splitter, ("news",), max_texts=50, seed=3)
    scored = score_texts(scheme, [t.text for t in texts], ["news"] * len(texts))
    assert len(scored) >= 45
    keys_per_text = 40
    mark = scored.mark
    flags = {("exact", a): 0 for a in (0.01, 0.05)} | {("paper", a): 0 for a in (0.01, 0.05)}
    for i in range(len(scored)):
        one = mark.batch(scored.items[i : i + 1])
        tables = [mark.material(f"independent|{i}|{j}") for j in range(keys_per_text)]
        for p in mark.p_values(one, tables):
            for stat, alpha in flags:
                flags[stat, alpha] += bool(p[stat][0] <= alpha)
    draws = len(scored) * keys_per_text
    for alpha in (0.01, 0.05):
        assert flags["exact", alpha] / draws <= _bound(alpha, draws)
    # The same check catches a miscalibrated statistic: the paper's normal tail fails it.
    assert flags["paper", 0.05] / draws > _bound(0.05, draws)


@pytest.mark.e2e
def test_direction_test_flags_at_most_alpha_of_key_independent_human_text(default_scheme):
    # The same binomial check for the default direction mark (own contexts, components
    # projected out) and its detector's p-value, the whole-text test combined with the span and
    # mixture tests:
    # every (text, key) pair is an independent draw, each text scored under its own keys.
    assert default_scheme.settings.kind == "direction" and default_scheme.settings.context == "own"
    assert default_scheme.components is not None
    texts, _ = human_texts(default_scheme.splitter, ("news",), max_texts=50, seed=3)
    scored = score_texts(default_scheme, [t.text for t in texts], ["news"] * len(texts), scan=True)
    assert len(scored) >= 45
    mark = scored.mark
    flags, keys_per_text = {0.01: 0, 0.05: 0}, 40
    for i in range(len(scored)):
        one = mark.batch(scored.items[i : i + 1])
        keys = [mark.material(f"independent|{i}|{j}") for j in range(keys_per_text)]
        for p in mark.p_values(one, keys):
            for alpha in flags:
                flags[alpha] += bool(p["exact"][0] <= alpha)
    draws = len(scored) * keys_per_text
    for alpha, count in flags.items():
        assert count / draws <= _bound(alpha, draws)


@pytest.mark.e2e
@pytest.mark.parametrize("mark", ["direction", "region"])
def test_calibrate_command_writes_json_report_and_png(tmp_path, monkeypatch, mark):
    from ksemstamp.keys import DEMO_KEY, key_fingerprint

    monkeypatch.setenv("KSEMSTAMP_CACHE", str(tmp_path / "cache"))  # the embedding store

    fingerprint = key_fingerprint("test-suite-key")  # conftest sets KSEMSTAMP_KEY
    marked = tmp_path / "marked.jsonl"
    records = [
        {
            "id": 1,
            "prompt": "The vote was close.",
            "text": "It passed. Critics were loud. The mayor smiled.",
            "key_fingerprint": fingerprint,
            "status": "ok",
        },
        {
            "id": 2,
            "prompt": "Rain fell.",
            "text": "Roads flooded. Schools shut.",
            "key_fingerprint": fingerprint,
            "status": "ok",
        },
        {"id": 3, "text": "Another key. Not used.", "key_fingerprint": key_fingerprint(DEMO_KEY)},
        {"id": 4, "status": "error", "error": "boom"},
    ]
    marked.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "cal"
    args = ["calibrate", "--output_dir", str(out), "--calibration.max_texts", "48"]
    args += ["--calibration.num_keys", "20", "--calibration.simulated_per_key", "30"]
    args += ["--calibration.watermarked", str(marked), "--quiet"]
    assert main([*args, "--mark.kind", mark]) == 0
    stats = ("exact",) if mark == "direction" else ("paper", "exact")

    result = json.loads((out / "calibration.json").read_text())
    assert result["texts_total"] >= 45
    assert set(result["sources"]) == {"news", "parliament", "tweets"}
    assert all(s["texts"] >= 10 for s in result["sources"].values())
    assert result["calibration"]["num_keys"] == 20
    assert tuple(result["calibration"]["statistics"]) == stats
    for group in ("news", "parliament", "tweets", "overall"):
        for stat in stats:
            for alpha in ("0.001", "0.01", "0.05"):
                f = result["null"][group][stat]["fpr"][alpha]
                assert 0 <= f["min"] <= f["mean"] <= f["max"] <= 1
    # Per-key rates are independent across keys with mean at most alpha and values in [0, 1],
    # so their average over 20 keys has a standard deviation of at most sqrt(a (1 - a) / 20).
    for alpha in (0.01, 0.05):
        assert result["null"]["overall"]["exact"]["fpr"][str(alpha)]["mean"] <= _bound(alpha, 20)
    gen = result["power"]["generated: marked.jsonl"]
    assert gen["texts"] == 2 and gen["skipped"] == {"not_ok": 1, "other_key": 1}
    assert gen["one_region_share"] <= 1 and gen["distinct_transitions_mean"] >= 1
    # Simulated power needs the region mark's transition model.
    assert ("simulated" in result["power"]) == (mark == "region")
    assert result["configured_key"]["key_fingerprint"] == fingerprint

    report = (out / "report.md").read_text()
    assert "ksemstamp calibrate --output_dir" in report and "| overall (" in report
    assert (out / "pvalues.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("*.tmp*"))
    assert len(list((tmp_path / "cache" / "embeddings").glob("*.pt"))) == 1


def test_hash_encoder_calibration_runs_without_models(hash_scheme, tmp_path):
    # The run itself on a stand-in encoder (no transition matrix: no simulated power).
    from ksemstamp.calibration import run_calibration, write_outputs

    settings = CalibrationSettings(sources=("parliament",), max_texts=20, num_keys=4)
    result = run_calibration(hash_scheme, settings, {"command": "x"}, progress=False)
    assert result["texts_total"] == 20 and "simulated" not in result["power"]
    paths = write_outputs(result, tmp_path)
    assert all(p.exists() for p in paths.values())
    assert not hasattr(hash_scheme.encoder, "cache")  # the caller's scheme was left as it was


def _direction_scheme(hash_encoder, context="previous"):
    from ksemstamp.scheme.partition import KMeansPartition

    centroids = torch.nn.functional.normalize(
        torch.randn(6, 32, generator=torch.Generator().manual_seed(1)), dim=-1
    )
    mark = DirectionSettings(context=context, context_temperature=0.0)
    return WatermarkScheme(hash_encoder, KMeansPartition(centroids, 0.0), "k", get_splitter(), mark)


def test_direction_sums_give_the_detectors_z(hash_encoder):
    # The calibration scores every text once, key-free; under any key its z must be exactly
    # the detector's under that key.
    from ksemstamp.calibration.scoring import calibration_keys

    scheme = _direction_scheme(hash_encoder)
    texts = [
        "One fact here. Another fact there. One fact here. A last word.",
        "Alpha came first. Beta came next.",
        "Only one sentence.",
        "Gamma rose. Delta fell. Epsilon stayed. Zeta left. Eta returned.",
    ]
    scored = score_texts(scheme, texts, ["x"] * len(texts), prompts=[None, "A prompt.", None, None])
    assert scored.too_short == {"x": 1} and len(scored) == 3
    kept = [texts[0], texts[1], texts[3]]
    prompts = [None, "A prompt.", None]
    for i, directions in enumerate(calibration_keys(scored.mark, 3, seed=0)):
        keyed = build_mark(scheme, key=f"calibration|0|{i}")
        results = Detector(scheme, scan=False, mark=keyed).detect_batch(kept, prompts)
        want = [r.z_score for r in results]
        (under,) = scored.mark.p_values(scored.evidence, [directions])
        assert under["z"] == pytest.approx(want, rel=1e-5)
        p = p_values(scored, directions, np.random.default_rng(0))
        assert set(p) == {"exact", "exact_randomised"}
        assert p["exact"] == pytest.approx([normal_sf(z) for z in want], rel=1e-5)


@pytest.mark.parametrize("context", ["previous", "own"])
def test_scanned_p_values_are_the_detectors_under_every_key(hash_encoder, context):
    # With the scan, a key's p-value is the detector's combination of the whole-text test and
    # the scan, whose null draws the calibration makes once per text.
    from ksemstamp.calibration.scoring import calibration_keys

    scheme = _direction_scheme(hash_encoder, context)
    texts = [
        "Gamma rose. Delta fell. Epsilon stayed. Zeta left. Eta returned. Theta slept.",
        "Alpha came first. Beta came next.",
        "Iota sang. Kappa danced. Lambda listened. Mu clapped.",
    ]
    scored = score_texts(scheme, texts, ["x"] * len(texts), scan=True)
    assert scored.evidence.evidence[1].null is None  # two sentences: no span of three to scan
    for i, directions in enumerate(calibration_keys(scored.mark, 3, seed=1)):
        keyed = build_mark(scheme, key=f"calibration|1|{i}")
        results = Detector(scheme, scan=True, mark=keyed).detect_batch(texts)
        assert "span" not in results[1].details and results[0].details["span"] is not None
        p = p_values(scored, directions)
        assert p["exact"] == pytest.approx([r.p_value for r in results], rel=1e-6)


def test_direction_calibration_runs_without_models(hash_encoder, tmp_path):
    from ksemstamp.calibration import run_calibration, write_outputs

    scheme = _direction_scheme(hash_encoder)
    settings = CalibrationSettings(sources=("parliament",), max_texts=20, num_keys=4)
    result = run_calibration(scheme, settings, {"command": "x"}, progress=False, scan=True)
    assert result["calibration"]["statistics"] == ["exact"] and result["calibration"]["scan"]
    assert "paper" not in result["null"]["overall"] and "simulated" not in result["power"]
    paths = write_outputs(result, tmp_path)
    assert "direction" in paths["report"].read_text()
    assert "windowed scan" in paths["report"].read_text()


def test_group_rates_find_the_group_a_key_flags_together():
    from ksemstamp.calibration.summary import group_rates

    groups = ["a"] * 20 + ["b"] * 25 + ["c"] * 5
    flat = np.full(50, 0.5)
    clustered = flat.copy()
    clustered[20:26] = 0.001  # six of group b's texts under the second key
    per_key = [{"exact": flat}, {"exact": clustered}]
    out = group_rates(per_key, groups, 0.01)
    assert out["groups"] == 2 and out["texts"] == 45  # c is too small to judge
    assert out["largest_group"] == "b" and out["largest_key"] == 1
    assert out["largest_share"] == pytest.approx(6 / 25) and out["cells_above_15pct"] == 1
    assert out["independent_tail"] < 1e-6
    assert group_rates(per_key, ["x"] * 50, 0.01, min_size=60) == {
        "min_size": 60, "alpha": 0.01, "groups": 0
    }  # fmt: skip
