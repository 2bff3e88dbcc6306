"""The ``engine`` group: what the served engines (``sampling.engine: vllm`` or ``openai``) need
beyond the sampling settings. The Hugging Face engines read none of it.

``vllm`` runs vLLM in this process (``vllm.LLM``, prefix caching on) on ``model.lm`` (a Hub id,
a folder, or an offline alias, whose converted folder is served); ``openai`` sends token-id
prompts to any OpenAI-compatible completions server (``vllm serve`` is the one tested) at
``base_url``. Both sample tokens only; where a unit ends, judging, pruning and steering stay in
this process (``generation.stream``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from .checks import Range, check

VllmDtype = Literal["auto", "bfloat16", "float16", "float32"]


@dataclass(frozen=True)
class EngineSettings:
    """The served engines' settings (``sampling.engine: vllm`` or ``openai``)."""

    chunk_tokens: Annotated[int, Range(1, 4096)] = 16
    """Tokens a row advances by in one call when no pruning check is due (tokens sampled past
    a unit's end within the call count as decoded; with ``keep_rows`` a row stops at its end)."""
    keep_rows: bool = True
    """A row's request stays running across pruning checks and stops at the token that shows
    its unit's end (``vllm``: vLLM's step API; ``openai``: a streamed request, closed when the
    row stops); false: each chunk is a new request, which re-reads the row from its last whole
    cached block (and, for a server, is one more round trip)."""
    bias_entries: Annotated[int, Range(0, 1_000_000)] = 1024
    """Steering: the largest entries of a row's logit bias passed on as a sparse
    ``logit_bias`` (0: no steering through this engine). The entries left out are the tokens
    steering would have favoured least."""
    dtype: VllmDtype = "bfloat16"
    """``vllm``: the weights' type (``bfloat16`` runs on CPUs with AVX-512 and on GPUs)."""
    max_model_len: Annotated[int, Range(16, 10_000_000)] | None = 2048
    """``vllm``: the longest sequence served (prompt and text); ``None``: the model's own."""
    block_size: Annotated[int, Range(1, 1024)] | None = None
    """``vllm``: tokens per KV-cache block. Prefix caching reuses whole blocks only, and a
    continued row re-reads its tokens since the last whole block: ``None`` takes 32 on a CPU
    (the smallest its attention takes; vLLM's CPU default of 128 caches nothing of a short
    prompt, which measured 4-5x slower per call) and vLLM's own on a GPU."""
    tensor_parallel_size: Annotated[int, Range(1, 1024)] = 1
    """``vllm``: GPUs one model is split over (vLLM's tensor parallelism; docs/gpu.md)."""
    gpu_memory_utilization: float = 0.5
    """``vllm`` on a GPU: the share of its memory vLLM may take (weights and KV cache)."""
    kv_cache_gib: Annotated[int, Range(1, 1024)] = 1
    """``vllm`` on a CPU: GiB of KV cache (``VLLM_CPU_KVCACHE_SPACE``, when not set already)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """``openai``: the server's API root (``/completions`` is appended)."""
    served_model: str | None = None
    """``openai``: the model name the server serves; ``None``: the server's first model."""
    api_key_env: str = "OPENAI_API_KEY"
    """``openai``: the environment variable that holds the API key (unset: no key is sent)."""
    timeout: float = 60.0
    """``openai``: seconds one request may take."""
    retries: Annotated[int, Range(0, 100)] = 3
    """``openai``: tries after a failed request (a refused connection, a 5xx, a timeout),
    waiting 1, 2, 4 ... seconds between them."""
    concurrency: Annotated[int, Range(1, 1024)] = 32
    """``openai`` with ``keep_rows: false``: requests in flight at once (one per row); with
    ``keep_rows`` every running row holds its own stream (32 for the default)."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.gpu_memory_utilization <= 1:
            problems.append(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.timeout <= 0:
            problems.append(f"timeout must be > 0, got {self.timeout}")
        if not self.base_url.startswith(("http://", "https://")):
            problems.append(f"base_url must start with http:// or https://, got {self.base_url!r}")
        check(self, problems)
