"""Outputs of a calibration result: ``calibration.json``, ``report.md`` and ``pvalues.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_json_atomic, write_text_atomic
from ..plots import pyplot_for, save_figure
from .scoring import DIAGNOSTIC, STATS


def _described(result: dict[str, Any]) -> dict[str, Any]:
    """The mark's own description of itself (``Mark.describe``), as the run recorded it."""
    return result["calibration"].get("description", {})


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def render_report(result: dict[str, Any]) -> str:
    """The markdown report of a calibration result: its sections in order."""
    sections = (
        _head,
        _headline,
        _human_texts,
        _false_positives,
        _uniformity,
        _power,
        _configured_key,
    )
    return "\n".join(line for section in sections for line in section(result)) + "\n"


def _head(result: dict[str, Any]) -> list[str]:
    """The title, how the run was made, the mark and the run time."""
    cal = result["calibration"]
    described = _described(result)
    lines: list[str] = []
    keys = described.get("keys", "keys")
    lines += [
        "# Detector calibration on human text",
        "",
        "Human-written text does not depend on the watermark key, so the share of human texts",
        "the detector flags at level alpha is its false-positive rate (FPR). One key is one",
        f"draw of that rate, so every number below is over {cal['num_keys']} {keys}",
        "(mean, with the spread over keys). Made by:",
        "",
        "```bash",
        result.get("command", "(command not recorded)"),
        "```",
        "",
        described.get("summary", f"K = {cal['num_regions']} regions")
        + "; "
        + ", ".join(f"{k} `{v}`" for k, v in _dotted(result.get("settings", {})))
        + ".",
        "Generation's settings (`search`, `sampling`: candidates, pruning, steering) do not enter",
        "these figures: a human text is scored without them, so the figures hold for every",
        "profile with this mark, encoder and partition.",
        f"Run time {result['seconds']:.0f} s.",
        "",
        "## Headline",
        "",
    ]
    return lines


def _headline(result: dict[str, Any]) -> list[str]:
    """One line a statistic and alpha, the false positives by group, and one line per power
    measurement at 1%."""
    null = result["null"]
    alphas = result["calibration"]["alphas"]
    stats = _stats(result)
    lines: list[str] = []
    overall = null["overall"]
    for stat in stats:
        for a in alphas:
            f = overall[stat]["fpr"][str(a)]
            lines.append(
                f"- `{stat}` at nominal {a}: {_pct(f['mean'])} of {overall['texts']} human texts "
                f"flagged (sd over keys {_pct(f['sd'])}, worst key {_pct(f['max'])})."
            )
    lines += _group_lines(result.get("groups", {}))
    for name, p in result["power"].items():
        for stat in stats:
            tpr = p[stat]["tpr_at_alpha"].get("0.01")
            emp = p[stat]["tpr_at_empirical_fpr"].get("0.01")
            if tpr and emp:
                lines.append(
                    f"- power on {name}: `{stat}` flags {_pct(tpr['mean'])} at nominal 0.01, "
                    f"{_pct(emp['mean'])} at the threshold that flags 1% of human news text "
                    "under the same key."
                )
    return lines


