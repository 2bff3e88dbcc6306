"""Watermarking through vLLM against plain vLLM generation, side by side in one run.

    python -m benchmarks vllm --vllm.prompts 12 --vllm.max_new_tokens 200

run with the Python of ``.venv-vllm`` (vLLM installed beside the project: ``make setup-vllm``). Variants, each on the same held-out
news prompts, one prompt a call, in turn prompt by prompt:

* ``plain_vllm``: ``vllm.LLM.generate`` of ``max_new_tokens`` tokens, ``n = 1`` (the floor);
* ``default_vllm``: the default mark (``configs/ksemstamp.yaml``) with ``sampling.engine vllm``
  (rows kept running across pruning checks, steered among each step's plausible entries inside
  vLLM's sampler: the engine core then runs in this process, for the floor too), and
  ``default_vllm_chunked``, the same with every chunk of a row a new request
  (``engine.keep_rows: false``);
* ``candidates128_vllm``: the 128-candidate profile (``configs/ksemstamp-gpu.yaml``) through vLLM;
* ``default_hf``: the default mark through the Hugging Face engine, and ``plain_hf``, plain
  ``generate`` of the same model (the HF engine's own floor), in the same process.

``--vllm.server true`` runs the served variants instead, against a ``vllm serve`` of the same
model the benchmark starts (``vllm_server``; nothing else runs in this process meanwhile):
``plain_server``, one completions request of ``max_new_tokens`` tokens (the floor, the engine's
own request path with one row), ``default_server``, the default mark through
``sampling.engine openai`` (each row one streamed request), and ``default_server_chunked``, the
same with a request per chunk. Writes ``results/vllm-server.json`` and ``.md``.

Every figure is per output token (the output re-tokenised the same way for every variant):
``over_plain_vllm_per_output_token`` is the per-prompt ratio of seconds per output token to
plain vLLM's on the same prompt (median and p90), ``decoded_per_output_token`` the tokens the
engine sampled per output token. Writes ``results/vllm.json`` and ``vllm.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ksemstamp import build_detector, build_scheme, build_watermarker
from ksemstamp.settings.files import load_watermark_settings
from ksemstamp.text.corpora import news_prompts

from .harness import (
    BENCH_KEY_LAYER,
    DEFAULT_CONFIG,
    RunSettings,
    apply_threads,
    at_least,
    distribution,
    header_markdown,
    new_report,
    quantile,
    refuse,
    write_report,
)

GPU_CONFIG = DEFAULT_CONFIG.with_name("ksemstamp-gpu.yaml")


@dataclass(frozen=True)
class VllmBenchSettings:
    """The mark through vLLM against plain vLLM."""

    prompts: int = 12
    """Held-out news prompts, one per call."""
    max_new_tokens: int = 200
    """New tokens per prompt."""
    prompt_words: int = 32
    """Prompt length in words (cut back to a sentence end)."""
    candidates128: bool = True
    """Run the 128-candidate profile too (the longest variant)."""
    hf: bool = True
    """Run the Hugging Face engine's default and plain ``generate`` too."""
    chunked: bool = True
    """Run the default with each chunk a new request too (``engine.keep_rows: false``), in
    process or through the server."""
    server: bool = False
    """Run the served variants instead (``plain_server``, ``default_server``)."""

    def __post_init__(self) -> None:
        refuse(self, at_least(self, 1, "prompts", "max_new_tokens", "prompt_words"))


def _config(path: Path, settings: VllmBenchSettings, engine: str, **eng: Any) -> Any:
    layer = {
        **BENCH_KEY_LAYER,
        "sampling": {"max_new_tokens": settings.max_new_tokens, "seed": 0, "engine": engine},
        "search": {"prompt_batch": 1},
        "engine": eng,
    }
    return load_watermark_settings([path], layer)


def vllm(vllm: VllmBenchSettings | None = None, run: RunSettings | None = None) -> int:
    """The mark through vLLM against plain vLLM generation (see the module docstring)."""
    settings = vllm or VllmBenchSettings()
    run = run or RunSettings()
    apply_threads(run)
    name = "vllm-server" if settings.server else "vllm"
    report = new_report("vllm", {"vllm": settings, "run": run})
    section = (run_server if settings.server else run_vllm)(
        settings,
        lambda s: write_report({**report, "vllm": s}, run.output_dir, name, render, False),
    )
    report["vllm"] = section
    print(write_report(report, run.output_dir, name, render, True))
    return 0


