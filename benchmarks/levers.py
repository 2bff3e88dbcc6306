"""Measurements behind the generation speed settings, one lever at a time.

Run from the repository root (see ``benchmarks/README.md``, "Levers")::

    python -m benchmarks.levers speed
    python -m benchmarks.levers quality
    python -m benchmarks.levers early

* ``speed``: one sampling round of ``R`` rows after a held-out news prefix, and plain
  ``generate``, for each LM weight format (``lm_dtype``), the formats alternated round by round;
  CPU seconds (this process, so other jobs on a shared machine distort it less than wall-clock)
  and wall seconds per decoded token. ``--threads-compare`` alternates torch threads instead.
* ``quality``: per format, the perplexity of held-out human news under the format itself, and
  watermarked (and plain) generations from the same prompts and seeds under a configuration
  file, scored by the Gemma-3-270M oracle (perplexity, as the evaluation computes it) and by
  the detector (exact p-values, valid share of scored transitions).
* ``early``: how well a candidate's first ``n`` tokens predict its whole sentence's region, on
  the design study's candidate pool (``research/study/data/pool.jsonl``): the share of candidates
  an early-rejection rule would drop although the whole sentence would have been accepted,
  against the share of decoded tokens it would save.

Each prints a Markdown table and writes ``results/levers-<name>.json`` and ``.md``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser, Namespace

from ksemstamp.assets import ORACLE_LM, load_lm, resolve_lm_dtype
from ksemstamp.builders import build_detector, build_scheme
from ksemstamp.generation.sampler import CandidateSampler
from ksemstamp.settings import SamplingSettings, WatermarkSettings
from ksemstamp.settings_files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts, news_windows
from ksemstamp.text.splitter import get_splitter

from .harness import BENCH_KEY_LAYER, REPO, header_markdown, new_report, parser, repo_relative
from .harness import write_report as _write_report

STUDY_POOL = REPO / "research" / "study" / "data" / "pool.jsonl"
"""The design study's candidate pool, which ``early`` replays."""


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _write(name: str, args: Namespace, header: dict[str, Any], figures: dict, table: str) -> None:
    """Print ``table`` and write ``levers-NAME.json`` and ``.md`` under ``--output-dir``: the
    report ``header`` (command, settings, machine) with the command's ``figures``."""
    report = {**header, **figures}

    def render(r: dict[str, Any]) -> str:
        return "\n".join(header_markdown(r, f"Levers: {name}")) + table + "\n"

    _write_report(report, args.output_dir, f"levers-{name}", render, final=True)
    print(table)
    print(f"wrote {Path(args.output_dir) / f'levers-{name}.json'}")


