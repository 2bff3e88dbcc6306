"""Design checks side by side: two paired by prompt, and the candidate curve over several.

    python -m lab compare --first c032 --second c128

prints, per variant, the second check's z less the first's over the prompts both ran (mean,
standard error, how many the second raised).

    python -m lab curve --names c032,c128,c256 --plain plain --kgw kgw \
        --output docs/evaluation/curve

reads ``runs/lab/check-NAME/summary.json`` of each check named and writes ``curve.md``,
``curve.json`` and ``curve.png`` to ``--output``: per check, its candidates per unit, how many
go on after the first pruning check, the candidates' temperature, the share of texts detected
at an exact 1% (worst key in brackets) and the median z, clean and under every attack it ran,
the edit that interleaves three human sentences with each watermarked one, the median
perplexity under the evaluation's oracle and its ratio to the unwatermarked texts of the same
prompts (``--plain``; paired by prompt, with a bootstrap interval), decoded tokens per output
token, and seconds per output token against the plain sampler on the same machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np

from ksemstamp.experimental import save_figure

from .check import ATTACKS, RUNS, read_jsonl

VARIANTS = ("clean", "attacked", "rewrite", "recursive", "bigram")
LABELS = {
    "clean": "clean",
    "attacked": "sentence paraphrase",
    "rewrite": "rewrite of every window",
    "recursive": "recursive paraphrase",
    "bigram": "bigram attack",
}


def load(name: str) -> dict:
    """A check's summary."""
    path = RUNS / f"check-{name}" / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run `python -m lab check --run.name {name}` first")
    return json.loads(path.read_text())


def paired_ratio(mine: dict[str, float], plain: dict[str, float]) -> dict | None:
    """The geometric mean of ``mine / plain`` over the prompts both scored, with a 95% bootstrap
    interval (2,000 resamples of the prompts, seed 0): a perplexity comparison that a few
    prompts' spread does not decide, as a difference of medians over 12 texts can."""
    ids = sorted(mine.keys() & plain.keys())
    if len(ids) < 2:
        return None
    logs = np.log([mine[i] for i in ids]) - np.log([plain[i] for i in ids])
    draws = np.random.default_rng(0).choice(logs, size=(2000, len(logs))).mean(axis=1)
    low, high = np.exp(np.percentile(draws, [2.5, 97.5]))
    return {"texts": len(ids), "ratio": float(np.exp(logs.mean())), "ci95": [low, high]}


def row(summary: dict, plain: dict | None) -> dict:
    """One check's figures (see the module docstring)."""
    settings = summary.get("settings", {})
    search, sampling = settings.get("search", {}), settings.get("sampling", {})
    out = {
        "name": summary["name"],
        "candidates": search.get("max_candidates"),
        "keep": search.get("prune_keep"),
        "steer": search.get("steer", 0.0),
        "temperature": sampling.get("temperature"),
        "texts": summary["texts"],
        "perplexity": summary.get("perplexity_median"),
        "decoded_per_token": summary.get("decoded_per_token"),
        "seconds_per_token": summary.get("seconds_per_token"),
    }
    if plain and plain.get("seconds_per_token"):
        out["seconds_over_plain"] = summary["seconds_per_token"] / plain["seconds_per_token"]
    if plain:
        out["perplexity_vs_plain"] = paired_ratio(
            summary.get("perplexity_by_id", {}), plain.get("perplexity_by_id", {})
        )
    for variant in VARIANTS:
        if variant in summary:
            v = summary[variant]
            out[variant] = {k: v[k] for k in ("detected_1pct", "worst_key", "median_z", "texts")}
    interleave = summary.get("edits", {}).get("interleave-75")
    if interleave:
        out["interleave-75"] = interleave
    return out


def _cell(value: dict | None) -> str:
    if not value:
        return "-"
    cell = f"{value['detected_1pct']:.2f} ({value['worst_key']:.2f})"
    return cell + (f", z {value['median_z']:.1f}" if value.get("median_z") is not None else "")


def _ratio(value: dict | None) -> str:
    if not value:
        return "-"
    return f"{value['ratio']:.2f} [{value['ci95'][0]:.2f}, {value['ci95'][1]:.2f}]"


