"""Reliability and key hygiene: killed runs resume exactly, the key never leaks, bad settings
are named."""

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from ksemstamp.assets import encoder_fingerprint
from ksemstamp.builders import build_scheme
from ksemstamp.cli import main
from ksemstamp.cli.console import command_line
from ksemstamp.scheme.centroids import CentroidFile
from ksemstamp.settings import WatermarkSettings
from ksemstamp.settings.files import load_settings_file, load_watermark_settings

REPO = Path(__file__).resolve().parents[1]
FAST = ["--sampling.max_new_tokens", "12", "--search.max_candidates", "3", "--quiet"]
PROMPTS = [
    "The storm hit the coast on Friday. Thousands lost power.",
    "The company reported higher profits. Its shares rose.",
    "The council met on Monday. It approved the budget.",
    "The team won the final. Fans filled the streets.",
]


def _env(key: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "KSEMSTAMP_KEY": key}
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def _write_prompts(path: Path, ids: list[str] | None = None) -> None:
    ids = ids or [f"p{i}" for i in range(len(PROMPTS))]
    rows = [{"id": i, "prompt": p} for i, p in zip(ids, PROMPTS, strict=True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------------- killed run


@pytest.mark.e2e
def test_killed_generate_resumes_without_loss_or_duplicates(tmp_path):
    src, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    # Ids repeat (as careless inputs do): resuming must still do every line exactly once.
    ids = ["p0", "p0", "p1", "p0"]
    _write_prompts(src, ids)
    # One prompt per batch, so records reach the file one at a time and the kill lands mid-run.
    cmd = [sys.executable, str(REPO / "watermark.py"), "generate", "--input", str(src)]
    cmd += ["--output", str(out), "--search.prompt_batch", "1", *FAST]
    env = _env("kill-test-key")
    with open(tmp_path / "stderr1", "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 1:
                proc.kill()
                break
            time.sleep(0.02)
        proc.wait(timeout=60)
    assert proc.returncode == -9, (proc.returncode, (tmp_path / "stderr1").read_text()[-2000:])
    before = out.read_bytes()
    complete = before[: before.rfind(b"\n") + 1]
    assert 1 <= complete.count(b"\n") < len(PROMPTS)

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming" in done.stderr
    after = out.read_bytes()
    assert after.startswith(complete)  # what was written before the kill is kept as it was
    rows = [json.loads(line) for line in after.decode().splitlines()]
    assert sorted(r["line"] for r in rows) == [1, 2, 3, 4]  # none lost, none twice
    assert all(
        r["id"] == ids[r["line"] - 1] and r["prompt"] == PROMPTS[r["line"] - 1] for r in rows
    )
    assert all(json.loads(x)["status"] == "ok" for x in after.decode().splitlines())


# ---------------------------------------------------------------------- the key never leaks

ENV_KEY = "zq7-ENVKEY-distinctive-81c4"
YAML_KEY = "yk3-YAMLKEY-distinctive-55e0"
FLAG_KEY = "fk9-FLAGKEY-distinctive-2d7b"


@pytest.mark.e2e
def test_key_appears_in_no_output_stream_or_error(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("KSEMSTAMP_KEY", ENV_KEY)
    prompts, gen, det = tmp_path / "p.jsonl", tmp_path / "g.jsonl", tmp_path / "d.jsonl"
    _write_prompts(prompts)
    prompts.write_text(prompts.read_text().splitlines()[0] + "\n")
    good = tmp_path / "key.yaml"
    good.write_text(f"key: {YAML_KEY}\nsearch: {{max_candidates: 3}}\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text(f'search: {{max_candidates: 3}}\nkey: "{YAML_KEY}\n')
    errors: list[str] = []

    def run(args: list[str]) -> None:
        try:
            main(args)
        except SystemExit as err:  # argparse errors: the message went to stderr
            errors.append(str(err))
        except Exception as err:
            errors.append(f"{err!r}\n{traceback.format_exc()}")

    run(["generate", "--input", str(prompts), "--output", str(gen), *FAST])
    run(["generate", "--prompt", PROMPTS[1], *FAST])
    run(["detect", "--input", str(gen), "--output", str(det), "--quiet"])
    run(["detect", "--text", "One sentence here. Another one there. A third.", "--quiet"])
    run(["detect", "--text", " Monday. It voted.", "--prompt", "The council met on", "--quiet"])
    run(["detect", "--text", "北京今天下雨。明天是晴天。", "--quiet"])
    run(["detect", "--config", str(good), "--print_config"])
    run(["detect", "--key", FLAG_KEY, "--print_config"])
    # error paths: a record made under another key, a broken YAML file, a bad setting
    run(["detect", "--config", str(good), "--input", str(gen), "--output", str(tmp_path / "e")])
    run(["detect", "--config", str(broken), "--text", "A. B."])
    gamma = ["--mark.kind", "region", "--mark.gamma", "0.3"]
    run(["detect", "--config", str(good), *gamma, "--text", "A. B."])
    run(["detect", "--config", str(good), "--search.candidate_batch", "0", "--text", "A. B."])
    run(
        ["calibrate", "--key", FLAG_KEY, "--calibration.sources", "news"]
        + ["--calibration.max_texts", "6", "--calibration.num_keys", "2"]
        + ["--calibration.simulated_per_key", "2", "--quiet"]
        + ["--output_dir", str(tmp_path / "cal"), "--calibration.reuse_embeddings", "false"]
    )
    with pytest.raises(ValueError) as err:
        WatermarkSettings.from_dict({"mark": {"gamma": 2.0, "margin": -1}, "key": YAML_KEY})
    errors.append(str(err.value))
    with pytest.raises(ValueError) as err:
        load_settings_file(broken)
    errors.append(str(err.value))

    captured = capfd.readouterr()
    # the runs did happen: records, an other-key refusal, the calibration report
    gen_rows = [json.loads(x) for x in gen.read_text().splitlines()]
    assert gen_rows[0]["status"] == "ok" and gen_rows[0]["key_fingerprint"]
    assert "different key" in (tmp_path / "e").read_text()
    assert (tmp_path / "cal" / "report.md").exists(), errors
    assert "--key '***'" in (tmp_path / "cal" / "report.md").read_text()
    assert any("broken.yaml" in e or "broken.yaml" in captured.err for e in errors)
    # build-time setting errors exit 2 with their one-line message on stderr
    assert "gamma * K" in captured.err

    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    texts = {str(p): p.read_bytes().decode("utf-8", "replace") for p in files}
    texts |= {"stdout": captured.out, "stderr": captured.err}
    texts |= {f"error {i}": e for i, e in enumerate(errors)}
    for where, text in texts.items():
        for key in (ENV_KEY, FLAG_KEY):
            assert key not in text, f"key found in {where}"
        if where != str(good) and where != str(broken):
            assert YAML_KEY not in text, f"YAML key found in {where}"


def test_broken_yaml_error_names_the_file_not_its_content(tmp_path):
    # PyYAML quotes the offending line in its messages; that line may be the key.
    path = tmp_path / "c.yaml"
    path.write_text(f'key: "{YAML_KEY}\n')
    with pytest.raises(ValueError) as err:
        load_watermark_settings([path])
    assert str(path) in str(err.value) and "line" in str(err.value)
    assert YAML_KEY not in str(err.value) and err.value.__cause__ is None
    assert err.value.__context__ is None or err.value.__suppress_context__


def test_command_line_hides_a_key_flag():
    shown = command_line(["calibrate", "--key", "s3cret", "--key=other", "--num-keys", "3"])
    assert "s3cret" not in shown and "other" not in shown and "--num-keys 3" in shown


# ---------------------------------------------------------------------- settings


class _Encoder:
    """A tiny stand-in encoder with weights, so that centroid files can name it."""

    def __init__(self) -> None:
        self.weight = torch.ones(2)

    def get_embedding_dimension(self) -> int:
        return 16

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    def encode(self, sentences, **kwargs):
        return torch.nn.functional.normalize(torch.ones(len(sentences), 16), dim=-1)


@pytest.mark.parametrize(
    "place,value",
    [
        ("mark.gamma", 1.5),
        ("mark.gamma", 0.0),
        ("mark.margin", -0.01),
        ("search.candidate_batch", 0),
        ("search.max_candidates", 0),
        ("sampling.max_new_tokens", 0),
        ("search.prompt_batch", 0),
        ("partition.lsh_bits", 0),
        ("detection.alpha", 0.0),
        ("detection.statistic", "z"),
        ("mark.valid_mode", "open"),
        ("partition.kind", "grid"),
        ("limits.max_text_chars", 0),
        ("limits.max_prompt_tokens", 0),
        ("mark.context_temperature", -0.1),
        ("sampling.temperature", 0.0),
        ("sampling.top_p", 0.0),
        ("sampling.top_k", -1),
        ("sampling.repetition_penalty", 0.0),
        ("sampling.max_sentence_tokens", 0),
    ],
)
def test_bad_setting_is_named(place, value, capsys):
    group, name = place.split(".")
    kind = {"kind": "region"} if name in ("gamma", "margin", "valid_mode") else {}
    data = {group: {**(kind if group == "mark" else {}), name: value}}
    with pytest.raises(ValueError, match=place):
        WatermarkSettings.from_dict(data)
    # the same through the command line: a usage error naming the setting, exit status 2
    argv = ["detect", *(["--mark.kind", "region"] if kind else []), f"--{place}", str(value)]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--print_config"])
    assert exit_.value.code == 2 and f"--{place}" in capsys.readouterr().err


def test_lsh_partition_scores_on_hard_contexts():
    # Soft context weights need centroids; an LSH partition keeps the previous region.
    cfg = WatermarkSettings.from_dict(
        {"partition": {"kind": "lsh"}, "mark": {"context_temperature": 0.05}, "key": "k"}
    )
    assert build_scheme(cfg, encoder=_Encoder()).settings.context_temperature == 0.0


def test_gamma_times_k_must_be_whole(tmp_path):
    # The valid table of the region mark needs gamma * K whole.
    with pytest.raises(ValueError, match="gamma"):
        build_scheme(
            WatermarkSettings.from_dict(
                {"partition": {"kind": "lsh"}, "mark": {"gamma": 0.3, "kind": "region"}, "key": "k"}
            ),
            encoder=_Encoder(),
        )
    encoder = _Encoder()
    two = tmp_path / "k2.pt"
    CentroidFile(torch.randn(2, 16), "tiny", encoder_fingerprint(encoder)).save(two)
    with pytest.raises(ValueError, match=r"gamma \* K.*K=2"):
        build_scheme(
            WatermarkSettings.from_dict(
                {
                    "partition": {"centroids": str(two)},
                    "mark": {"gamma": 0.25, "kind": "region"},
                    "key": "k",
                }
            ),
            encoder=encoder,
        )
    build_scheme(
        WatermarkSettings.from_dict(
            {
                "partition": {"centroids": str(two)},
                "mark": {"gamma": 0.5, "kind": "region"},
                "key": "k",
            }
        ),
        encoder=encoder,
    )


def test_fewer_than_two_regions_is_refused(tmp_path):
    encoder = _Encoder()
    one = tmp_path / "k1.pt"
    CentroidFile(
        torch.randn(1, 16), "tiny", encoder_fingerprint(encoder), mean=torch.zeros(16)
    ).save(one)
    with pytest.raises(ValueError, match=r"centroids must be \(K >= 2"):
        build_scheme(
            WatermarkSettings.from_dict(
                {
                    "partition": {"centroids": str(one)},
                    "mark": {"remove_components": 0},
                    "key": "k",
                }
            ),
            encoder=encoder,
        )
    with pytest.raises(FileNotFoundError, match="centroid file not found"):
        build_scheme(
            WatermarkSettings.from_dict(
                {"partition": {"centroids": str(tmp_path / "no.pt")}, "key": "k"}
            ),
            encoder=encoder,
        )


@pytest.mark.parametrize(
    "args",
    [
        ["detect", "--batch_size", "0", "--text", "A. B."],
        ["calibrate", "--calibration.num_keys", "0"],
        ["calibrate", "--calibration.max_texts", "0"],
    ],
)
def test_bad_command_option_is_named(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and args[1] in capsys.readouterr().err
