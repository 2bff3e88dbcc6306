"""The command line and its JSONL contract, in-process, on the real offline models."""

import json
from types import SimpleNamespace

import pytest

from ksemstamp.cli import main
from ksemstamp.io import ResumableWriter
from ksemstamp.jsonl import read_jsonl

pytestmark = pytest.mark.e2e

# A fixed seed: a resumed record must be the text the first run wrote.
FAST = ["--sampling.max_new_tokens", "12", "--search.max_candidates", "3", "--sampling.seed", "0"]
FAST += ["--quiet"]
PROMPTS = [
    {"id": "a", "prompt": "The storm hit the coast on Friday. Thousands lost power.", "extra": 1},
    {"id": "b", "prompt": "The company reported higher profits. Its shares rose."},
]


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_generate_then_detect_jsonl(tmp_path):
    src, out, det = tmp_path / "p.jsonl", tmp_path / "g.jsonl", tmp_path / "d.jsonl"
    bad = [
        "{not json",
        "[1, 2]",
        {"id": "c"},
        {"id": "d", "prompt": 5},
        {"id": "e", "prompt": "x" * 200_001},
    ]
    # A prompt that ends mid-sentence is completed first; the record says which part.
    unfinished = {"id": "f", "prompt": "The storm hit the coast on Friday and"}
    _write(src, PROMPTS + bad + [unfinished])
    # 3: some lines failed (0 when every line is done, 1 when none is)
    assert main(["generate", "--input", str(src), "--output", str(out), *FAST]) == 3
    rows = {r.get("id", r["line"]): r for r in _lines(out)}
    assert len(rows) == 8
    for key in ("a", "b"):
        r = rows[key]
        assert r["status"] == "ok" and r["text"] and r["prompt"] == PROMPTS[ord(key) - 97]["prompt"]
        assert {"num_sentences", "candidates", "fallbacks", "key_fingerprint"} <= set(r)
        assert r["num_sentences"] >= 1 and 1 <= r["candidates"] <= 3 * r["num_sentences"]
        # a short text (12 tokens) says how many units it holds and how many detection needs
        if r["num_sentences"] < 4:
            assert r["scored_units"] == r["num_sentences"] and r["units_needed"] == 4
    assert rows["a"]["extra"] == 1
    for key in (3, 4, "c", "d", "e"):
        assert rows[key]["status"] == "error" and rows[key]["error"]
    assert "the limit is 200,000" in rows["e"]["error"]
    f = rows["f"]
    assert f["status"] == "ok" and f["text"].startswith(f["completion"]) and f["completion"]
    assert "KSEMSTAMP_KEY" not in out.read_text() and "test-suite-key" not in out.read_text()

    # detect: the generated records plus more bad lines
    gen_rows = [r for r in _lines(out) if r["status"] == "ok"]
    other_key = {**gen_rows[0], "id": "wrong-key", "key_fingerprint": "000000000000"}
    extra = [
        {"id": "empty", "text": ""},
        {"id": "no-text"},
        {"id": "num", "text": 3},
        "oops",
        other_key,
    ]
    _write(src, gen_rows + extra)
    assert main(["detect", "--input", str(src), "--output", str(det), "--quiet"]) == 3
    got = {r.get("id", r["line"]): r for r in _lines(det)}
    assert got["a"]["status"] == "ok" and got["a"]["num_scored"] >= 1
    assert {"z_score", "p_value", "num_scored", "num_valid", "status"} <= set(got["a"])
    assert got["empty"]["status"] == "too_short" and got["empty"]["z_score"] is None
    assert got["no-text"]["status"] == "error" and got["num"]["status"] == "error"
    assert got[len(gen_rows) + 4]["status"] == "error"  # the "oops" line
    assert got["wrong-key"]["status"] == "error" and "different key" in got["wrong-key"]["error"]
    # detection cuts the completed record as it was generated
    assert got["f"]["completion"] == rows["f"]["completion"]
    assert got["f"]["regions"] == rows["f"]["regions"] and got["f"]["num_scored"] >= 1


