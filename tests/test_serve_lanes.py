"""The page under large texts (``serve.lanes``): small detections have a lane of their own, the
heavy lane is bounded (503 and ``Retry-After`` beyond it), and a small encoder pass goes before
the next piece of a large one. Ordered with events, not timed."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from fastapi import HTTPException

from ksemstamp.serve.lanes import PASS_SENTENCES, EncoderGate, Lanes, fair_embed


def test_a_small_detection_runs_while_the_heavy_lane_is_full_and_one_more_heavy_is_refused():
    lanes = Lanes(workers=1, max_heavy=1)
    small_ran = threading.Event()
    started = threading.Event()

    def heavy_job() -> bool:
        started.set()
        return small_ran.wait(5)  # False if the small job were queued behind this one

    def small_job() -> str:
        small_ran.set()
        return "small"

    async def scenario() -> tuple[str, bool, HTTPException]:
        heavy = asyncio.ensure_future(lanes.run(True, heavy_job))
        while not started.is_set():
            await asyncio.sleep(0.01)
        with pytest.raises(HTTPException) as refused:
            await lanes.run(True, lambda: "never")
        small = await lanes.run(False, small_job)
        return small, await heavy, refused.value

    small, heavy_saw_small, refused = asyncio.run(scenario())
    assert small == "small" and heavy_saw_small
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "30"
    assert "at most 1" in refused.detail and lanes.heavy_in == 0
    lanes.shutdown()


def test_a_small_pass_goes_before_the_next_piece_of_a_large_one():
    gate = EncoderGate()
    order: list[str] = []
    first_piece = threading.Event()
    small_waiting = threading.Event()

    def embed(sentences, progress=False):
        order.append(f"{len(sentences)}")
        if len(order) == 1:  # the large pass's first piece: let the small one queue up
            first_piece.set()
            small_waiting.wait(10)
        return torch.zeros(len(sentences), 4)

    fair = fair_embed(embed, gate)
    large = [f"s{i}" for i in range(PASS_SENTENCES * 2 + 1)]
    out: dict[str, torch.Tensor] = {}
    big = threading.Thread(target=lambda: out.setdefault("large", fair(large)))
    big.start()
    first_piece.wait(10)
    small = threading.Thread(target=lambda: out.setdefault("small", fair(["one", "two"])))
    small.start()
    # The small pass is now waiting on the gate (it registers before it blocks).
    for _ in range(1000):
        if gate._small_waiting:
            break
        threading.Event().wait(0.005)
    small_waiting.set()
    big.join(10)
    small.join(10)
    assert order == [str(PASS_SENTENCES), "2", str(PASS_SENTENCES), "1"]
    assert out["large"].shape == (len(large), 4) and out["small"].shape == (2, 4)
