"""JSONL reading and atomic writes."""

import json

import pytest

from ksemstamp.io import (
    atomic_target,
    drop_cut_last_line,
    read_jsonl_objects,
    write_json_atomic,
    write_jsonl_atomic,
)


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
