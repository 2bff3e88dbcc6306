"""Whatever a user's JSONL holds, every line becomes one record or one error, and every record
is written back as strict JSON; an output is never the input, nor another file, nor shared."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ksemstamp.io import OutputLocked, ResumableWriter, earlier_output_problem, json_line
from ksemstamp.jsonl import MAX_DEPTH, InputRecord, parse_jsonl, read_jsonl

ANY_CHAR = st.characters(codec=None, categories=None)  # lone surrogates included
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(ANY_CHAR, max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)
# Lines as users write them: JSON of any value (NaN, surrogates and all), or anything at all.
LINES = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v)),
    st.dictionaries(st.sampled_from(["id", "text", "prompt", "x"]), JSON_VALUES).map(json.dumps),
    st.text(ANY_CHAR, max_size=30),
)
PROPERTY = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _strict(line: str):
    """Parse ``line`` as RFC 8259 JSON: no NaN, no Infinity."""

    def refuse(name):
        raise AssertionError(f"{name} in output")

    return json.loads(line, parse_constant=refuse)


def _cut(content: str) -> list[str]:
    """The lines of ``content`` as the readers cut them (``\\n``, ``\\r\\n``, ``\\r``)."""
    return content.replace("\r\n", "\n").replace("\r", "\n").split("\n")


@PROPERTY
@given(st.lists(LINES, max_size=8))
def test_every_line_is_one_record_or_one_error(tmp_path, lines):
    content = "\n".join(lines) + "\n"
    path = tmp_path / "in.jsonl"
    path.write_bytes(content.encode("utf-8", "surrogatepass"))
    records = list(read_jsonl(path))
    # Surrogates in the raw bytes are not UTF-8: they read as U+FFFD, never as an exception.
    assert [r.line for r in records] == list(range(1, len(_cut(content))))  # blank ones too
    for rec in records:
        assert (rec.data is None) != (rec.error is None)
        if rec.error:
            assert rec.error.startswith(f"line {rec.line} ") and "\n" not in rec.error
        else:
            assert _strict(json_line(rec.data)) == rec.data  # written back, read back the same


@PROPERTY
@given(st.lists(LINES, max_size=8))
def test_the_page_and_the_command_line_cut_lines_alike(tmp_path, lines):
    content = "\u2028".join(lines[:2]) + "\n" + "\r\n".join(lines[2:]) + "\x85\n"
    path = tmp_path / "in.jsonl"
    path.write_text(content, encoding="utf-8", errors="replace", newline="")
    from_file = [(r.line, r.data, r.error) for r in read_jsonl(path)]
    from_page = [
        (r.line, r.data, r.error) for r in parse_jsonl(path.read_bytes().decode("utf-8-sig"))
    ]
    assert from_page == from_file


def test_lines_are_cut_at_line_feeds_not_at_unicode_separators():
    text = '{"text": "one\u2028two\x85three"}\r\n{"text": "b"}\r{"text": "c"}\n'
    records = parse_jsonl(text)
    assert [r.data["text"] for r in records] == ["one\u2028two\x85three", "b", "c"]
    assert [r.line for r in records] == [1, 2, 3]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"text": "a", "n": ' + "9" * 5000 + "}", "integer of 5,000 digits"),
        ('{"text": "a", "n": -' + "9" * 5000 + "}", "integer of 5,000 digits"),
        ('{"text": "a", "n": ' + "[" * 100_000 + "]" * 100_000 + "}", "levels deep"),
        ('{"n": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}", "levels deep"),
        ('{"text": "a", "score": NaN}', "NaN is not a JSON number"),
        ('{"text": "a", "score": -Infinity}', "-Infinity is not a JSON number"),
        ('{"text": "a", "score": 1e400}', "out of range"),
    ],
)
def test_a_line_that_cannot_be_read_is_its_own_error(line, reason):
    records = parse_jsonl(f'{{"text": "before"}}\n{line}\n{{"text": "after"}}\n')
    assert [r.data for r in records[::2]] == [{"text": "before"}, {"text": "after"}]
    assert records[1].data is None and reason in records[1].error
    assert records[1].error.startswith("line 2 ")


def test_nesting_up_to_the_limit_is_read():
    depth = MAX_DEPTH - 1
    (record,) = parse_jsonl('{"n": ' + "[" * depth + "]" * depth + "}\n")
    assert record.error is None


def test_records_are_written_as_strict_json_whatever_they_hold():
    record = {"text": "a\ud800b", "\udfff": [float("nan"), float("inf"), 1.5], "s": "\u2028"}
    line = json_line(record)
    assert line.encode("utf-8")  # no lone surrogate left raw
    assert _strict(line) == {"text": "a\ud800b", "\udfff": [None, None, 1.5], "s": "\u2028"}


def test_a_second_writer_on_the_same_output_stops_at_once(tmp_path):
    out = tmp_path / "out.jsonl"
    with ResumableWriter(out) as first:
        first.write({"line": 1, "status": "ok"})
        with pytest.raises(OutputLocked, match="being written by another run"):
            ResumableWriter(out)
        # another process is refused too (the lock is the operating system's)
        code = (
            "import sys; from ksemstamp.io import ResumableWriter\n"
            "try:\n    ResumableWriter(sys.argv[1])\nexcept ValueError as e:\n"
            "    print(e); sys.exit(3)\n"
        )
        other = subprocess.run(
            [sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=60
        )
        assert other.returncode == 3 and "another run" in other.stdout
    with ResumableWriter(out) as again:  # released with the first
        assert 1 in again.done_lines
    assert out.read_text().count("\n") == 1


def test_an_existing_file_is_checked_before_it_is_touched(tmp_path):
    out = tmp_path / "essay.txt"
    out.write_text("My essay.\nIts last line, without a line end")
    before = out.read_bytes()

    def refuse(rows, tail):
        assert rows == [None] and tail == b"Its last line, without a line end"  # all of it
        raise ValueError("not an output")

    with pytest.raises(ValueError, match="not an output"):
        ResumableWriter(out, accept=refuse)
    assert out.read_bytes() == before  # not even the unfinished last line was cut


INPUTS = [InputRecord(1, {"id": "a", "text": "One."}), InputRecord(2, None, "line 2 is bad")]


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ([], None),
        ([{"id": "a", "text": "One.", "line": 1, "status": "ok", "z": 1}], None),
        ([{"line": 2, "status": "error", "z": None}], None),
        ([None], "line 1 is not a JSON object"),
        ([{"id": "a", "text": "One."}], "has no line, status"),
        ([{"id": "a", "text": "One.", "line": 1, "status": "ok"}], "has no z"),
        ([{"id": "a", "text": "Other.", "line": 1, "status": "ok", "z": 1}], "another 'text'"),
        ([{"id": "b", "text": "One.", "line": 1, "status": "ok", "z": 1}], "another 'id'"),
        ([{"line": 3, "status": "ok", "z": 1}], "input line 3, which the input does not have"),
    ],
)
def test_an_earlier_output_must_match_the_command_and_its_input(rows, problem):
    found = earlier_output_problem(rows, INPUTS, "text", ["z"])
    assert found is None if problem is None else problem in found


@pytest.mark.parametrize(
    ("tail", "safe"),
    [
        (b"", True),
        (b"{", True),
        (b'{"id": "a", "te', True),  # cut inside the input's fields
        (b'{"id": "a", "text": "One.", "line": 1, "status": "o', True),  # inside the result's
        (b'{"line": 2, "sta', True),  # the error record of a line that was not JSON
        (b'{"id": "b", "te', False),  # no input line has this id
        (b"notes without a line end", False),
        (b"\x00\x01\xff", False),
        (b" ", False),
    ],
)
def test_what_follows_the_last_line_break_must_start_a_record(tail, safe):
    found = earlier_output_problem([], INPUTS, "text", ["z"], tail)
    assert found is None if safe else "without a line break" in found
