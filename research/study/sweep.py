"""Sweep design points through the simulator: the design grid, its two stages, the table and
the frontier.

Every design is simulated under the same ``num_keys`` keyed tables for every held-out document of
the pool (``runner.Sweep``), so designs are compared on the same contexts and keys; what is
reported per design is ``runner.summarize``'s. The ingredient diagnostics reported beside the
sweep are in ``diagnostics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from .design import Design
from .diagnostics import direction_ingredients, displacement_check, ingredient_stats
from .runner import Sweep, write_results


def markdown_table(results: list[dict], attacks: Sequence[str]) -> str:
    """One row per design: cost, then power at alpha 1% clean and after each attack."""
    head = (
        "| design | cand. mean | cand. p95 | stalls | invalid | scored/text | "
        + " | ".join(f"TPR@1% {a}" for a in ("clean", *attacks))
        + " | worst key clean / "
        + attacks[0]
        + " | agreement "
        + attacks[0]
        + " |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        p = r["power"]
        cells = [
            f"`{r['label']}`",
            f"{r['candidates_mean']:.1f}",
            f"{r['candidates_p95']:.0f}",
            f"{r['fallback_share']:.1%}",
            f"{r['invalid_share']:.1%}",
            f"{r['scored_per_text']:.1f}",
            *(f"{p[a]['0.01']['mean']:.2f}" for a in ("clean", *attacks)),
            f"{p['clean']['0.01']['min']:.2f} / {p[attacks[0]]['0.01']['min']:.2f}",
            f"{r['agreement'][attacks[0]]:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the grid


KS = (8, 16, 32, 64)
DIRECTION_KS = (*KS, 128)
PASS_RATES = (1.0, 0.7, 0.5)


NAMED = ("paper (K=8)", "region K=64 (former default)", "direction (default)")
"""Labels of the ``named_designs``, in order."""


def named_designs() -> list[Design]:
    """The published scheme (K = 8, margin 0.035, as configs/ksemstamp-paper.yaml), the former
    default (configs/ksemstamp-region.yaml) and the shipped default (configs/ksemstamp.yaml)."""
    paper = Design(k=8, margin=0.035, gamma=0.25, rule="paper", max_candidates=100)
    return [paper, region_design(), shipped_design()]


def region_design() -> Design:
    """The former default, configs/ksemstamp-region.yaml (K = 64, margin patience 20)."""
    return Design(k=64, margin=0.035, gamma=0.25, rule="novelty", patience=10, margin_patience=20)


def shipped_design() -> Design:
    """The design ``configs/ksemstamp.yaml`` ships: the direction mark on the K = 64 centroids
    with soft contexts (0.05), 32 candidates per sentence pruned to 12 after 8 tokens (margin
    0.3). The sweep of ``results.json`` was made when it shipped the hard-context best of 12."""
    return Design(
        mark="direction",
        k=64,
        max_candidates=32,
        context_temperature=0.05,
        prune_tokens=8,
        prune_keep=12,
        prune_margin=0.3,
    )


def direction_grid() -> list[Design]:
    """Direction designs: context partition, early-acceptance threshold and candidate budget."""
    return [
        Design(mark="direction", k=k, threshold=t, max_candidates=n)
        for k in DIRECTION_KS
        for n in (8, 12, 16, 24)
        for t in (1.4, 1.8, 2.2, float("inf"))
    ]


def stage_one(sweep: Sweep) -> list[Design]:
    """Partition x valid-set context x rule x gamma, at matched pass rates."""
    designs = []
    for k in KS:
        for rate in PASS_RATES:
            base = sweep.margin_for(Design(k=k, fallback="valid"), rate)
            for context in ("previous", "fixed"):
                for gamma in (0.25, 0.5):
                    for rule in ("paper", "evidence"):
                        designs.append(replace(base, context=context, gamma=gamma, rule=rule))
    return designs


def stage_two(best: Sequence[Design]) -> list[Design]:
    """Length cap, candidate budget, margin patience, stall fallback and rule patience around
    the best points."""
    designs = []
    for d in best:
        # Without a margin, margin patience and the valid fallback change nothing: every valid
        # draw already passes, so those variants would repeat their base design.
        relaxes = (None,) if d.margin == 0 else (None, 10, 20)
        fallbacks = ("last",) if d.margin == 0 else ("last", "valid")
        for max_tokens in (24, 32, 48, 64):
            for n_max in (30, 50, 100):
                for relax in relaxes:
                    for fallback in fallbacks:
                        designs.append(
                            replace(
                                d,
                                max_tokens=max_tokens,
                                max_candidates=n_max,
                                margin_patience=relax,
                                fallback=fallback,
                            )
                        )
        for patience in (3, 5, 20):
            designs.append(replace(d, rule="evidence", patience=patience))
    return list(dict.fromkeys(designs))


COST_TARGETS = {"candidates_mean": 12.0, "candidates_p95": 40.0, "invalid_share": 0.02}
"""The issue's generation targets: mean and 95th percentile candidates per sentence, and the
share of sentences accepted outside the valid set (stalls that found no valid candidate)."""


def within_cost(result: dict, slack: float = 1.0) -> bool:
    """Whether ``result`` meets ``COST_TARGETS`` (each multiplied by ``slack``)."""
    return all(result[name] <= bound * slack for name, bound in COST_TARGETS.items())


def objective(result: dict, attack: str = "lm-paraphrase", slack: float = 1.0) -> float:
    """Mean TPR at alpha 1% after ``attack`` for designs within the cost targets (times
    ``slack``), else minus infinity."""
    if not within_cost(result, slack):
        return float("-inf")
    return result["power"][attack]["0.01"]["mean"]


def run_study(
    pool: str | Path,
    pairs: str | Path,
    centroids: str | Path,
    output: str | Path,
    encoder: str = "all-minilm-l6-v2",
    num_keys: int = 10,
    max_new_tokens: int = 200,
    top: int = 3,
) -> list[dict]:
    """The whole study: ingredients, stage one, stage two around the ``top`` designs by
    ``objective``; writes ``output`` (JSON) and a Markdown table beside it."""
    from .ingredients import load_ingredients

    ing = load_ingredients(pool, pairs, encoder)
    sweep = Sweep(ing, centroids, num_keys=num_keys, max_new_tokens=max_new_tokens)
    report: dict = {
        "documents": ing.num_docs,
        "contexts": int(len(ing.cand)),
        "candidates_per_context": int(ing.cand.shape[1]),
        "keys": num_keys,
        "max_new_tokens": max_new_tokens,
        "ingredients": ingredient_stats(sweep, KS, PASS_RATES),
        "direction_ingredients": direction_ingredients(sweep),
        "displacement_scale": dict(ing.scale),
        "displacement_check": displacement_check(sweep, KS),
    }
    attacks = list(ing.attacked)
    named = sweep.run_all(named_designs())
    first = named + sweep.run_all(stage_one(sweep))
    # Stage two refines the designs with the most power after paraphrase among those within
    # twice the mean-candidate target: stage one runs N_max = 100 with no margin patience (its
    # p95 is mostly N_max), the settings stage two then trades for cost.
    ranked = sorted(
        first[3:],
        key=lambda r: (
            r["candidates_mean"] <= 2 * COST_TARGETS["candidates_mean"],
            r["power"]["lm-paraphrase"]["0.01"]["mean"],
        ),
        reverse=True,
    )
    best = [Design(**r["design"]) for r in ranked[:top]]
    second = sweep.run_all(stage_two(best))
    direction = sweep.run_all(direction_grid())
    report["stage_one"] = first
    report["stage_two"] = second
    report["direction"] = direction
    output = Path(output)
    write_results(report, output)
    allr = first[:3] + sorted(
        first[3:] + second + direction,
        key=lambda r: (within_cost(r), r["power"]["lm-paraphrase"]["0.01"]["mean"]),
        reverse=True,
    )
    output.with_suffix(".md").write_text(markdown_table(allr, attacks))
    plot_frontier(report, output.with_name("frontier.png"))
    return allr


# ---------------------------------------------------------------------- the frontier


def frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the Pareto frontier of ``(cost, power)`` points (lower cost, higher power),
    in order of cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    best, out = float("-inf"), []
    for i in order:
        if points[i][1] > best:
            out.append(i)
            best = points[i][1]
    return out


def plot_frontier(report: dict, path: str | Path) -> Path:
    """Power at alpha 1% against mean candidates per sentence for every simulated design,
    clean and after each LM attack, with the frontier and the paper / former / shipped designs
    marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["stage_one"] + report["stage_two"] + report.get("direction", [])
    named = dict(enumerate(NAMED))
    region = [r.get("design", {}).get("mark", "region") == "region" for r in results]
    panels = [("clean", "clean"), ("lm-paraphrase", "LM paraphrase"), ("lm-bigram", "bigram")]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 4.2), sharey=True)
    for ax, (attack, title) in zip(axes, panels, strict=True):
        pts = [(r["candidates_mean"], r["power"][attack]["0.01"]["mean"]) for r in results]
        for mask, color, label in (
            (True, "0.7", "region designs"),
            (False, "tab:cyan", "direction designs"),
        ):
            chosen = [pt for pt, m in zip(pts, region, strict=True) if m == mask]
            if chosen:
                ax.scatter(*zip(*chosen, strict=True), s=8, color=color, label=label)
        front = frontier(pts)
        ax.plot(*zip(*(pts[i] for i in front), strict=True), color="0.3", lw=1, label="frontier")
        for i, (name, marker) in enumerate(zip(named.values(), "sDo", strict=True)):
            ax.scatter(*pts[i], marker=marker, s=60, zorder=3, label=name)
        ax.axvline(12, color="tab:red", lw=0.8, ls=":")
        ax.set_title(f"TPR at alpha 1%, {title}")
        ax.set_xlabel("candidates per sentence (mean)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of texts with exact p <= 0.01")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"{report['documents']} held-out news documents x {report['keys']} keys, "
        f"{report['max_new_tokens']} tokens (dotted: the 12-candidate target)",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
