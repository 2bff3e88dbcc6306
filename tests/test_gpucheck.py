"""The GPU check: its device bookkeeping, and (slow) the whole check on 2 CPU processes."""

import pytest

from ksemstamp.cli import main
from ksemstamp.cli.gpucheck import CheckFailed, check_ranks, expected_devices
from ksemstamp.parallel import DEVICE_LINE


def _lines(*ranks):
    return "\n".join(
        DEVICE_LINE.format(rank=r, world=w, device=d, models="lm bfloat16") for r, w, d in ranks
    )


def test_every_rank_must_report_its_own_device():
    expected = ["cuda:0", "cuda:1"]
    ok = "noise\n" + _lines((1, 2, "cuda:1"), (0, 2, "cuda:0")) + "\nmore noise"
    assert check_ranks(ok, expected, "generate") == [
        "rank 0/2: cuda:0: lm bfloat16",
        "rank 1/2: cuda:1: lm bfloat16",
    ]
    # Two processes share one stderr: a progress bar closed with a carriage return (no
    # newline) can stand before a rank's line.
    barred = "token vectors: 100%|#####| 69/69\r" + " " * 30 + "\r" + _lines((0, 2, "cuda:0"))
    assert check_ranks(barred + "\n" + _lines((1, 2, "cuda:1")), expected, "generate") == [
        "rank 0/2: cuda:0: lm bfloat16",
        "rank 1/2: cuda:1: lm bfloat16",
    ]
    with pytest.raises(CheckFailed, match="rank 1 of 2 has its models on cuda:0"):
        check_ranks(_lines((0, 2, "cuda:0"), (1, 2, "cuda:0")), expected, "generate")
    with pytest.raises(CheckFailed, match="one process per device \\(2\\), saw ranks \\[0\\]"):
        check_ranks(_lines((0, 1, "cuda:0")), expected, "detect")
    with pytest.raises(CheckFailed, match="rank 0 of 2 has its models on cpu"):
        check_ranks(_lines((0, 2, "cpu"), (1, 2, "cuda:1")), expected, "detect")


def test_without_a_gpu_the_check_says_so_and_points_to_cpu(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CheckFailed, match="--cpu"):
        expected_devices(cpu=False, devices=None)
    assert expected_devices(cpu=True, devices=None) == ["cpu", "cpu"]
    assert main(["gpucheck", "--workdir", "unused"]) == 1
    assert capsys.readouterr().err.startswith("FAILED: no CUDA GPU")


@pytest.mark.slow
@pytest.mark.e2e
def test_the_whole_check_passes_on_two_cpu_processes(tmp_path, capsys, monkeypatch):
    # As a user runs it, without a key of their own: the check makes a strong one. Here that
    # key is fixed (and generation is seeded), so that the outcome does not depend on the draw:
    # under a random key, the two texts of 64 tokens were once both missed.
    import ksemstamp.keys

    monkeypatch.delenv("KSEMSTAMP_KEY", raising=False)
    monkeypatch.delenv("KSEMSTAMP_ALLOW_WEAK_KEY", raising=False)
    made = []
    monkeypatch.setattr(
        ksemstamp.keys,
        "new_key",
        lambda: (
            made.append(1) or "f1646612c82adb59ed15d6970dd46814bed580f96f3dda205f87cc4f161b5cb9"
        ),
    )
    argv = ["gpucheck", "--cpu", "--workdir", str(tmp_path), "--prompts", "1", "--steps", "2"]
    assert main([*argv, "--max_new_tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "train: 2 steps and K = 64 centroids on cpu" in out
    for step in ("generate", "detect"):
        assert f"{step}: rank 0/2: cpu: encoder float32, partition float32" in out
        assert f"{step}: rank 1/2: cpu:" in out
    assert out.strip().endswith("ran on the expected devices")
    assert made == [1]
