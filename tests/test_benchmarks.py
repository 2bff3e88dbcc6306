"""The benchmarks (``benchmarks/``): their shared harness, their commands and settings, and
their reports."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks import bench, detection, generation, generation_report, harness, training
from benchmarks.__main__ import COMMANDS, run
from ksemstamp.cli import console
from ksemstamp.experimental import main
from ksemstamp.settings.files import load_watermark_settings

ROOT = Path(__file__).resolve().parents[1]


def from_the_root(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m benchmarks ARGS`` from the repository root, this checkout's package first."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=check,
    )


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


def test_report_files_carry_the_header_and_no_timer(tmp_path, monkeypatch):
    # The command line as the runner records it for ``python -m benchmarks detection ...``.
    monkeypatch.setattr(
        console, "ARGV", ["-m", "benchmarks", "detection", "--detection.texts", "3"]
    )
    settings = {
        "detection": detection.DetectionSettings(texts=3),
        "run": harness.RunSettings(output_dir=str(tmp_path)),
    }
    report = harness.new_report("detection", settings)
    assert report["command"].endswith("python -m benchmarks detection --detection.texts 3")
    assert report["settings"]["detection"]["texts"] == 3
    assert report["settings"]["detection"]["repeats"] == 3
    assert report["settings"]["run"] == {"threads": None}  # never the output folder
    report["figures"] = {"x": 1}
    text = harness.write_report(report, tmp_path, "t", lambda r: "# t\n", final=True)
    saved = json.loads((tmp_path / "t.json").read_text())
    assert text == (tmp_path / "t.md").read_text() == "# t\n"
    assert saved["complete"] is True and saved["figures"] == {"x": 1}
    assert saved["settings"]["detection"]["texts"] == 3
    assert "started" not in saved and saved["total_seconds"] >= 0


def test_a_report_records_the_arguments_the_runner_was_given(monkeypatch):
    """What the runner records of a command line is what ``new_report`` writes after
    ``python -m benchmarks NAME``; a command called from Python records none."""
    seen = []

    def probe(texts: int = 1) -> int:
        """A stand-in benchmark."""
        seen.append(harness.arguments_of("probe"))
        return 0

    commands = {"probe": probe}
    assert main(["probe", "--texts", "5"], prog="python -m benchmarks", commands=commands) == 0
    assert seen == [["--texts", "5"]]
    monkeypatch.setattr(console, "ARGV", [])
    assert harness.arguments_of("probe") == []


def test_a_benchmark_without_targets_has_no_targets_table():
    assert harness.targets_markdown([]) == []
    (line,) = harness.targets_markdown([{"target": "t", "measured": 0.5, "met": False}])[4:]
    assert line == "| t | 0.50 | no |"


def test_measure_records_seconds_and_peak_memory():
    m = harness.measure(lambda: bytearray(32 * 2**20))
    assert len(m.value) == 32 * 2**20 and m.seconds >= 0
    if harness.reset_peak_rss():
        assert m.peak_mib >= 32


def test_bench_takes_every_part_and_its_defaults(capsys):
    argv = ["bench", "--generation.prompts", "3", "--sections", "detection"]
    assert run([*argv, "--generation.warmup", "false", "--print_config"]) == 0
    given = yaml.safe_load(capsys.readouterr().out)
    assert given["generation"]["prompts"] == 3 and given["generation"]["warmup"] is False
    assert given["generation"]["time_budget"] is None  # no limit
    assert given["detection"]["texts"] == 100 and given["training"]["batch"] == 16
    assert given["training"]["warmup"] == 2 and given["run"]["threads"] is None
    assert given["sections"] == ["detection"]
    assert run(["bench", "--generation.warmup", "--print_config"]) == 0  # alone: true
    given = yaml.safe_load(capsys.readouterr().out)
    assert given["generation"]["warmup"] is True
    assert given["sections"] == ["generation", "detection", "training"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench", "--training.warmup", "0"],
            "training.warmup (--training.warmup) must be >= 1 (the first step pays one-off "
            "costs), got 0",
        ),
        (["training", "--training.steps", "0"], "training.steps (--training.steps) must be >= 1"),
        (["detection", "--detection.texts", "many"], "detection.texts"),
        (["throughput", "--throughput.batches", "0,8"], "throughput.batches"),
        (["precision", "--run.threads", "0"], "run.threads (--run.threads) must be >= 1"),
        (["generation", "--generation.prompts", "0"], "generation.prompts"),
        (["threads", "--threads.prompts", "0"], "threads.prompts (--threads.prompts) must be >= 1"),
        (["steering", "--steering.entries", "0"], "steering.entries (--steering.entries) must be"),
        (["detection", "--detect-texts", "3"], "unrecognized arguments: --detect-texts"),
    ],
)
def test_unusable_settings_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m benchmarks {argv[0]}: error: ") and message in err
    assert err.count("\n") == 1


def test_bench_refuses_an_unknown_section_before_measuring(capsys, monkeypatch):
    def measured(*args, **kwargs):
        raise AssertionError("measured before the sections were checked")

    monkeypatch.setattr(bench, "run_generation", measured)
    assert run(["bench", "--sections", "generation,speed"]) == 2
    err = capsys.readouterr().err
    assert "--sections: give one or more of generation, detection, training" in err
    assert "(unknown: speed)" in err and err.count("\n") == 1


def test_every_benchmark_is_a_command_and_nothing_else_runs_one():
    """One way to run a benchmark: ``python -m benchmarks NAME``; no module runs itself."""
    assert set(COMMANDS) == {
        "bench",
        "generation",
        "detection",
        "training",
        "throughput",
        "precision",
        "threads",
        "vllm",
        "steering",
    }
    for name, fn in COMMANDS.items():
        assert fn.__module__ == f"benchmarks.{name}" and fn.__doc__
    for path in (ROOT / "benchmarks").glob("*.py"):
        text = path.read_text()
        if path.name != "__main__.py":
            assert "__name__ ==" not in text and "def main(" not in text, path.name
        assert "ArgumentParser" not in text, path.name  # the runner reads every option


def test_the_benchmarks_list_their_commands_from_the_repository_root():
    out = from_the_root("--help").stdout
    for name in COMMANDS:
        assert f"\n  {name} " in out
    assert "usage: python -m benchmarks COMMAND" in out


DOCUMENTED = [
    ROOT / "benchmarks" / "README.md",
    ROOT / "docs" / "gpu.md",
    ROOT / "docs" / "results.md",
    ROOT / "Makefile",
    *sorted((ROOT / "benchmarks").glob("*.py")),
]
"""Where benchmark command lines are written down for a reader to run."""


def documented_commands(path: Path) -> list[list[str]]:
    """The ``python -m benchmarks`` command lines of ``path`` (a Markdown file's fenced blocks and
    inline code, a Makefile's recipes, a module's indented examples), each as its argv after
    ``benchmarks``; lines continued with a backslash are joined, and an ellipsis that stands for
    more flags is dropped (one that stands for a flag's value is kept). A placeholder command
    (``NAME``) and ``--help`` are left out."""
    text = path.read_text().replace("\\\n", " ")
    if path.suffix == ".md":
        fenced = r"^```\w*\n(.*?)^```"
        lines = [ln for block in re.findall(fenced, text, re.M | re.S) for ln in block.splitlines()]
        rest = re.sub(fenced, "", text, flags=re.M | re.S)
        lines += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", rest)]
    elif path.suffix == ".py":
        lines = [ln for ln in text.splitlines() if re.match(r"\s{4,}python -m benchmarks ", ln)]
    else:
        lines = text.splitlines()
    found = []
    for line in lines:
        _, hit, tail = line.partition("-m benchmarks ")
        words = shlex.split(tail, comments=True) if hit else []
        if words and words[0] != "NAME" and "--help" not in words:
            found.append([w for i, w in enumerate(words) if w != "..." or words[i - 1][:2] == "--"])
    return found


def test_the_documented_command_lines_are_read_by_the_runner(capsys):
    """Every ``python -m benchmarks`` command line the docs, the Makefile and the modules show
    is read by the runner as written (its settings printed, nothing measured)."""
    seen = set()
    for path in DOCUMENTED:
        for argv in documented_commands(path):
            try:
                code = run([*argv, "--print_config"])
            except SystemExit as exit_:
                code = exit_.code
            assert code == 0, (path.name, argv, capsys.readouterr().err)
            seen.add(argv[0])
    capsys.readouterr()
    assert seen == set(COMMANDS)


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


def _section() -> dict:
    """A generation section as ``run_generation`` records it, two prompts."""
    return {
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


def test_generation_targets_and_table_from_a_section():
    section = _section()
    met = [t["met"] for t in generation_report.generation_targets(section)]
    # default: within 3x / 6x / 10x, no 60 s sentence; paper: 4x misses the median bound and
    # its 70 s sentence the stall bound; the sequential sample is 5x slower (>= 3x asked).
    assert met == [True] * 4 + [False, True, True, False] + [True]
    text = "\n".join(
        generation_report.generation_markdown(
            section, {"prompts": 2, "prompt_words": 32, "max_new_tokens": 200}
        )
    )
    assert (
        "| default | `configs/x.yaml` | K64 / direction / 32, pruned to 12 after 8 tokens |" in text
    )
    assert "| paper | `configs/x.yaml` | K8 / 0.035 / 100 |" in text
    assert "Generator smollm2-135m-instruct (fp32)" in text and "temperature 0.7," in text
    assert "2.50 / 2.50 / 2.50" in text


def test_the_bench_report_reads_its_settings_by_group(tmp_path):
    """``bench``'s Markdown from a report as ``bench`` writes it: the settings in their groups."""
    settings = {
        "generation": generation.GenerationSettings(prompts=3, max_new_tokens=24),
        "detection": detection.DetectionSettings(),
        "training": training.TrainingSettings(),
        "run": harness.RunSettings(output_dir=str(tmp_path)),
        "sections": ("generation", "training"),
    }
    report = harness.new_report("bench", settings)
    assert report["settings"]["generation"]["max_new_tokens"] == 24
    assert report["settings"]["sections"] == ["generation", "training"]
    report["generation"] = _section()
    report["training"] = {"measured": False, "todo": "not measured, missing packages ['x']"}
    report["targets"] = bench.targets(report)
    text = harness.write_report(report, tmp_path, bench.NAME, bench.render, final=True)
    assert "2 of 3 requested held-out news prompts (test split, ~32 words" in text
    assert "24 new tokens each" in text and "## Training" in text
    assert "## Detection" not in text and (tmp_path / "latest.md").read_text() == text


def test_training_without_its_extra_says_what_was_not_measured():
    train = {"measured": False, "todo": "not measured, missing packages ['datasets']"}
    (target,) = training.training_targets(train)
    assert target["met"] is False and "datasets" in target["note"]
    assert "**not measured" in "\n".join(training.training_markdown(train))


@pytest.mark.e2e
def test_detection_benchmark_runs_as_a_command(tmp_path):
    """``python -m benchmarks detection`` from the repository root, on a few texts."""
    argv = ["--detection.texts", "3", "--detection.repeats", "1", "--run.threads", "1"]
    out = from_the_root("detection", *argv, "--run.output_dir", str(tmp_path)).stdout
    assert "| `Detector.detect_batch` |" in out
    report = json.loads((tmp_path / "detection.json").read_text())
    assert report["detection"]["texts"] == 3 and report["detection"]["scored_ok"] == 3
    assert report["targets"][0]["target"].startswith("detection >=")
    assert report["command"].endswith(
        f"python -m benchmarks detection {' '.join(argv)} --run.output_dir {tmp_path}"
    )
    assert report["settings"]["detection"]["texts"] == 3
    assert report["settings"]["run"] == {"threads": 1}
    assert "Command: `OMP_NUM_THREADS=" in (tmp_path / "detection.md").read_text()


def test_the_benchmark_key_is_accepted_without_the_weak_key_override(monkeypatch):
    """The benchmarks' fixed public key says it is weak on purpose: without the test suite's
    ``KSEMSTAMP_ALLOW_WEAK_KEY`` every settings layer they build passes the key check."""
    from ksemstamp.keys import check_key, weak_keys_allowed

    monkeypatch.delenv("KSEMSTAMP_ALLOW_WEAK_KEY", raising=False)
    assert not weak_keys_allowed()
    with pytest.raises(ValueError, match="too weak"):
        check_key(harness.BENCH_KEY)
    given = generation.GenerationSettings(prompts=1, warmup=False)
    settings = [v.config for v in generation.make_variants(given)]
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


def test_the_generation_benchmark_measures_any_profile_on_any_device():
    """``--generation.device`` moves both configurations (a GPU run needs no edited file), and
    ``--generation.default_config`` measures another profile, such as the GPU one, as is."""
    gpu = ROOT / "configs" / "ksemstamp-gpu.yaml"
    settings = generation.GenerationSettings(default_config=str(gpu), device="cuda:1")
    variants = {v.name: v.config for v in generation.make_variants(settings)}
    assert {c.model.device for c in variants.values()} == {"cuda:1"}
    assert (variants["default"].search.max_candidates, variants["default"].search.prune_keep) == (
        128,
        32,
    )
    plain = generation.read_config(
        ROOT / "configs" / "ksemstamp.yaml", generation.GenerationSettings()
    )
    assert plain.model.device == "cpu" and plain.search.max_candidates == 32


def test_the_threads_benchmark_compares_every_cell_with_the_default_alone(monkeypatch):
    from benchmarks import threads as bench_threads

    seconds = {("default", False): 1.0, ("passive", False): 1.1, ("default", True): 15.0}

    def cell(settings, policy, count, beside):
        s = seconds.get((policy, beside), 2.0 if count == "auto" else 1.8)
        return {"seconds": s * 40, "tokens": 40, "texts": ["a"] if count == "auto" else ["b"]}

    monkeypatch.setattr(bench_threads, "_cell", cell)
    section = bench_threads.bench_threads(bench_threads.ThreadsSettings())
    got = {r["cell"]: (round(r["vs_default_alone"], 2), r["same_texts"]) for r in section["rows"]}
    assert got == {
        "alone, default": (1.0, True),
        "alone, passive": (1.1, True),
        "beside, default": (15.0, True),
        "beside, passive": (2.0, True),
        "beside, passive, 1 thread": (1.8, False),
    }
    assert [t["met"] for t in bench_threads.threads_targets(section)] == [True]
    seconds[("passive", True)] = 3.5  # a policy that helps less misses the target
    slower = bench_threads.bench_threads(bench_threads.ThreadsSettings())
    assert [t["met"] for t in bench_threads.threads_targets(slower)] == [False]
    table = "\n".join(bench_threads.threads_markdown(section))
    assert "| beside, default | default | auto | 15.000 | 15.00x | yes |" in table


def test_the_steering_benchmark_times_each_vocabulary_s_set_up(monkeypatch, tmp_path, encoder):
    """One row per vocabulary, with the set-up's steps and the rate of later entries; the
    target is met or not by the measured seconds."""
    from benchmarks import steering as bench_steering

    class Words:
        def __len__(self) -> int:
            return 300

        def batch_decode(self, rows):
            return [f" w{i}" if i % 3 else "," for (i,) in rows]

    monkeypatch.setattr(bench_steering, "_vocabularies", lambda: [("tiny", Words(), 300)])
    monkeypatch.setattr(bench_steering.steering_module, "SAMPLE", 50)
    assert run(["steering", "--steering.entries", "20", "--run.output_dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "steering.json").read_text())
    (row,) = report["steering"]["rows"]
    assert row["entries"] == 300 and row["word_entries"] == 200
    assert row["ready_seconds"] >= row["setup_seconds"] > 0 and row["entries_per_second"] > 0
    (target,) = report["targets"]
    assert target["met"] == (row["ready_seconds"] < 60)
    assert "| tiny | 300 | 200 |" in (tmp_path / "steering.md").read_text()
