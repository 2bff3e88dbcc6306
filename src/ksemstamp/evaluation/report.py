"""The evaluation report: ``results.md`` (tables with confidence intervals) and ``roc.png``.

The first table decides every text as a user would, by its own p-value at a stated alpha, for
each algorithm and each of clean, attacked and edited texts, beside the AUROC, with the size of
each mark; the tables after it are the paper's layout (ROC of the z-scores, quality)."""

from __future__ import annotations

from pathlib import Path

from ..plots import pyplot_for, save_figure
from ..settings.evaluation import LABELS

KGW_STATISTIC = (
    "KGW's z-test of the green-token count (transformers' WatermarkDetector), normal tail"
)
"""What KGW's p-value is, in words (the sentence-level marks describe their own)."""


def _label(results: dict, algorithm: str) -> str:
    """The report's name of ``algorithm``: the run's ``EvalSettings.labels`` (a run of an
    earlier version: the shipped ones), else the name itself."""
    labels = results.get("settings", {}).get("labels", LABELS)
    return labels.get(algorithm, algorithm)


def _fmt(value, pattern: str = "{:.3f}") -> str:
    return "-" if value is None else pattern.format(value)


def _ci(metrics: dict) -> str:
    interval = metrics.get("auroc_ci95")
    return "-" if interval is None else f"{interval[0]:.3f}-{interval[1]:.3f}"


def _text_label(name: str, m: dict) -> str:
    if name == "none":
        return "clean"
    return f"{name} (edit)" if m.get("kind") == "edit" else name


def _similarity(m: dict) -> str:
    if m.get("similarity") is None:
        return "-"
    out = f"{m['similarity']:.2f}"
    if "window_similarity" in m:
        windows = _fmt(m.get("rewritten_window_similarity"), "{:.2f}")
        out += f" (rewritten windows {windows}; {m['fallback_share']:.0%} of windows kept)"
    return out


def _size(size: dict | None) -> str:
    if not size or not size.get("texts"):
        return "-"
    median = size["median_tokens"]
    value = "never" if median is None else f"{median:.0f}"
    return f"{value} ({size['never']} of {size['texts']} never)"


