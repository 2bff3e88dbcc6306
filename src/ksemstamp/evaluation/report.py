"""The evaluation report: ``results.md`` (tables with confidence intervals) and ``roc.png``."""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_target

LABELS = {
    "ksemstamp": "k-SemStamp",
    "ksemstamp-paper": "k-SemStamp (paper)",
    "ksemstamp-region": "k-SemStamp (region, K=64)",
    "ksemstamp-soft": "k-SemStamp (direction, soft contexts)",
    "ksemstamp-pruned": "k-SemStamp (direction, soft contexts, pruned 32 to 12)",
    "semstamp": "SemStamp",
    "kgw": "KGW",
    "none": "No watermark",
}


def _fmt(value, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def _ci(metrics: dict) -> str:
    interval = metrics.get("auroc_ci95")
    return "-" if interval is None else f"{interval[0]:.3f}-{interval[1]:.3f}"


def markdown_table(results: dict) -> str:
    """The paper's layout: one row per algorithm and attack; quality on each ``no attack`` row."""
    lines = [
        f"Prompts: {results['prompts']}. Similarity: {results['similarity']}. "
        f"Score: {results['score']}.",
        "",
        "| Algorithm | Attack | AUC | AUC 95% CI | TPR@1% | TPR@5% | Sim | PPL | PPL med. | Ent-3 "
        "| Sem-Ent | Cand./sent. | Margin rej. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algorithm, attacks in results["detection"].items():
        q = results["quality"][algorithm]
        for name, m in attacks.items():
            first = name == "none"
            lines.append(
                "| "
                + " | ".join(
                    [
                        LABELS[algorithm] if first else "",
                        "no attack" if first else name,
                        _fmt(m["auroc"]),
                        _ci(m),
                        _fmt(m["tpr_at_fpr_1"]),
                        _fmt(m["tpr_at_fpr_5"]),
                        _fmt(m.get("similarity")),
                        _fmt(q["perplexity"], "{:.2f}") if first else "",
                        _fmt(q.get("perplexity_median"), "{:.2f}") if first else "",
                        _fmt(q["ent3"], "{:.2f}") if first else "",
                        _fmt(q["sem_ent"], "{:.2f}") if first else "",
                        _fmt(q.get("candidates_per_sentence"), "{:.1f}") if first else "",
                        _fmt(q.get("margin_rejection_share"), "{:.3f}") if first else "",
                    ]
                )
                + " |"
            )
    for name in ("none", "human"):
        if name in results["quality"]:
            q = results["quality"][name]
            label = "Human text" if name == "human" else LABELS[name]
            lines.append(
                f"| {label} | - | - | - | - | - | - | {_fmt(q['perplexity'], '{:.2f}')} | "
                f"{_fmt(q.get('perplexity_median'), '{:.2f}')} | "
                f"{_fmt(q['ent3'], '{:.2f}')} | {_fmt(q['sem_ent'], '{:.2f}')} | "
                f"{_fmt(q.get('candidates_per_sentence'), '{:.1f}')} | - |"
            )
    k = {q.get("sem_ent_k") for q in results["quality"].values()}
    lines += [
        "",
        f"Sem-Ent: k-means with k = {sorted(k)} clusters (paper: 50) over the oracle's "
        f"mean-pooled last hidden states. PPL under `{results['settings']['oracle']}`: mean and "
        "median over texts. "
        "TPR at FPR x%: best TPR among ROC thresholds whose FPR on these negatives is <= x% "
        "(no interpolation). AUC 95% CI: stratified bootstrap over texts (2000 resamples).",
        "",
    ]
    exact_rows = [
        (algorithm, name, m["exact"])
        for algorithm, attacks in results["detection"].items()
        for name, m in attacks.items()
        if "exact" in m
    ]
    if exact_rows:
        lines += [
            "The same texts ranked by the exact key-randomisation p-value instead of the z-score:",
            "",
            "| Algorithm | Attack | AUC | AUC 95% CI | TPR@1% | TPR@5% |",
            "|---|---|---|---|---|---|",
        ]
        for algorithm, name, m in exact_rows:
            first = name == "none"
            lines.append(
                f"| {LABELS[algorithm] if first else ''} | {'no attack' if first else name} | "
                f"{_fmt(m['auroc'])} | {_ci(m)} | {_fmt(m['tpr_at_fpr_1'])} | "
                f"{_fmt(m['tpr_at_fpr_5'])} |"
            )
        lines.append("")
    alpha_rows = [
        (algorithm, name, m["at_alpha"])
        for algorithm, attacks in results["detection"].items()
        for name, m in attacks.items()
        if "at_alpha" in m
    ]
    if alpha_rows:
        lines += [
            "Decided as a user decides: the share of texts whose exact p-value is at most alpha "
            "(TPR: watermarked texts, FPR: human texts; with several keys, the mean over keys "
            "and the worst key):",
            "",
            "| Algorithm | Attack | TPR p<=1% | worst key | TPR p<=5% | worst key | FPR p<=1% "
            "| FPR p<=5% |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for algorithm, name, m in alpha_rows:
            first = name == "none"
            one, five = m["0.01"], m["0.05"]
            lines.append(
                f"| {LABELS[algorithm] if first else ''} | {'no attack' if first else name} | "
                f"{_fmt(one.get('tpr_mean_over_keys', one['tpr']), '{:.2f}')} | "
                f"{_fmt(one.get('tpr_worst_key'), '{:.2f}')} | "
                f"{_fmt(five.get('tpr_mean_over_keys', five['tpr']), '{:.2f}')} | "
                f"{_fmt(five.get('tpr_worst_key'), '{:.2f}')} | "
                f"{_fmt(one['fpr'], '{:.3f}')} | {_fmt(five['fpr'], '{:.3f}')} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_roc(results: dict, path: Path) -> None:
    """ROC curves, one panel per algorithm, one line per attack."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algorithms = list(results["detection"])
    fig, axes = plt.subplots(
        1, max(1, len(algorithms)), figsize=(4.2 * max(1, len(algorithms)), 4), squeeze=False
    )
    for ax, algorithm in zip(axes[0], algorithms, strict=False):
        for name, m in results["detection"][algorithm].items():
            label = f"{'no attack' if name == 'none' else name} (AUC {m['auroc']:.3f})"
            ax.step(m["roc"]["fpr"], m["roc"]["tpr"], where="post", label=label)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.8)
        ax.set_title(LABELS[algorithm])
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_target(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
