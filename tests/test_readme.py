"""The README's code runs as written: its Python blocks are run, its command lines (and those
of docs/cli.md and docs/training.md) are parsed by the real command line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ksemstamp.cli import resolve
from ksemstamp.cli.parser import parse
from ksemstamp.keys import new_key

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "cli.md", ROOT / "docs" / "training.md"]
ENTRIES = ("watermark.py", "ksemstamp")
"""How a command line in the docs calls a command."""


def blocks(path: Path, language: str) -> list[str]:
    """The fenced code blocks of ``path`` in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.M | re.S)


def command_lines(path: Path) -> list[list[str]]:
    """The ``watermark.py`` and ``ksemstamp`` command lines of the bash blocks of ``path``,
    each as its argv after the entry; optional parts written ``[--flag value]`` are kept,
    unbracketed, and lines continued with a backslash are joined."""
    lines = []
    for block in blocks(path, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.replace("[", "").replace("]", ""), comments=True)
            # what a shell does with the output is not the command's: `> text.txt`, `| ...`
            cut = next((i for i, w in enumerate(words) if w in (">", ">>", "|")), len(words))
            words = words[:cut]
            entry = next((w for w in words if w in ENTRIES or w.endswith("/ksemstamp")), None)
            argv = words[words.index(entry) + 1 :] if entry is not None else []
            # `train` is LightningCLI's (tests/test_training_fit.py); COMMAND is a placeholder.
            if argv and argv[0] not in ("train", "COMMAND", "--help"):
                lines.append(argv)
    return lines


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_line_in_the_docs_parses(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # paths such as configs/eval/news.yaml are the checkout's
    argvs = command_lines(path)
    assert len(argvs) >= 4
    for argv in argvs:
        fn, prog, rest = resolve(argv, "ksemstamp")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the docs speak today's spelling
            parse(fn, rest, prog)  # a flag that no longer exists stops here with its one-line error


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
