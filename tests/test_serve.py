"""The web app's API on a stand-in encoder (fast): limits, batches, errors, the key, the queue."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from fastapi.testclient import TestClient

from ksemstamp.detection.inputs import record_problem
from ksemstamp.detector import DetectionResult
from ksemstamp.jsonl import parse_jsonl
from ksemstamp.serve import Limits, create_app
from ksemstamp.serve.jobs import GenerationQueue, JobFailed, QueueFull
from ksemstamp.serve.present import _segments
from ksemstamp.settings import DirectionSettings, RegionSettings, WatermarkSettings

SECRET = "fast-serve-secret-key-7f3a91"
SENTENCES = [f"Sentence number {i} talks about topic {i * 7 % 13}." for i in range(40)]


@pytest.fixture
def app(hash_encoder):
    # SemStamp's region mark: the chains below are built from its valid table.
    cfg = WatermarkSettings.from_dict(
        {"partition": {"kind": "lsh"}, "mark": {"kind": "region"}, "key": SECRET}
    )
    return create_app(cfg, limits=Limits(max_chars=2_000), encoder=hash_encoder, generation=False)


@pytest.fixture
def client(app):
    return TestClient(app)


def _valid_chain(detector, length):
    """Sentences whose every consecutive pair is valid under the app's key."""
    scheme, table = detector.scheme, detector.mark.host_table
    regions = scheme.regions(SENTENCES)[0].tolist()
    chain, prev, used = [SENTENCES[0]], regions[0], set()
    while len(chain) < length:
        options = [
            (s, r)
            for s, r in zip(SENTENCES, regions, strict=True)
            if table[prev, r] and s not in chain
        ]
        if not options:
            break
        # Prefer transitions not used yet: they are what the exact test counts as evidence.
        s, r = min(options, key=lambda o: (prev, o[1]) in used)
        used.add((prev, r))
        chain.append(s)
        prev = r
    return chain