def run_server(settings: VllmBenchSettings, on_prompt: Any = None) -> dict[str, Any]:
    """The served variants on every prompt, against a server this run starts."""
    from ksemstamp.generation.stream import Extension, served_path

    from .vllm_server import vllm_server

    folder = served_path(_config(DEFAULT_CONFIG, settings, "openai").model.lm)
    with vllm_server(folder) as url:
        default = _config(DEFAULT_CONFIG, settings, "openai", base_url=url)
        scheme = build_scheme(default)
        wm = build_watermarker(default, scheme)
        engine = wm.engine
        eos = {i: -100.0 for i in engine.suppress}

        def plain_server(prompt: str, seed: int) -> tuple[str, int]:
            ids = engine.tokenizer(prompt)["input_ids"]
            job = Extension(ids, settings.max_new_tokens, seed, eos or None)
            out = engine.streamer.extend([job])[0].ids
            return engine.tokenizer.decode(out, skip_special_tokens=True), len(out)

        runners = {"plain_server": plain_server, "default_server": _mark_runner(wm)}
        if settings.chunked:
            chunked = _config(DEFAULT_CONFIG, settings, "openai", base_url=url, keep_rows=False)
            runners["default_server_chunked"] = _mark_runner(build_watermarker(chunked, scheme))
        return _timed(settings, runners, wm, build_detector(default, scheme), on_prompt)


