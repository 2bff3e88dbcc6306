"""What the routes of one app share: the models, the settings in force, the pools and limits.

``create_app`` builds one ``ServeState`` and keeps it as ``app.state.serve``; a route gets it
with the ``serve_state`` dependency. Nothing here holds the key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException, Request

from ..detector import DetectionResult, Detector
from ..scheme.core import WatermarkScheme
from ..settings.watermark import WatermarkSettings
from ..watermarker import Watermarker
from .jobs import GenerationQueue, JobFailed
from .lanes import Lanes
from .present import Limits, detection_view


@dataclass
class ServeState:
    """The app's models and settings (``settings`` without the key in any output)."""

    settings: WatermarkSettings
    scheme: WatermarkScheme
    detector: Detector
    watermarker: Watermarker | None
    limits: Limits
    fingerprint: str
    demo_key: bool
    generation: bool
    lanes: Lanes
    jobs: GenerationQueue | None = None
    open_streams: int = 0
    generates: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.generates = self.watermarker is not None or self.jobs is not None
        if self.jobs is None:
            self.jobs = GenerationQueue(self.run_generation, max_waiting=self.limits.max_waiting)

    async def in_pool(self, function: Callable, *args: Any, heavy: bool = False) -> Any:
        """Run ``function(*args)`` in a lane of the app's pools (``heavy``: the large texts'
        lane, bounded), not on the server's threads."""
        return await self.lanes.run(heavy, function, *args)

    def check_size(self, name: str, value: str | None) -> None:
        """Refuse (413) a text or prompt over the character limit."""
        if value is not None and len(value) > self.limits.max_chars:
            raise HTTPException(
                413,
                f"the {name} has {len(value):,} characters; the limit is {self.limits.max_chars:,}",
            )

    def view(self, result: DetectionResult, text: str, seconds: float) -> dict[str, Any]:
        """A detection as the page shows it (``present.detection_view``)."""
        out = detection_view(
            result, text, self.detector.mark, alpha=self.detector.alpha, unit=self.settings.unit
        )
        out["seconds"] = round(seconds, 4)
        out["key_fingerprint"] = self.fingerprint
        return out

    def run_generation(self, params: dict[str, Any], report: Callable[[dict], None]) -> dict:
        """One queued generation (``jobs``), its progress reported, then its detection."""
        watermarker = self.watermarker
        assert watermarker is not None
        watermarker.max_new_tokens = params["max_new_tokens"]

        def progress(p) -> None:
            report(
                {
                    "sentences": p.sentences,
                    "candidates": p.candidates,
                    "drawn_for_current": p.drawn_for_current,
                    "tokens": p.tokens,
                    "max_tokens": p.max_tokens,
                    "text": p.texts[0],
                }
            )

        res = watermarker.generate([params["prompt"]], on_progress=progress)[0]
        if res.status != "ok":
            raise JobFailed(res.error or "generation failed")
        start = time.perf_counter()
        result = self.detector.detect(res.text, res.prompt_for_detection)
        return {
            "prompt": params["prompt"],
            "text": res.text,
            "generation": {
                "num_sentences": res.num_sentences,
                "num_tokens": res.num_tokens,
                "candidates": res.candidates,
                "fallbacks": res.fallbacks,
                "seconds": round(res.seconds, 2),
                "key_fingerprint": self.fingerprint,
                "completion": res.completion,
                "prompt_dropped_chars": res.prompt_dropped_chars,
                "chat": res.chat,
            },
            "detection": self.view(result, res.text, time.perf_counter() - start),
        }


def serve_state(request: Request) -> ServeState:
    """The dependency that hands a route its app's ``ServeState``."""
    return request.app.state.serve
