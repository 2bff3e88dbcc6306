"""Bodies past the size limit on a real uvicorn server (as ``ksemstamp serve`` runs it, in a
process of its own so that its memory can be read): 200 MB sent with ``Transfer-Encoding:
chunked`` to every route that takes a body is refused with 413 while the server's peak memory
grows by less than 100 MB, and the next request is answered."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ksemstamp.serve import free_port

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
SERVER = """
import sys
sys.path.insert(0, {tests!r})
import uvicorn
from conftest import HashEncoder
from ksemstamp.serve import create_app
from ksemstamp.settings import WatermarkSettings

settings = WatermarkSettings.from_dict(
    {{"partition": {{"kind": "lsh"}}, "key": "bodies-test-key-5c1e0a9f3b7d2e8a"}}
)
app = create_app(settings, encoder=HashEncoder(), generation=False, host="127.0.0.1")
uvicorn.run(app, host="127.0.0.1", port={port}, log_level="warning")
"""
TOTAL = 200 * 2**20
PAD = b"The council met. "
HEADS = {
    "/api/detect": ("application/json", b'{"text": "'),
    "/api/generate": ("application/json", b'{"prompt": "'),
    "/api/batch": (
        "multipart/form-data; boundary=XyZ",
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="t.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\n",
    ),
}


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _post_chunked(port: int, path: str, kind: str, head: bytes) -> tuple[int, int]:
    """POST about ``TOTAL`` bytes to ``path`` in chunks, stopping once the server answers;
    the answer's status and the bytes sent."""
    sock = socket.create_connection(("127.0.0.1", port))
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {kind}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = PAD * (65536 // len(PAD))
    framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    try:
        sock.sendall(request.encode() + b"%x\r\n" % len(head) + head + b"\r\n")
        while sent < TOTAL and not select.select([sock], [], [], 0)[0]:
            sock.sendall(framed)
            sent += len(chunk)
        if sent >= TOTAL:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(30)
    answer = b""
    try:
        while b"\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, sent


def test_chunked_bodies_past_the_limit_are_refused_without_holding_them(tmp_path):
    port = free_port()
    script = SERVER.format(tests=str(TESTS), port=port)
    server = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{base}/api/info", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        detect = httpx.post(f"{base}/api/detect", json={"text": "One. Two. Three."}, timeout=30)
        assert detect.status_code == 200
        before = _peak_kib(server.pid)
        for path, (kind, head) in HEADS.items():
            start = time.perf_counter()
            status, sent = _post_chunked(port, path, kind, head)
            seconds = time.perf_counter() - start
            print(f"\n{path}: {status} after {sent / 2**20:.0f} MB sent, {seconds:.2f} s")
            assert status == 413 and sent < TOTAL
            after = httpx.post(f"{base}/api/detect", json={"text": "One. Two."}, timeout=30)
            assert after.status_code == 200 and json.loads(after.text)["status"] == "ok"
        grown = (_peak_kib(server.pid) - before) / 1024
        print(f"peak memory grew by {grown:.0f} MB")
        assert grown < 100
    finally:
        server.terminate()
        server.wait(30)