def _human_texts(result: dict[str, Any]) -> list[str]:
    """What the human texts are, per source."""
    cal = result["calibration"]
    lines: list[str] = []
    lines += [
        "",
        "## Human texts",
        "",
        f"{result['texts_total']} texts, each a run of consecutive sentences of one document "
        f"cut at about {cal['window_words']} words (~200 tokens, a generation's length). No "
        + described_first(result),
        "None of these texts was used to fit the centroids (fitted on the news `fit` split).",
        "",
        "| source | what | texts | too short | mean scored sentences | same region as previous |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in result["sources"].items():
        lines.append(
            f"| {name} | {s['description']} | {s['texts']} (of {s['available_pieces']}) | "
            f"{s['too_short']} | {s['scored_mean']:.1f} | {_pct(s['same_region_share'])} |"
        )
    return lines


def _false_positives(result: dict[str, Any]) -> list[str]:
    """The false-positive rate at nominal alpha over keys, per source."""
    cal = result["calibration"]
    null = result["null"]
    alphas = result["calibration"]["alphas"]
    stats = _stats(result)
    lines: list[str] = []
    lines += [
        "",
        f"With independent regions, a sentence would share its predecessor's region about "
        f"{_pct(1 / cal['num_regions'])} of the time (1/K for equally likely regions).",
        "",
        "## False-positive rate at nominal alpha",
        "",
        "Mean over keys, then [5th, 95th percentile] over keys; last column: share of keys whose",
        "FPR exceeds alpha. The exact test's promise is over the key: a human text is flagged",
        "with probability at most alpha when the key is drawn at random, so the mean over keys",
        "stays at or below alpha. Under one fixed key, texts that share regions are flagged or",
        "cleared together, so one key's rate on a corpus can exceed alpha.",
        "",
        "| texts | statistic | alpha | FPR mean | sd | [q05, q95] | max | keys over alpha |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group in [*result["sources"], "overall"]:
        for stat in stats:
            for a in alphas:
                f = null[group][stat]["fpr"][str(a)]
                lines.append(
                    f"| {group} ({null[group]['texts']}) | {stat} | {a} | **{_pct(f['mean'])}** | "
                    f"{_pct(f['sd'])} | [{_pct(f['q05'])}, {_pct(f['q95'])}] | {_pct(f['max'])} | "
                    f"{_pct(f['keys_above_alpha'])} |"
                )
    return lines


def _uniformity(result: dict[str, Any]) -> list[str]:
    """How far the p-values are from uniform, per key and pooled."""
    null = result["null"]
    stats = _stats(result)
    uniformity = _described(result).get("uniformity", ["gets over random keys."])
    lines: list[str] = []
    lines += [
        "",
        "## Distance from uniform",
        "",
        "`KS` is the largest gap between the p-values' distribution function and the uniform",
        "one; `excess` counts only gaps where too many p-values are small (what causes false",
        "positives). *Per key*: the texts of one key move together (texts that share regions",
        "share the table's verdict on them), so a single key's distribution can sit far from",
        "uniform even for a valid test. *Pooled*: all keys together, the distribution a text",
        *uniformity,
        "",
        "| texts | statistic | KS per key, mean [q05, q95] | excess per key, mean [q05, q95] "
        "| KS pooled | excess pooled |",
        "|---|---|---|---|---|---|",
    ]
    for group in [*result["sources"], "overall"]:
        for stat in (*stats, DIAGNOSTIC):
            row = null[group][stat]
            ks, ex = row["ks"], row["ks_excess"]
            lines.append(
                f"| {group} | {stat} | {ks['mean']:.3f} [{ks['q05']:.3f}, {ks['q95']:.3f}] | "
                f"{ex['mean']:.3f} [{ex['q05']:.3f}, {ex['q95']:.3f}] | "
                f"{row['ks_pooled']:.3f} | {row['ks_excess_pooled']:.3f} |"
            )
    return lines


def _power(result: dict[str, Any]) -> list[str]:
    """Power on simulated and real watermarked texts."""
    stats = _stats(result)
    fallbacks = _described(result).get("fallbacks", "{n} fallbacks")
    lines: list[str] = []
    lines += [
        "",
        "![p-value histograms](pvalues.png)",
        "",
        "Left and middle: histograms of the human texts' p-values pooled over keys (uniform",
        "would be flat at 1). Right: FPR against nominal alpha; a calibrated test stays on or",
        "below the diagonal.",
        "",
        "## Detection power beside it",
        "",
    ]
    lines += [
        "True-positive rates (TPR): the share of watermarked texts flagged. Simulated texts are",
        "scored under every key above; real generations only under the key they were made with,",
        "so they are one draw, and with n texts each text moves a rate by 100/n points.",
        "",
    ]
    power = result["power"]
    if not power:
        lines.append("No power measurement in this run.")
    for name, p in power.items():
        lines += [f"### {name}", "", p["what"][0].upper() + p["what"][1:] + ".", ""]
        if name.startswith("generated"):
            skipped = p["skipped"]
            lines.append(
                f"{p['texts']} texts ({p['too_short']} too short; skipped: {skipped['not_ok']} "
                f"failed records, {skipped['other_key']} of another key), "
                f"{p['num_scored_mean']:.1f} scored sentences and "
                f"{p['distinct_transitions_mean']:.1f} distinct region transitions on average; "
                f"{_pct(p['one_region_share'])} never leave one region. Generation drew "
                f"{p['candidates_per_sentence']:.1f} candidates per sentence, with "
                f"{fallbacks.format(n=p['fallbacks'])}."
            )
        else:
            lines.append(f"{p['texts_per_key']} texts per key; lengths: {p['lengths']}.")
        lines += [
            f"Empirical-FPR thresholds come from the {p['empirical_fpr_reference']}.",
            "",
            "| statistic | TPR at nominal alpha 0.01 | TPR at nominal 0.05 | TPR at empirical "
            "FPR 1% | TPR at empirical FPR 0.1% |",
            "|---|---|---|---|---|",
        ]
        for stat in stats:
            nominal, emp = p[stat]["tpr_at_alpha"], p[stat]["tpr_at_empirical_fpr"]
            cells = [
                _pct(nominal[key]["mean"]) if key in nominal else "-" for key in ("0.01", "0.05")
            ]
            cells += [_pct(emp[key]["mean"]) if key in emp else "-" for key in ("0.01", "0.001")]
            lines.append(f"| {stat} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _configured_key(result: dict[str, Any]) -> list[str]:
    """The human texts' FPR under the configured key."""
    alphas = result["calibration"]["alphas"]
    stats = _stats(result)
    lines: list[str] = []
    conf = result["configured_key"]
    lines += [
        "## The configured key",
        "",
        f"Under the configured key (fingerprint `{conf['key_fingerprint']}`"
        + (f", {result['key']}" if result.get("key") else "")
        + "), one draw among the keys above, the human texts were flagged at:",
        "",
        "| statistic | " + " | ".join(f"alpha {a}" for a in alphas) + " |",
        "|---|" + "---|" * len(alphas),
    ]
    for stat in stats:
        cells = [_pct(conf["human_fpr"][stat][str(a)]) for a in alphas]
        lines.append(f"| {stat} | " + " | ".join(cells) + " |")
    return lines


def _group_lines(groups: dict[str, Any]) -> list[str]:
    """Headline lines on false positives by group (``summary.group_rates``)."""
    lines = []
    for alpha, g in groups.items():
        if not g.get("groups"):
            continue
        lines.append(
            f"- by group at nominal {alpha} ({g['groups']} documents, speeches or accounts of at "
            f"least {g['min_size']} texts, {g['texts']} texts): the most any group had flagged "
            f"under one key is {_pct(g['largest_share'])} ({g['largest_group']}, "
            f"{g['largest_group_texts']} texts, key {g['largest_key']}); "
            f"{g['cells_above_15pct']} of {g['cells']} (group, key) cells above 15%. Were the "
            f"group's texts independent, so many flagged would happen with probability "
            f"{g['independent_tail']:.2g}."
        )
    return lines


def _dotted(settings: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The recorded settings as ``(place, value)`` pairs: a group's fields as ``group.field``
    (reports written before the settings groups recorded them flat)."""
    out = []
    for key, value in settings.items():
        if isinstance(value, dict):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def described_first(result: dict[str, Any]) -> str:
    """What becomes of a text's first unit without a prompt, in the mark's words."""
    return _described(result).get("first", "prompt: each text's first sentence only seeds.")


def _stats(result: dict[str, Any]) -> list[str]:
    """The statistics a result holds (the direction mark has ``exact`` only)."""
    return list(result["calibration"].get("statistics", STATS))


def plot_pvalues(result: dict[str, Any], path: str | Path) -> None:
    """Write the p-value histograms and the FPR-against-alpha curve as a PNG."""
    plt = pyplot_for(path)
    if plt is None:
        return

    hist, curve = result["histogram"], result["fpr_curve"]
    edges = np.asarray(hist["edges"])
    stats = _stats(result)
    titles = {"paper": "paper: normal tail of z", "exact": "exact: key randomisation"}
    fig, axes = plt.subplots(1, len(stats) + 1, figsize=(4.7 * (len(stats) + 1), 4))
    for ax, stat in zip(axes[: len(stats)], stats, strict=True):
        title = titles[stat]
        ax.stairs(hist[stat], edges, fill=True, alpha=0.6, label=stat)
        if stat == "exact" and len(stats) > 1:
            ax.stairs(hist[DIAGNOSTIC], edges, color="black", label="exact, ties randomised")
        ax.axhline(1.0, color="grey", linestyle="--", label="uniform")
        ax.set_title(title)
        ax.set_xlabel("p-value of human text")
        ax.set_ylabel("density")
        ax.legend(fontsize=8)
    ax = axes[-1]
    a = np.asarray(curve["alphas"])
    for stat in stats:
        # A zero rate has no place on a log axis: the line stops where nothing is flagged.
        rate = np.asarray(curve[stat], dtype=np.float64)
        ax.loglog(a, np.where(rate > 0, rate, np.nan), label=stat)
    ax.loglog(a, a, color="grey", linestyle="--", label="nominal")
    ax.set_xlabel("nominal alpha")
    ax.set_ylabel("share of human texts flagged (0 not drawn)")
    ax.set_title("false-positive rate")
    ax.legend(fontsize=8)
    n, keys = result["texts_total"], result["calibration"]["num_keys"]
    fig.suptitle(f"{n} human texts x {keys} keys")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], output_dir: str | Path) -> dict[str, Path]:
    """Write ``calibration.json``, ``report.md`` and ``pvalues.png`` into ``output_dir``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "calibration.json",
        "report": out / "report.md",
        "png": out / "pvalues.png",
    }
    write_json_atomic(paths["json"], result)
    write_text_atomic(paths["report"], render_report(result))
    plot_pvalues(result, paths["png"])
    return paths
