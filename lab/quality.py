"""The quality of a design's texts against plain sampling of the same prompts.

    python -m lab quality --quality.names c032,q050 --quality.plain plain48 \
        --quality.output docs/evaluation/quality

reads ``runs/lab/check-NAME/`` of every check named and of the plain one (``--run.plain``), and
writes ``quality.md``, ``quality.json`` and ``quality.png`` to ``--output``. Per design, over
the prompts both hold:

- the evaluation oracle's perplexity (Gemma-3-270M, ``summary.json``) as a geometric-mean ratio
  to the plain twin's, with a 95% bootstrap interval, and the share of texts above twice their
  twin's;
- the same under the generator itself (``--quality.generator true``: SmolLM2 in fp32 reads every text
  again): how far a design moves the texts from what the LM would say, the distortion a
  semantic mark promises to keep small (not an independent judge: plain sampling is its own);
- repetition: each text's share of word 3-grams that repeat an earlier one, its distinct word
  2-grams over all of them (means);
- degeneration (``degeneration``), counted for plain and marked texts alike: runs of a repeated
  word piece ("LabLabLab", "the the the"), a unit said twice, three or more questions in a row
  that open alike ("What's the impact? What's the message? What's the award?"), words
  glued from words the text uses apart ("pastComm", "ChinaPet"), and four or more units in a
  row on one template, the same first three words ("He is not King John. He is not King
  Harry. He is not King Fiona."; counted since 2026-12-07: rows measured before hold no
  figure for it).

The rule a design is held to (docs/evaluation/quality.md): ratio at most 1.05 with the interval's
upper end at most 1.20, and no more degenerate texts than plain sampling.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ksemstamp.experimental import save_figure

from .check import RUNS, read_jsonl
from .curve import paired_ratio
from .leakage import repetition

PIECE_RUN = re.compile(r"([A-Za-z]{2,}?)\1{2,}")
"""A word piece three or more times in a row, glued ("LabLabLab") ..."""
WORD_RUN = re.compile(r"\b(\w+)(?:\W+\1\b){2,}", re.I)
"""... or as words ("the the the", "very, very, very")."""
CAMEL = re.compile(r"\b[A-Za-z]*[a-z][A-Z][A-Za-z]*\b")
PIECES = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
"""Letters glued into a non-word: a word whose capitalised pieces are each a word the text
uses on its own ("pastComm" beside "past" and "Comm", "ChinaPet" beside "China" and "Pet");
a brand name ("MailOnline", "YouTube") is not, unless the text uses its pieces apart."""
UNIT = re.compile(r"[^.!?;:\n]+[.!?;:]?")


def degeneration(text: str) -> dict[str, int]:
    """What in ``text`` reads as degenerate: ``piece_runs``, ``repeated_units``,
    ``question_runs`` and ``glued`` (counts; see the module docstring)."""
    units = [" ".join(u.split()).lower() for u in UNIT.findall(text) if len(u.split()) >= 4]
    seen: set[str] = set()
    repeated = 0
    for unit in units:
        key = unit.rstrip(".!?;:")
        repeated += key in seen
        seen.add(key)
    questions = [s.strip() for s in re.findall(r"[^.!?\n]+[.!?]", text)]
    runs = run = 0
    for i, sentence in enumerate(questions):
        asks = sentence.endswith("?")
        alike = (
            i > 0
            and questions[i - 1].endswith("?")
            and _opening(sentence) == _opening(questions[i - 1])
        )
        run = run + 1 if asks and alike else (1 if asks else 0)
        runs += run == 3
    return {
        "piece_runs": len(PIECE_RUN.findall(text)) + len(WORD_RUN.findall(text)),
        "repeated_units": repeated,
        "question_runs": runs,
        "glued": len(glued(text)),
        "template_runs": template_runs(text),
    }


TEMPLATE_RUN = 4
"""Units in a row on one template that read as degenerate: human news has runs of three
("I remember the smiles. I remember the hugs. I remember the couples ..."), in 6 of 378 `val`
articles, and one of four (a column's "From a man ..." anaphora)."""


def template_runs(text: str) -> int:
    """Runs of ``TEMPLATE_RUN`` or more units of ``text`` in a row that open with the same three
    words."""
    openings = [tuple(re.findall(r"\w+", u.lower())[:3]) for u in UNIT.findall(text)]
    openings = [o for o in openings if o]
    runs = run = 0
    for i, opening in enumerate(openings):
        run = run + 1 if i and len(opening) == 3 and opening == openings[i - 1] else 1
        runs += run == TEMPLATE_RUN
    return runs


def glued(text: str) -> list[str]:
    """The words of ``text`` glued from words it uses on their own (``CAMEL``, ``PIECES``)."""
    alone = {w.lower() for w in re.findall(r"[A-Za-z]+", text)}
    out = []
    for word in CAMEL.findall(text):
        pieces = [p.lower() for p in PIECES.findall(word)]
        if len(pieces) >= 2 and all(len(p) >= 2 and p in alone for p in pieces):
            out.append(word)
    return out


def _opening(sentence: str) -> tuple[str, ...]:
    return tuple(sentence.lower().split()[:2])


@dataclass(frozen=True)
class QualitySettings:
    """Which checks to compare, and where the table goes."""

    names: str = "p050,c032"
    """The checks compared with plain sampling, comma-separated."""
    plain: str = "plain48"
    """The plain check (``--run.plain``) of the same prompts."""
    output: str = "docs/evaluation/quality"
    """The folder ``quality.md``, ``quality.json`` and ``quality.png`` go to."""
    generator: bool = False
    """Also read every text with the generator (SmolLM2, fp32) for its own perplexity."""


def _texts(name: str) -> dict[str, str]:
    path = RUNS / f"check-{name}" / "generations.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run `python -m lab check --run.name {name}` first")
    return {r["id"]: r["text"] for r in read_jsonl(path) if r.get("text")}