def test_index_and_assets_are_served_locally(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for asset in ("/static/app.js", "/static/style.css"):
        assert client.get(asset).status_code == 200
    # No CDN, no web font: every reference is to the server itself.
    body = page.text + client.get("/static/style.css").text + client.get("/static/app.js").text
    assert "http://" not in body.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in body and "@import" not in body and "url(" not in body


def test_detect_a_marked_chain_colours_every_sentence(client, app):
    chain = _valid_chain(app.state.detector, 10)
    text = " ".join(chain[:5]) + "\n\n" + " ".join(chain[5:])
    view = client.post("/api/detect", json={"text": text}).json()
    assert view["status"] == "ok" and view["decision"] == "watermarked"
    assert view["num_valid"] == view["num_scored"] == len(chain) - 1
    assert [s["verdict"] for s in view["sentences"]] == ["seed"] + ["valid"] * (len(chain) - 1)
    # The segments put the text back together exactly, paragraph break included.
    rebuilt = "".join(
        seg["gap"] + (view["sentences"][seg["sentence"]]["text"] if "sentence" in seg else "")
        for seg in view["segments"]
    )
    assert rebuilt == text
    chart = view["null"]
    assert chart["observed"] == view["num_valid"]
    assert chart["tail"] == pytest.approx(view["p_value"]) and sum(chart["pmf"]) == pytest.approx(1)
    assert "probability" in view["explanation"] and "holding the key" in view["explanation"]
    assert view["key_fingerprint"] == app.state.key_fingerprint


def test_detect_with_a_prompt_scores_the_first_sentence(client):
    view = client.post(
        "/api/detect", json={"text": "Only one sentence here.", "prompt": "A prompt. It ends."}
    ).json()
    assert view["status"] == "ok" and view["num_scored"] == 1
    assert view["sentences"][0]["previous_region"] is not None


def test_too_short_text_says_so(client):
    view = client.post("/api/detect", json={"text": "Just one sentence."}).json()
    assert view["decision"] == "too_short" and view["headline"] == "Too short to score"
    assert "two sentences" in view["message"] and view["null"] is None


@pytest.mark.parametrize(
    "body,status,words",
    [
        ({"text": ""}, 422, "empty"),
        ({"text": "  \n "}, 422, "empty"),
        ({"text": "x" * 2_001}, 413, "limit is 2,000"),
        ({"text": "Fine. Text.", "prompt": "p" * 2_001}, 413, "prompt"),
        ({"prompt": "no text"}, 422, "'text' is required"),
        ({"text": 5}, 422, "'text'"),
    ],
)
def test_bad_detect_requests_get_a_clear_4xx(client, body, status, words):
    response = client.post("/api/detect", json=body)
    assert response.status_code == status
    assert words in response.json()["error"]
    assert client.post("/api/detect", json={"text": "One. Two."}).status_code == 200


def test_non_json_body_is_refused(client):
    response = client.post(
        "/api/detect", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "not valid JSON" in response.json()["error"]


def _upload(client, name, data: bytes):
    return client.post("/api/batch", files={"file": (name, io.BytesIO(data))})


def test_batch_jsonl_keeps_the_cli_contract_and_reports_bad_lines(client, app):
    chain = _valid_chain(app.state.detector, 8)
    lines = [
        json.dumps({"id": "marked", "text": " ".join(chain)}),
        "{not json",
        json.dumps({"id": "short", "text": "One sentence."}),
        "",
        json.dumps({"id": "no-text", "prompt": "x."}),
        json.dumps({"id": "other-key", "text": "A. B.", "key_fingerprint": "000000000000"}),
        json.dumps({"id": "huge", "text": "y" * 3_000}),
        "[1, 2]",
        json.dumps({"id": "chinese", "text": "北京今天下雨。明天是晴天。"}, ensure_ascii=False),
    ]
    response = _upload(client, "texts.jsonl", "\n".join(lines).encode())
    assert response.status_code == 200
    out = response.json()
    rows = {r.get("id", r["line"]): r for r in out["records"]}
    assert rows["marked"]["status"] == "ok" and rows["marked"]["watermarked"] is True
    assert rows["short"]["status"] == "too_short"
    assert rows[2]["status"] == "error" and "not valid JSON" in rows[2]["error"]
    assert rows["no-text"]["error"] == "missing field 'text'"
    assert "different key" in rows["other-key"]["error"]
    assert "limit" in rows["huge"]["error"]
    assert "not a JSON object" in rows[8]["error"]
    assert rows["chinese"]["status"] == "unsupported" and "CJK" in rows["chinese"]["error"]
    assert rows[4]["error"] == "line 4 is blank"
    assert out["summary"] == {
        "ok": 1,
        "too_short": 1,
        "unsupported": 1,
        "error": 6,
        "watermarked": 1,
    }
    # The download is the same records as `watermark.py detect --output` writes, in order.
    written = [json.loads(x) for x in out["jsonl"].splitlines()]
    assert written == out["records"] and [r["line"] for r in written] == list(range(1, 10))
    assert set(written[0]) >= {
        "z_score",
        "p_value",
        "num_scored",
        "num_valid",
        "watermarked",
        "statistic",
        "regions",
        "verdicts",
        "status",
        "id",
        "text",
        "line",
    }
    assert out["output_name"] == "texts.detections.jsonl"


def test_batch_txt_is_one_text(client):
    out = _upload(client, "essay.txt", " ".join(SENTENCES[:6]).encode()).json()
    assert len(out["records"]) == 1 and out["records"][0]["num_scored"] == 5


@pytest.mark.parametrize(
    "name,data,status,words",
    [
        ("bad.txt", b"caf\xe9 au lait. Ok.", 400, "not valid UTF-8"),
        ("bad.jsonl", b'{"text": "\xff"}', 400, "not valid UTF-8"),
        ("empty.jsonl", b"\n \n", 422, "empty"),
        ("all-bad.jsonl", b"not json\nnor this\n", 422, "no line is a JSON object"),
        ("big.txt", b"z" * 2_001, 413, "limit"),
        ("image.png", b"\x89PNG", 415, ".txt or .jsonl"),
    ],
)
def test_bad_uploads_get_a_clear_4xx(client, name, data, status, words):
    response = _upload(client, name, data)
    assert response.status_code == status
    assert words in response.json()["error"]


def test_upload_limits(hash_encoder):
    app = create_app(
        WatermarkSettings.from_dict({"partition": {"kind": "lsh"}, "key": SECRET}),
        limits=Limits(max_upload_bytes=100, max_records=2),
        encoder=hash_encoder,
        generation=False,
    )
    client = TestClient(app)
    assert _upload(client, "a.txt", b"x" * 101).status_code == 413
    three = b'{"text": "A. B."}\n' * 3
    response = _upload(client, "a.jsonl", three)
    assert response.status_code == 413 and "more than 2 records" in response.json()["error"]


def test_a_flood_of_tiny_lines_is_refused_after_the_limit_not_after_parsing_all(
    client, monkeypatch
):
    # 2.1 million lines in 4 MB: the record limit is checked while the lines are read, and
    # reading stops one record past it.
    import ksemstamp.jsonl

    parsed = []
    parse_line = ksemstamp.jsonl._parse_line
    monkeypatch.setattr(
        ksemstamp.jsonl, "_parse_line", lambda *a: parsed.append(1) or parse_line(*a)
    )
    response = _upload(client, "flood.jsonl", b"1\n" * 2_100_000)
    limit = Limits().max_records
    assert response.status_code == 413
    assert f"more than {limit:,} records" in response.json()["error"]
    assert len(parsed) <= limit + 1


def test_uploads_are_read_off_the_event_loop(client, monkeypatch):
    # Decoding and parsing an upload of up to max_upload_bytes takes a while: on the event loop
    # it would hold every other request (the page's /api/info, progress streams) meanwhile.
    import asyncio

    import ksemstamp.serve.routes_detect as routes

    on_loop = []
    parse = routes.parse_jsonl

    def watched(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return parse(*args, **kwargs)

    monkeypatch.setattr(routes, "parse_jsonl", watched)
    response = _upload(client, "texts.jsonl", b'{"text": "One. Two. Three."}\n')
    assert response.status_code == 200 and on_loop == [False]


def test_the_page_and_the_detector_share_one_size_limit(hash_encoder):
    # Without limits the page takes max_text_chars; given limits replace it for the detector too.
    cfg = WatermarkSettings.from_dict(
        {"partition": {"kind": "lsh"}, "limits": {"max_text_chars": 120}, "key": SECRET}
    )
    app = create_app(cfg, encoder=hash_encoder, generation=False)
    client = TestClient(app)
    assert client.get("/api/info").json()["max_chars"] == 120 == app.state.detector.max_chars
    response = client.post("/api/detect", json={"text": " ".join(SENTENCES[:5])})
    assert response.status_code == 413 and "limit is 120" in response.json()["error"]
    wider = create_app(cfg, limits=Limits(max_chars=500), encoder=hash_encoder, generation=False)
    assert wider.state.detector.max_chars == 500
    answer = TestClient(wider).post("/api/detect", json={"text": " ".join(SENTENCES[:5])})
    assert answer.status_code == 200 and answer.json()["status"] == "ok"


def test_detect_says_when_a_script_is_not_read(client):
    view = client.post("/api/detect", json={"text": "😀😀😀 🎉🎉"}).json()
    assert view["status"] == view["decision"] == "unsupported"
    assert "no letters" in view["message"] and view["headline"]


def test_generation_is_refused_without_a_model(client):
    response = client.post("/api/generate", json={"prompt": "Hello there."})
    assert response.status_code == 503
    assert client.get("/api/jobs/nothing").status_code == 404


def test_the_key_never_leaves_the_server(client, app, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    chain = _valid_chain(app.state.detector, 6)
    responses = [
        client.get("/"),
        client.get("/static/app.js"),
        client.get("/api/info"),
        client.get("/missing"),
        client.post("/api/detect", json={"text": " ".join(chain)}),
        client.post("/api/detect", json={"text": ""}),
        client.post("/api/detect", json={"wrong": SECRET[:3]}),
        _upload(client, "t.jsonl", b'{"text": "A. B."}\nnot json\n'),
        _upload(client, "t.txt", b"\xff"),
        client.post("/api/generate", json={"prompt": "A prompt."}),
    ]

    # An internal error whose message happens to hold the key: the page gets a bare 500, the
    # log gets the traceback with the key blanked out.
    def broken(*args, **kwargs):
        raise RuntimeError(f"something went wrong near {SECRET}")

    monkeypatch.setattr(app.state.detector, "detect", broken)
    failed = client.post("/api/detect", json={"text": "One. Two."})
    assert failed.status_code == 500 and "internal error" in failed.json()["error"]
    responses.append(failed)
    for response in responses:
        assert SECRET not in response.text
        assert all(SECRET not in v for v in response.headers.values())
    assert client.get("/api/info").json()["key_fingerprint"] == app.state.key_fingerprint
    assert "something went wrong near ***" in caplog.text
    assert SECRET not in caplog.text


# ---------------------------------------------------------------------- pieces


def test_segments_fall_back_when_a_sentence_is_not_found():
    assert _segments("A b.  C d.", ["A b.", "C d."]) == [
        {"gap": "", "sentence": 0},
        {"gap": "  ", "sentence": 1},
        {"gap": ""},
    ]
    assert _segments("A b.", ["X."]) == [{"gap": "", "sentence": 0}, {"gap": "A b."}]
    assert _segments("  ", []) == [{"gap": "  "}]


def test_null_chart_uses_the_prompt_seed():
    result = DetectionResult(
        status="ok",
        num_scored=2,
        num_valid=1,
        regions=[1, 2],
        verdicts=["valid", "invalid"],
        seed_region=0,
        p_value=0.5,
    )
    chart = _mark(RegionSettings(), bits=2).view(result, 0.01, "sentence")["null"]
    # Transitions 0->1 and 1->2, one valid region per row: each valid with chance 1/4.
    assert chart["pmf"] == pytest.approx([9 / 16, 6 / 16, 1 / 16])
    assert chart["tail"] == pytest.approx(7 / 16) and chart["expected"] == pytest.approx(0.5)


def test_direction_mark_view_scores_and_normal_chart(hash_encoder):
    cfg = WatermarkSettings.from_dict(
        {
            "partition": {"kind": "lsh"},
            "mark": {"kind": "direction", "context": "previous"},
            "detection": {"scan": False},
            "key": SECRET,
        }
    )
    app = create_app(cfg, encoder=hash_encoder, generation=False)
    client = TestClient(app)
    assert client.get("/api/info").json()["mark"] == "direction"
    scheme, mark = app.state.detector.scheme, app.state.detector.mark
    # A chain picked for the key: each next sentence the best-scoring after the previous one.
    emb = scheme.embed(SENTENCES)
    vectors, regions = mark.vectors(emb), scheme.locate(emb)[0].tolist()
    chain, prev = [SENTENCES[0]], regions[0]
    for _ in range(7):
        scores = mark.scores(vectors, [prev] * len(SENTENCES)).tolist()
        best = max((i for i, s in enumerate(SENTENCES) if s not in chain), key=lambda i: scores[i])
        chain.append(SENTENCES[best])
        prev = regions[best]
    view = client.post("/api/detect", json={"text": " ".join(chain)}).json()
    assert view["counted"] == "positive / scored" and view["decision"] == "watermarked"
    assert view["null"]["kind"] == "normal"
    assert view["null"]["z"] == pytest.approx(view["z_score"])
    assert view["null"]["tail"] == pytest.approx(view["p_value"])
    assert view["expected"] == pytest.approx(view["num_scored"] / 2)
    scored = [s for s in view["sentences"] if s["scored"]]
    assert len(scored) == 7 and all(s["score"] > 0 for s in scored)
    assert view["sentences"][0]["score"] is None
    assert "exactly normal" in view["explanation"]
    assert "region of the previous clause" in view["explanation"]  # the default's units
    assert SECRET not in json.dumps(view)


def test_own_context_view_names_the_sentence_itself_and_the_marked_span(hash_encoder):
    cfg = WatermarkSettings.from_dict(
        {
            "partition": {"kind": "lsh"},
            "mark": {"kind": "direction", "context": "own", "units": "sentences"},
            "key": SECRET,
        }
    )
    app = create_app(cfg, encoder=hash_encoder, generation=False)
    client = TestClient(app)
    info = client.get("/api/info").json()
    assert info["mark_settings"]["context"] == "own" and info["scan"] is True
    assert info["prompt_seeds"] is False
    scheme, mark = app.state.detector.scheme, app.state.detector.mark
    # The sentences that lean the key's way on their own context, in any order.
    emb = scheme.embed(SENTENCES)
    scores = mark.scores(mark.vectors(emb), scheme.locate(emb)[0]).tolist()
    marked = sorted(range(len(SENTENCES)), key=lambda i: -scores[i])[:8]
    view = client.post("/api/detect", json={"text": " ".join(SENTENCES[i] for i in marked)})
    view = view.json()
    assert "region of the sentence itself" in view["explanation"]
    assert all(s["previous_region"] is None for s in view["sentences"])
    assert view["span"] is not None and 0 < view["span_p_value"] <= 1
    assert "most strongly marked run of sentences" in view["explanation"]
    # The chart shades the whole-text test's tail; the verdict's p combines it with the span's,
    # the mixture's and the weighted z's, and never exceeds four times the smallest of the four.
    tests = ("span_p_value", "mixture_p_value", "weighted_p_value")
    smallest = min(view["null"]["tail"], *(view[t] for t in tests))
    assert smallest <= view["p_value"] <= 4 * smallest + 1e-9


def _mark(settings, bits=3, kmeans=False):
    """The mark of ``settings`` on a stand-in encoder and an LSH (or k-means) partition."""
    from conftest import HashEncoder

    from ksemstamp.marks import build_mark
    from ksemstamp.scheme.core import WatermarkScheme
    from ksemstamp.scheme.partition import KMeansPartition, LSHPartition
    from ksemstamp.text.splitter import get_splitter

    if kmeans:
        import torch

        centroids = torch.nn.functional.normalize(
            torch.randn(4, 32, generator=torch.Generator().manual_seed(0)), dim=-1
        )
        partition = KMeansPartition(centroids, 0.0)
    else:
        partition = LSHPartition(32, bits=bits)
    return build_mark(WatermarkScheme(HashEncoder(), partition, "k", get_splitter(), settings))


def _explanation(mark, result):
    return mark.view(result, 0.01, "sentence")["explanation"]


def test_soft_context_explanation():
    result = DetectionResult(status="ok", z_score=3.0, p_value=0.00135, num_scored=6, num_valid=5)
    text = _explanation(_mark(DirectionSettings(), kmeans=True), result)
    assert "blend of the directions" in text and "exactly normal" in text


def test_explanation_names_a_text_that_never_changes_step():
    region = _mark(RegionSettings())
    same = DetectionResult(
        status="ok",
        num_scored=3,
        num_valid=3,
        regions=[2, 2, 2, 2],
        verdicts=["seed", "valid", "valid", "valid"],
        p_value=0.25,
        statistic="exact",
    )
    assert "same step, region 2 to region 2" in _explanation(region, same)
    varied = DetectionResult(
        status="ok",
        num_scored=2,
        num_valid=2,
        regions=[1, 2, 3],
        verdicts=["seed", "valid", "valid"],
        p_value=0.06,
        statistic="exact",
    )
    assert "same step" not in _explanation(region, varied)


def test_parse_jsonl_and_check_record():
    parsed = parse_jsonl('{"text": "a"}\n\n[1]\n{bad\n')
    assert [(p.line, p.error is None) for p in parsed] == [
        (1, True),
        (2, False),
        (3, False),
        (4, False),
    ]
    assert parsed[1].error == "line 2 is blank"
    assert (
        record_problem({"text": "a", "prompt": 3}, "f", None, False, 10)
        == "'prompt' must be a string or null, got int"
    )
    assert record_problem({"text": "a", "key_fingerprint": "f"}, "f", None, False, 10) is None
    assert "longer than the limit" in record_problem({"text": "a" * 11}, "f", None, False, 10)


@pytest.mark.parametrize("strict", [False, True])
def test_an_upload_made_under_other_identity_settings_is_answered_as_the_cli_answers_it(
    hash_encoder, strict
):
    """The page builds its rows with the command line's builder: ``--detection.strict`` refuses
    a record whose identity differs, else it is scored and says so."""
    from ksemstamp.detection.inputs import identity_fields
    from ksemstamp.settings.identity import identity_of

    cfg = WatermarkSettings.from_dict(
        {
            "partition": {"kind": "lsh"},
            "mark": {"kind": "region"},
            "key": SECRET,
            "detection": {"strict": strict},
        }
    )
    app = create_app(cfg, limits=Limits(max_chars=2_000), encoder=hash_encoder, generation=False)
    there = identity_of(WatermarkSettings(mark=DirectionSettings(units="sentences")), "e", "c")
    record = {"text": " ".join(SENTENCES[:4]), **identity_fields(there)}
    row = _upload(TestClient(app), "in.jsonl", (json.dumps(record) + "\n").encode()).json()
    row = row["records"][0]
    if strict:
        assert row["status"] == "error" and "refused under --strict" in row["error"]
    else:
        assert row["status"] in ("ok", "too_short") and "mark.kind" in row["identity_mismatch"]


def test_queue_runs_one_job_at_a_time_in_order():
    gate = threading.Event()
    running, order = [], []

    def run(params, report):
        running.append(params["n"])
        assert len(running) == 1, "two jobs ran at once"
        report({"step": 1})
        if params["n"] == 0:
            gate.wait(10)
        if params["n"] == 2:
            running.pop()
            raise JobFailed("the prompt was refused")
        order.append(params["n"])
        running.pop()
        return {"n": params["n"]}

    queue = GenerationQueue(run, max_waiting=2)
    first = queue.submit({"n": 0})
    snap = queue.wait(first["id"], first["version"], 5)
    while snap["state"] != "running":
        snap = queue.wait(first["id"], snap["version"], 5)
    second, third = queue.submit({"n": 1}), queue.submit({"n": 2})
    assert (second["position"], second["ahead"]) == (1, 1)
    assert (third["position"], third["ahead"]) == (2, 2)
    with pytest.raises(QueueFull):
        queue.submit({"n": 3})
    gate.set()
    for job in (first, second, third):
        snap = queue.snapshot(job["id"])
        while snap["state"] not in ("done", "error"):
            snap = queue.wait(job["id"], snap["version"], 5)
        job.update(snap)
    assert order == [0, 1]
    assert first["result"] == {"n": 0} and first["progress"] == {"step": 1}
    assert third["state"] == "error" and third["error"] == "the prompt was refused"
    queue.close()


def test_serve_command_passes_host_port_settings_and_limits(monkeypatch, tmp_path):
    import ksemstamp.serve as serve_module
    from ksemstamp.cli import main

    calls = []
    monkeypatch.setattr(serve_module, "serve", lambda *args: calls.append(args))
    config = tmp_path / "s.yaml"
    config.write_text("mark: {kind: region, gamma: 0.5}\n")
    argv = [
        "serve",
        "--config",
        str(config),
        "--port",
        "9123",
        "--max_chars",
        "50",
        "--generation",
        "false",
        "--detection.alpha",
        "0.05",
    ]
    assert main(argv) == 0
    cfg, host, port, limits, generation = calls[0]
    assert (host, port, limits.max_chars, generation) == ("127.0.0.1", 9123, 50, False)
    assert (cfg.mark.gamma, cfg.detection.alpha) == (0.5, 0.05)
    # without --max_chars the page keeps the detector's own limit
    config.write_text("limits: {max_text_chars: 1234}\n")
    assert main(["serve", "--config", str(config), "--generation", "false"]) == 0
    assert calls[1][3].max_chars == 1234


def test_serve_logs_the_address(monkeypatch, capsys, app):
    import uvicorn

    import ksemstamp.serve as serve_module
    from ksemstamp.cli.console import console_output

    ran = []
    monkeypatch.setattr(serve_module, "create_app", lambda *a, **k: app)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: ran.append(self.config.port))
    with console_output():  # as under `ksemstamp serve`: the library's log on stderr
        serve_module.serve(
            WatermarkSettings.from_dict({"partition": {"kind": "lsh"}, "key": SECRET}), port=0
        )
    err = capsys.readouterr().err
    assert f"http://127.0.0.1:{ran[0]}/" in err and app.state.key_fingerprint in err
    assert SECRET not in err


def test_an_oversized_body_is_refused_before_it_is_read(hash_encoder):
    app = create_app(
        WatermarkSettings.from_dict({"partition": {"kind": "lsh"}, "key": SECRET}),
        limits=Limits(max_chars=10, max_upload_bytes=10),
        encoder=hash_encoder,
        generation=False,
    )
    response = TestClient(app).post("/api/detect", json={"text": "x" * 100})
    assert response.status_code == 413 and "larger" in response.json()["error"]


def test_detect_reads_a_retyped_text_as_the_original_and_says_so(client):
    text = " ".join(SENTENCES[:4])
    retyped = text.replace("o", "\u043e", 3).replace("Sentence", "Sen\u200btence", 1)
    plain, view = (client.post("/api/detect", json={"text": t}).json() for t in (text, retyped))
    assert view["p_value"] == plain["p_value"] and view["sentences"] == plain["sentences"]
    assert plain["normalization"] is None
    assert "3 look-alike letters" in view["normalization"]
    assert "1 invisible character" in view["normalization"]
    assert "altered on purpose" in view["normalization"]
    # every sentence is shown in place in the text as it was read
    assert [seg["sentence"] for seg in view["segments"] if "sentence" in seg] == [0, 1, 2, 3]


def test_a_detect_request_without_a_json_content_type_is_told_what_it_lacks(client):
    response = client.post("/api/detect", content=b'{"text": "One. Two."}')
    assert response.status_code == 415
    said = response.json()["error"]
    assert "Content-Type: application/json" in said and "content type: none" in said
    typed = client.post(
        "/api/detect", content=b'{"text": "One. Two."}', headers={"content-type": "text/plain"}
    )
    assert typed.status_code == 415 and "'text/plain'" in typed.json()["error"]
    assert client.post("/api/detect", json={"text": "One. Two."}).status_code == 200
