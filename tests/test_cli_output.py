"""``detect --input/--output`` on a stand-in detector (fast): what an output may be, and how a
run that cannot write says so. The same loop serves ``generate``."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import HashEncoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_io_input import LINES, _cut, _strict

import ksemstamp.cli as cli
import ksemstamp.cli.commands as commands
import ksemstamp.cli.processors as records
from ksemstamp.detector import Detector
from ksemstamp.io import ResumableWriter
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.scheme.partition import LSHPartition
from ksemstamp.settings import RegionSettings
from ksemstamp.text.splitter import get_splitter

ROWS = [{"id": i, "text": f"Sentence {i} is here. And another {i} follows."} for i in range(3)]


def _detector(cfg=None):
    scheme = WatermarkScheme(
        HashEncoder(), LSHPartition(32, bits=3), "k", get_splitter(), RegionSettings()
    )
    return Detector(scheme, max_chars=10_000)


@pytest.fixture
def stand_in(monkeypatch):
    """The stand-in detector, and how often one was built (a model load, in real use)."""
    built = []
    stand_in = lambda cfg: built.append(1) or _detector()  # noqa: E731
    monkeypatch.setattr(commands, "build_detector", stand_in)  # one text
    monkeypatch.setattr(records, "build_detector", stand_in)  # --input
    return built


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _detect(src, out):
    return cli.main(["detect", "--input", str(src), "--output", str(out), "--quiet"])


def test_output_equal_to_input_is_refused_before_any_work(tmp_path, stand_in, capsys):
    src = tmp_path / "in.jsonl"
    _write(src, ROWS)
    before = src.read_bytes()
    assert _detect(src, src) == 2
    assert _detect(src, tmp_path / "." / "in.jsonl") == 2
    os.link(src, tmp_path / "same.jsonl")
    assert _detect(src, tmp_path / "same.jsonl") == 2
    err = capsys.readouterr().err
    assert err.count("is the --input file") == 3 and "Give another file for --output" in err
    assert src.read_bytes() == before and stand_in == []


def test_output_without_input_is_refused_instead_of_ignored(tmp_path, stand_in, capsys):
    # One --text or --prompt prints its result; an --output beside it would be silently left
    # unwritten, so it is refused before any model loads.
    out = tmp_path / "out.jsonl"
    assert cli.main(["detect", "--text", "One. Two.", "--output", str(out), "--quiet"]) == 2
    assert cli.main(["generate", "--prompt", "One.", "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "detect: --output goes with --input" in err
    assert "generate: --output goes with --input" in err
    assert not out.exists() and stand_in == []


def test_a_file_that_is_no_earlier_output_is_refused_and_left_alone(tmp_path, stand_in, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "notes.txt"
    _write(src, ROWS)
    out.write_text("My notes.\nA last line without its line end")
    before = out.read_bytes()
    assert _detect(src, out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --output ") and "is not an earlier output of `detect`" in err
    assert "Give a new --output" in err and len(err.splitlines()) == 1
    assert out.read_bytes() == before and stand_in == []
    # a generate output (no detection fields) is not a detect output either
    _write(out, [{**ROWS[0], "line": 1, "status": "ok", "num_sentences": 2}])
    assert _detect(src, out) == 2
    assert "has no num_scored, num_valid, p_value, z_score" in capsys.readouterr().err
    # nor is the output of another input
    _write(out, [{**ROWS[0], "text": "Other.", "line": 1, "status": "ok", "z_score": None,
                  "p_value": None, "num_scored": 0, "num_valid": 0}])  # fmt: skip
    assert _detect(src, out) == 2
    assert "another 'text'" in capsys.readouterr().err and stand_in == []


@pytest.mark.parametrize(
    "content",
    [
        b"precious data without a trailing newline",
        b"\x7fELF\x02\x01\x00\x00binary\xff\xfe",
        b'{"note": "a JSON object, but no record of this input"}',
        b'{"id": 0, "text": "Another text',  # looks like a cut record, of another input
    ],
)
def test_a_file_without_a_line_break_is_no_earlier_output(tmp_path, stand_in, capsys, content):
    # Its whole content must prove it is an earlier output: with no complete line there is
    # nothing else to check, and the repair of a cut last line would truncate all of it.
    src, out = tmp_path / "in.jsonl", tmp_path / "nonl.txt"
    _write(src, ROWS)
    out.write_bytes(content)
    assert _detect(src, out) == 2
    err = capsys.readouterr().err.strip()
    assert "is not an earlier output of `detect`" in err and len(err.splitlines()) == 1
    assert "line break" in err
    assert out.read_bytes() == content and stand_in == []
    # after complete records too
    first = tmp_path / "first.jsonl"
    _write(src, ROWS[:1])
    assert _detect(src, first) == 0
    first.write_bytes(first.read_bytes() + content)
    before = first.read_bytes()
    _write(src, ROWS)
    assert _detect(src, first) == 2 and first.read_bytes() == before


def test_any_cut_of_the_record_being_written_resumes(tmp_path, stand_in, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [*ROWS, {"id": "é", "text": "Café au lait. Ünïcode here."}]
    _write(src, rows)
    assert _detect(src, out) == 0
    whole = out.read_bytes()
    last = whole[whole.rfind(b"\n", 0, len(whole) - 1) + 1 :]
    done = whole[: len(whole) - len(last)]
    # cuts all along the last record, inside a two-byte character too
    split = last.index("é".encode()) + 1
    for cut in sorted({*range(1, len(last) - 1, 13), split}):
        out.write_bytes(done + last[:cut])
        assert _detect(src, out) == 0, cut
        assert out.read_bytes() == whole
    capsys.readouterr()


def test_a_real_earlier_run_resumes(tmp_path, stand_in, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, ROWS[:2])
    assert _detect(src, out) == 0
    first = out.read_text()
    out.write_text(first + first.splitlines()[0][:20])  # a record cut by a crash
    _write(src, ROWS)  # and a line appended since
    assert _detect(src, out) == 0
    assert "2 records already in" in capsys.readouterr().err
    lines = out.read_text().splitlines()
    assert out.read_text().startswith(first) and [json.loads(x)["line"] for x in lines] == [1, 2, 3]
    assert _detect(src, out) == 0 and stand_in == [1, 1]  # nothing left: no model loaded


def test_a_second_run_on_the_same_output_stops_at_once(tmp_path, stand_in, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, ROWS)
    with ResumableWriter(out):
        assert _detect(src, out) == 2
    err = capsys.readouterr().err
    assert "is being written by another run right now" in err and stand_in == []
    assert out.read_text() == ""


def test_an_output_that_cannot_be_written_is_one_line(tmp_path, stand_in, capsys):
    src = tmp_path / "in.jsonl"
    _write(src, ROWS)
    assert _detect(src, tmp_path) == 2  # a folder
    assert capsys.readouterr().err.strip() == f"error: {tmp_path}: Is a directory"
    locked = tmp_path / "read-only.jsonl"
    locked.write_text("")
    locked.chmod(0o444)
    # root writes anyway, unless the file is immutable
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(locked)]).returncode:
        pytest.skip("cannot make a file read-only for root here (chattr +i failed)")
    try:
        assert _detect(src, locked) == 2
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {locked}: ") and len(err.splitlines()) == 1
    assert "Permission denied" in err or "Operation not permitted" in err


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(LINES, min_size=1, max_size=6))
def test_detect_writes_one_strict_record_per_input_line(tmp_path_factory, stand_in, lines):
    folder = tmp_path_factory.mktemp("run")
    src, out = folder / "in.jsonl", folder / "out.jsonl"
    content = "\n".join(lines) + "\n"
    src.write_bytes(content.encode("utf-8", "surrogatepass"))
    assert cli.main(["detect", "--input", str(src), "--output", str(out), "--quiet"]) in (0, 1, 3)
    written = [_strict(line) for line in out.read_text(encoding="utf-8").split("\n")[:-1]]
    # every line, blank ones too (the last piece of the cut is what follows the last line end)
    expected = list(range(1, len(_cut(content))))
    assert [r["line"] for r in written] == expected
    for row in written:
        assert row["status"] in ("ok", "too_short", "unsupported", "error")


def test_every_input_line_gets_a_record_blank_ones_too(tmp_path, stand_in, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [json.dumps(ROWS[0]), "", "   \t", json.dumps(ROWS[1]), ""]
    src.write_text("\n".join(lines) + "\n")  # five lines, the last one blank too
    assert _detect(src, out) == 3  # some lines failed
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5]
    blank = [r for r in records if r["status"] == "error"]
    assert [r["line"] for r in blank] == [2, 3, 5]
    assert all(r["error"] == f"line {r['line']} is blank" for r in blank)
    assert "detect: 2 scored, 3 failed" in capsys.readouterr().err
    assert _detect(src, out) == 3  # and they resume like any other record, still failed
    assert "5 records already in" in capsys.readouterr().err


def test_a_fixed_line_is_redone_in_place_and_the_exit_status_says_what_failed(
    tmp_path, stand_in, capsys
):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    broken = '{"id": 1, "text": "Tab\there. Then more."}'  # a raw tab inside a string
    lines = [json.dumps(ROWS[0]), broken, json.dumps(ROWS[2])]
    src.write_text("\n".join(lines) + "\n")
    assert _detect(src, out) == 3  # 0: every line done, 3: some failed, 1: every line failed
    failed = json.loads(out.read_text().splitlines()[1])
    # the whole message, with where the line went wrong
    assert failed["error"] == "line 2 is not valid JSON: Invalid control character at column 23"
    capsys.readouterr()
    lines[1] = json.dumps(ROWS[1])  # fixed, with its id, and the run again
    src.write_text("\n".join(lines) + "\n")
    assert _detect(src, out) == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["line"], r["id"], r["status"]) for r in records] == [
        (1, 0, "ok"),
        (2, 1, "ok"),
        (3, 2, "ok"),
    ]
    assert "redoing 1 failed record" in capsys.readouterr().err and len(stand_in) == 2
    # a record that did not fail is never redone: a changed text there is refused as before
    src.write_text(src.read_text().replace("Sentence 2", "Changed 2"))
    assert _detect(src, out) == 2
    assert "another 'text'" in capsys.readouterr().err


def test_every_line_failed_exits_with_1(tmp_path, stand_in):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("{not json\n[1]\n")
    assert _detect(src, out) == 1


def test_ctrl_c_says_in_one_line_what_was_written_and_exits_130(tmp_path, monkeypatch, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, ROWS)
    detector = _detector()
    calls = []
    detect_batch = detector.detect_batch

    def pressed_on_the_second_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return detect_batch(*args, **kwargs)

    monkeypatch.setattr(detector, "detect_batch", pressed_on_the_second_batch)
    monkeypatch.setattr(records, "build_detector", lambda cfg: detector)  # --input
    monkeypatch.setattr(commands, "build_detector", lambda cfg: detector)  # --text
    argv = ["detect", "--input", str(src), "--output", str(out), "--batch_size", "1", "--quiet"]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert err == (
        f"interrupted: 1 record written to {out} (1 of 3 input lines done); "
        "rerun the same command to resume\n"
    )
    assert [json.loads(x)["line"] for x in out.read_text().splitlines()] == [1]
    assert cli.main(argv) == 0  # the rerun resumes
    assert [json.loads(x)["line"] for x in out.read_text().splitlines()] == [1, 2, 3]
    assert "1 records already in" in capsys.readouterr().err
    # a command with nothing to resume says so
    monkeypatch.setattr(
        detector, "detect", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert cli.main(["detect", "--text", "One. Two.", "--quiet"]) == 130
    assert capsys.readouterr().err == "interrupted: nothing was written\n"


def test_ctrl_c_just_after_a_record_reached_the_file_counts_that_record(
    tmp_path, monkeypatch, capsys
):
    # Ctrl-C can land inside the writer's call, after the record is in the file and before the
    # loop counts it (say, during fsync): the message must count what the file holds.
    from ksemstamp.io import ResumableWriter

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, ROWS)
    detector = _detector()
    monkeypatch.setattr(records, "build_detector", lambda cfg: detector)
    write = ResumableWriter.write
    calls = []

    def pressed_once_the_second_record_is_written(self, record):
        write(self, record)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(ResumableWriter, "write", pressed_once_the_second_record_is_written)
    argv = ["detect", "--input", str(src), "--output", str(out), "--batch_size", "1", "--quiet"]
    assert cli.main(argv) == 130
    assert [json.loads(x)["line"] for x in out.read_text().splitlines()] == [1, 2]
    assert capsys.readouterr().err == (
        f"interrupted: 2 records written to {out} (2 of 3 input lines done); "
        "rerun the same command to resume\n"
    )


def test_detect_file_reads_at_most_the_limit(tmp_path, stand_in, capsys):
    import tracemalloc

    big = tmp_path / "big.txt"
    with open(big, "wb") as handle:
        handle.truncate(50_000_000)  # 50 MB of NUL bytes, sparse on disk
    tracemalloc.start()
    try:
        code = cli.main(
            ["detect", "--file", str(big), "--limits.max_text_chars", "1000", "--quiet"]
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err.strip()
    assert code == 1 and peak < 5_000_000  # read: the limit and one character more
    assert (
        err
        == f"error: {big} has more than 1,000 characters; the limit is 1,000 (limits.max_text_chars)"
    )
    assert stand_in == []  # refused before any model loads
    if os.path.exists("/dev/zero"):  # endless: only a bounded read ends
        assert cli.main(["detect", "--file", "/dev/zero", "--quiet"]) == 1
        assert "more than 200,000 characters" in capsys.readouterr().err
    small = tmp_path / "small.txt"
    small.write_text("\ufeff" + ROWS[0]["text"])
    assert cli.main(["detect", "--file", str(small), "--quiet"]) == 0
    assert "Sentence 0 is here." in capsys.readouterr().out


def test_control_characters_of_a_text_never_reach_the_terminal(stand_in, capsys):
    text = "Clear \x1b[2Jthe screen. Ring\x07 the bell.\rAnd \x9b more."
    assert cli.main(["detect", "--text", text, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\x9b" not in out
    assert "Clear \\x1b[2Jthe screen." in out and "\\x07" in out


@pytest.mark.parametrize("quiet", [["--quiet"], []])
def test_every_command_silences_the_model_loading_bars(stand_in, monkeypatch, quiet):
    import warnings

    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Hub's bars may be off for the process already
        hf_logging.enable_progress_bar()
    assert cli.main(["detect", "--text", "One. Two.", *quiet]) == 0
    assert not hf_logging.is_progress_bar_enabled()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # for what loads transformers later


def test_figures_are_saved_as_small_palette_pngs(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from ksemstamp.plots import save_figure

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [0, 1, 4], label="a")
    ax.legend()
    path = tmp_path / "plots" / "figure.png"
    save_figure(fig, path, dpi=80)
    plt.close(fig)
    image = Image.open(path)
    assert image.format == "PNG" and image.mode == "P" and image.size == (320, 240)
    assert [p.name for p in path.parent.iterdir()] == ["figure.png"]  # no temporary file left


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_a_device_that_keeps_nothing_is_refused_before_any_model_loads(
    tmp_path, stand_in, capsys, device
):
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    src = tmp_path / "in.jsonl"
    _write(src, ROWS)
    assert _detect(src, device) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: --output {device} is a device, not a file: the records written there would "
        "not be kept, nor could a rerun resume from them. Give a file"
    )
    assert stand_in == []


def test_a_pipe_takes_the_records(tmp_path, stand_in):
    import threading

    src, pipe = tmp_path / "in.jsonl", tmp_path / "pipe"
    _write(src, ROWS)
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()))
    reader.start()
    assert _detect(src, pipe) == 0
    reader.join(30)
    lines = got[0].decode().splitlines()
    assert [json.loads(x)["line"] for x in lines] == [1, 2, 3]


def test_a_missing_output_folder_is_created_and_said(tmp_path, stand_in, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "new" / "dir" / "out.jsonl"
    _write(src, ROWS)
    assert _detect(src, out) == 0
    assert f"created the folder {out.parent} for out.jsonl" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 3
    assert _detect(src, out) == 0  # there now: nothing to say
    assert "created the folder" not in capsys.readouterr().err


def test_a_record_s_chat_and_prompt_must_have_their_types(tmp_path, stand_in):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [
        {"text": "One. Two.", "chat": "yes"},
        {"text": "One. Two.", "chat": 1},
        {"text": "One. Two.", "prompt": ["a"]},
        {"text": "One. Two.", "chat": True, "prompt": None},
    ]
    _write(src, rows)
    assert _detect(src, out) == 3
    errors = [json.loads(x).get("error") for x in out.read_text().splitlines()]
    assert errors == [
        "'chat' must be true or false, got str",
        "'chat' must be true or false, got int",
        "'prompt' must be a string or null, got list",
        None,
    ]


def test_a_record_made_under_other_identity_settings_says_so_and_strict_refuses_it(
    tmp_path, monkeypatch, capsys
):
    from ksemstamp.detection.inputs import identity_fields
    from ksemstamp.settings import DirectionSettings, WatermarkSettings
    from ksemstamp.settings.identity import identity_of

    here = identity_of(WatermarkSettings(mark=DirectionSettings(units="sentences")), "enc", "c1")
    there = identity_of(WatermarkSettings(), "enc", "c1")  # clause units, the default
    detector = _detector()
    detector.scheme.identity = here
    monkeypatch.setattr(records, "build_detector", lambda cfg: detector)
    text = "Sentence one is here. And another follows."
    rows = [
        {"id": "same", "text": text, **identity_fields(here)},
        {"id": "clauses", "text": text, **identity_fields(there)},
        {"id": "old", "text": text},  # made before records carried an identity
    ]
    src, out, strict = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "strict.jsonl"
    _write(src, rows)
    assert cli.main(["detect", "--input", str(src), "--output", str(out), "--quiet"]) == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["status"] for r in got] == ["ok", "ok", "ok"]
    assert "identity_mismatch" not in got[0] and "identity_mismatch" not in got[2]
    assert got[1]["identity_mismatch"] == ["mark.units"]
    assert got[1]["identity_differences"] == "mark.units: clauses there, sentences here"
    err = capsys.readouterr().err
    assert err.count("made under other identity settings") == 1 and "--strict" in err
    argv = ["detect", "--input", str(src), "--output", str(strict), "--quiet", "--strict"]
    assert cli.main(argv) == 3  # two lines failed, the first is scored
    got = [json.loads(x) for x in strict.read_text().splitlines()]
    # Under --strict a record must show the identity it was made under: an older record
    # without one is refused too.
    assert [r["status"] for r in got] == ["ok", "error", "error"]
    assert got[1]["error"].startswith(
        "made under other identity settings than it would be scored with (mark.units: clauses "
        "there, sentences here); refused under --strict"
    )
    assert got[2]["error"].startswith("made under identity settings it does not show (no identity)")
    err = capsys.readouterr().err.strip().splitlines()
    refused = [line for line in err if line.startswith("refused:")]
    assert refused == [
        f'refused: line 2 (id "clauses"): {got[1]["error"]}',
        f'refused: line 3 (id "old"): {got[2]["error"]}',
    ]


@pytest.mark.parametrize("differs", ["key", "units"])
def test_a_resume_under_another_key_or_identity_is_refused_unless_told(
    tmp_path, monkeypatch, capsys, differs
):
    """A new shell without the run's key (or with other units) resuming a generate run would
    mix two marks in one file: refused in one line naming what differs, before any model loads;
    ``--mixed true`` goes on."""
    from types import SimpleNamespace

    from ksemstamp.keys import key_fingerprint
    from ksemstamp.results import GenerationResult
    from ksemstamp.settings.identity import identity_of

    built = []

    def watermarker(cfg):
        built.append(cfg)
        scheme = SimpleNamespace(
            key_fingerprint=key_fingerprint(cfg.key),
            identity=identity_of(cfg, "enc", "c1"),
            encoder=None,
            partition=None,
        )
        texts = lambda prompts, watermark: [  # noqa: E731
            GenerationResult(prompt=p, text="One. Two.") for p in prompts
        ]
        return SimpleNamespace(scheme=scheme, generate=texts, engine=SimpleNamespace(model=None))

    monkeypatch.setattr(records, "build_watermarker", watermarker)
    monkeypatch.setattr(records, "length_note", lambda res, cfg: None)
    monkeypatch.setenv("KSEMSTAMP_KEY", "the-first-run-key")
    src, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": i, "prompt": f"Prompt {i}."} for i in range(3)])
    argv = ["generate", "--input", str(src), "--output", str(out), "--quiet"]
    assert cli.main(argv) == 0
    out.write_text(out.read_text().splitlines(keepends=True)[0])  # an interrupted run
    again = [*argv, "--mark.units", "sentences"] if differs == "units" else argv
    if differs == "key":
        monkeypatch.setenv("KSEMSTAMP_KEY", "another-key-in-a-new-shell")
    built.clear()
    assert cli.main(again) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    said = "another key (fingerprint" if differs == "key" else "mark.units clauses"
    assert said in err and "--mixed true" in err and not built
    assert len(out.read_text().splitlines()) == 1  # nothing written
    assert cli.main([*again, "--mixed", "true"]) == 0
    assert len(out.read_text().splitlines()) == 3


@pytest.mark.parametrize("detected", [True, False])
def test_the_demo_tells_one_story_about_a_short_text(monkeypatch, capsys, detected):
    """A short text's note comes after the verdict and agrees with it (it once forecast "not
    watermarked" above a detection that said watermarked)."""
    from types import SimpleNamespace

    from ksemstamp.results import GenerationResult, SentenceRecord

    units = [SentenceRecord(text=f"Clause {i}.", region=0, candidates=1) for i in range(3)]
    res = GenerationResult(prompt="p", text="Clause 0. Clause 1. Clause 2.", sentences=units)
    verdict = SimpleNamespace(watermarked=detected)
    monkeypatch.setattr(commands, "news_prompt", lambda *a: "A prompt.")
    monkeypatch.setattr(commands, "build_scheme", lambda cfg: None)
    monkeypatch.setattr(
        commands,
        "build_watermarker",
        lambda cfg, s: SimpleNamespace(generate=lambda *a, **k: [res]),
    )
    monkeypatch.setattr(
        commands,
        "build_detector",
        lambda cfg, s: SimpleNamespace(detect=lambda *a: verdict, mark=None),
    )
    monkeypatch.setattr(commands, "format_detection", lambda r, m, u: "VERDICT")
    assert cli.main(["demo", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "VERDICT" in out and "will likely" not in err
    note = [line for line in err.splitlines() if line.startswith("note:")]
    said = "detected this time, but 3 scored clauses" if detected else "not detected: 3 scored"
    assert len(note) == 1 and said in note[0] and "--sampling.max_new_tokens" in note[0]