def _oracle(name: str) -> dict[str, float]:
    path = RUNS / f"check-{name}" / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the check {name} has not finished")
    return json.loads(path.read_text())["perplexity_by_id"]


def measure(texts: dict[str, str]) -> dict:
    """Repetition means and degeneration counts over ``texts``."""
    rep = [repetition(t) for t in texts.values()]
    flags = [degeneration(t) for t in texts.values()]
    kinds = {k: int(sum(f[k] > 0 for f in flags)) for k in flags[0]} if flags else {}
    return {
        "texts": len(texts),
        "repeated_trigrams": float(np.mean([r for r, _ in rep])),
        "distinct_bigrams": float(np.mean([d for _, d in rep])),
        "degenerate_texts": int(sum(any(f.values()) for f in flags)),
        "degenerate_by_kind": kinds,
        "degenerate_ids": sorted(i for i, f in zip(texts, flags, strict=True) if any(f.values())),
    }


def generator_perplexity(texts: dict[str, str], prompts: dict[str, str]) -> dict[str, float]:
    """Each text's perplexity under the generator (SmolLM2, fp32), given its prompt."""
    from ksemstamp.experimental import Oracle, load_lm

    oracle = Oracle(*load_lm("smollm2-135m-instruct", "cpu", "fp32"))
    ids = list(texts)
    scores = oracle.score([prompts[i] for i in ids], [texts[i] for i in ids])
    return {i: s.perplexity for i, s in zip(ids, scores, strict=True)}


def quality(quality: QualitySettings | None = None) -> int:
    """Quality: perplexity, repetition and degeneration against plain sampling."""
    settings = quality or QualitySettings()
    names = [n for n in settings.names.split(",") if n]
    plain_texts = _texts(settings.plain)
    plain_ppl = _oracle(settings.plain)
    prompts = {
        r["id"]: r["prompt"]
        for r in read_jsonl(RUNS / f"check-{settings.plain}" / "generations.jsonl")
    }
    rows = {settings.plain: {"name": settings.plain, **measure(plain_texts)}}
    own_plain = generator_perplexity(plain_texts, prompts) if settings.generator else None
    for name in names:
        texts = _texts(name)
        ppl = _oracle(name)
        ratio = paired_ratio(ppl, plain_ppl)
        ids = sorted(ppl.keys() & plain_ppl.keys())
        above = float(np.mean([ppl[i] > 2 * plain_ppl[i] for i in ids])) if ids else None
        row = {"name": name, "oracle_ratio": ratio, "above_twice_plain": above, **measure(texts)}
        if own_plain is not None:
            row["generator_ratio"] = paired_ratio(generator_perplexity(texts, prompts), own_plain)
        rows[name] = row
    out = Path(settings.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    table = markdown(rows)
    (out / "quality.md").write_text(table)
    plot(rows, out / "quality.png")
    print(table)
    return 0


def _ratio_cell(ratio: dict | None) -> str:
    if not ratio:
        return "-"
    low, high = ratio["ci95"]
    return f"{ratio['ratio']:.2f} [{low:.2f}, {high:.2f}]"


def markdown(rows: dict[str, dict]) -> str:
    """The quality table."""
    lines = [
        "| check | texts | oracle perplexity / plain [95%] | > 2x plain | generator's own / plain "
        "[95%] | repeated 3-grams | distinct 2-grams | degenerate texts (runs, repeats, "
        "questions, glued, templates) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows.values():
        kinds = row["degenerate_by_kind"]
        counts = ", ".join(str(kinds.get(k, "-")) for k in DEGENERATION_KINDS)
        above = "-" if row.get("above_twice_plain") is None else f"{row['above_twice_plain']:.2f}"
        lines.append(
            f"| `{row['name']}` | {row['texts']} | {_ratio_cell(row.get('oracle_ratio'))} "
            f"| {above} | {_ratio_cell(row.get('generator_ratio'))} "
            f"| {row['repeated_trigrams']:.3f} | {row['distinct_bigrams']:.3f} "
            f"| {row['degenerate_texts']} ({counts}) |"
        )
    return "\n".join(lines) + "\n"


DEGENERATION_KINDS = ("piece_runs", "repeated_units", "question_runs", "glued", "template_runs")


def plot(rows: dict[str, dict], path: Path) -> None:
    """Each design's oracle perplexity ratio with its interval, against the rule's bounds."""
    import matplotlib.pyplot as plt

    marked = [r for r in rows.values() if r.get("oracle_ratio")]
    fig, ax = plt.subplots(figsize=(6, 0.6 * len(marked) + 1.6))
    for y, row in enumerate(marked):
        r = row["oracle_ratio"]
        low, high = r["ci95"]
        ax.errorbar(r["ratio"], y, xerr=[[r["ratio"] - low], [high - r["ratio"]]], fmt="o")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.axvline(1.05, color="green", ls="--", lw=0.8, label="point bound 1.05")
    ax.axvline(1.20, color="red", ls=":", lw=0.8, label="upper bound 1.20")
    ax.set_yticks(range(len(marked)), [r["name"] for r in marked])
    ax.set_xlabel("oracle perplexity / plain sampling (geometric mean, 95% bootstrap)")
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)
