"""The README's code runs as written: its Python blocks are run, its command lines (and those
of docs/cli.md) are parsed by the real command line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ksemstamp.cli_args import parse
from ksemstamp.keys import new_key

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "cli.md"]


def blocks(path: Path, language: str) -> list[str]:
    """The fenced code blocks of ``path`` in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.M | re.S)


def command_lines(path: Path) -> list[list[str]]:
    """The ``watermark.py`` command lines of the bash blocks of ``path``, each as its argv
    after ``watermark.py``; optional parts written ``[--flag value]`` are kept, unbracketed."""
    lines = []
    for block in blocks(path, "bash"):
        for line in block.splitlines():
            words = shlex.split(line.replace("[", "").replace("]", ""), comments=True)
            if "watermark.py" in words:
                lines.append(words[words.index("watermark.py") + 1 :])
    return lines


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_line_in_the_docs_parses(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # paths such as configs/eval/news.yaml are the checkout's
    argvs = command_lines(path)
    assert len(argvs) >= 7
    for argv in argvs:
        parse(argv)  # a flag that no longer exists stops here with its one-line error


@pytest.mark.e2e
def test_the_python_blocks_of_the_readme_run_as_written(tmp_path):
    code = blocks(ROOT / "README.md", "python")
    assert code, "the README has a Python example"
    # A strong key from the environment, as the README asks; weak keys are not let through.
    env = {k: v for k, v in os.environ.items() if k != "KSEMSTAMP_ALLOW_WEAK_KEY"}
    env |= {"KSEMSTAMP_KEY": new_key(), "HF_HUB_OFFLINE": "1"}
    for source in code:
        run = subprocess.run(
            [sys.executable, "-c", source],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=1200,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Warning" not in run.stderr, run.stderr[-3000:]
        assert run.stdout.strip()