def test_generate_resumes_without_loss_or_duplicates(tmp_path):
    src, out = tmp_path / "p.jsonl", tmp_path / "g.jsonl"
    _write(src, PROMPTS)
    assert main(["generate", "--input", str(src), "--output", str(out), *FAST]) == 0
    first = _lines(out)
    # simulate a run killed while writing the second record
    text = out.read_text().splitlines(keepends=True)
    out.write_text(text[0] + text[1][: len(text[1]) // 2])
    assert main(["generate", "--input", str(src), "--output", str(out), *FAST]) == 0
    second = _lines(out)
    assert [r["id"] for r in second] == ["a", "b"]
    # same seed and prompt: the redone record is the same text, whatever else was in its batch;
    # its sentence scores agree up to float rounding (the encoder pads a batch to its longest
    # sentence, so an embedding depends on its batch in the last digits)
    for a, b in zip(first, second, strict=True):
        a.pop("seconds"), b.pop("seconds")
        assert a.pop("scores") == pytest.approx(b.pop("scores"), abs=1e-5)
        assert a == b


def test_all_bad_input_exits_nonzero(tmp_path):
    src, out = tmp_path / "p.jsonl", tmp_path / "g.jsonl"
    _write(src, ["garbage", {"id": 1}])
    assert main(["generate", "--input", str(src), "--output", str(out), *FAST]) == 1
    assert len(_lines(out)) == 2


def test_text_mode_and_settings(tmp_path, capsys):
    assert main(["detect", "--text", "One sentence. Two sentences. Three.", "--quiet"]) == 0
    assert "z =" in capsys.readouterr().out
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mark: {kind: region, gamma: 0.5}\nsearch: {margin: 0.01}\n")
    assert main(["detect", "--config", str(cfg), "--search.margin", "0.02", "--print_config"]) == 0
    printed = capsys.readouterr().out
    assert "gamma: 0.5" in printed and "margin: 0.02" in printed and "\nkey:" not in printed
    with pytest.raises(SystemExit):
        main(["detect", "--mark.kind", "region", "--mark.gamma", "2", "--text", "x"])


def test_resumable_writer_repairs_partial_line(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text('{"id": 1, "line": 1}\n{"id": 2, "li')
    with ResumableWriter(path) as w:
        assert w.done_ids == {"1"}
        w.write({"id": 2, "line": 2})
    assert [r.data["id"] for r in read_jsonl(path)] == [1, 2]


def test_build_time_setting_errors_are_one_line(tmp_path, capsys):
    # gamma * K (the region mark's valid sets) is only checked once the centroids (K) are known
    region = ["--mark.kind", "region", "--mark.gamma", "0.3"]
    assert main(["detect", *region, "--text", "One. Two. Three."]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "gamma" in err and "Traceback" not in err
    missing = tmp_path / "nope.pt"
    assert main(["detect", "--partition.centroids", str(missing), "--text", "One. Two."]) == 2
    assert "centroid file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_exit_130_and_the_rerun_resumes(tmp_path):
    # A real SIGINT, as Ctrl-C in a terminal sends it, in the middle of a real run.
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    src, out = tmp_path / "texts.jsonl", tmp_path / "out.jsonl"
    count = 400
    texts = [f"Record {i} opens here. It goes on for a while. Then it ends." for i in range(count)]
    _write(src, [{"id": i, "text": t} for i, t in enumerate(texts)])
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, str(root / "watermark.py"), "detect", "--input", str(src)]
    argv += ["--output", str(out), "--batch_size", "1", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # The child gets the default SIGINT disposition: a suite started in the background (`make
    # test &`) ignores SIGINT, children inherit that, and Python then never raises
    # KeyboardInterrupt.
    run = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while (not out.exists() or out.read_text().count("\n") < 3) and time.monotonic() < deadline:
        assert run.poll() is None, run.stderr.read()
        time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    err = run.communicate(timeout=120)[1]
    written = out.read_text().count("\n")
    assert run.returncode == 130 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: ") and "rerun the same command to resume" in last
    assert f"({written:,} of {count:,} input lines done)" in last
    assert 3 <= written < count and out.read_text().endswith("\n")  # whole records only
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and f"{written} already done" in done.stderr
    assert [r["line"] for r in _lines(out)] == list(range(1, count + 1))


def test_every_stderr_line_is_one_write(monkeypatch):
    """The processes of a multi-device run share stderr, unbuffered: a line written in two
    parts (text, then its break) can get another process's line spliced in between."""
    import logging
    import sys
    import warnings

    from ksemstamp.cli.console import console_output, print_err

    writes = []
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(write=writes.append, flush=lambda: None))
    with console_output():
        logging.getLogger("ksemstamp.parallel").info("rank 0/2: models on cpu: encoder")
        warnings.warn("a deprecated spelling", stacklevel=1)
        print_err("error: one line")
    assert writes == [
        "rank 0/2: models on cpu: encoder\n",
        "warning: a deprecated spelling\n",
        "error: one line\n",
    ]
