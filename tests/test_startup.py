"""A command answers at once: its help, ``keygen``, a refused key and a bad flag load none of
the model libraries (torch, transformers, Lightning, sentence-transformers take seconds to
import). Measured in a fresh interpreter: the test process has them loaded already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "lightning", "sentence_transformers")
WEAK = ["--key", "aaaaaaaaaaaaaaaaaaaaaaab"]

# Runs each command line in turn in one interpreter, and says after which one a model library
# was first loaded (each runs with the modules the ones before it loaded: a library loaded
# once stays loaded).
PROBE = """
import contextlib, io, json, sys
from ksemstamp.cli import COMMANDS, main
heavy = %r
first = {}
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    first.setdefault("codes", []).append(code)
    for name in heavy:
        if name in sys.modules and name not in first:
            first[name] = argv
print(json.dumps(first))
"""


def _probe(argvs: list[list[str]], tmp_path: Path) -> dict:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "KSEMSTAMP_CACHE": str(tmp_path / "cache"),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    return json.loads(out.stdout)


def test_help_keygen_refused_keys_and_bad_flags_load_no_model_library(tmp_path):
    from ksemstamp.cli import COMMANDS

    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "prompt": "One."}\n')
    helps = [[name, "--help"] for name, entry in COMMANDS.items() if not isinstance(entry, dict)]
    helps += [["corpus", sub, "--help"] for sub in COMMANDS["corpus"]]
    helps = [h for h in helps if h[0] != "train"]  # its help is LightningCLI's: Lightning's own
    refused = [
        ["generate", "--prompt", "One.", *WEAK, "--quiet"],
        ["generate", "--input", str(src), "--output", str(tmp_path / "g.jsonl"), *WEAK],
        ["detect", "--text", "One. Two.", *WEAK, "--quiet"],
        ["detect", "--input", str(src), "--output", str(tmp_path / "d.jsonl"), *WEAK],
        ["demo", *WEAK],
        ["serve", *WEAK],
        ["calibrate", *WEAK],
        ["generate", "--promtp", "One."],  # a mistyped flag
        ["detect", "--text", "x", "--sampling.temperature", "-1"],  # a bad value
        ["genrate"],  # a mistyped command
    ]
    argvs = [["--help"], ["keygen"], *helps, *refused]
    found = _probe(argvs, tmp_path)
    codes = found.pop("codes")
    assert codes == [0] * (2 + len(helps)) + [2] * len(refused)
    assert found == {}, f"loaded by: {found}"


def test_every_front_door_runs_the_same_commands(tmp_path):
    """``python -m ksemstamp``, ``python watermark.py`` and the console script (where this
    environment installed it) list the same commands and run one."""
    script = Path(sys.executable).with_name("ksemstamp")
    doors = [[sys.executable, "-m", "ksemstamp"], [sys.executable, str(ROOT / "watermark.py")]]
    doors += [[str(script)]] if script.exists() else []
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    listings = []
    for door in doors:
        listing = subprocess.run([*door, "--help"], capture_output=True, text=True, env=env)
        assert listing.returncode == 0, (door, listing.stderr[-2000:])
        listings.append(listing.stdout.split("\n", 1)[1])  # the first line names the program
        key = subprocess.run([*door, "keygen"], capture_output=True, text=True, env=env)
        assert key.returncode == 0 and len(key.stdout.strip()) == 64, (door, key.stderr[-2000:])
    assert "generate" in listings[0] and all(text == listings[0] for text in listings)
