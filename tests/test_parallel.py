"""Work over devices with Trainer.predict: models on each process's own device, shards merged
in input order, resumable; and generate/detect --input over two processes giving what one gives."""

import json
from types import SimpleNamespace

import pytest
import torch

from ksemstamp.cli import main
from ksemstamp.parallel import (
    DeviceMismatchError,
    DeviceSettings,
    Job,
    PredictModule,
    check_devices,
    run_jsonl,
)
from ksemstamp.records import RecordProcessor


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _as_rank(module, device: str, rank: int = 0, world: int = 1):
    """``module`` as if a trainer had given this process ``device``."""
    strategy = SimpleNamespace(root_device=torch.device(device))
    module._trainer = SimpleNamespace(world_size=world, global_rank=rank, strategy=strategy)
    return module


def test_each_process_builds_its_models_on_the_device_it_was_given():
    seen = []

    def factory(device):
        seen.append(device)
        return Job(lambda rows: rows, {"model": torch.nn.Linear(2, 2, device=device)})

    # `meta` stands in for an accelerator: whatever the trainer gives, the job is built there.
    module = _as_rank(PredictModule(factory, report=False), "meta")
    module.on_predict_start()
    assert seen == [torch.device("meta")]

    def global_setting(device):  # builds where a global setting says, not where it was told
        return Job(lambda rows: rows, {"lm": torch.nn.Linear(2, 2), "encoder": torch.nn.ReLU()})

    module = _as_rank(PredictModule(global_setting, report=False), "meta")
    with pytest.raises(DeviceMismatchError, match="lm on cpu"):
        module.on_predict_start()
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(DeviceMismatchError, match="m on cpu, meta"):
        check_devices({"m": mixed}, torch.device("meta"))


class Upper:
    """A picklable job factory: upper-cases each record's text and notes the lines it saw."""

    seen: list[int] = []

    def __call__(self, device):
        def process(records):
            Upper.seen.extend(r.line for r in records)
            return [{**r.data, "line": r.line, "text": r.data["text"].upper()} for r in records]

        return Job(process)


class StopsAtLine3:
    """A job factory whose run is stopped by Ctrl-C when it reaches input line 3."""

    def __call__(self, device):
        def process(records):
            if any(r.line == 3 for r in records):
                raise KeyboardInterrupt
            return [{**r.data, "line": r.line} for r in records]

        return Job(process)


def test_ctrl_c_over_devices_keeps_the_finished_batches_and_says_so(tmp_path, capsys):
    # Lightning ends a run stopped by Ctrl-C with exit status 1; the command still says in one
    # line what the shards hold, and exits with 130.
    from ksemstamp.cli.processors import PROCESSORS
    from ksemstamp.records import process_jsonl
    from ksemstamp.settings import WatermarkSettings

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": i, "text": f"t{i}"} for i in range(6)])
    args = SimpleNamespace(
        input=str(src),
        output=str(out),
        quiet=True,
        parallel=DeviceSettings(accelerator="cpu", devices=1),
    )
    options = dict(name="detect", unit="text", batch_size=2, option=False)
    with pytest.raises(KeyboardInterrupt) as stop:
        process_jsonl(
            args,
            WatermarkSettings(),
            processors=PROCESSORS,
            job=lambda *_: StopsAtLine3(),
            **options,
        )
    assert str(stop.value) == (
        f"2 records written to the shards beside {out} (2 of 6 input lines done); "
        "rerun the same command to resume"
    )
    assert "KeyboardInterrupt" not in capsys.readouterr().err  # nor Lightning's own notice