def _models(formats: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """One loaded LM per format (``auto`` resolved, so the names say what ran)."""
    return {fmt: load_lm(dtype=fmt) for fmt in formats}


# ---------------------------------------------------------------------- speed


def _round_cost(sampler, prefix: str, context: str, rows: int, seed: int) -> tuple[float, float]:
    """CPU and wall seconds per decoded token of one round whose judge accepts nothing."""
    sampler.prefixes.clear()  # every round pays its prefill, as a new sentence does
    gen = torch.Generator().manual_seed(seed)
    cpu, wall = time.process_time(), time.perf_counter()
    result = sampler.sample_round(
        [prefix], [rows], lambda g, t: [(False, None)] * len(t), [gen], [context]
    )[0]
    tokens = max(1, result.decoded_tokens)
    return (time.process_time() - cpu) / tokens, (time.perf_counter() - wall) / tokens


def _step_cost(sampler, prefix: str, rows: int, steps: int = 6) -> tuple[float, float]:
    """CPU and wall seconds of one decoding step with ``rows`` live rows after ``prefix``."""
    from ksemstamp.generation.kvcache import CopiedCacheDecoder, SharedPrefixDecoder

    state = sampler.prefixes.get([prefix])
    kind = SharedPrefixDecoder if sampler.shared_prefix else CopiedCacheDecoder
    decoder = kind(sampler.model, state, [0] * rows, steps + 1)
    ids = torch.full((rows,), 13)
    with torch.inference_mode():
        decoder.step(ids, [0] * rows)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(steps):
            decoder.step(ids, [0] * rows)
    return (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps


def _generate_cost(model, tokenizer, prefix: str, tokens: int, seed: int) -> tuple[float, float]:
    """CPU and wall seconds per new token of plain ``generate`` (prefill included)."""
    enc = tokenizer(prefix, return_tensors="pt")
    with torch.inference_mode(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cpu, wall = time.process_time(), time.perf_counter()
        model.generate(
            **enc,
            do_sample=True,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            temperature=0.7,
            repetition_penalty=1.05,
            top_k=0,
            pad_token_id=tokenizer.pad_token_id,
        )
    return (time.process_time() - cpu) / tokens, (time.perf_counter() - wall) / tokens


def run_speed(args: Namespace, header: dict[str, Any]) -> None:
    formats = [resolve_lm_dtype(f) for f in args.formats.split(",")]
    models = _models(formats)
    splitter = get_splitter()
    samplers = {
        f: CandidateSampler(m, t, splitter, SamplingSettings()) for f, (m, t) in models.items()
    }
    prefix = news_windows(1, words=args.prefix_words, skip=50)[0]
    context = splitter.split(prefix)[-1]
    rows_list = [int(r) for r in args.rows.split(",")]
    cases = [(f, r) for r in rows_list for f in formats] + [(f, "generate") for f in formats]
    cases += [(f, f"step{r}") for r in sorted({1, *rows_list}) for f in formats]
    if args.threads_compare:
        fmt = formats[0]
        cases = [(t, r) for r in [*rows_list, "generate"] for t in (1, args.threads_compare)]
    samples: dict[str, list[tuple[float, float]]] = {f"{a}|{b}": [] for a, b in cases}

    def once(case: tuple[Any, Any], seed: int) -> tuple[float, float]:
        name, rows = case
        if args.threads_compare:
            torch.set_num_threads(name)
            model, tok = models[fmt]
            sampler = samplers[fmt]
        else:
            model, tok = models[name]
            sampler = samplers[name]
        if rows == "generate":
            return _generate_cost(model, tok, prefix, args.generate_tokens, seed)
        if isinstance(rows, str):  # "stepR": one decoding step of R live rows
            return _step_cost(sampler, prefix, int(rows[4:]))
        return _round_cost(sampler, prefix, context, rows, seed)

    for case in cases:  # warm-up: first calls pay one-off costs
        once(case, 0)
    for rep in range(args.repeats):
        # Same seed for every variant of a repeat (the same work); the order alternates.
        order = cases if rep % 2 == 0 else cases[::-1]
        for case in order:
            samples[f"{case[0]}|{case[1]}"].append(once(case, 100 + rep))
        print(f"  repeat {rep + 1}/{args.repeats} done", flush=True)
    base_name = 1 if args.threads_compare else formats[0]
    rows_out = []
    for key, values in samples.items():
        name, rows = key.split("|")
        cpu = _median([c for c, _ in values])
        wall = _median([w for _, w in values])
        base = samples[f"{base_name}|{rows}"]
        rows_out.append(
            {
                "variant": name,
                "rows": rows,
                "cpu_ms_per_token": 1000 * cpu,
                "wall_ms_per_token": 1000 * wall,
                "cpu_ratio": cpu / _median([c for c, _ in base]),
                "wall_ratio": wall / _median([w for _, w in base]),
                "cpu_samples": [round(1000 * c, 3) for c, _ in values],
                "wall_samples": [round(1000 * w, 3) for _, w in values],
            }
        )
    what = "threads" if args.threads_compare else "lm_dtype"
    lines = [
        "rows R: a sampling round of R rows (ms per decoded token); generate: plain `generate` "
        "(ms per new token); stepR: one decoding step with R live rows (ms per step).",
        "",
        f"| {what} | rows | CPU ms | ratio | wall ms | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows_out:
        lines.append(
            f"| {r['variant']} | {r['rows']} | {r['cpu_ms_per_token']:.2f} | {r['cpu_ratio']:.2f} "
            f"| {r['wall_ms_per_token']:.2f} | {r['wall_ratio']:.2f} |"
        )
    report = {
        "prefix_tokens": len(models[formats[0]][1](prefix)["input_ids"]),
        "threads": args.threads,
        "rows": rows_out,
    }
    _write("threads" if args.threads_compare else "speed", args, header, report, "\n".join(lines))


# ---------------------------------------------------------------------- quality


def _teacher_forced_perplexity(model, tokenizer, texts: Sequence[str]) -> float:
    """Perplexity of ``texts`` under ``model`` (every token after the first)."""
    nll, count = 0.0, 0
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0, :-1]
            nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
            count += ids.shape[1] - 1
    return math.exp(nll / count)


def run_quality(args: Namespace, header: dict[str, Any]) -> None:
    from ksemstamp.builders import build_watermarker
    from ksemstamp.evaluation.metrics import Oracle

    formats = [resolve_lm_dtype(f) for f in args.formats.split(",")]
    models = _models(formats)
    base = load_watermark_settings(
        [args.config],
        {**BENCH_KEY_LAYER, "sampling": {"max_new_tokens": args.max_new_tokens, "seed": 0}},
    )
    scheme = build_scheme(base)
    detector = build_detector(base, scheme)
    prompts = news_prompts(args.prompts, 32)
    human = news_windows(args.human_texts, words=150, skip=args.prompts)
    out: dict[str, Any] = {"config": repo_relative(args.config), "formats": {}}
    # Every generation is appended to a JSONL file as it is made, and a rerun with the same
    # settings skips what is there: on a machine shared with other jobs this can take hours.
    store = Path(args.output_dir) / f"levers-{args.name}-generations.jsonl"
    done = {}
    if store.exists():
        for line in store.read_text().splitlines():
            rec = json.loads(line)
            done[(rec["format"], rec["prompt_index"])] = rec
    watermarkers = {
        f: build_watermarker(base.updated({"model": {"lm_dtype": f}}), scheme, lm=models[f])
        for f in formats
    }
    for i, prompt in enumerate(prompts):
        order = formats if i % 2 == 0 else formats[::-1]
        for fmt in order:
            if (fmt, i) in done and done[(fmt, i)]["prompt"] == prompt:
                continue
            wm = watermarkers[fmt]
            start = time.perf_counter()
            (marked,) = wm.generate([prompt])
            seconds = time.perf_counter() - start
            (plain,) = wm.generate([prompt], watermark=False)
            rec = {
                "format": fmt,
                "prompt_index": i,
                "prompt": prompt,
                "watermarked": marked.text,
                "plain": plain.text,
                "candidates": marked.candidates,
                "sentences": marked.num_sentences,
                "fallbacks": marked.fallbacks,
                "seconds": seconds,
            }
            done[(fmt, i)] = rec
            with store.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(
                f"  prompt {i + 1}/{len(prompts)} {fmt}: {marked.num_sentences} sentences, "
                f"{marked.candidates} candidates, {seconds:.0f} s",
                flush=True,
            )
    records = {f: [done[(f, i)] for i in range(len(prompts))] for f in formats}
    generated = {
        f: {k: [r[k] for r in records[f]] for k in ("watermarked", "plain")} for f in formats
    }
    stats = {
        f: {
            k: [r[k] for r in records[f]]
            for k in ("candidates", "sentences", "fallbacks", "seconds")
        }
        for f in formats
    }
    oracle_model, oracle_tok = load_lm(ORACLE_LM)
    oracle = Oracle(oracle_model, oracle_tok)
    for fmt in formats:
        model, tok = models[fmt]
        row: dict[str, Any] = {
            "human_perplexity_under_format": _teacher_forced_perplexity(model, tok, human)
        }
        for kind in ("watermarked", "plain"):
            texts = generated[fmt][kind]
            scores = oracle.score(prompts, texts)
            ppl = [s.perplexity for s in scores if s.perplexity is not None]
            row[f"{kind}_oracle_perplexity_median"] = _median(ppl)
            row[f"{kind}_oracle_perplexity_mean"] = statistics.mean(ppl)
        results = detector.detect_batch(generated[fmt]["watermarked"], prompts)
        p_values = [r.p_value for r in results]
        scored = sum(r.num_scored for r in results)
        z_scores = [r.z_score for r in results if r.z_score is not None]
        row.update(
            p_values=p_values,
            z_scores=[r.z_score for r in results],
            z_mean=statistics.mean(z_scores) if z_scores else None,
            detected_at_alpha=sum(p is not None and p <= base.alpha for p in p_values),
            valid_share=sum(r.num_valid for r in results) / scored if scored else None,
            scored_sentences=scored,
            candidates_per_sentence=sum(stats[fmt]["candidates"]) / sum(stats[fmt]["sentences"]),
            fallbacks=sum(stats[fmt]["fallbacks"]),
            seconds=stats[fmt]["seconds"],
            texts=generated[fmt],
        )
        out["formats"][fmt] = row
    lines = [
        "| lm_dtype | human ppl (under the format) | oracle ppl, watermarked (median) "
        "| oracle ppl, plain (median) | p <= alpha | mean z | valid share "
        "| candidates / sentence | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fmt, r in out["formats"].items():
        lines.append(
            f"| {fmt} | {r['human_perplexity_under_format']:.2f} "
            f"| {r['watermarked_oracle_perplexity_median']:.2f} "
            f"| {r['plain_oracle_perplexity_median']:.2f} "
            f"| {r['detected_at_alpha']} / {len(prompts)} | {r['z_mean']:.2f} "
            f"| {r['valid_share']:.3f} "
            f"| {r['candidates_per_sentence']:.1f} | {r['fallbacks']} |"
        )
    _write(args.name, args, header, out, "\n".join(lines))


# ---------------------------------------------------------------------- early rejection


def _early_config(path: str) -> tuple[str, WatermarkSettings]:
    return Path(path).stem, load_watermark_settings(
        [path], {**BENCH_KEY_LAYER, "sampling": {"seed": 0}}
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _simulated_round_cost(lengths, accepted, step_ms: tuple[float, float]) -> tuple[float, bool]:
    """Cost of one round under ordered acceptance: every row decodes until it finishes or its
    group resolves (the first accepted row and every row before it finished), at
    ``fixed + per_row * live rows`` per step. Returns the cost and whether a row was accepted."""
    hits = torch.nonzero(accepted).flatten()
    end = int(lengths[: int(hits[0]) + 1].max()) if len(hits) else int(lengths.max())
    steps = torch.arange(end, dtype=torch.float64)
    live = (lengths[None, :] > steps[:, None]).sum(dim=1)
    fixed, per_row = step_ms
    return float((fixed + per_row * live).sum()), bool(len(hits))


def _simulated_cost_ratio(ctx_of, lengths, accepted, drop, n, rows, args, seed) -> float:
    """Decoding cost per accepted sentence with early rejection over without, simulated on the
    pool: rounds of ``rows`` candidates drawn (with replacement) from a context's measured
    candidates until one is accepted or ``max_candidates`` are drawn."""
    gen = torch.Generator().manual_seed(seed)
    step_ms = tuple(float(x) for x in args.step_cost.split(","))
    early_len = torch.where(drop, torch.full_like(lengths, n), lengths)
    early_acc = accepted & ~drop
    base_total = early_total = 0.0
    for c in range(int(ctx_of.max()) + 1):
        idx = torch.nonzero(ctx_of == c).flatten()
        for _ in range(args.sentences_per_context):
            state = gen.get_state()  # the same draws with and without early rejection
            costs = []
            for lens, acc in ((lengths, accepted), (early_len, early_acc)):
                gen.set_state(state)
                drawn, cost = 0, 0.0
                while drawn < args.max_candidates:
                    size = min(rows, args.max_candidates - drawn)
                    take = idx[torch.randint(len(idx), (size,), generator=gen)]
                    spent, hit = _simulated_round_cost(lens[take], acc[take], step_ms)
                    cost += spent
                    drawn += size
                    if hit:
                        break
                costs.append(cost)
            base_total += costs[0]
            early_total += costs[1]
    return early_total / base_total


def run_early(args: Namespace, header: dict[str, Any]) -> None:
    """Offline accuracy of early rejection on the study pool, for each configuration file."""
    from ksemstamp.centroids import CentroidFile
    from ksemstamp.encoding import embed
    from ksemstamp.keys import valid_table
    from ksemstamp.partition import kmeans_gap

    pool = [json.loads(line) for line in Path(args.pool).read_text().splitlines() if line]
    _, tokenizer = load_lm()
    lengths = [int(n) for n in args.tokens.split(",")]
    contexts, cands = [], []  # cands: (context index, text, token ids)
    for doc in pool:
        for ctx in doc["contexts"]:
            contexts.append(ctx["previous"])
            for text, _ in ctx["candidates"]:
                if text:  # empty candidates are never accepted and never reach a check
                    ids = tokenizer(" " + text, add_special_tokens=False)["input_ids"]
                    cands.append((len(contexts) - 1, text, ids))
    partial = {
        n: [tokenizer.decode(ids[:n], skip_special_tokens=True).strip() for _, _, ids in cands]
        for n in lengths
    }
    token_counts = torch.tensor([len(ids) for _, _, ids in cands], dtype=torch.float64)
    ctx_of = torch.tensor([c for c, _, _ in cands])
    report: dict[str, Any] = {
        "pool": repo_relative(args.pool),
        "contexts": len(contexts),
        "candidates": len(cands),
        "mean_candidate_tokens": float(token_counts.mean()),
        "configs": {},
    }
    lines = []
    for path in args.configs.split(","):
        name, cfg = _early_config(path)
        scheme = build_scheme(cfg)
        centroids = CentroidFile.load(cfg.centroid_path()).centroids
        enc = scheme.encoder
        prev_region, _ = kmeans_gap(embed(enc, contexts), centroids)
        full_region, full_gap = kmeans_gap(embed(enc, [t for _, t, _ in cands]), centroids)
        part = {n: kmeans_gap(embed(enc, partial[n]), centroids) for n in lengths}
        k = centroids.shape[0]
        mark = cfg.mark  # a region mark: its valid tables and margin are measured
        if mark.valid_mode == "keyed":
            tables = [valid_table(k, mark.gamma, f"early-{i}") for i in range(args.num_keys)]
        else:
            tables = [valid_table(k, mark.gamma, None, "paper")]
        simulated = {tuple(float(x) for x in r.split(":")) for r in args.simulate.split(",")}
        simulated = {(int(n), tau) for n, tau in simulated}
        q = prev_region[ctx_of]
        rows = []
        for n in lengths:
            region_n, gap_n = part[n]
            same = float((region_n == full_region).double().mean())
            for tau in [float(t) for t in args.depths.split(",")]:
                per_key: dict[str, list[float]] = {}
                for key_index, table in enumerate(tables):
                    valid = table[q, full_region]
                    accepted = valid & (full_gap > mark.margin)
                    drop = (token_counts > n) & ~table[q, region_n] & (gap_n > tau)
                    saved = ((token_counts - n).clamp(min=0) * drop).sum() / token_counts.sum()
                    figures = {
                        "accepted_share": float(accepted.double().mean()),
                        "dropped_share": float(drop.double().mean()),
                        "false_drop_rate": float(
                            (drop & accepted).sum() / max(1, int(accepted.sum()))
                        ),
                        "false_drop_rate_valid": float(
                            (drop & valid).sum() / max(1, int(valid.sum()))
                        ),
                        "tokens_saved_share": float(saved),
                    }
                    if (n, tau) in simulated:
                        for r in (16, 32):
                            figures[f"round_cost_ratio_{r}"] = _simulated_cost_ratio(
                                ctx_of, token_counts, accepted, drop, n, r, args, key_index
                            )
                    for k, v in figures.items():
                        per_key.setdefault(k, []).append(v)
                row = {"tokens": n, "depth": tau, "partial_region_equals_full": same}
                row.update({k: statistics.mean(v) for k, v in per_key.items()})
                row["false_drop_rate_worst_key"] = max(per_key["false_drop_rate"])
                rows.append(row)
        report["configs"][name] = {
            "centroids": str(cfg.centroid_path().name),
            "K": k,
            "gamma": mark.gamma,
            "margin": mark.margin,
            "keys": len(tables),
            "rules": rows,
        }
        lines += [
            f"**{name}** (K = {k}, gamma = {mark.gamma}, margin = {mark.margin}; "
            f"{len(tables)} valid table(s))",
            "",
            "| first n tokens | region as the whole sentence | depth > | dropped | "
            "false drops (of acceptable) | worst key | false drops (of valid) "
            "| decoded tokens saved | cost per sentence, 16 rows | 32 rows |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['tokens']} | {r['partial_region_equals_full']:.2f} | {r['depth']} "
                f"| {r['dropped_share']:.3f} | {r['false_drop_rate']:.3f} "
                f"| {r['false_drop_rate_worst_key']:.3f} | {r['false_drop_rate_valid']:.3f} "
                f"| {r['tokens_saved_share']:.3f} | {_fmt(r.get('round_cost_ratio_16'))} "
                f"| {_fmt(r.get('round_cost_ratio_32'))} |"
            )
        lines.append("")
    _write("early", args, header, report, "\n".join(lines))


# ---------------------------------------------------------------------- command line


def _speed_options(p: ArgumentParser) -> None:
    p.add_argument("--formats", type=str, default="fp32,bf16,int8")
    p.add_argument("--rows", type=str, default="1,8,32", help="rows per round")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--prefix-words", type=int, default=120)
    p.add_argument("--generate-tokens", type=int, default=32)
    p.add_argument(
        "--threads-compare",
        type=int,
        default=0,
        help="alternate 1 thread and this many (first format only), wall-clock",
    )


def _quality_options(p: ArgumentParser) -> None:
    p.add_argument("--formats", type=str, default="fp32,bf16,int8")
    p.add_argument("--config", type=str, default=str(REPO / "configs" / "ksemstamp.yaml"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--human-texts", type=int, default=40)
    p.add_argument(
        "--name",
        type=str,
        default="quality",
        help="results/levers-NAME.json and its generations file; a rerun with the same name "
        "reuses the stored generations",
    )


def _early_options(p: ArgumentParser) -> None:
    p.add_argument("--pool", type=str, default=str(STUDY_POOL))
    p.add_argument("--tokens", type=str, default="4,6,8,12,16", help="prefix lengths n to test")
    p.add_argument(
        "--keys", dest="num_keys", type=int, default=20, help="valid tables (keys) to average"
    )
    p.add_argument("--depths", type=str, default="0,0.02,0.05,0.1", help="gap thresholds to test")
    p.add_argument(
        "--configs",
        type=str,
        default=",".join(
            str(REPO / "configs" / c) for c in ("ksemstamp.yaml", "ksemstamp-paper.yaml")
        ),
    )
    p.add_argument(
        "--simulate",
        type=str,
        default="8:0.05,12:0.05,12:0.1,16:0.05,16:0.1",
        help="n:depth rules whose cost per sentence is simulated",
    )
    p.add_argument(
        "--step-cost",
        type=str,
        default="66,4.3",
        help="ms per decoding step: fixed, per live row (from `levers speed`)",
    )
    p.add_argument("--sentences-per-context", type=int, default=5)
    p.add_argument("--max-candidates", type=int, default=100)


COMMANDS = {
    "speed": ("cost per decoded token by lm_dtype (or threads)", _speed_options, run_speed),
    "quality": ("perplexity and detection by lm_dtype", _quality_options, run_quality),
    "early": ("early rejection accuracy on the study pool", _early_options, run_early),
}


def parse_args(argv: Sequence[str] | None = None) -> tuple[str, Namespace]:
    """The command and its flags (each command takes the harness's ``--threads``, default 1,
    and ``--output-dir``)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0], env_prefix=False)
    sub = p.add_subcommands(required=True, dest="command")
    for name, (help_text, options, _) in COMMANDS.items():
        command = parser(help_text, threads=1)
        options(command)
        sub.add_subcommand(name, command, help=help_text)
    args = p.parse_args(argv)
    return args.command, args[args.command]


def main(argv: Sequence[str] | None = None) -> int:
    command, args = parse_args(argv)
    torch.set_num_threads(args.threads)
    header = new_report("levers", args, argv)
    COMMANDS[command][2](args, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