def decision_table(results: dict) -> list[str]:
    """The decision table (see the module) as markdown lines."""
    lines = [
        "Decided by each algorithm's own p-value at a stated alpha: the share of watermarked "
        "texts with p <= 0.01 and p <= 0.05 (the human row: the share of human continuations, "
        "i.e. the false-positive rate), the worst key's share at 0.01 where the run has several "
        "keys, and the AUROC and TPR at an empirical FPR of 1% of the ranking by z. Size: "
        "median over clean texts of the generated tokens of the shortest prefix, cut at a "
        "sentence end, detected at p <= 0.01 (texts that never reach it count as infinite).",
        "",
        "| Algorithm | Text | n | p <= 0.01 | p <= 0.05 | worst key, p <= 0.01 | AUROC "
        "| TPR@1% | Similarity | Size (tokens) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algorithm, attacks in results["detection"].items():
        first = True
        for name, m in attacks.items():
            if "at_alpha" not in m:
                continue
            one, five = m["at_alpha"]["0.01"], m["at_alpha"]["0.05"]
            size = _size(results.get("size", {}).get(algorithm)) if name == "none" else ""
            lines.append(
                f"| {_label(results, algorithm) if first else ''} | {_text_label(name, m)} | "
                f"{m['positives']} | {_fmt(one['tpr'], '{:.2f}')} | {_fmt(five['tpr'], '{:.2f}')} "
                f"| {_fmt(one.get('tpr_worst_key'), '{:.2f}')} | {_fmt(m['auroc'])} | "
                f"{_fmt(m['tpr_at_fpr_1'], '{:.2f}')} | {_similarity(m)} | {size} |"
            )
            first = False
        clean = attacks.get("none", {}).get("at_alpha")
        if clean:
            lines.append(
                f"| | human (FPR) | {attacks['none']['negatives']} | "
                f"{_fmt(clean['0.01']['fpr'], '{:.3f}')} | {_fmt(clean['0.05']['fpr'], '{:.3f}')} "
                f"| {_fmt(clean['0.01'].get('fpr_worst_key'), '{:.3f}')} | - | - | - | - |"
            )
    lines.append("")
    statistics = results.get("statistics", {})
    if statistics:
        lines += ["p-values:", ""]
        lines += [f"- {_label(results, a)}: {label}." for a, label in statistics.items()]
        lines.append("")
    return lines


def markdown_table(results: dict) -> str:
    """The decision table, then the paper's layout: one row per algorithm and attack; quality
    on each ``no attack`` row."""
    lines = [
        f"Prompts: {results['prompts']}. Similarity: {results['similarity']}. "
        f"Score: {results['score']}.",
        "",
        *decision_table(results),
        *paper_table(results),
        *exact_table(results),
    ]
    return "\n".join(lines)


def paper_table(results: dict) -> list[str]:
    """The paper's layout as markdown lines: detection of each algorithm and attack, quality
    on each ``no attack`` row and on the unwatermarked and human texts, and how to read it."""
    lines = [
        "| Algorithm | Attack | AUC | AUC 95% CI | TPR@1% | TPR@5% | Sim | PPL | PPL med. | Ent-3 "
        "| Sem-Ent | Cand./sent. | Decoded/token | Margin rej. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for algorithm, attacks in results["detection"].items():
        q = results["quality"][algorithm]
        label = _label(results, algorithm)
        lines += [_paper_row(label, name, m, q) for name, m in attacks.items()]
    for name in ("none", "human"):
        if name in results["quality"]:
            q = results["quality"][name]
            label = "Human text" if name == "human" else _label(results, name)
            lines.append(
                f"| {label} | - | - | - | - | - | - | {_fmt(q['perplexity'], '{:.2f}')} | "
                f"{_fmt(q.get('perplexity_median'), '{:.2f}')} | "
                f"{_fmt(q['ent3'], '{:.2f}')} | {_fmt(q['sem_ent'], '{:.2f}')} | "
                f"{_fmt(q.get('candidates_per_sentence'), '{:.1f}')} | "
                f"{_fmt(q.get('decoded_per_token'), '{:.1f}')} | - |"
            )
    k = {q.get("sem_ent_k") for q in results["quality"].values()}
    return lines + [
        "",
        f"Sem-Ent: k-means with k = {sorted(k)} clusters (paper: 50) over the oracle's "
        f"mean-pooled last hidden states. PPL under `{results['settings']['oracle']}`: mean and "
        "median over texts. "
        "TPR at FPR x%: best TPR among ROC thresholds whose FPR on these negatives is <= x% "
        "(no interpolation). AUC 95% CI: stratified bootstrap over texts (2000 resamples).",
        "",
    ]


def _paper_row(label: str, name: str, m: dict, q: dict) -> str:
    """One row of the paper's table: attack ``name``'s detection ``m``, and on the ``no
    attack`` row the algorithm's quality ``q``."""
    first = name == "none"
    return (
        "| "
        + " | ".join(
            [
                label if first else "",
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
                _fmt(q.get("decoded_per_token"), "{:.1f}") if first else "",
                _fmt(q.get("margin_rejection_share"), "{:.3f}") if first else "",
            ]
        )
        + " |"
    )


def exact_table(results: dict) -> list[str]:
    """The same texts ranked by their exact p-value, as markdown lines (none when no entry
    has an ``exact`` ranking)."""
    exact_rows = [
        (algorithm, name, m["exact"])
        for algorithm, attacks in results["detection"].items()
        for name, m in attacks.items()
        if "exact" in m
    ]
    if not exact_rows:
        return []
    lines = [
        "The same texts ranked by their exact p-value instead of z (region mark: the exact "
        "key-randomisation p-value; direction mark: z's exact normal tail, the same ranking):",
        "",
        "| Algorithm | Attack | AUC | AUC 95% CI | TPR@1% | TPR@5% |",
        "|---|---|---|---|---|---|",
    ]
    for algorithm, name, m in exact_rows:
        first = name == "none"
        lines.append(
            f"| {_label(results, algorithm) if first else ''} | {'no attack' if first else name} | "
            f"{_fmt(m['auroc'])} | {_ci(m)} | {_fmt(m['tpr_at_fpr_1'])} | "
            f"{_fmt(m['tpr_at_fpr_5'])} |"
        )
    return lines + [""]


def plot_roc(results: dict, path: Path) -> None:
    """ROC curves, one panel per algorithm, one line per attack."""
    plt = pyplot_for(path)
    if plt is None:
        return

    algorithms = list(results["detection"])
    fig, axes = plt.subplots(
        1, max(1, len(algorithms)), figsize=(4.2 * max(1, len(algorithms)), 4), squeeze=False
    )
    for ax, algorithm in zip(axes[0], algorithms, strict=False):
        for name, m in results["detection"][algorithm].items():
            label = f"{'no attack' if name == 'none' else name} (AUC {m['auroc']:.3f})"
            ax.step(m["roc"]["fpr"], m["roc"]["tpr"], where="post", label=label)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.8)
        ax.set_title(_label(results, algorithm))
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
