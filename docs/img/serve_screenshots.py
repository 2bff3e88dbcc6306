"""Make the screenshots of `watermark.py serve` shown in the README (docs/img/serve-*.png).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python docs/img/serve_screenshots.py

Starts the app on a free port with the default settings (the key from ``KSEMSTAMP_KEY``, else
the public demo key, as ``make demo``), generates a watermarked continuation of a prompt in the
Generate tab, pastes it into the Detect tab, and scores a small JSONL file (that text, two human
news texts, a too-short text and a bad line) in the Batch tab, driving Debian's chromium through
Playwright. Prints the server-side time of the detection request. The screenshots are kept in
256 colours (``shrink``): every clone of the repository carries them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from ksemstamp.serve import create_app, free_port
from ksemstamp.settings import SamplingSettings, WatermarkSettings
from ksemstamp.text.corpora import news_articles

OUT = Path(__file__).resolve().parent
PROMPT = (
    "The city council approved a new budget on Monday after months of debate. "
    "The plan raises spending on schools and roads."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    args = parser.parse_args()

    # the texts shown in docs/web.md
    app = create_app(WatermarkSettings(sampling=SamplingSettings(seed=0)))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    url = f"http://127.0.0.1:{port}/"
    prompt = args.prompt

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})

        page.goto(url + "#generate")
        page.fill("#generate-prompt", prompt)
        page.fill("#generate-tokens", str(args.max_new_tokens))
        page.click("#generate-button")
        page.wait_for_selector("#generate-counts:not(:empty)", timeout=600_000)
        page.wait_for_timeout(4_000)
        page.screenshot(path=str(OUT / "serve-generate-progress.png"))
        page.wait_for_selector("#generate-result #verdict", timeout=1_800_000)
        page.screenshot(path=str(OUT / "serve-generate.png"), full_page=True)
        text = page.evaluate(
            "() => [...document.querySelectorAll('#generate-result .marked-text .s')]"
            ".map(e => e.textContent).join(' ')"
        )

        page.click("#tab-detect")
        page.fill("#detect-text", text)
        page.fill("#detect-prompt", prompt)
        page.click("#detect-button")
        page.wait_for_selector("#detect-result #verdict")
        seconds = page.inner_text("dd[data-field='detection took']")
        page.screenshot(path=str(OUT / "serve-detect.png"), full_page=True)

        human = [" ".join(a.text.split()[:150]) for a in news_articles("test")[10:12]]
        rows = [
            json.dumps(
                {
                    "id": "generated",
                    "prompt": prompt,
                    "text": text,
                    "key_fingerprint": app.state.key_fingerprint,
                }
            ),
            json.dumps({"id": "news-10", "text": human[0]}),
            json.dumps({"id": "news-11", "text": human[1]}),
            json.dumps({"id": "one-line", "text": "A single sentence cannot be scored."}),
            '{"id": "cut", "text": "a line cut off',
        ]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "texts.jsonl"
            path.write_text("\n".join(rows) + "\n")
            page.click("#tab-batch")
            page.set_input_files("#batch-file", str(path))
            page.click("#batch-button")
            page.wait_for_selector("#batch-table")
        page.screenshot(path=str(OUT / "serve-batch.png"), full_page=True)
        browser.close()
    server.should_exit = True
    print(f"detection request (server side): {seconds}")
    for path in OUT.glob("serve-*.png"):
        shrink(path)


def shrink(path: Path) -> None:
    """A page's screenshot in 256 colours: half the bytes, the same look (flat colours, text)."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, optimize=True
    )


if __name__ == "__main__":
    main()
