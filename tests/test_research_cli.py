"""The research commands' flags (``research.order.run``, ``python -m research.study``): every
command their READMEs and the Makefile document parses, without running (the work function is
replaced), and ``--config`` files and settings checks behave as in ``watermark.py``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import research.order.run as order
import research.study.__main__ as study
from research.study.pool import PoolSettings

ROOT = Path(__file__).resolve().parents[1]


def documented(text: str, module: str) -> list[list[str]]:
    """The flags of each ``python -m MODULE`` line of ``text``'s shell code blocks (fenced
    ``bash`` blocks, or Makefile recipes), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in text.splitlines():
        found = re.search(rf"(?:python|\$\(PY\)) -m {re.escape(module)}(?:\s+(.*))?$", line)
        if found:
            out.append(shlex.split(found[1] or ""))
    return out


def code_blocks(path: Path) -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S))


def makefile_study_commands() -> list[list[str]]:
    text = (ROOT / "Makefile").read_text()
    data = re.search(r"^STUDY_DATA := (.*?\n(?:\t.*\n|\s+--.*\n)*)", text, flags=re.M)
    study_data = " ".join(re.sub(r"\\\n", " ", data[1]).split())
    recipe = re.search(r"^results-study:.*\n((?:\t.*\n)+)", text, flags=re.M)[1]
    return documented(recipe.replace("$(STUDY_DATA)", study_data), "research.study")


@pytest.fixture
def ran(monkeypatch):
    """The calls the commands would have run."""
    calls = []
    monkeypatch.setattr(order, "run", lambda settings: calls.append(("order", settings)))
    monkeypatch.setattr(study, "run", lambda command, args: calls.append((command, args)))
    return calls


def test_documented_order_commands_parse(ran):
    commands = documented(
        code_blocks(ROOT / "research" / "order" / "README.md"), "research.order.run"
    )
    assert commands
    for argv in commands:
        order.main(argv)
    settings = ran[0][1]
    assert settings.designs == "chain,self,self:tau=0.1" and settings.keys == 10
    assert settings.out == "research/order/results.json"
    assert (settings.n, settings.null_keys, settings.cache) == (32, 100, "runs/order")


def test_documented_study_commands_parse(ran):
    commands = documented(code_blocks(ROOT / "research" / "study" / "README.md"), "research.study")
    make = makefile_study_commands()
    assert len(commands) == 6 and len(make) == 3
    for argv in commands + make:
        assert study.main(argv) == 0
    by_command = {}
    for command, args in ran:
        by_command.setdefault(command, []).append(args)
    pool = by_command["pool"][0].settings
    assert pool == PoolSettings(documents=24, contexts_per_doc=14)
    assert by_command["pairs"][0].settings.sentences == 600
    assert by_command["centroids"][0].ks == "16,32,128"
    sweep = by_command["sweep"][-1]  # the Makefile's
    assert sweep.pool == "research/study/data/pool.jsonl" and sweep.num_keys == 20
    assert sweep.centroids == "research/study/data/centroids" and sweep.max_new_tokens == 200
    assert by_command["prune"][-1].output == "research/study/prune.json"
    assert by_command["attribution"][0].eval_config == "docs/evaluation/confirm-run.yaml"
    assert Path(ROOT, sweep.pool).exists() and Path(ROOT, sweep.centroids).is_dir()


def test_config_files_and_flags(ran, tmp_path):
    cfg = tmp_path / "pool.yaml"
    cfg.write_text("output: p.jsonl\ndocuments: 5\ncandidates: 8\n")
    study.main(["pool", "--candidates", "4", "--config", str(cfg)])
    command, args = ran[-1]
    assert command == "pool" and args.output == "p.jsonl"
    assert args.settings == PoolSettings(documents=5, candidates=4)  # flags win over files

    cfg = tmp_path / "order.yaml"
    cfg.write_text("keys: 3\nnull_keys: 7\nedits: ''\n")
    order.main(["--config", str(cfg), "--n", "8"])
    settings = ran[-1][1]
    assert (settings.keys, settings.null_keys, settings.n, settings.edits) == (3, 7, 8, "")


def test_bad_flags_are_usage_errors(ran, capsys):
    for argv in (
        ["pool", "--output", "p.jsonl", "--documents", "0"],  # PoolSettings refuses it
        ["sweep", "--pool", "p.jsonl"],  # required flags missing
        ["plot", "--results", "r.json", "--output", "o.png", "--nope", "1"],
    ):
        with pytest.raises(SystemExit) as exit_:
            study.main(argv)
        assert exit_.value.code == 2, argv
    assert "--documents" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        order.main(["--keys", "many"])
    assert exit_.value.code == 2
    assert not ran
