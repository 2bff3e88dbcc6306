"""The web app on the real offline models: detection, the generation queue, and a real browser."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ksemstamp.marks import build_mark
from ksemstamp.serve import create_app, free_port
from ksemstamp.settings import WatermarkSettings
from ksemstamp.text.corpora import news_articles

pytestmark = pytest.mark.e2e

SECRET = "e2e-serve-secret-key-4c19d2"
PROMPT = "The city council approved a new budget on Monday. The plan raises spending on schools."


@pytest.fixture(scope="module")
def app(encoder, lm):
    # Few candidates per sentence: generation tests only need the machinery to run.
    cfg = WatermarkSettings.from_dict(
        {
            "search": {"max_candidates": 8},
            "sampling": {"max_new_tokens": 200, "seed": 0},
            "key": SECRET,
        }
    )
    return create_app(cfg, encoder=encoder, lm=lm)


@pytest.fixture(scope="module")
def client(app):
    return TestClient(app)


@pytest.fixture(scope="module")
def marked_text(app) -> str:
    """Human news sentences chosen for the key: each next one the best-scoring of a corpus, on
    its own context (the default) or after the previous one's region (``context: previous``):
    the direction mark's rule with a corpus in place of the LM."""
    scheme = app.state.detector.scheme
    assert scheme.settings.kind == "direction"
    pool = [
        s
        for a in news_articles("test")[:40]
        for s in scheme.splitter.split(a.text)
        # Plain sentences, so that the splitter cuts the joined chain back into them.
        if 8 <= len(s.split()) <= 30 and s[0].isupper() and s[-1] in ".!?" and '"' not in s
    ]
    emb = scheme.embed(pool)
    regions, vectors = scheme.locate(emb)[0].tolist(), build_mark(scheme).vectors(emb)
    own = scheme.settings.context == "own"
    # Under own contexts every sentence counts, the first too: start with the best of the pool;
    # chained, the first sentence only seeds.
    first = (
        int(build_mark(scheme).scores(vectors, build_mark(scheme).context_weights(emb)).argmax())
        if own
        else 0
    )
    chain, prev = [first], regions[first]
    while len(chain) < 11:
        contexts = build_mark(scheme).context_weights(emb) if own else [prev] * len(pool)
        scores = build_mark(scheme).scores(vectors, contexts)
        scores[chain] = float("-inf")
        for _ in range(50):
            best = int(scores.argmax())
            # Keep only sentences that the splitter cuts back out of the joined text.
            joined = [pool[i] for i in chain] + [pool[best]]
            if scheme.splitter.split(" ".join(joined)) == joined:
                break
            scores[best] = float("-inf")
        else:
            raise AssertionError("no sentence of the pool joins the chain cleanly")
        chain.append(best)
        prev = regions[best]
    return " ".join(pool[i] for i in chain)


@pytest.fixture(scope="module")
def human_text() -> str:
    return " ".join(news_articles("test")[3].text.split()[:150])  # about 200 tokens


def test_detect_marked_and_human_text(client, app, marked_text, human_text):
    marked = client.post("/api/detect", json={"text": marked_text}).json()
    assert marked["decision"] == "watermarked" and marked["p_value"] <= 0.01
    verdicts = [s["verdict"] for s in marked["sentences"]]
    # Under own contexts the first sentence is scored too; chained, it only seeds.
    first = 0 if app.state.detector.scheme.settings.context == "own" else 1
    assert verdicts[first:] == ["valid"] * (11 - first)
    human = client.post("/api/detect", json={"text": human_text}).json()
    assert human["status"] == "ok" and human["num_scored"] >= 4
    assert human["decision"] == "not_watermarked" and human["p_value"] > 0.01
    # Models are loaded once: a ~200-token text answers well under a second.
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        client.post("/api/detect", json={"text": human_text})
        timings.append(time.perf_counter() - start)
    assert min(timings) < 1.0, timings


