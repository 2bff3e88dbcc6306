"""A new user's first ten minutes, from a fresh clone: the README's set-up, then its first
steps (``keygen``, ``generate``, ``detect``, ``serve``) as written, in a shell.

It clones the repository's committed tree, runs the README's set-up block (``make setup``: a new
virtual environment, installed from PyPI and pip's cache, about 2 minutes on 2 cores), and runs
the first steps in the activated environment, with an empty model cache. ``generate`` is asked
for a short text (the README's default of 200 tokens takes minutes on a CPU) and ``serve``
answers one detection on a free port, then stops."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SHORT = " --sampling.max_new_tokens 40 --search.max_candidates 8"


def _block(title: str) -> str:
    """The bash block under the README's section ``title``."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(f"## {title}\n") :]
    return re.search(r"^```bash\n(.*?)^```", section, re.M | re.S)[1]


def _bash(script: str, cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, f"{script}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    return run


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None, reason="git, make")
def test_the_first_ten_minutes_of_a_new_user(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "ksemstamp"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KSEMSTAMP_", "VIRTUAL_ENV"))}
    env |= {"KSEMSTAMP_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    env |= {"PYTHON": shutil.which("python3", path=os.path.dirname(sys.executable)) or "python3"}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONWARNINGS", None)

    setup = _block("Set-up")
    assert "make setup" in setup and "source .venv/bin/activate" in setup
    started = time.perf_counter()
    _bash(setup, clone, env, timeout=1800)
    setup_s = time.perf_counter() - started

    steps = _block("First steps").splitlines()
    keygen, generate, detect, serve = steps
    assert keygen.startswith('export KSEMSTAMP_KEY="$(ksemstamp keygen)"')
    assert generate.startswith("ksemstamp generate") and "> text.txt" in generate
    assert detect.startswith("ksemstamp detect --file text.txt")
    assert serve.startswith("ksemstamp serve")
    generate = generate.replace(" > text.txt", SHORT + " --quiet > text.txt")
    script = "\n".join(
        [
            "source .venv/bin/activate",
            'test "$(command -v ksemstamp)" = "$PWD/.venv/bin/ksemstamp"',
            "TIMEFORMAT='help %R'; time ksemstamp --help > /dev/null",
            "TIMEFORMAT='keygen %R'; time ksemstamp keygen > /dev/null",
            keygen,
            "test ${#KSEMSTAMP_KEY} -eq 64",
            generate,
            detect.replace("ksemstamp detect", "ksemstamp detect --quiet"),
            'echo "key=$KSEMSTAMP_KEY" > key.env',
        ]
    )
    run = _bash(script, clone, env, timeout=1800)
    times = dict(re.findall(r"^(help|keygen) ([\d.]+)$", run.stderr, re.M))
    text = (clone / "text.txt").read_text().strip()
    assert (
        text
        and "Loading weights" not in run.stderr
        and "warning: no watermark key" not in run.stderr
    )
    report = run.stdout
    assert "verdict" in report and re.search(r"p = [\d.e-]+ \(exact", report), report
    assert text[-1] in ".!?\"'”)", text  # a finished sentence

    # serve, as the README starts it, on a free port; one detection through the page's API
    key = (clone / "key.env").read_text().strip().split("=", 1)[1]
    server = subprocess.Popen(
        ["bash", "-c", f"source .venv/bin/activate && exec {serve.split('#')[0].strip()} "
         "--port 0 --generation false --quiet"],
        cwd=clone,
        env=env | {"KSEMSTAMP_KEY": key},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        address = None
        deadline = time.monotonic() + 600
        while address is None and time.monotonic() < deadline:
            line = server.stderr.readline()
            assert line or server.poll() is None, "serve stopped"
            found = re.search(r"serving on (http://\S+/)", line)
            address = found[1] if found else None
        assert address, "serve never said where it serves"
        page = None
        while page is None and time.monotonic() < deadline:  # it says so just before it listens
            try:
                page = urllib.request.urlopen(address, timeout=60).read().decode()
            except OSError:
                time.sleep(0.5)
        assert page is not None and "<!doctype html>" in page.lower()
        body = json.dumps({"text": text, "prompt": generate.split('"')[1]}).encode()
        request = urllib.request.Request(
            address + "api/detect", body, {"Content-Type": "application/json"}
        )
        answer = json.loads(urllib.request.urlopen(request, timeout=300).read())
        assert answer["p_value"] is not None, answer
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
    print(f"set-up {setup_s:.0f} s; --help {times.get('help')} s; keygen {times.get('keygen')} s")
