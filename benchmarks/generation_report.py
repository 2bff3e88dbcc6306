"""The generation benchmark's targets and tables, read from its section of a report (what
``generation`` measures and summarises; ``bench`` renders it too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .generation_runs import HARD, STALL_SECONDS
from .harness import dist_cell, fmt


def generation_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The generation targets of benchmarks/README.md, each with its figure and whether it is
    met."""
    out = []
    rows = {r["name"]: r for r in section["variants"]}
    for name in ("default", "paper"):
        ratios = rows[name]["over_hf_generate_per_prompt"] or {}
        for stat, bound in (("median", 3.0), ("p90", 6.0), ("worst", 10.0)):
            value = ratios.get(stat)
            out.append(
                {
                    "target": f"{name}: watermarked / plain generate, s per output token, "
                    f"{stat} over prompts <= {bound:g}x",
                    "measured": value,
                    "met": value is not None and value <= bound,
                }
            )
        worst = (rows[name]["sentence_seconds"] or {}).get("worst")
        out.append(
            {
                "target": f"{name}: no sentence searched longer than {STALL_SECONDS:g} s "
                "(longest sentence, s)",
                "measured": worst,
                "met": worst is not None and worst <= STALL_SECONDS,
            }
        )
    seq = section.get("sequential") or {}
    hard = (seq.get("both_hard") or seq.get("hard_in_default_run") or {}).get(
        "sequential_over_batched_per_sentence"
    )
    out.append(
        {
            "target": f"default: >= 3x faster than the sequential engine on sentences "
            f"needing >= {HARD} candidates (sampled sentences)",
            "measured": hard,
            "met": hard is not None and hard >= 3.0,
        }
    )
    return out


def generation_markdown(section: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The generation tables: one row per variant, then the sequential sample. ``settings``
    are the generation settings the report records (``report["settings"]["generation"]``)."""
    rows = {r["name"]: r for r in section["variants"]}
    d = rows["default"]["settings"]
    lines = [
        "## Generation",
        "",
        f"{section['prompts_completed']} of {settings['prompts']} requested held-out news prompts "
        f"(test split, ~{settings['prompt_words']} words cut at a sentence end), "
        f"{settings['max_new_tokens']} new tokens each, one prompt per call, one fixed key, "
        f"variants in a rotating order. Generator {d['model']['lm']} "
        f"({rows['default']['lm_dtype_resolved']}), sampling as the default configuration "
        f"(temperature {d['sampling']['temperature']}, repetition penalty "
        f"{d['sampling']['repetition_penalty']}).",
        "",
        "| variant | config | K / margin (or mark) / N_max | tokens / s | s per token: median / p90 "
        "/ worst prompt | x plain generate: median / p90 / worst prompt | candidates per "
        "sentence: mean; median / p90 / worst prompt | decoded tokens per output token "
        f"| longest sentence s | sentences > {STALL_SECONDS:g} s | fallbacks | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in section["variants"]:
        mark, search = r["settings"]["mark"], r["settings"]["search"]
        centroids = r["settings"]["partition"]["centroids"]
        k = Path(centroids).stem.rsplit("-", 1)[-1].upper() if centroids else "K64"
        scheme = "-"
        if r["watermark"] and mark["kind"] == "direction":
            scheme = f"{k} / direction / {search['max_candidates']}"
            if search["prune_tokens"]:
                scheme += (
                    f", pruned to {search['prune_keep']} after {search['prune_tokens']} tokens"
                )
        elif r["watermark"]:
            # the margin is search's now; results made before name it under mark
            margin = search.get("margin", mark.get("margin"))
            scheme = f"{k} / {margin} / {search['max_candidates']}"
        per_prompt = dist_cell(r["candidates_per_sentence_per_prompt"], 1)
        candidates = (
            f"{fmt(r['candidates_per_sentence'], 1)}; {per_prompt}" if r["watermark"] else "-"
        )
        lines.append(
            f"| {r['name']} | `{r['config_file']}` | {scheme} | {fmt(r['tokens_per_second'])} "
            f"| {dist_cell(r['seconds_per_token_per_prompt'], 3)} "
            f"| {dist_cell(r['over_hf_generate_per_prompt'])} | {candidates} "
            f"| {fmt(r.get('decoded_per_output_token'), 2)} "
            f"| {fmt((r['sentence_seconds'] or {}).get('worst'), 1)} "
            f"| {r['sentences_over_60s'] if r['kind'] == 'loop' else '-'} "
            f"| {r['fallbacks'] if r['watermark'] else '-'} | {fmt(r['peak_rss_mib'], 0)} |"
        )
    lines += [
        "",
        "Per-prompt figures: each prompt's seconds per output token (output tokens counted "
        "by re-tokenising the text, the same way for every variant), and its ratio to plain "
        "`generate` on the same prompt; p90 interpolates between prompts. A sentence's "
        "seconds are those of the sampling rounds that produced it (embedding and judging "
        "included).",
        "",
    ]
    return lines + sequential_markdown(section.get("sequential"))


def sequential_markdown(seq: dict[str, Any] | None) -> list[str]:
    """The sequential sample's table (nothing when it did not run)."""
    if not seq:
        return []
    lines = [
        "### Sequential engine (a sample of sentences, not whole prompts)",
        "",
        f"Whole prompts under `sampling.engine: sequential` would take hours, so "
        f"{seq['sentences']} sentences of the default run were searched again by both "
        f"strategies from the same prefix (the prompt and the text before the "
        f"sentence), one sentence each, in alternating order; sentences that needed >= "
        f"{HARD} candidates in the run were sampled first. The two searches draw "
        f"different candidates, so each needs its own number of them.",
        "",
        "| sentences | n | sequential s / sentence | batched s / sentence "
        "| sequential / batched per sentence | per candidate | candidates seq. / batched |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, name in (
        ("all sampled", "all"),
        (f">= {HARD} candidates in the default run", "hard_in_default_run"),
        (f">= {HARD} candidates in both searches", "both_hard"),
    ):
        x = seq.get(name)
        if not x:
            lines.append(f"| {label} | 0 | - | - | - | - | - |")
            continue
        lines.append(
            f"| {label} | {x['sentences']} | {fmt(x['sequential_seconds_per_sentence'], 1)} "
            f"| {fmt(x['batched_seconds_per_sentence'], 1)} "
            f"| {fmt(x['sequential_over_batched_per_sentence'])} "
            f"| {fmt(x['sequential_over_batched_per_candidate'])} "
            f"| {x['candidates_sequential']} / {x['candidates_batched']} |"
        )
    lines.append("")
    return lines
