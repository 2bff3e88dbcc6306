"""JSONL reading and atomic writes."""

import json

import pytest

from ksemstamp.io import (
    ResumableWriter,
    atomic_target,
    drop_cut_last_line,
    write_json_atomic,
    write_jsonl_atomic,
)
from ksemstamp.jsonl import InputRecord, read_jsonl, read_jsonl_objects


def test_reader_ignores_a_cut_last_line_only(tmp_path):
    path = tmp_path / "r.jsonl"
    write_jsonl_atomic(path, [{"id": 1}, {"id": 2}])
    with path.open("a") as f:
        f.write('{"id": 3, "te')
    assert read_jsonl_objects(path) == [{"id": 1}, {"id": 2}]
    path.write_text('{"id": 1}\n{broken\n{"id": 2}\n')
    with pytest.raises(ValueError, match=":2 is not valid JSON"):
        read_jsonl_objects(path)
    assert read_jsonl_objects(path, skip_invalid=True) == [{"id": 1}, {"id": 2}]
    path.write_text('[1, 2]\n{"id": 2}\n')
    with pytest.raises(ValueError, match="not a JSON object"):
        read_jsonl_objects(path)
    with pytest.raises(FileNotFoundError):
        read_jsonl_objects(tmp_path / "missing.jsonl")
    assert read_jsonl_objects(tmp_path / "missing.jsonl", missing_ok=True) == []


def test_drop_cut_last_line_truncates_in_place(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\n{"id": 2')
    assert drop_cut_last_line(path) == b'{"id": 1}\n'
    assert path.read_text() == '{"id": 1}\n'
    assert drop_cut_last_line(tmp_path / "missing") == b""


def test_atomic_write_replaces_or_keeps_the_old_file(tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json_atomic(path, {"b": 1, "a": [1]})
    assert json.loads(path.read_text()) == {"a": [1], "b": 1}
    with pytest.raises(RuntimeError), atomic_target(path) as tmp:
        assert tmp.suffix == ".json" and tmp.parent == path.parent
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert json.loads(path.read_text()) == {"a": [1], "b": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_reader_skips_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 1, "text": "A."}\n{"id": 2, "text": "B."}\n')
    records = list(read_jsonl(path))
    assert [(r.line, r.error, r.data) for r in records] == [
        (1, None, {"id": 1, "text": "A."}),
        (2, None, {"id": 2, "text": "B."}),
    ]


def test_resume_keys_on_the_input_line_so_repeated_ids_are_each_done_once(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"id": "a"}, {"id": "b"}, {"id": "b"}, {"x": 1}, {"id": "a"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = list(read_jsonl(src))
    # A first run wrote lines 1 and 2, then was killed while writing line 3.
    with ResumableWriter(out) as writer:
        for rec in records[:2]:
            writer.write({**rec.data, "line": rec.line})
    with out.open("a") as handle:
        handle.write('{"id": "b", "li')
    with ResumableWriter(out) as writer:
        todo = [r.line for r in records if not writer.is_done(r)]
        assert todo == [3, 4, 5]  # line 3 shares its id with line 2 and is still to do
        assert writer.has_id("b") and not writer.has_id("c")
        for rec in records:
            if rec.line in todo:
                writer.write({**rec.data, "line": rec.line})
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in written] == [1, 2, 3, 4, 5]  # none lost, none twice
    with ResumableWriter(out) as writer:
        assert all(writer.is_done(r) for r in records)


def test_resume_refuses_an_input_that_changed_under_the_output(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "line": 1}\n')
    with ResumableWriter(out) as writer:
        assert writer.is_done(InputRecord(1, {"id": "a"}))
        with pytest.raises(ValueError, match='input line 1 has id "a".*now has id "z"'):
            writer.is_done(InputRecord(1, {"id": "z"}))
        assert not writer.is_done(InputRecord(2, {"id": "a"}))
