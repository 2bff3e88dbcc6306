"""The web app against careless and hostile clients (stand-in encoder, fast): other hosts and
origins, security headers, odd characters and numbers, cancelling a generation."""

from __future__ import annotations

import json
import threading

import pytest
from conftest import HashEncoder
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_io_input import LINES, _cut, _strict

from ksemstamp.serve import Limits, create_app
from ksemstamp.serve.guard import SECURITY_HEADERS, allowed_hosts, host_name
from ksemstamp.serve.jobs import GenerationQueue
from ksemstamp.settings import WatermarkSettings

SECRET = "fast-serve-secret-key-7f3a91"
CFG = WatermarkSettings.from_dict(
    {"partition": {"kind": "lsh"}, "mark": {"kind": "region"}, "key": SECRET}
)
TEXT = "The council met on Monday. It approved the budget. Schools get more money."
ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=60)


def _app(**kwargs):
    return create_app(CFG, limits=Limits(max_chars=2_000), encoder=HashEncoder(), **kwargs)


APP = _app(generation=False)


def test_head_answers_and_every_answer_carries_the_security_headers():
    client = TestClient(APP)
    head = client.head("/")
    assert head.status_code == 200 and head.text == ""
    for response in (head, client.get("/api/info"), client.get("/nowhere"), client.get("/")):
        for name, value in SECURITY_HEADERS.items():
            assert response.headers[name] == value
    assert "default-src 'self'" in head.headers["content-security-policy"]


def test_a_host_other_than_the_bound_address_is_refused():
    app = _app(generation=False, host="127.0.0.1")
    for base in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"):
        assert TestClient(app, base_url=base).get("/api/info").status_code == 200
    evil = TestClient(app, base_url="http://rebound.example:8000")
    for response in (evil.get("/api/info"), evil.get("/"), evil.post("/api/detect", json={})):
        assert response.status_code == 400 and "127.0.0.1 only" in response.json()["error"]
        assert response.headers["x-frame-options"] == "DENY"
    # bound to every interface on purpose: any name is taken
    anywhere = _app(generation=False, host="0.0.0.0")
    assert TestClient(anywhere, base_url="http://my-box.lan").get("/api/info").status_code == 200


def test_host_names_are_read_without_their_port():
    assert host_name("LocalHost:8000") == "localhost" and host_name("[::1]:80") == "::1"
    assert host_name("::1") == "::1" and host_name("example.org") == "example.org"
    assert allowed_hosts("::") is None and allowed_hosts(None) is None
    assert allowed_hosts("192.168.1.5") == frozenset({"192.168.1.5"})
    assert "localhost" in allowed_hosts("127.0.0.1") and "127.0.0.1" in allowed_hosts("localhost")


def test_uploads_and_detections_come_from_the_page_only():
    client = TestClient(APP)
    files = {"file": ("t.jsonl", json.dumps({"text": TEXT}).encode())}
    for origin in ("http://evil.example", "null", "http://testserver.evil.example"):
        headers = {"Origin": origin}
        assert client.post("/api/batch", files=files, headers=headers).status_code == 403
        refused = client.post("/api/detect", json={"text": TEXT}, headers=headers)
        assert refused.status_code == 403 and "this page only" in refused.json()["error"]
    assert client.get("/api/info", headers={"Origin": "http://evil.example"}).status_code == 200
    own = {"Origin": "http://testserver"}
    assert client.post("/api/batch", files=files, headers=own).status_code == 200
    assert client.post("/api/detect", json={"text": TEXT}).status_code == 200  # curl sends none


def test_odd_characters_and_numbers_get_answers_not_500():
    client = TestClient(APP)
    body = '{"text": "One \\ud800sentence. Two\\udfff sentences. Three."}'
    view = client.post(
        "/api/detect", content=body, headers={"Content-Type": "application/json"}
    ).json()
    assert view["status"] == "ok" and view["sentences"][0]["text"] == "One sentence."
    lines = [
        '{"id": 1, "text": "Lone \\ud800 here. And more."}',
        '{"id": 2, "text": "A. B.", "n": ' + "9" * 5000 + "}",
        '{"id": 3, "text": "A. B.", "n": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"id": 4, "text": "A. B.", "score": NaN}',
        '{"id": 5, "text": "The council\u2028met today. It voted."}',
    ]
    files = {"file": ("t.jsonl", "\n".join(lines).encode("utf-8"))}
    response = client.post("/api/batch", files=files)
    out = response.json()
    assert response.status_code == 200 and len(out["records"]) == 5
    assert [r["status"] for r in out["records"]] == ["ok", "error", "error", "error", "ok"]
    assert "5,000 digits" in out["records"][1]["error"] and "NaN" in out["records"][3]["error"]
    assert out["records"][0]["text"] == "Lone \ud800 here. And more."  # kept as given
    assert [_strict(x)["line"] for x in out["jsonl"].splitlines()] == [1, 2, 3, 4, 5]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ANY_TEXT, st.one_of(st.none(), ANY_TEXT))
@example("One \ud800here. Two.", "\ud800")
def test_detect_never_answers_500(text, prompt):
    body = json.dumps({"text": text, "prompt": prompt})  # a lone surrogate as its escape
    response = TestClient(APP).post(
        "/api/detect", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code in (200, 413, 422)
    _strict(response.text)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(LINES, min_size=1, max_size=6))
def test_batch_answers_one_record_per_line_or_a_4xx(lines):
    content = "\n".join(lines)
    raw = content.encode("utf-8", "surrogatepass")
    response = TestClient(APP).post("/api/batch", files={"file": ("t.jsonl", raw)})
    assert response.status_code in (200, 400, 413, 422)
    body = _strict(response.text)
    if response.status_code == 200:
        pieces = _cut(content)  # every line, blank ones too; no line after a last line end
        assert len(body["records"]) == len(pieces) - (pieces[-1] == "")