def markdown(rows: list[dict], plain: dict | None, kgw: dict | None) -> str:
    """The curve's table."""
    head = ["check", "candidates", "keep", "steer", "temperature", "texts"]
    head += [LABELS[v] for v in VARIANTS] + ["3/4 human interleaved"]
    head += [
        "perplexity",
        "perplexity / plain [95%]",
        "decoded / token",
        "seconds / token vs plain",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], r["candidates"], r["keep"], r["steer"], r["temperature"], r["texts"]]
        cells += [_cell(r.get(v)) for v in VARIANTS] + [_cell(r.get("interleave-75"))]
        cells += [
            "-" if r["perplexity"] is None else f"{r['perplexity']:.1f}",
            _ratio(r.get("perplexity_vs_plain")),
            f"{r['decoded_per_token']:.1f}",
            "-" if r.get("seconds_over_plain") is None else f"{r['seconds_over_plain']:.1f}x",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    notes = []
    if plain is not None and plain.get("perplexity_median") is not None:
        notes.append(
            f"Unwatermarked texts of the same prompts (`{plain['name']}`): median perplexity "
            f"{plain['perplexity_median']:.1f}."
        )
    if kgw is not None and "rewrite" in kgw:
        notes.append(
            f"KGW on the same prompts under the rewrite of every window: {_cell(kgw['rewrite'])}."
        )
    return "\n".join(lines) + ("\n\n" + " ".join(notes) if notes else "") + "\n"


def plot(
    rows: list[dict], path: Path, plain_perplexity: float | None = None, by: str = "candidates"
) -> None:
    """Detection at 1% and perplexity against ``by`` (``candidates`` per unit, or ``steer``),
    one line per temperature and variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    temperatures = sorted({r["temperature"] for r in rows})
    for temperature in temperatures:
        mine = sorted((r for r in rows if r["temperature"] == temperature), key=lambda r: r[by])
        # By candidates a check is a point of one curve; by steering, checks differ in more
        # than the strength, so each is a labelled point.
        line = "-" if by == "candidates" else ""
        for variant, style in (("attacked", "o"), ("rewrite", "s"), ("recursive", "^")):
            points = [(r[by], r[variant]["detected_1pct"]) for r in mine if variant in r]
            if points:
                xs, ys = zip(*points, strict=True)
                left.plot(xs, ys, style + line, label=f"{LABELS[variant]}, T={temperature}")
            if by != "candidates" and variant == "attacked":
                for r in (r for r in mine if variant in r):
                    at = (r[by], r[variant]["detected_1pct"])
                    left.annotate(
                        r["name"], at, fontsize=6, xytext=(3, -9), textcoords="offset points"
                    )
        points = [(r[by], r["perplexity"], r["name"]) for r in mine if r["perplexity"]]
        if points:
            xs, ys, names = zip(*points, strict=True)
            right.plot(xs, ys, "o" + line, label=f"T={temperature}")
            if by != "candidates":
                for x, y, name in points:
                    right.annotate(
                        name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points"
                    )
    left.set_ylabel("detected at an exact 1%")
    left.set_ylim(0, 1.02)
    left.legend(fontsize=7)
    right.set_ylabel("median perplexity (oracle)")
    right.set_yscale("log")
    if plain_perplexity is not None:
        right.axhline(plain_perplexity, color="grey", linestyle=":", label="unwatermarked")
    right.legend(fontsize=7)
    for ax in (left, right):
        if by == "candidates":
            ax.set_xscale("log", base=2)
        ax.set_xlabel("candidates per unit" if by == "candidates" else "steering (sd)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def curve(
    names: list[str],
    output: str,
    plain: str | None = None,
    kgw: str | None = None,
    by: Literal["candidates", "steer"] = "candidates",
) -> int:
    """The candidate curve: a table, JSON and plot from the design checks named.

    Args:
        names: the checks, in the table's order.
        output: the folder for curve.md, curve.json and curve.png.
        plain: the unwatermarked check of the same prompts (perplexity and speed baseline).
        kgw: the KGW check of the same prompts.
        by: the plot's x axis: candidates per unit, or the steering strength.
    """
    base = load(plain) if plain else None
    baseline = load(kgw) if kgw else None
    rows = [row(load(n), base) for n in names]
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, base, baseline)
    (folder / "curve.md").write_text(table)
    data = {"rows": rows, "plain": base and base.get("perplexity_median"), "kgw": baseline}
    (folder / "curve.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
    plot(rows, folder / "curve.png", base and base.get("perplexity_median"), by)
    print(table, end="")
    return 0


def compare(first: str, second: str) -> int:
    """Two design checks paired by prompt: the second's z less the first's, per variant.

    Args:
        first: a check's name.
        second: another's.
    """
    runs = [
        {(r["variant"], r["id"]): r for r in read_jsonl(RUNS / f"check-{n}" / "detections.jsonl")}
        for n in (first, second)
    ]
    out: dict = {"first": first, "second": second}
    for variant in ("clean", *(v for *_, v in ATTACKS.values())):
        pairs = sorted(k for k in runs[0].keys() & runs[1].keys() if k[0] == variant)
        if len(pairs) < 2:
            continue
        diff = np.array([runs[1][k]["z"] - runs[0][k]["z"] for k in pairs])
        out[variant] = {
            "pairs": len(pairs),
            "mean_z_difference": float(diff.mean()),
            "standard_error": float(diff.std(ddof=1) / np.sqrt(len(diff))),
            "second_higher": int((diff > 0).sum()),
        }
    print(json.dumps(out, indent=1))
    return 0
