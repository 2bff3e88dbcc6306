"""The server under watchers: 200 open progress streams and 50 concurrent detections while
``/api/info`` is asked again and again, on a real uvicorn server (as ``watermark.py serve``
runs it) with a stand-in encoder that takes 0.1 s a pass, like the real one on a short text.

Prints the ``/api/info`` latencies (run with ``-s`` to see them); the bar is p95 under 1 s.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import httpx
import pytest
import uvicorn
from conftest import HashEncoder

from ksemstamp.serve import Limits, create_app, free_port
from ksemstamp.serve.jobs import GenerationQueue
from ksemstamp.settings import WatermarkSettings

pytestmark = pytest.mark.slow

STREAMS, DETECTIONS, PINGS = 200, 50, 40
TEXT = " ".join(f"Sentence number {i} talks about topic {i * 7 % 13}." for i in range(8))


class SlowEncoder(HashEncoder):
    """The stand-in encoder at the real one's pace: 0.1 s a pass."""

    def encode(self, sentences, **kwargs):
        time.sleep(0.1)
        return super().encode(sentences, **kwargs)


def _generation(stop: threading.Event):
    def run(params, report):
        while not stop.wait(0.2):  # a progress report every 0.2 s until the test ends
            report({"tokens": 1, "max_tokens": 10, "sentences": 0, "text": ""})
        return {"text": ""}

    return run


async def _load(base: str) -> dict:
    limits = httpx.Limits(max_connections=STREAMS + DETECTIONS + 20)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as client:
        jobs = [
            (await client.post("/api/generate", json={"prompt": "A."})).json() for _ in range(5)
        ]
        opened, streams, events = asyncio.Event(), [], []

        async def watch(job_id):
            async with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
                assert response.status_code == 200
                streams.append(job_id)
                if len(streams) == STREAMS:
                    opened.set()
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events.append(job_id)

        watchers = [asyncio.create_task(watch(jobs[i % 5]["id"])) for i in range(STREAMS)]
        await asyncio.wait_for(opened.wait(), 60)
        over = await client.get(f"/api/jobs/{jobs[0]['id']}/events")  # one stream too many
        detections = [
            asyncio.create_task(client.post("/api/detect", json={"text": TEXT}))
            for _ in range(DETECTIONS)
        ]
        await asyncio.sleep(0.2)  # let the detections queue up
        latencies = []
        for _ in range(PINGS):
            start = time.perf_counter()
            assert (await client.get("/api/info")).status_code == 200
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.05)
        answers = await asyncio.gather(*detections)
        for job in jobs:
            await client.delete(f"/api/jobs/{job['id']}")
        await asyncio.wait_for(asyncio.gather(*watchers), 60)  # every stream ends with its job
        return {
            "latencies": latencies,
            "detections": [r.status_code for r in answers],
            "over": over.status_code,
            "events": len(events),
        }


def test_info_stays_fast_under_streams_and_detections():
    stop = threading.Event()
    app = create_app(
        WatermarkSettings.from_dict(
            {"partition": {"kind": "lsh"}, "key": "load-test-key-0123456789abcdef"}
        ),
        limits=Limits(max_streams=STREAMS),
        encoder=SlowEncoder(),
        generation=False,
        host="127.0.0.1",
        jobs=GenerationQueue(_generation(stop), max_waiting=8),
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        result = asyncio.run(_load(f"http://127.0.0.1:{port}"))
    finally:
        stop.set()
        server.should_exit = True
        thread.join(30)
    latencies = sorted(result["latencies"])
    p50 = statistics.median(latencies)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    print(
        f"\n/api/info under {STREAMS} streams and {DETECTIONS} detections: "
        f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms "
        f"({len(latencies)} requests); {result['events']} stream events"
    )
    assert p95 < 1.0
    assert result["detections"] == [200] * DETECTIONS
    assert result["over"] == 503  # streams are bounded
    assert result["events"] >= STREAMS  # every stream got at least its first snapshot
