"""Without the ``serve`` and ``plots`` extras (fastapi, uvicorn, python-multipart, matplotlib),
``detect`` and ``generate`` run and ``serve`` says in one line which extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

WITHOUT_EXTRAS = """
import importlib.abc, sys

EXTRAS = {"fastapi", "starlette", "uvicorn", "multipart", "python_multipart", "matplotlib"}


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NotInstalled())
from ksemstamp.cli import main

raise SystemExit(main(sys.argv[1:]))
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KSEMSTAMP_KEY": "extras-test-key", "KSEMSTAMP_ALLOW_WEAK_KEY": "1"}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_serve_without_the_extra_names_it_in_one_line():
    done = _run("serve", "--port", "0")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the web page needs fastapi")
    assert "pip install 'ksemstamp[serve]'" in last and "Traceback" not in done.stderr


@pytest.mark.e2e
def test_detect_and_generate_run_without_the_extras(tmp_path):
    prompts, made, scored = (tmp_path / n for n in ("prompts.jsonl", "made.jsonl", "scored.jsonl"))
    prompts.write_text('{"id": "a", "prompt": "The council met on Monday."}\n')
    generate = _run(
        "generate",
        *("--input", str(prompts), "--output", str(made)),
        *("--sampling.max_new_tokens", "12", "--sampling.seed", "0", "--quiet"),
    )
    assert generate.returncode == 0, generate.stderr
    assert json.loads(made.read_text())["status"] == "ok"
    detect = _run("detect", "--input", str(made), "--output", str(scored), "--quiet")
    assert detect.returncode == 0, detect.stderr
    assert 0 < json.loads(scored.read_text())["p_value"] <= 1