def run_vllm(settings: VllmBenchSettings, on_prompt: Any = None) -> dict[str, Any]:
    """Every variant on every prompt; ``on_prompt`` sees the section after each prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from ksemstamp.assets import load_lm
    from ksemstamp.generation.stream import api_sampling, served_path
    from ksemstamp.generation.vllm_engine import build_llm, steers_per_step

    default = _config(DEFAULT_CONFIG, settings, "vllm")
    path = served_path(default.model.lm)
    llm = build_llm(path, default.engine, "cpu", 0, steer=steers_per_step(default))
    scheme = build_scheme(default)
    marks = {"default_vllm": build_watermarker(default, scheme, llm)}
    if settings.chunked:
        chunked = _config(DEFAULT_CONFIG, settings, "vllm", keep_rows=False)
        marks["default_vllm_chunked"] = build_watermarker(chunked, scheme, llm)
    if settings.candidates128:
        gpu = _config(GPU_CONFIG, settings, "vllm")
        marks["candidates128_vllm"] = build_watermarker(gpu, build_scheme(gpu), llm)
    tokenizer = marks["default_vllm"].engine.tokenizer
    hf = None
    if settings.hf:
        hf_cfg = _config(DEFAULT_CONFIG, settings, "batched")
        hf = load_lm(hf_cfg.model.lm, "cpu", "bf16")
        marks["default_hf"] = build_watermarker(hf_cfg, scheme, hf)
    params = api_sampling(default.sampling)
    eos = {i: -100.0 for i in marks["default_vllm"].engine.suppress}

    def plain_vllm(prompt: str, seed: int) -> tuple[str, int]:
        sp = SamplingParams(
            max_tokens=settings.max_new_tokens,
            seed=seed,
            ignore_eos=True,
            logit_bias=eos or None,
            **params,
        )
        out = llm.generate(
            [TokensPrompt(prompt_token_ids=tokenizer(prompt)["input_ids"])], sp, use_tqdm=False
        )[0].outputs[0]
        return tokenizer.decode(out.token_ids, skip_special_tokens=True), len(out.token_ids)

    def plain_hf(prompt: str, seed: int) -> tuple[str, int]:
        import torch

        model, tok = hf
        enc = tok(prompt, return_tensors="pt")
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = model.generate(
                **enc,
                do_sample=True,
                max_new_tokens=settings.max_new_tokens,
                temperature=default.sampling.temperature,
                repetition_penalty=default.sampling.repetition_penalty,
                suppress_tokens=list(eos),
                pad_token_id=tok.eos_token_id,
            )
        new = out[0, enc["input_ids"].shape[1] :]
        return tok.decode(new, skip_special_tokens=True), len(new)

    runners: dict[str, Any] = {"plain_vllm": plain_vllm}
    if hf is not None:
        runners["plain_hf"] = plain_hf
    for name, wm in marks.items():
        runners[name] = _mark_runner(wm)
    detector = build_detector(default, scheme)
    return _timed(settings, runners, marks["default_vllm"], detector, on_prompt)


def _timed(
    settings: VllmBenchSettings, runners: dict[str, Any], mark: Any, detector: Any, on_prompt: Any
) -> dict[str, Any]:
    """Every runner on every prompt in turn, after an untimed warm-up (each plain engine once,
    ``mark`` once); each text detected (untimed) and re-tokenised the same way."""
    tokenizer = mark.engine.tokenizer
    prompts = news_prompts(settings.prompts, settings.prompt_words)
    for name in FLOORS:
        if name in runners:
            runners[name](prompts[0], 1)
    mark.generate([prompts[0]], watermark=True)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for index, prompt in enumerate(prompts):
        for name, fn in runners.items():
            start = time.perf_counter()
            text, decoded = fn(prompt, index)
            seconds = time.perf_counter() - start
            tokens = len(tokenizer(text.strip(), add_special_tokens=False)["input_ids"])
            found = detector.detect(text, prompt)  # untimed: the same detector for every text
            rows[name].append(
                {
                    "seconds": seconds,
                    "tokens": tokens,
                    "decoded": decoded,
                    "z": found.z_score,
                    "p": found.p_value,
                }
            )
            print(
                f"prompt {index + 1}/{len(prompts)} {name}: {tokens} tokens in {seconds:.1f} s",
                flush=True,
            )
        if on_prompt is not None:
            on_prompt(summarize(rows))
    return summarize(rows)


FLOORS = ("plain_vllm", "plain_hf", "plain_server")
"""The plain variants: every variant's time per output token over each one's that ran."""


def _mark_runner(wm: Any) -> Any:
    def run(prompt: str, seed: int) -> tuple[str, int]:
        result = wm.generate([prompt])[0]
        if result.status != "ok":
            raise RuntimeError(f"generation failed: {result.error}")
        return result.text, result.decoded_tokens

    return run


def summarize(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per variant: seconds and decoded tokens per output token, the per-prompt ratio to plain
    vLLM (and to plain HF ``generate`` where it ran), and its texts' detection (share at an exact
    p <= 0.01 under the benchmark's key, median z)."""

    def per_token(r: dict[str, float]) -> float:
        return r["seconds"] / max(r["tokens"], 1)

    first = next(iter(rows.values()))
    out: dict[str, Any] = {"prompts_completed": len(first), "variants": {}}
    for name, runs in rows.items():
        tokens = sum(r["tokens"] for r in runs)
        entry = {
            "prompts": len(runs),
            "seconds": sum(r["seconds"] for r in runs),
            "output_tokens": tokens,
            "decoded_per_output_token": sum(r["decoded"] for r in runs) / max(tokens, 1),
            "detected_at_1pct": sum(r["p"] is not None and r["p"] <= 0.01 for r in runs)
            / max(len(runs), 1),
            "median_z": quantile([r["z"] for r in runs if r["z"] is not None], 0.5),
        }
        for floor in FLOORS:
            if floor in rows and len(rows[floor]) == len(runs):
                ratios = [
                    per_token(r) / per_token(f) for r, f in zip(runs, rows[floor], strict=True)
                ]
                entry[f"over_{floor}_per_output_token"] = {
                    "median": quantile(ratios, 0.5),
                    "p90": quantile(ratios, 0.9),
                    "per_prompt": distribution(ratios),
                }
        out["variants"][name] = entry
    return out


def render(report: dict[str, Any]) -> str:
    lines = header_markdown(report, "vLLM benchmark")
    section = report.get("vllm", {})
    lines += [
        "| variant | prompts | s per output token | over plain vLLM or server (median, p90) | "
        "over plain HF generate (median) | decoded per output token | detected at p <= 1% "
        "(median z) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in section.get("variants", {}).items():
        vs = (
            v.get("over_plain_vllm_per_output_token")
            or v.get("over_plain_server_per_output_token")
            or {}
        )
        hf = v.get("over_plain_hf_per_output_token") or {}
        lines.append(
            f"| {name} | {v['prompts']} | {v['seconds'] / max(v['output_tokens'], 1):.3f} | "
            f"{_x(vs.get('median'))}, {_x(vs.get('p90'))} | {_x(hf.get('median'))} | "
            f"{v['decoded_per_output_token']:.1f} | {v['detected_at_1pct']:.2f} "
            f"({_z(v['median_z'])}) |"
        )
    return "\n".join(lines) + "\n"


def _z(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