def _events(client, job_id):
    with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return [
            json.loads(line[len("data: ") :])
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


def test_generation_is_queued_and_streams_progress(client):
    first = client.post("/api/generate", json={"prompt": PROMPT, "max_new_tokens": 8})
    second = client.post(
        "/api/generate",
        json={"prompt": "The storm hit the coast. Thousands lost power.", "max_new_tokens": 8},
    )
    assert first.status_code == second.status_code == 202
    second = second.json()
    assert second["state"] == "queued" and second["ahead"] >= 1
    events = _events(client, first.json()["id"])
    assert events[-1]["state"] == "done", events[-1]
    progress = [e["progress"] for e in events if e["progress"]]
    assert progress and progress[-1]["sentences"] >= 1 and progress[-1]["candidates"] >= 1
    result = events[-1]["result"]
    assert result["text"] and result["generation"]["num_sentences"] >= 1
    view = result["detection"]
    assert view["status"] == "ok" and view["num_scored"] >= 1  # the prompt seeds sentence one
    later = _events(client, second["id"])
    assert later[-1]["state"] == "done"


def test_bad_prompts_and_the_key(client):
    # Refused at once, before the queue: input that is not text, too many tokens asked for.
    binary = client.post("/api/generate", json={"prompt": "\x00\x01\x02\x03 data"})
    assert binary.status_code == 422 and "not text" in binary.json()["error"]
    too_long = client.post("/api/generate", json={"prompt": PROMPT, "max_new_tokens": 10_000})
    assert too_long.status_code == 422
    for response in (binary, too_long, client.get("/api/info")):
        assert SECRET not in response.text


# ---------------------------------------------------------------------- browser


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def server_url(app):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.browser
def test_browser_shows_verdict_coloured_sentences_batch_and_generation(
    server_url, app, marked_text, tmp_path: Path
):
    browser_path = _chromium()
    if browser_path is None:
        pytest.skip("no chromium found (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server_url + "/")
            # The page's content security policy forbids eval: wait with locators, not
            # string predicates (Playwright evaluates those in the page).
            expect = sync_api.expect
            expect(page.locator("#fingerprint")).to_have_text(re.compile(r".{4,}"))
            page.fill("#detect-text", marked_text)
            page.click("#detect-button")
            page.wait_for_selector("#verdict", timeout=30_000)
            assert page.inner_text("#verdict") == "Watermarked"
            spans = page.locator(".marked-text .s")
            verdicts = spans.evaluate_all("els => els.map(e => e.dataset.verdict)")
            own = app.state.detector.scheme.settings.context == "own"
            assert verdicts == (["valid"] * 11 if own else ["seed"] + ["valid"] * 10)
            # Coloured: a valid sentence's background is the green of the legend.
            colour = page.eval_on_selector(
                ".marked-text .s.valid", "e => getComputedStyle(e).backgroundColor"
            )
            assert colour == "rgb(200, 236, 208)"
            assert "region" in page.get_attribute(".marked-text .s.valid", "title")
            # The p-value's tail is shaded: bars (region mark) or the normal curve (direction).
            assert page.locator(".chart svg .tail").count() >= 1
            assert "probability" in page.inner_text(".explain")
            assert SECRET not in page.content()
            page.screenshot(path=str(tmp_path / "detect.png"), full_page=True)
            # A bad request shows the server's message and the page keeps working.
            page.fill("#detect-text", "   ")
            page.click("#detect-button")
            # "scoring ..." first, then the server's message.
            expect(page.locator("#detect-status")).not_to_have_text(
                re.compile(r"^scoring"), timeout=30_000
            )
            assert "empty" in page.inner_text("#detect-status")

            # Batch: the table shows each line's result or error, and the output downloads.
            upload = tmp_path / "texts.jsonl"
            upload.write_text(json.dumps({"id": "m", "text": marked_text}) + "\n{cut off\n")
            page.click("#tab-batch")
            page.set_input_files("#batch-file", str(upload))
            page.click("#batch-button")
            page.wait_for_selector("#batch-table")
            rows = page.locator("#batch-table tr").all_inner_texts()
            assert "watermarked" in rows[1] and "not valid JSON" in rows[2]
            with page.expect_download() as download:
                page.click("#batch-download")
            saved = tmp_path / "out.jsonl"
            download.value.save_as(saved)
            lines = [json.loads(x) for x in saved.read_text().splitlines()]
            assert [r["status"] for r in lines] == ["ok", "error"]
            page.screenshot(path=str(tmp_path / "batch.png"), full_page=True)

            # Generate: progress arrives over server-sent events, then the detection view.
            page.click("#tab-generate")
            page.fill("#generate-tokens", "8")
            page.click("#generate-button")
            page.wait_for_selector("#generate-result #verdict", timeout=300_000)
            assert "done:" in page.inner_text("#generate-status")
            assert page.locator("#generate-result .marked-text .s").count() >= 1
            page.screenshot(path=str(tmp_path / "generate.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "detect.png").stat().st_size > 10_000
