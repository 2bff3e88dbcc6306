"""The generation routes: queue a continuation (``POST /api/generate``) and follow it
(``/api/jobs/{id}``, its progress stream ``/events``, ``DELETE`` to cancel)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from ..generation.prompts import plan_prompt
from ..io import json_line
from .jobs import FINISHED, QueueFull
from .state import ServeState, serve_state

router = APIRouter()
STATE = Depends(serve_state)
STREAM_WAIT = 10.0
"""Seconds a progress stream waits for news before it sends a keep-alive comment."""
NO_SUCH_JOB = "no such generation (finished ones are kept for a while)"


class GenerateRequest(BaseModel):
    """Body of ``POST /api/generate``."""

    prompt: str
    max_new_tokens: int | None = None


@router.post("/api/generate", status_code=202)
async def generate(body: GenerateRequest, state: ServeState = STATE) -> dict[str, Any]:
    """Queue a watermarked continuation of ``prompt``; follow it at ``/api/jobs/{id}``.
    ``max_new_tokens`` must be between 1 and the setting (``null``: the setting)."""
    if not state.generates:
        raise HTTPException(503, "this server was started without a language model")
    state.check_size("prompt", body.prompt)
    most = state.settings.sampling.max_new_tokens
    tokens = most if body.max_new_tokens is None else body.max_new_tokens
    if not 1 <= tokens <= most:
        raise HTTPException(422, f"max_new_tokens must be between 1 and {most}")
    wm = state.watermarker
    if wm is not None:
        # The generator's own rules for a prompt, checked now rather than after the queue.
        start = await state.in_pool(
            partial(
                plan_prompt,
                body.prompt,
                state.scheme.splitter,
                wm.tokenizer,
                chat=wm.chat,
                budget=wm.prompt_budget,
                max_chars=wm.max_prompt_chars,
            )
        )
        if start.error is not None:
            raise HTTPException(422, start.error)
    try:
        return state.jobs.submit({"prompt": body.prompt, "max_new_tokens": tokens})
    except QueueFull as err:
        raise HTTPException(429, str(err)) from None


@router.get("/api/jobs/{job_id}")
async def job(job_id: str, state: ServeState = STATE) -> dict[str, Any]:
    """A generation's state: queued (with its place in line), running, done, error or
    cancelled."""
    snap = state.jobs.snapshot(job_id)
    if snap is None:
        raise HTTPException(404, NO_SUCH_JOB)
    return snap


@router.delete("/api/jobs/{job_id}")
async def cancel(job_id: str, state: ServeState = STATE) -> dict[str, Any]:
    """Cancel a generation: a queued one at once, a running one at its next progress."""
    snap = state.jobs.cancel(job_id)
    if snap is None:
        raise HTTPException(404, NO_SUCH_JOB)
    return snap


@router.get("/api/jobs/{job_id}/events")
async def job_events(job_id: str, request: Request, state: ServeState = STATE) -> StreamingResponse:
    """Server-sent events: a snapshot each time the generation moves, until it ends."""
    jobs, limits = state.jobs, state.limits
    if jobs.snapshot(job_id) is None:
        raise HTTPException(404, "no such generation")
    if state.open_streams >= limits.max_streams:
        raise HTTPException(
            503, f"{limits.max_streams} progress streams are open; follow /api/jobs/{{id}}"
        )

    async def stream() -> AsyncIterator[str]:
        state.open_streams += 1
        try:
            version = -1
            while True:
                snap = await jobs.wait_async(job_id, version, STREAM_WAIT)
                if snap is None:
                    return
                if snap["version"] == version:
                    if jobs.closed:
                        return
                    yield ": still waiting\n\n"
                else:
                    version = snap["version"]
                    yield f"data: {json_line(snap)}\n\n"
                if snap["state"] in FINISHED or await request.is_disconnected():
                    return
        finally:
            state.open_streams -= 1

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