class Gate:
    """A stand-in generation that reports progress until it is let go."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()

    def __call__(self, params, report):
        self.started.set()
        while not self.go.wait(0.01):
            report({"tokens": 1})
        return {"text": "done"}


def test_max_new_tokens_zero_is_refused_and_null_is_the_setting():
    gate = Gate()
    client = TestClient(_app(generation=False, jobs=GenerationQueue(gate)))
    for bad in (0, -1, CFG.sampling.max_new_tokens + 1):
        response = client.post("/api/generate", json={"prompt": "Hi.", "max_new_tokens": bad})
        assert response.status_code == 422 and "between 1 and 200" in response.json()["error"]
    snap = client.post("/api/generate", json={"prompt": "Hi.", "max_new_tokens": None}).json()
    assert snap["state"] in ("queued", "running")
    gate.go.set()


def test_a_queued_or_running_generation_can_be_cancelled():
    gate = Gate()
    client = TestClient(_app(generation=False, jobs=GenerationQueue(gate)))
    first = client.post("/api/generate", json={"prompt": "One."}).json()
    second = client.post("/api/generate", json={"prompt": "Two."}).json()
    third = client.post("/api/generate", json={"prompt": "Three."}).json()
    assert gate.started.wait(5)
    cancelled = client.delete(f"/api/jobs/{second['id']}").json()
    assert cancelled["state"] == "cancelled" and "before it started" in cancelled["error"]
    assert client.get(f"/api/jobs/{third['id']}").json()["position"] == 1  # moved up
    running = client.delete(f"/api/jobs/{first['id']}").json()
    assert running["state"] == "running" and running["cancel_requested"]
    events = client.get(f"/api/jobs/{first['id']}/events").text  # ends with the job
    assert json.loads(events.strip().split("data: ")[-1])["state"] == "cancelled"
    assert client.get(f"/api/jobs/{third['id']}").json()["state"] in ("running", "done")
    gate.go.set()
    assert client.delete("/api/jobs/nope").status_code == 404


@pytest.mark.parametrize("method", ["post", "delete"])
def test_changing_a_job_from_another_origin_is_refused(method):
    client = TestClient(_app(generation=False, jobs=GenerationQueue(Gate())))
    kwargs = {"json": {"prompt": "Hi."}} if method == "post" else {}
    path = "/api/generate" if method == "post" else "/api/jobs/x"
    response = getattr(client, method)(path, headers={"Origin": "http://evil.example"}, **kwargs)
    assert response.status_code == 403


# ---------------------------------------------------------------------- bodies past the limits

SMALL = Limits(max_chars=1_000, max_upload_bytes=20_000)
CHUNK = 4096


def _stream(head: bytes, pad: bytes, total: int, pulled: list[int]):
    """A body of about ``total`` bytes sent in chunks without a Content-Length (chunked):
    ``head``, then ``pad`` repeated; ``pulled`` counts the chunks the server asked for."""
    yield head
    pulled.append(1)
    for _ in range(total // CHUNK):
        pulled.append(1)
        yield pad * (CHUNK // len(pad))


BODIES = {
    "/api/detect": ("application/json", b'{"text": "', b"The council met. "),
    "/api/generate": ("application/json", b'{"prompt": "', b"The council met. "),
    "/api/batch": (
        "multipart/form-data; boundary=XyZ",
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="t.txt"\r\n'
        b"Content-Type: text/plain\r\n\r\n",
        b"The council met. ",
    ),
}


@pytest.mark.parametrize("route", list(BODIES))
def test_a_chunked_body_past_the_limit_is_refused_as_it_streams_in(route):
    app = create_app(
        CFG, limits=SMALL, encoder=HashEncoder(), generation=False,
        jobs=GenerationQueue(Gate()),
    )  # fmt: skip
    client = TestClient(app)
    kind, head, pad = BODIES[route]
    largest = SMALL.max_upload_bytes + 4 * SMALL.max_chars
    pulled: list[int] = []
    response = client.post(
        route, content=_stream(head, pad, 50 * largest, pulled), headers={"Content-Type": kind}
    )
    assert response.status_code == 413, response.text
    assert response.json() == {"error": "the request is larger than this server accepts"}
    assert response.headers["x-frame-options"] == "DENY"
    # and answers the next request as usual (a real server and 200 MB: test_serve_load.py)
    assert client.post("/api/detect", json={"text": TEXT}).status_code == 200


def test_a_declared_length_past_the_limit_is_refused_before_reading():
    client = TestClient(_app(generation=False))
    pulled: list[int] = []
    headers = {"Content-Type": "application/json", "Content-Length": str(10**9)}
    response = client.post(
        "/api/detect", content=_stream(b'{"text": "', b"x", 10**6, pulled), headers=headers
    )
    assert response.status_code == 413 and len(pulled) <= 1


def test_a_second_file_in_one_upload_is_refused_not_ignored():
    client = TestClient(APP)
    one = ("a.jsonl", json.dumps({"text": TEXT}).encode())
    two = ("b.jsonl", json.dumps({"text": "Other. Text."}).encode())
    for files in ([("file", one), ("file", two)], [("file", one), ("extra", two)]):
        response = client.post("/api/batch", files=files)
        assert response.status_code == 422
        assert response.json()["error"] == "the request holds 2 files; upload one file a request"
    assert client.post("/api/batch", files=[("file", one)]).status_code == 200
