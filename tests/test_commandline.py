"""The command line: flags from the settings groups and the commands' signatures, files,
printing, errors, the dashed spelling of development versions refused, and every command line
the docs show read as written. No model is loaded."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest
import yaml

from ksemstamp.calibration import CalibrationSettings
from ksemstamp.cli import COMMANDS, main, resolve
from ksemstamp.cli.options import parameters
from ksemstamp.cli.parser import CommandLineError, parse
from ksemstamp.settings import GROUPS, MARK_KINDS, RegionSettings, WatermarkSettings
from ksemstamp.settings.evaluation import EvalSettings

SECRET = "s3cret-Key-Value-9b1e"


def _parse(argv):
    fn, prog, rest = resolve(argv, "ksemstamp")
    return parse(fn, rest, prog)


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        _parse([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_command_is_one_function_in_one_registry():
    for name, entry in COMMANDS.items():
        for fn in entry.values() if isinstance(entry, dict) else [entry]:
            assert callable(fn) and fn.__doc__, name


@pytest.mark.parametrize("kind", list(MARK_KINDS))
def test_every_setting_is_a_flag_of_its_group(kind, capsys):
    shown = _help(["generate", "--mark.kind", kind], capsys)
    mine = {"mark": MARK_KINDS[kind], "search": MARK_KINDS[kind].search}
    for name, cls in {**GROUPS, **mine}.items():
        for f in dataclasses.fields(cls):
            assert re.search(rf"--{name}\.{f.name}[ \n]", shown), f"--{name}.{f.name}"
    other = next(k for k in MARK_KINDS if k != kind)
    for name, cls in {"mark": MARK_KINDS[other], "search": MARK_KINDS[other].search}.items():
        own = {f.name for f in dataclasses.fields(mine[name])}
        for f in dataclasses.fields(cls):
            if f.name not in own:  # only the mark in force has its fields
                assert f"--{name}.{f.name} " not in shown, f"--{name}.{f.name}"


def test_every_command_shows_its_own_options_and_groups(capsys):
    shown = _help(["calibrate"], capsys)
    for f in dataclasses.fields(CalibrationSettings):
        assert f"--calibration.{f.name}" in shown
    assert "--output_dir" in shown and "--quiet" in shown
    shown = _help(["evaluate"], capsys)
    for f in dataclasses.fields(EvalSettings):
        assert f"--{f.name}" in shown
    assert "--kgw.bias" in shown and "--model.lm" not in shown


def test_files_in_order_then_flags_wherever_they_stand(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(
        "mark: {kind: region, gamma: 0.5}\nsearch: {margin: 0.01}\nsampling: {seed: 3}\n"
    )
    second.write_text("search: {margin: 0.02, adaptive_batch: false}\n")
    argv = ["detect", "--sampling.seed", "9", "--config", str(first), f"--config={second}"]
    settings = _parse([*argv, "--search.adaptive_batch"]).kwargs["settings"]
    assert settings.mark == RegionSettings(gamma=0.5) and settings.search.margin == 0.02
    assert settings.sampling.seed == 9 and settings.search.adaptive_batch is True
    settings = _parse(argv).kwargs["settings"]
    assert settings.search.adaptive_batch is False and settings.partition.lsh_bits == 3


def test_another_kind_of_mark_replaces_the_mark_whole(tmp_path):
    region = tmp_path / "region.yaml"
    region.write_text("mark: {kind: region, gamma: 0.5}\n")
    direction = tmp_path / "direction.yaml"
    direction.write_text("mark: {kind: direction, remove_components: 3}\n")
    settings = _parse(["detect", "--config", str(region), "--config", str(direction)])
    assert settings.kwargs["settings"].mark.remove_components == 3
    flagged = _parse(["detect", "--config", str(direction), "--mark.kind", "region"])
    assert flagged.kwargs["settings"].mark == RegionSettings()
    with pytest.raises(CommandLineError, match="mark.gamma"):
        _parse(["detect", "--config", str(direction), "--mark.gamma", "0.3"])


def test_booleans_nulls_lists_and_text_as_typed():
    run = _parse(["detect", "--search.adaptive_batch", "false", "--quiet"])
    assert run.kwargs["settings"].search.adaptive_batch is False and run.kwargs["quiet"] is True
    run = _parse(
        ["detect", "--search.threshold", "null", "--key", "#x", "--model.lm", "null"]
        + ["--text", "null", "--prompt", "# A: b"]
    )
    settings = run.kwargs["settings"]
    # A str setting is what was typed: YAML would make '#x' and 'null' into None.
    assert (settings.search.threshold, settings.key, settings.model.lm) == (None, "#x", "null")
    assert (run.kwargs["text"], run.kwargs["prompt"]) == ("null", "# A: b")
    run = _parse(
        ["calibrate", "--calibration.sources", "news,tweets", "--calibration.watermarked", "a"]
        + ["--calibration.watermarked", "b", "--calibration.alphas", "[0.001, 0.01]"]
    )
    calibration = run.kwargs["calibration"]
    assert calibration.sources == ("news", "tweets") and calibration.watermarked == ("a", "b")
    assert calibration.alphas == (0.001, 0.01)


def test_print_config_is_a_complete_file_that_reads_back(tmp_path, capsys):
    file = tmp_path / "k.yaml"
    file.write_text(f"key: {SECRET}\nmark: {{kind: region, gamma: 0.5}}\n")
    argv = ["calibrate", "--config", str(file), "--key", SECRET, "--calibration.num_keys", "7"]
    assert main([*argv, "--print_config"]) == 0
    printed = capsys.readouterr().out
    data = yaml.safe_load(printed)
    assert SECRET not in printed and "key" not in data
    assert data["mark"] == {**dataclasses.asdict(RegionSettings()), "gamma": 0.5}
    assert data["calibration"]["num_keys"] == 7 and data["output_dir"] == "calibration"
    assert set(data) >= {*GROUPS, "calibration", "quiet"}
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    first, back = _parse(argv), _parse(["calibrate", "--config", str(again)])
    assert back.kwargs["calibration"] == first.kwargs["calibration"]
    assert back.kwargs["settings"].to_dict() == first.kwargs["settings"].to_dict()


@pytest.mark.parametrize(
    "argv,named",
    [
        (["detect", "--mark.kind", "region", "--mark.gamma", "abc"], "--mark.gamma"),
        (["detect", "--search.candidate_batch", "0"], "--search.candidate_batch"),
        (["detect", "--gama", "0.5"], "--gama"),
        (["detect", "--mark.kind", "region", "--search.margin_patience", "x"], "margin_patience"),
        (["calibrate", "--calibration.window_words", "0"], "--calibration.window_words"),
        (["evaluate", "--num_prompts", "0"], "--num_prompts"),
        (["evaluate", "--algorithms", "ksemstamp,unigram"], "unigram"),
        (["launch"], "launch"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--key", SECRET] if argv[0] not in ("evaluate", "launch") else argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert named in err and SECRET not in err


def test_bad_files_are_one_line_without_the_key(tmp_path, capsys):
    cases = {
        "broken.yaml": f'sampling: {{seed: 1}}\nkey: "{SECRET}\n',
        "unknown.yaml": f"serch: {{max_candidates: 3}}\nkey: {SECRET}\n",
        "wrong.yaml": f"search: {{max_candidates: high}}\nkey: {SECRET}\n",
        "keytype.yaml": "key: [1, 2]\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SystemExit) as exit_:
            main(["detect", "--config", str(path), "--print_config"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert SECRET not in err and "[1, 2]" not in err
    with pytest.raises(SystemExit):
        main(["detect", "--config", str(tmp_path / "broken.yaml")])
    assert "broken.yaml: YAML error at line" in capsys.readouterr().err


def _integer_options():
    """``(command line, flag)`` for every integer option of every command, of both marks."""
    import typing

    from ksemstamp.cli.options import options_of

    seen = {}
    for name, entry in COMMANDS.items():
        for sub, fn in entry.items() if isinstance(entry, dict) else [("", entry)]:
            for kind in MARK_KINDS:
                options = options_of(fn, kind)
                given = [(o.flag, "1" if o.hint is int else "x") for o in options if o.required]
                for option in options:
                    args = typing.get_args(option.hint) or (option.hint,)
                    if int in args:
                        head = [name, sub] if sub else [name]
                        own = option.dest.startswith(("mark.", "search."))
                        mark = ["--mark.kind", kind] if own else []
                        rest = [t for f, v in given if f != option.flag for t in (f, v)]
                        seen[(name, sub, option.dest)] = ([*head, *mark, *rest], option.flag)
    return sorted(seen.values())


INTEGER_OPTIONS = _integer_options()


@pytest.mark.parametrize(("argv", "flag"), INTEGER_OPTIONS, ids=[f for _, f in INTEGER_OPTIONS])
def test_every_integer_setting_refuses_an_absurd_value(argv, flag):
    with pytest.raises(CommandLineError) as err:
        _parse([*argv, flag, "99999999999999999999"])
    message = str(err.value)
    assert f"{flag[2:]} ({flag}) must be <= " in message


def test_an_absurd_search_is_refused_in_one_line_before_any_model_loads(monkeypatch, capsys):
    import time

    import ksemstamp.assets

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ksemstamp.assets, "load_encoder", no_model)
    monkeypatch.setattr(ksemstamp.assets, "load_lm", no_model)
    huge = "99999999999999999999"
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--prompt", "A.", "--search.max_candidates", huge,
              "--search.candidate_batch", huge])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "search.max_candidates (--search.max_candidates) must be <= 10,000" in err
    assert "search.candidate_batch (--search.candidate_batch) must be <= 4,096" in err
    assert time.perf_counter() - start < 5


def test_a_float_setting_must_be_finite(tmp_path, capsys):
    path = tmp_path / "inf.yaml"
    path.write_text("sampling: {temperature: .inf}\nmark: {context_temperature: .nan}\n")
    with pytest.raises(CommandLineError) as err:
        _parse(["detect", "--config", str(path)])
    assert "sampling.temperature (--sampling.temperature) must be a finite number" in str(err.value)
    assert "mark.context_temperature (--mark.context_temperature) must be a finite" in str(
        err.value
    )


def _alias_bomb(levels: int, flow: bool = False) -> str:
    """YAML of ``levels`` anchors, each a list of nine aliases of the one before: 9**levels
    values once expanded, in ``levels`` lines."""
    names = "abcdefghijklmnop"[:levels]
    items = [", ".join(['"x"'] * 9)] + [", ".join([f"*{p}"] * 9) for p in names[:-1]]
    if flow:
        return "[" + ", ".join(f"&{n} [{i}]" for n, i in zip(names, items, strict=True)) + "]"
    return "".join(f"{n}: &{n} [{i}]\n" for n, i in zip(names, items, strict=True))


def test_a_yaml_alias_bomb_is_refused_at_once_naming_the_file(tmp_path, capsys):
    import time
    import tracemalloc

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(9))
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        main(["detect", "--config", str(bomb), "--text", "One. Two."])
    seconds, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"{bomb}: its YAML aliases expand to more than 100,000 values" in err
    assert seconds < 2 and peak < 300 * 2**20
    # in a flag's value, read as YAML for a typed option, and in a list option's
    for flag in ("--search.max_candidates", "--calibration.alphas"):
        command = "calibrate" if flag.startswith("--calibration") else "detect"
        with pytest.raises(SystemExit):
            main([command, flag, _alias_bomb(7, flow=True)])
        assert f"the value of {flag}: its YAML aliases expand" in capsys.readouterr().err
    # training reads its files through LightningCLI: the same bound holds there
    from ksemstamp.cli.train import cli_main

    with pytest.raises(SystemExit) as exit_:
        cli_main(["fit", "--config", str(bomb)])
    assert exit_.value.code == 2 and f"{bomb}: its YAML aliases expand" in capsys.readouterr().err
    # a few aliases stay as YAML has them
    small = tmp_path / "small.yaml"
    small.write_text("sampling: &s {seed: 4}\nsearch: {max_candidates: 3}\n")
    assert _parse(["detect", "--config", str(small)]).kwargs["settings"].sampling.seed == 4


def test_a_settings_file_that_is_not_utf8_or_too_large_is_named(tmp_path, capsys):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("sampling: {seed: 1}\n# caf\xe9\n".encode("latin-1"))
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 200_000)
    for path, problem in ((latin, "not UTF-8 text"), (huge, "larger than 1,048,576 bytes")):
        with pytest.raises(SystemExit):
            main(["detect", "--config", str(path), "--text", "One. Two."])
        err = capsys.readouterr().err
        assert f"{path}: {problem}" in err and len(err.strip().splitlines()) == 1


def test_evaluate_takes_its_settings_from_files_and_flags(tmp_path):
    file = tmp_path / "eval.yaml"
    attacks = [{"name": n, "paraphraser": "wordnet"} for n in ("a", "b", "c")]
    file.write_text(yaml.safe_dump({"num_prompts": 9, "attacks": attacks, "seed": 2}))
    run = _parse(
        ["evaluate", "--config", str(file), "--algorithms", "ksemstamp", "--num_prompts", "5"]
        + ["--only_attacks", "c,a", "--watermark_overrides", "{search: {max_candidates: 20}}"]
        + ["--kgw.bias", "3.0"]
    )
    settings = run.kwargs["settings"]
    assert isinstance(settings, EvalSettings)
    assert (settings.algorithms, settings.num_prompts, settings.seed) == (["ksemstamp"], 5, 2)
    assert settings.watermark_overrides == {"search": {"max_candidates": 20}}
    assert settings.kgw.bias == 3.0 and settings.kgw.greenlist_ratio == 0.25
    assert settings.watermark_config("ksemstamp").search.max_candidates == 20
    chosen = settings.select_attacks(run.kwargs["only_attacks"])
    assert [a["name"] for a in chosen.attacks] == ["c", "a"]
    with pytest.raises(ValueError, match="unknown attacks"):
        settings.select_attacks(["d"])


def test_the_dashed_spelling_of_development_versions_is_an_unknown_option(capsys):
    # 0.1.0 was never released: the dashed flags of its development versions are not read.
    with pytest.raises(CommandLineError, match="max-new-tokens"):
        _parse(["generate", "--max-new-tokens", "40"])


def test_a_command_s_signature_is_its_options():
    roles = {p.name: p.role for p in parameters(COMMANDS["calibrate"])}
    assert roles == {
        "settings": "settings",
        "calibration": "group",
        "output_dir": "option",
        "quiet": "option",
    }
    assert isinstance(_parse(["calibrate"]).kwargs["settings"], WatermarkSettings)


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["detect", "--kye", SECRET, "--text", "A. B."], "--kye (did you mean --key?)"),
        (["detect", "--kye=" + SECRET, "--text", "A. B."], "--kye (did you mean --key?)"),
        (["detect", "--text", "A. B.", SECRET], "1 value"),
        (["keygen", "--key", SECRET], "--key"),
        (["generate", "--prompt", "A.", "--keyy", SECRET, "--gama", "0.5"], "--keyy"),
        (
            ["generate", "--prompt", "A.", "--search.margin", SECRET],
            "--search.margin (a setting of the region mark: --mark.kind region)",
        ),
        (
            ["generate", "--mark.kind", "region", "--search.steer", SECRET],
            "--search.steer (a setting of the direction mark: --mark.kind direction)",
        ),
    ],
)
def test_a_mistyped_flag_is_named_but_no_value_is_echoed(argv, shown, capsys):
    # The value after a mistyped flag may be the key: an error names the flags it did not know,
    # never the values around them.
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1
    assert SECRET not in err and "unrecognized arguments" in err and shown in err
    assert "not shown" in err


def test_the_key_never_appears_in_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("KSEMSTAMP_KEY", SECRET)
    for argv in (
        ["generate", "--key", SECRET, "--search.max_candidates", SECRET],
        ["generate", f"--key={SECRET}", "--mark.kind", SECRET],
        ["generate", "--mark.context", SECRET],  # the key put in the wrong place
    ):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert SECRET not in err and "***" in err


def test_every_option_of_every_command_has_a_description_and_groups_read_cleanly(capsys):
    from ksemstamp.cli.options import options_of

    for name, entry in COMMANDS.items():
        if name == "train":  # LightningCLI's own help
            continue
        for sub, fn in entry.items() if isinstance(entry, dict) else [("", entry)]:
            for kind in MARK_KINDS:
                undocumented = [o.flag for o in options_of(fn, kind) if not (o.help or "").strip()]
                assert undocumented == [], f"{name} {sub}: {undocumented}"
            shown = _help([name, sub] if sub else [name], capsys)
            headings = [line for line in shown.splitlines() if line and not line[0].isspace()]
            assert not [h for h in headings if h.endswith(".:") or h.endswith(")):")], headings
    assert "model (the generator, the sentence encoder, and where they run):" in _help(
        ["generate"], capsys
    )


def test_the_web_page_names_the_command_line_as_users_run_it():
    from pathlib import Path

    import ksemstamp.serve

    page = (Path(ksemstamp.serve.__file__).parent / "static" / "index.html").read_text()
    assert "watermark.py" not in page and "ksemstamp detect --input" in page


ROOT = Path(__file__).resolve().parents[1]
ENV_OR_WRAPPER = re.compile(r"^([A-Z_]+=\S*|nice|-n|\d+|time)$")


def documented_command_lines(path: Path) -> list[list[str]]:
    """The ``ksemstamp`` command lines of a Markdown file's fenced blocks or a Makefile's recipes,
    each as its argv after the program name: continued lines joined, environment assignments and
    ``nice`` dropped, cut at a pipe or redirection. Synopses (``[--flag ...]``), placeholders
    (``COMMAND``) and ``--help`` are left out."""
    text = path.read_text().replace("\\\n", " ")
    if path.suffix == ".md":
        blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S)
        lines = [line for block in blocks for line in block.splitlines()]
    else:
        lines = [line for line in text.splitlines() if line.startswith("\t")]
    found = []
    for line in lines:
        words = shlex.split(line, comments=True)
        while words and ENV_OR_WRAPPER.match(words[0]):
            words = words[1:]
        if words[:1] == ["ksemstamp"]:
            words = words[1:]
        elif words[:3] == ["python", "-m", "ksemstamp"]:
            words = words[3:]
        else:
            continue
        for stop in ("|", ">", "&&", ";", "2>&1"):
            words = words[: words.index(stop)] if stop in words else words
        if words and not words[0].isupper() and "--help" not in words and "[--" not in line:
            found.append(words)
    return found


def test_the_documented_command_lines_are_read_as_written():
    """Every ``ksemstamp`` command line the README, the docs and the Makefile show parses and
    builds its settings (files named must exist, flags must be today's); nothing runs."""
    paths = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md"))]
    seen = []
    for path in paths:
        for argv in documented_command_lines(path):
            fn, prog, rest = resolve(argv, "ksemstamp")
            try:
                parse(fn, rest, prog)
            except CommandLineError as err:
                pytest.fail(f"{path.relative_to(ROOT)}: ksemstamp {' '.join(argv)}: {err}")
            seen.append(argv[0])
    assert {"generate", "detect", "calibrate", "evaluate", "pairs", "agreement"} <= set(seen)


@pytest.mark.parametrize("command", ["detect", "calibrate"])
def test_a_command_that_never_generates_lists_only_what_it_reads(command, capsys):
    shown = _help([command], capsys)
    assert "--sampling." not in shown and "--search." not in shown and "--engine." not in shown
    assert "--help_all" in shown and "--mark.kind" in shown and "--detection.alpha" in shown
    with pytest.raises(SystemExit) as exit_:
        _parse([command, "--help_all"])
    assert exit_.value.code == 0
    everything = capsys.readouterr().out
    assert "--sampling.seed" in everything and "--search.steer" in everything
    assert len(everything.splitlines()) > 1.5 * len(shown.splitlines())
    # Taken all the same: a settings file or a flag shared with generate is no error.
    invocation = _parse(
        [command, "--sampling.seed", "3", *(["--text", "x"] if command == "detect" else [])]
    )
    assert invocation.kwargs["settings"].sampling.seed == 3
    assert "--sampling.seed" in _help(["generate"], capsys)