def test_run_jsonl_merges_in_input_order_and_resumes(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": i, "text": f"t{i}"} for i in range(6)])
    # An interrupted earlier run: line 2 in the output, line 5 in a shard it left behind.
    _write(out, [{"id": 1, "line": 2, "text": "T1"}])
    _write(tmp_path / "out.jsonl.shard1.jsonl", [{"id": 4, "line": 5, "text": "T4"}])
    Upper.seen = []
    settings = DeviceSettings(accelerator="cpu", devices=1)
    new, skipped = run_jsonl(src, out, Upper(), settings, batch_size=2, progress=False)
    assert sorted(Upper.seen) == [1, 3, 4, 6] and skipped == 2
    assert [r["line"] for r in new] == [1, 3, 4, 6]
    assert [(r["line"], r["text"]) for r in _lines(out)] == [(n, f"T{n - 1}") for n in range(1, 7)]
    assert not list(tmp_path.glob("*.shard*"))
    # Done: a rerun processes nothing. An input that changed under the output is refused.
    Upper.seen = []
    assert run_jsonl(src, out, Upper(), settings, 2, progress=False) == ([], 6)
    assert Upper.seen == []
    _write(src, [{"id": "other", "text": "x"}])
    with pytest.raises(ValueError, match="input changed"):
        run_jsonl(src, out, Upper(), settings, 2, progress=False)


def _stub_detect(cfg, progress=False):
    def process(datas):
        fields = {"p_value": None, "num_scored": 0, "num_valid": 0}  # as a detect record has
        return [{"status": "ok", "z_score": float(len(d["text"])), **fields} for d in datas]

    def check(data):
        return None if isinstance(data.get("text"), str) else "missing field 'text'"

    return RecordProcessor(check, process, {"z_score": None})


def test_detect_input_over_devices_writes_what_one_process_writes(tmp_path, monkeypatch, capsys):
    import ksemstamp.cli.processors

    monkeypatch.setitem(ksemstamp.cli.processors.PROCESSORS, "detect", _stub_detect)
    src = tmp_path / "in.jsonl"
    _write(src, [{"id": "a", "text": "abc"}, "not json", {"id": "b"}, {"id": "c", "text": "x"}])
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    # 3: some lines failed
    assert main(["detect", "--input", str(src), "--output", str(one), "--quiet"]) == 3
    flags = ["--parallel.accelerator", "cpu", "--parallel.devices", "1"]
    flags += ["--parallel.strategy", "auto"]
    assert main(["detect", "--input", str(src), "--output", str(many), "--quiet", *flags]) == 3
    assert _lines(one) == _lines(many)
    assert [r["status"] for r in _lines(many)] == ["ok", "error", "error", "ok"]
    # The failed lines fixed, a rerun over devices redoes them in place.
    _write(src, [{"id": "a", "text": "abc"}, {"id": "n", "text": "no"}, {"id": "b", "text": "b"},
                 {"id": "c", "text": "x"}])  # fmt: skip
    assert main(["detect", "--input", str(src), "--output", str(many), "--quiet", *flags]) == 0
    assert [(r["line"], r["status"], r["z_score"]) for r in _lines(many)] == [
        (1, "ok", 3.0),
        (2, "ok", 2.0),
        (3, "ok", 1.0),
        (4, "ok", 1.0),
    ]
    # Device settings spread --input files; one text is placed with --model.device instead.
    assert main(["detect", "--text", "One. Two.", "--parallel.devices", "2"]) == 2
    assert "--model.device" in capsys.readouterr().err


def test_a_weak_key_is_refused_before_any_process_starts(tmp_path, monkeypatch, capsys):
    import ksemstamp.parallel

    def no_processes(*args, **kwargs):
        raise AssertionError("processes were started with a weak key")

    monkeypatch.setattr(ksemstamp.parallel, "run_jsonl", no_processes)
    monkeypatch.delenv("KSEMSTAMP_ALLOW_WEAK_KEY", raising=False)
    monkeypatch.setenv("KSEMSTAMP_KEY", "password1")
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [{"id": "a", "text": "One sentence here. Another one there."}])
    # Over two processes, and in this one (which left an empty --output behind).
    for devices in (TWO, []):
        argv = ["detect", "--input", str(src), "--output", str(out), "--quiet", *devices]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: the watermark key is too weak") and err.count("\n") == 1
        assert "password1" not in err
        assert not out.exists() and not list(tmp_path.glob("*.shard*"))


PROMPTS = [
    {"id": f"p{i}", "prompt": f"Story {i} begins here. The town council met on Monday."}
    for i in range(4)
]
# A fixed seed: two processes must write what one writes.
FAST = [
    "--sampling.max_new_tokens",
    "24",
    "--search.max_candidates",
    "4",
    "--model.threads",
    "1",
    "--sampling.seed",
    "0",
    "--quiet",
]
TWO = ["--parallel.accelerator", "cpu", "--parallel.devices", "2"]
TWO += ["--parallel.strategy", "ddp_spawn"]


def _same_records(a, b):
    """Equal records but for the time taken; scores equal to 1e-5, since the encoder's batches
    (padded to their longest sentence) differ between the runs in the last digits."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        exact = {k: v for k, v in x.items() if k not in ("seconds", "scores")}
        assert exact == {k: v for k, v in y.items() if k not in ("seconds", "scores")}
        assert x["scores"] == pytest.approx(y["scores"], abs=1e-5)


@pytest.mark.slow
@pytest.mark.e2e
def test_two_processes_write_what_one_process_writes(tmp_path, capfd):
    src = tmp_path / "prompts.jsonl"
    _write(src, PROMPTS)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(["generate", "--input", str(src), "--output", str(one), *FAST]) == 0
    capfd.readouterr()
    # `--device cuda` (no GPU here) would fail if a process built its models there: each
    # builds them on the device its trainer gave it instead.
    argv = ["generate", "--input", str(src), "--output", str(two), *FAST, *TWO]
    assert main([*argv, "--model.device", "cuda"]) == 0
    err = capfd.readouterr().err
    assert "rank 0/2: models on cpu: encoder float32, partition float32, lm" in err
    assert "rank 1/2: models on cpu:" in err
    generated = _lines(two)
    assert [r["id"] for r in generated] == [p["id"] for p in PROMPTS]
    assert all(r["status"] == "ok" and r["text"] for r in generated)
    _same_records(generated, _lines(one))
    assert not list(tmp_path.glob("*.shard*"))

    det_one, det_two = tmp_path / "det-one.jsonl", tmp_path / "det-two.jsonl"
    assert main(["detect", "--input", str(one), "--output", str(det_one), "--quiet"]) == 0
    assert main(["detect", "--input", str(one), "--output", str(det_two), "--quiet", *TWO]) == 0
    a, b = _lines(det_one), _lines(det_two)
    assert [r["line"] for r in b] == [1, 2, 3, 4] and all(r["status"] == "ok" for r in b)
    for x, y in zip(a, b, strict=True):
        assert x["regions"] == y["regions"] and x["num_scored"] == y["num_scored"]
        assert x["watermarked"] == y["watermarked"]
        assert x["z_score"] == pytest.approx(y["z_score"], abs=1e-5)
        assert x["p_value"] == pytest.approx(y["p_value"], rel=1e-4)
