"""The ``watermark.py`` parser: flags from the settings dataclasses, files, printing, errors.

No model is loaded: these only parse and build settings.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest
import yaml

from ksemstamp import cli_args
from ksemstamp.calibration import CalibrationSettings
from ksemstamp.cli import main
from ksemstamp.cli_args import COMMANDS, parse
from ksemstamp.config import WatermarkConfig
from ksemstamp.evaluation.settings import EvalSettings
from ksemstamp.settings_flags import SettingsGroup, normalise_argv

SECRET = "zz-secret-key-7f3a"


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse([command, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize(
    "command,settings,rename",
    [
        ("detect", WatermarkConfig, {}),
        ("generate", WatermarkConfig, {}),
        ("serve", WatermarkConfig, {}),
        ("calibrate", WatermarkConfig, {}),
        ("calibrate", CalibrationSettings, cli_args.CALIBRATION.rename),
        ("evaluate", EvalSettings, {}),
    ],
)
def test_every_field_is_a_dashed_flag(command, settings, rename, capsys):
    shown = _help(command, capsys)
    for f in dataclasses.fields(settings):
        flag = _flag(rename.get(f.name, f.name))
        assert re.search(re.escape(flag) + r"[ ,\n\]]", shown), flag
        if f.type in (bool, "bool"):
            # argparse puts a short flag's help on the same line, a long one's on the next.
            negative = _flag("no_" + rename.get(f.name, f.name))
            assert re.search(re.escape(negative) + r"(\n| {2,})", shown), negative


@dataclass
class _Extended(WatermarkConfig):
    """Fields of the kind other changes add, to show the parser needs no edit for them."""

    chat: bool = False
    """Wrap prompts in the chat template."""
    cache_dtype: str = "float32"
    max_text_chars: int | None = None


def test_a_new_setting_needs_no_parser_edit(monkeypatch, tmp_path, capsys):
    extended = SettingsGroup(_Extended, "watermark settings")
    monkeypatch.setitem(
        COMMANDS, "detect", dataclasses.replace(COMMANDS["detect"], settings=extended)
    )
    file = tmp_path / "s.yaml"
    file.write_text("max_text_chars: 300\ncache_dtype: float16\n")
    got = parse(["detect", "--chat", "--config", str(file), "--cache-dtype", "bfloat16"]).settings
    assert isinstance(got, _Extended)
    assert (got.chat, got.cache_dtype, got.max_text_chars) == (True, "bfloat16", 300)
    assert "Wrap prompts in the chat template" in _help("detect", capsys)


def test_files_in_order_then_flags_wherever_they_stand(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("gamma: 0.5\nmargin: 0.01\nseed: 3\n")
    second.write_text("margin: 0.02\nadaptive_batch: false\n")
    argv = ["detect", "--seed", "9", "--config", str(first), f"--config={second}"]
    cfg = parse(argv + ["--adaptive-batch"]).settings
    assert (cfg.gamma, cfg.margin, cfg.seed, cfg.adaptive_batch) == (0.5, 0.02, 9, True)
    cfg = parse(argv).settings
    assert cfg.adaptive_batch is False and cfg.lsh_bits == WatermarkConfig().lsh_bits


def test_booleans_nulls_and_text_as_typed():
    assert parse(["detect", "--no-adaptive-batch"]).settings.adaptive_batch is False
    cfg = parse(["detect", "--margin-patience", "null", "--key", "#x", "--lm", "null"]).settings
    # A str setting is what was typed: YAML would make '#x' and 'null' into None.
    assert (cfg.margin_patience, cfg.key, cfg.lm) == (None, "#x", "null")
    args = parse(["detect", "--text", "null", "--prompt", "# A: b"]).args
    assert (args.text, args.prompt) == ("null", "# A: b")


def test_lists_take_commas_repeats_and_yaml():
    run = parse(
        ["calibrate", "--sources", "news,tweets", "--watermarked", "a.jsonl"]
        + ["--watermarked", "b.jsonl", "--alphas", "[0.001, 0.01]", "--calibration-seed", "4"]
        + ["--no-embedding-cache", "--seed", "5"]
    )
    cal = run.args.calibration
    assert cal.sources == ("news", "tweets") and cal.watermarked == ("a.jsonl", "b.jsonl")
    assert cal.alphas == (0.001, 0.01) and cal.seed == 4 and cal.reuse_embeddings is False
    assert run.settings.seed == 5  # the sampling seed is another setting
    assert parse(["calibrate", "--alphas", "0.05,0.1"]).args.calibration.alphas == (0.05, 0.1)


def test_normalise_argv():
    flags = {"--sources": str}
    argv = ["calibrate", "--gamma", "0.5", "--sources", "a", "--config", "x.yaml", "--sources=b,c"]
    assert normalise_argv(argv, flags, "calibrate") == [
        "calibrate",
        "--config",
        "x.yaml",
        "--gamma",
        "0.5",
        '--sources=["a", "b", "c"]',
    ]


def test_print_config_reads_back_and_never_shows_the_key(tmp_path, capsys):
    file = tmp_path / "k.yaml"
    file.write_text(f"key: {SECRET}\ngamma: 0.5\n")
    argv = ["calibrate", "--config", str(file), "--key", SECRET, "--num-keys", "7"]
    assert main([*argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert SECRET not in printed and "key:" not in yaml.safe_load(printed)
    data = yaml.safe_load(printed)
    assert data["gamma"] == 0.5 and data["num_keys"] == 7 and data["calibration_seed"] == 0
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    run = parse(["calibrate", "--config", str(again)])
    first = parse(argv)
    assert run.args.calibration == first.args.calibration
    assert run.settings.to_dict() == first.settings.to_dict()


@pytest.mark.parametrize(
    "argv,named",
    [
        (["detect", "--gamma", "abc"], "--gamma"),
        (["detect", "--gamma", "2", "--candidate-batch", "0"], "--candidate-batch"),
        (["detect", "--gama", "0.5"], "--gama"),
        (["detect", "--margin-patience", "x"], "--margin-patience"),
        (["calibrate", "--window-words", "0"], "--window-words"),
        (["evaluate", "--num-prompts", "0"], "--num-prompts"),
        (["evaluate", "--algorithms", "ksemstamp,unigram"], "unigram"),
        (["serve", "--max-chars", "0"], "--max-chars"),
        (["launch"], "launch"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--key", SECRET] if argv[0] != "evaluate" else argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert named in err and SECRET not in err


def test_bad_files_are_one_line_without_the_key(tmp_path, capsys):
    cases = {
        "broken.yaml": f'gamma: 0.25\nkey: "{SECRET}\n',
        "unknown.yaml": f"gama: 0.25\nkey: {SECRET}\n",
        "wrong.yaml": f"gamma: high\nkey: {SECRET}\n",
        "keytype.yaml": "key: [1, 2]\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SystemExit) as exit_:
            main(["detect", "--config", str(path), "--print-config"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert SECRET not in err and "[1, 2]" not in err
    with pytest.raises(SystemExit):
        main(["detect", "--config", str(tmp_path / "broken.yaml")])
    assert "broken.yaml: YAML error at line" in capsys.readouterr().err


def test_evaluate_takes_its_settings_from_files_and_flags(tmp_path):
    file = tmp_path / "eval.yaml"
    attacks = [{"name": n, "paraphraser": "wordnet"} for n in ("a", "b", "c")]
    file.write_text(yaml.safe_dump({"num_prompts": 9, "attacks": attacks, "seed": 2}))
    run = parse(
        ["evaluate", "--config", str(file), "--algorithms", "ksemstamp", "--num-prompts", "5"]
        + ["--only-attacks", "c,a", "--watermark-overrides", "{max_candidates: 20}"]
    )
    settings = run.settings
    assert isinstance(settings, EvalSettings)
    assert (settings.algorithms, settings.num_prompts, settings.seed) == (["ksemstamp"], 5, 2)
    assert settings.watermark_overrides == {"max_candidates": 20}
    assert [a["name"] for a in settings.select_attacks(run.args.only_attacks).attacks] == ["c", "a"]
    with pytest.raises(ValueError, match="unknown attacks"):
        settings.select_attacks(["d"])


SECRET = "s3cret-Key-Value-9b1e"


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["detect", "--kye", SECRET, "--text", "A. B."], "--kye (did you mean --key?)"),
        (["detect", "--kye=" + SECRET, "--text", "A. B."], "--kye (did you mean --key?)"),
        (["detect", "--text", "A. B.", SECRET], "1 value"),
        (["keygen", "--key", SECRET], "--key"),
        (["generate", "--prompt", "A.", "--keyy", SECRET, "--gama", "0.5"], "--keyy"),
    ],
)
def test_a_mistyped_flag_is_named_but_no_value_is_echoed(argv, shown, capsys):
    # The value after a mistyped flag may be the key: an error names the flags it did not know,
    # never the values around them.
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1
    assert SECRET not in err and "unrecognized arguments" in err and shown in err
    assert "not shown" in err


def test_the_key_never_appears_in_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("KSEMSTAMP_KEY", SECRET)
    for argv in (
        ["generate", "--key", SECRET, "--gamma", SECRET],
        ["generate", f"--key={SECRET}", "--mark", SECRET],
        ["generate", "--mark", SECRET],  # the key put in the wrong place
    ):
        with pytest.raises(SystemExit):
            parse(argv)
        err = capsys.readouterr().err
        assert SECRET not in err and "***" in err
