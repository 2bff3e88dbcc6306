"""The pruning stage of the design study: more candidates per sentence for about the same cost.

The direction mark's evidence per sentence grows with the number of candidates it chooses from
(the best of 12 scores 1.38 on average along a random direction, the best of 24 1.55), and so
does what survives a paraphrase; but each candidate costs decoding. A pruned round (``pruning``)
starts many rows and stops most of them after their first tokens. This stage simulates, with
soft contexts as shipped, the best of 12 to 32 candidates without pruning beside pruned rounds,
on the same pool, keys and attacks as the rest of the study, and reports power against cost:
decoded tokens per sentence and the round's *step cost* per output token (single-row decoding
steps, ``simulate.ROW_COST`` per extra row; plain sampling costs 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .design import Design
from .runner import Sweep, write_results
from .sweep import frontier

TAU = 0.05
"""The shipped context temperature."""


def prune_grid(k: int = 64) -> list[Design]:
    """The hard-context best of 12 (the default before soft contexts), the soft-context best of
    12 to 32, and pruned rounds of 12 to 32 rows (checks every 8 tokens; 8 or 12 rows kept after
    the first; with and without the margin rule)."""
    base = Design(mark="direction", k=k, max_candidates=12)
    designs = [base]
    for n in (12, 16, 24, 32):
        designs.append(Design(mark="direction", k=k, max_candidates=n, context_temperature=TAU))
    for n in (16, 24, 32):
        for keep in (8, 12):
            for margin in (None, 0.3):
                designs.append(
                    Design(
                        mark="direction",
                        k=k,
                        max_candidates=n,
                        context_temperature=TAU,
                        prune_tokens=8,
                        prune_keep=keep,
                        prune_margin=margin,
                    )
                )
    designs.append(
        Design(
            mark="direction",
            k=k,
            max_candidates=12,
            context_temperature=TAU,
            prune_tokens=8,
            prune_keep=12,
            prune_margin=0.3,
        )
    )
    return designs


def partial_correlation(sweep: Sweep, draws: int = 20, seed: int = 0) -> dict[str, float]:
    """How well a candidate's first ``n`` tokens predict its sentence's score: per context of
    the pool and random standard normal direction, the correlation between the scores of the
    candidates' whole sentences and of their first ``n`` tokens (a candidate of at most ``n``
    tokens is whole in both), averaged; per checkpoint ``n``."""
    from .sweep import shipped_design

    dv = sweep.view(shipped_design())
    rng = np.random.default_rng(seed)
    out = {}
    for n, partial in sorted(dv.partial.items()):
        corr = []
        for row in sweep.ing.cand:
            ids = np.unique(row[row >= 0])
            if len(ids) < 3:
                continue
            directions = rng.standard_normal((draws, dv.vectors.shape[1]))
            whole, first = dv.vectors[ids] @ directions.T, partial[ids] @ directions.T
            for j in range(draws):
                if whole[:, j].std() > 0 and first[:, j].std() > 0:
                    corr.append(float(np.corrcoef(whole[:, j], first[:, j])[0, 1]))
        out[str(n)] = float(np.mean(corr))
    return out


def markdown_table(results: Sequence[dict], attacks: Sequence[str]) -> str:
    """One row per design: costs, the share of sentences whose would-be best candidate the
    rule stopped, then power at alpha 1% (worst key) clean and after each attack, and the human
    false-positive rate."""
    head = (
        "| design | candidates | decoded tokens / sentence | step cost / token | tokens / sentence"
        " | best row stopped | mean best score | "
        + " | ".join(f"p <= 0.01 {a}" for a in ("clean", *attacks))
        + " | human FPR 1% |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        p = r["power"]
        cells = [
            f"`{r['label']}`",
            f"{r['candidates_mean']:.0f}",
            f"{r['decoded_per_sentence']:.0f}",
            f"{r['step_cost_per_token']:.2f}",
            f"{r['tokens_per_text'] / max(r['sentences_per_text'], 1e-9):.1f}",
            f"{r['best_dropped_share']:.2f}" if "best_dropped_share" in r else "-",
            f"{r['mean_best_score']:.2f}",
            *(
                f"{p[a]['0.01']['mean']:.2f} ({p[a]['0.01']['min']:.2f})"
                for a in ("clean", *attacks)
            ),
            f"{r['human_fpr']['0.01']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: Sequence[dict], path: str | Path, attacks: Sequence[str]) -> Path:
    """Power at alpha 1% against step cost per output token, clean and after each attack,
    pruned and unpruned designs apart, with the frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .sweep import shipped_design

    shipped = shipped_design()
    former = replace(shipped, max_candidates=12, prune_tokens=None, prune_margin=None)
    marked = [
        (shipped.to_dict(), "*", "default (32, pruned to 12)"),
        (former.to_dict(), "s", "former default (best of 12)"),
    ]
    panels = ["clean", *attacks]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), sharey=True)
    for ax, attack in zip(axes, panels, strict=True):
        pts = [(r["step_cost_per_token"], r["power"][attack]["0.01"]["mean"]) for r in results]
        pruned = [r["design"]["prune_tokens"] is not None for r in results]
        for flag, color, label in ((False, "tab:gray", "best of n"), (True, "tab:cyan", "pruned")):
            chosen = [pt for pt, m in zip(pts, pruned, strict=True) if m == flag]
            if chosen:
                ax.scatter(*zip(*chosen, strict=True), s=18, color=color, label=label)
        front = frontier(pts)
        ax.plot(*zip(*(pts[i] for i in front), strict=True), color="0.3", lw=1, label="frontier")
        for design, marker, label in marked:
            hits = [pt for pt, r in zip(pts, results, strict=True) if r["design"] == design]
            if hits:
                ax.scatter(*hits[0], marker=marker, s=90, zorder=3, label=label)
        ax.set_title(f"p <= 0.01, {attack}")
        ax.set_xlabel("round cost per output token (single-row steps)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of texts detected")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_prune_study(
    pool: str | Path,
    pairs: str | Path,
    centroids: str | Path,
    output: str | Path,
    encoder: str = "all-minilm-l6-v2",
    num_keys: int = 20,
    max_new_tokens: int = 200,
) -> list[dict]:
    """Simulate ``prune_grid`` and write ``output`` (JSON), a Markdown table and a plot beside
    it."""
    from .ingredients import load_ingredients

    ing = load_ingredients(pool, pairs, encoder)
    sweep = Sweep(ing, centroids, num_keys=num_keys, max_new_tokens=max_new_tokens)
    results = sweep.run_all(prune_grid())
    correlation = partial_correlation(sweep)
    output = Path(output)
    write_results({"partial_correlation": correlation, "designs": results}, output)
    attacks = list(ing.attacked)
    table = markdown_table(results, attacks)
    cells = ", ".join(f"{n} tokens {c:.2f}" for n, c in correlation.items())
    note = (
        "\nCorrelation between a candidate's score and the score of its first n tokens "
        f"(per context, random directions): {cells}.\n"
    )
    output.with_suffix(".md").write_text(table + note)
    plot(results, output.with_suffix(".png"), attacks)
    return results
