"""Strength against cost: the default with 8, 16, 32 and 64 candidates per sentence.

Reads the evaluation run folders of ``make results-candidates`` (one per candidate count, same
prompts, keys and settings otherwise; 32 is the robust run's folder) and writes
``docs/evaluation/candidates/curve.{md,json,png}``: per count, the share of texts at an exact
p <= 0.01 (mean over texts and the worst key), clean and under the evaluation's Gemma-3-270M
paraphrase, the median z of both, candidates and decoded tokens per output token, and the
median perplexity under the oracle (and the unwatermarked texts' of the same prompts, from the
robust run's ``none`` records). Seconds are left out: the runs shared the machine unevenly.

    python -m research.robust.candidates [--runs 8=runs/eval-candidates-8 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ksemstamp.evaluation.scoring import ALPHAS, flagged_at_alpha

from .common import read_jsonl

RUNS = {
    8: "runs/eval-candidates-8",
    16: "runs/eval-candidates-16",
    32: "runs/eval-robust",
    64: "runs/eval-candidates-64",
}
OUT = Path("docs/evaluation/candidates")
ALPHA = ALPHAS[0]  # 1%, the evaluation's first decision level
ATTACK = "lm-paraphrase"


def _by_id(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in read_jsonl(str(path))} if path.exists() else {}


def decisions(records: list[dict], alpha: float = ALPHA) -> dict:
    """Share of ``records`` with ``p_value <= alpha``, overall and under the worst key (the
    evaluation's own ``flagged_at_alpha``), and their median z."""
    if alpha not in ALPHAS:
        raise ValueError(f"alpha must be one of the evaluation's {ALPHAS}, got {alpha}")
    flagged = flagged_at_alpha(records, [])[str(alpha)]
    return {
        "texts": len(records),
        "rate": flagged["tpr"],
        "worst_key": flagged.get("tpr_worst_key", flagged["tpr"]),
        "median_z": statistics.median(r["z_score"] for r in records) if records else None,
    }


def summarise(folder: Path, ids: list[str]) -> dict:
    """One candidate count's row, restricted to the prompts ``ids``."""
    gens = _by_id(folder / "generations" / "ksemstamp.jsonl")
    clean = _by_id(folder / "detections" / "ksemstamp.none.jsonl")
    attacked = _by_id(folder / "detections" / f"ksemstamp.{ATTACK}.jsonl")
    quality = _by_id(folder / "quality" / "ksemstamp.jsonl")
    texts = _by_id(folder / "attacks" / f"ksemstamp.{ATTACK}.jsonl")
    missing = [i for i in ids if i not in gens or i not in clean or i not in attacked]
    if missing:
        raise SystemExit(f"{folder}: no records yet for {len(missing)} prompts ({missing[:3]})")
    g = [gens[i] for i in ids]
    tokens = sum(int(r["num_tokens"]) for r in g)
    return {
        "folder": str(folder),
        "clean": decisions([clean[i] for i in ids]),
        ATTACK: decisions([attacked[i] for i in ids]),
        "candidates_per_sentence": sum(int(r["candidates"]) for r in g)
        / sum(int(r["num_sentences"]) for r in g),
        "decoded_per_token": sum(int(r["decoded_tokens"]) for r in g) / tokens,
        "paraphrase_similarity": statistics.mean(texts[i]["similarity"] for i in ids)
        if all(i in texts for i in ids)
        else None,
        "median_sentence_score": statistics.median(x for r in g for x in r["scores"]),
        "perplexity_median": statistics.median(quality[i]["perplexity"] for i in ids)
        if all(i in quality for i in ids)
        else None,
    }


def table(rows: dict[int, dict]) -> str:
    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    lines = [
        "| candidates | clean at 1% (worst key) | clean median z | paraphrase at 1% (worst key) "
        "| paraphrase median z | paraphrase similarity | median sentence score | decoded tokens per output token "
        "| perplexity, median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in sorted(rows.items()):
        c, a = r["clean"], r[ATTACK]
        lines.append(
            f"| {n} | {f(c['rate'])} ({f(c['worst_key'])}) | {f(c['median_z'])} "
            f"| {f(a['rate'])} ({f(a['worst_key'])}) | {f(a['median_z'])} "
            f"| {f(r['paraphrase_similarity'])} "
            f"| {f(r['median_sentence_score'])} | {f(r['decoded_per_token'], '{:.1f}')} "
            f"| {f(r['perplexity_median'], '{:.1f}')} |"
        )
    return "\n".join(lines)


def plot(rows: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, style in (("clean", "o-"), (ATTACK, "s--")):
        left.plot(ns, [rows[n][name]["median_z"] for n in ns], style, label=name)
    left.axhline(2.326, color="grey", lw=0.8, ls=":", label="z at p = 0.01")
    left.set_ylabel("median z")
    left.legend(fontsize=8)
    right.plot(ns, [rows[n]["decoded_per_token"] for n in ns], "o-")
    right.set_ylabel("decoded tokens per output token")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("candidates per sentence")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", nargs="*", default=[f"{n}={p}" for n, p in RUNS.items()], metavar="N=FOLDER"
    )
    parser.add_argument("--output-dir", type=Path, default=OUT)
    parser.add_argument(
        "--baseline",
        type=Path,
        default=Path(RUNS[32]),
        help="run folder with `none` quality records",
    )
    args = parser.parse_args(argv)
    runs = {int(n): Path(p) for n, _, p in (s.partition("=") for s in args.runs)}
    first = runs[min(runs)]
    ids = [r["id"] for r in read_jsonl(str(first / "prompts.jsonl"))]
    rows = {n: summarise(folder, ids) for n, folder in runs.items()}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    md = table(rows)
    plain = _by_id(args.baseline / "quality" / "none.jsonl")
    unmarked = (
        statistics.median(plain[i]["perplexity"] for i in ids)
        if all(i in plain for i in ids)
        else None
    )
    if unmarked is not None:
        md += f"\n\nUnwatermarked texts of the same prompts, median perplexity: {unmarked:.1f}."
    (args.output_dir / "curve.json").write_text(
        json.dumps(
            {"prompts": ids, "alpha": ALPHA, "rows": rows, "unwatermarked_perplexity": unmarked},
            indent=1,
        )
        + "\n"
    )
    (args.output_dir / "curve.md").write_text(md + "\n")
    plot(rows, args.output_dir / "curve.png")
    print(md)


if __name__ == "__main__":
    main()
