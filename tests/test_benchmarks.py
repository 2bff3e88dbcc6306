"""The benchmark scripts: their shared harness, their flags and their reports (``benchmarks/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench, detection, generation, harness, training
from ksemstamp.settings.files import load_watermark_settings

ROOT = Path(__file__).resolve().parents[1]


def test_quantile_and_distribution_match_numpy():
    rng = np.random.default_rng(0)
    values = rng.random(37).tolist()
    for q in (0.0, 0.5, 0.9, 1.0):
        assert harness.quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
    d = harness.distribution([*values, None])
    assert d["n"] == 37 and d["worst"] == max(values)
    assert d["median"] == pytest.approx(float(np.median(values)))
    assert harness.quantile([], 0.5) is None and harness.ratio(1.0, 0.0) is None
    assert harness.dist_cell({"median": 1.0, "p90": 2.5, "worst": None}) == "1.00 / 2.50 / -"


def test_report_files_carry_the_header_and_no_timer(tmp_path):
    p = harness.parser("a test benchmark")
    detection.add_arguments(p)
    args = p.parse_args(["--detect-texts", "3", "--output-dir", str(tmp_path)])
    report = harness.new_report("detection", args, ["--detect-texts", "3"])
    assert report["command"].endswith("python -m benchmarks.detection --detect-texts 3")
    assert report["settings"]["detect_texts"] == 3 and "output_dir" not in report["settings"]
    report["figures"] = {"x": 1}
    text = harness.write_report(report, tmp_path, "t", lambda r: "# t\n", final=True)
    saved = json.loads((tmp_path / "t.json").read_text())
    assert text == (tmp_path / "t.md").read_text() == "# t\n"
    assert saved["complete"] is True and saved["figures"] == {"x": 1}
    assert "started" not in saved and saved["total_seconds"] >= 0


def test_measure_records_seconds_and_peak_memory():
    m = harness.measure(lambda: bytearray(32 * 2**20))
    assert len(m.value) == 32 * 2**20 and m.seconds >= 0
    if harness.reset_peak_rss():
        assert m.peak_mib >= 32


def test_bench_takes_every_part_and_checks_its_flags():
    args = bench.parse_args(["--prompts", "3", "--sections", "detection", "--no-warmup"])
    assert args.prompts == 3 and args.warmup is False and args.time_budget == float("inf")
    assert args.detect_texts == 100 and args.train_batch == 16 and args.threads is None
    for bad in (["--sections", "generation,speed"], ["--train-warmup", "0"]):
        with pytest.raises(SystemExit) as exit_:
            bench.parse_args(bad)
        assert exit_.value.code == 2


def _variant(name: str, over: float, worst_sentence: float, watermark: bool = True) -> dict:
    return {
        "name": name,
        "kind": "loop",
        "watermark": watermark,
        "config_file": "configs/x.yaml",
        # The settings as summarize_variant records them: the shipped default, or the paper's.
        "settings": generation.variant_settings(
            load_watermark_settings(
                [
                    ROOT
                    / "configs"
                    / ("ksemstamp-paper.yaml" if name == "paper" else "ksemstamp.yaml")
                ],
                dict(harness.BENCH_KEY_LAYER),
            )
        ),
        "lm_dtype_resolved": "fp32",
        "tokens_per_second": 3.0,
        "seconds_per_token_per_prompt": {"median": 0.3, "p90": 0.4, "worst": 0.5},
        "over_hf_generate_per_prompt": {"median": over, "p90": over, "worst": over},
        "candidates_per_sentence": 32.0,
        "candidates_per_sentence_per_prompt": {"median": 32, "p90": 32, "worst": 32},
        "decoded_per_output_token": 20.0,
        "sentence_seconds": {"median": 5.0, "p90": 6.0, "worst": worst_sentence},
        "sentences_over_60s": int(worst_sentence > 60),
        "fallbacks": 0,
        "peak_rss_mib": 1500.0,
    }


def test_generation_targets_and_table_from_a_section():
    section = {
        "prompts_completed": 2,
        "variants": [_variant("default", 2.5, 12.0), _variant("paper", 4.0, 70.0)],
        "sequential": generation.summarize_sequential(
            [
                {
                    "hard_in_default_run": True,
                    "batched": {"seconds": 2.0, "candidates": 32},
                    "sequential": {"seconds": 10.0, "candidates": 32},
                }
            ]
        ),
    }
    met = [t["met"] for t in generation.generation_targets(section)]
    # default: within 3x / 6x / 10x, no 60 s sentence; paper: 4x misses the median bound and
    # its 70 s sentence the stall bound; the sequential sample is 5x slower (>= 3x asked).
    assert met == [True] * 4 + [False, True, True, False] + [True]
    text = "\n".join(
        generation.generation_markdown(
            section, {"prompts": 2, "prompt_words": 32, "max_new_tokens": 200}
        )
    )
    assert (
        "| default | `configs/x.yaml` | K64 / direction / 32, pruned to 12 after 8 tokens |" in text
    )
    assert "| paper | `configs/x.yaml` | K8 / 0.035 / 100 |" in text
    assert "Generator smollm2-135m-instruct (fp32)" in text and "temperature 0.7," in text
    assert "2.50 / 2.50 / 2.50" in text


def test_training_without_its_extra_says_what_was_not_measured():
    train = {"measured": False, "todo": "not measured, missing packages ['datasets']"}
    (target,) = training.training_targets(train)
    assert target["met"] is False and "datasets" in target["note"]
    assert "**not measured" in "\n".join(training.training_markdown(train))


@pytest.mark.e2e
def test_detection_benchmark_runs_as_a_module(tmp_path):
    """``python -m benchmarks.detection`` from the repository root, on a few texts."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.detection", "--detect-texts", "3"]
        + ["--detect-repeats", "1", "--threads", "1", "--output-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| `Detector.detect_batch` |" in out
    report = json.loads((tmp_path / "detection.json").read_text())
    assert report["detection"]["texts"] == 3 and report["detection"]["scored_ok"] == 3
    assert report["targets"][0]["target"].startswith("detection >=")


def test_the_benchmark_key_is_accepted_without_the_weak_key_override(monkeypatch):
    """The benchmarks' fixed public key says it is weak on purpose: without the test suite's
    ``KSEMSTAMP_ALLOW_WEAK_KEY`` every settings layer they build passes the key check."""
    from ksemstamp.keys import check_key, weak_keys_allowed

    monkeypatch.delenv("KSEMSTAMP_ALLOW_WEAK_KEY", raising=False)
    assert not weak_keys_allowed()
    with pytest.raises(ValueError, match="too weak"):
        check_key(harness.BENCH_KEY)
    args = bench.parse_args(["--prompts", "1", "--no-warmup"])
    settings = [v.config for v in generation.make_variants(args)]
    settings.append(detection.WatermarkSettings.from_dict(harness.BENCH_KEY_LAYER))
    for s in settings:
        assert s.key == harness.BENCH_KEY
        check_key(s.key, s.allow_weak_key)


def test_detection_and_throughput_targets_follow_the_device():
    from benchmarks import throughput

    cpu = {"device": "cpu", "detect_over_raw": 0.95, "score_ms_per_text": 2.5}
    assert [t["met"] for t in detection.detection_targets(cpu)] == [True, True]
    slow = dict(cpu, score_ms_per_text=3.5)
    assert [t["met"] for t in detection.detection_targets(slow)] == [True, False]
    gpu = {"device": "cuda:0", "detect_over_raw": 0.4}
    (target,) = detection.detection_targets(gpu)
    assert "GPU" in target["target"] and target["met"] is False

    row = {
        "prompts": 64,
        "watermarked_tokens_per_second": 900.0,
        "plain_tokens_per_second": 1500.0,
        "watermarked_over_plain": 0.6,
    }
    section = {"device": "cuda", "lm": "x", "lm_dtype": "bf16", "max_new_tokens": 8, "rows": [row]}
    (target,) = throughput.throughput_targets(section)
    assert target["met"] and target["measured"] == 0.6
    assert throughput.throughput_targets(dict(section, device="cpu")) == []
    assert "| 64 | 900.0 | 1500.0 | 0.60 |" in throughput.throughput_markdown(section)
