"""Settings for generation and detection: ``WatermarkConfig`` and how a settings file is read.

``WatermarkConfig`` mirrors the YAML files under ``configs/`` field by field. Paper values are
the defaults where the paper gives one (gamma 0.25, margin 0.035 for k-SemStamp, 100 candidates
per sentence, temperature 0.7, repetition penalty 1.05, no top-k, ~200 new tokens). The builders
that turn settings into objects are in ``builders``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from .assets import DEFAULT_ENCODER, DEFAULT_LM

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root (relative settings paths are tried against it); not used to find data."""
PACKAGE_DATA = Path(__file__).resolve().parent / "data"
# Shipped inside the package, so a wheel install finds them; ``checkpoints/`` links to the files.
# K = 64 is the default for the exact test's power (docs/study); K = 8 is the paper's partition.
DEFAULT_CENTROIDS = {
    DEFAULT_ENCODER: PACKAGE_DATA / "centroids-all-minilm-l6-v2-k64.pt",
}
PAPER_CENTROIDS = PACKAGE_DATA / "centroids-all-minilm-l6-v2-k8.pt"

# The choices of the settings that take one of a few names: a field typed with one of these is
# checked once, by ``WatermarkConfig.__post_init__`` (and by the command line's parser).
LmDtype = Literal["auto", "fp32", "bf16", "int8"]
Partition = Literal["kmeans", "lsh"]
ValidMode = Literal["keyed", "paper"]
MarkName = Literal["direction", "region"]
Context = Literal["own", "previous"]
SamplerStrategy = Literal["batched", "sequential"]
Statistic = Literal["exact", "paper"]
Selection = Literal["text", "sentence"]


@dataclass
class WatermarkConfig:
    """Everything that defines a watermark and how text is generated and scored.

    The key is never written anywhere: ``to_dict`` leaves it out.
    """

    lm: str = DEFAULT_LM
    """Generator: offline alias, local folder, ``.gguf`` file or Hub id."""
    lm_dtype: LmDtype = "auto"
    """Generator weights: ``fp32``; ``bf16``; ``int8`` (dynamic int8 attention and output head,
    CPU only); or ``auto`` (default): ``bf16`` where the device computes bfloat16 natively (a
    CPU with AVX512-BF16/AMX, a CUDA GPU that supports it), else ``fp32``. On 24 held-out
    prompts bf16 read human news as fp32 does and its watermarked texts were detected as often
    within noise (``benchmarks/results/levers-quality.json``). ``int8`` is faster on a CPU
    without bf16 and kept the test's power, but raised the LM's perplexity on held-out human news
    by 10% (``levers-quality-int8.json``), so ``auto`` never picks it. The evaluation's figures
    were made in ``fp32``. Outputs differ between formats, so pin one to reproduce a text exactly."""
    threads: int | None = None
    """torch threads for generation and detection; ``None`` keeps torch's default (every core
    available to the process, unless ``OMP_NUM_THREADS`` says otherwise). Set 1 on a machine
    shared with other jobs, where threads waiting on busy cores slow every job down."""
    encoder: str = DEFAULT_ENCODER
    """Sentence encoder: offline alias, local folder or Hub id."""
    partition: Partition = "kmeans"
    """``kmeans`` (k-SemStamp) or ``lsh`` (SemStamp)."""
    centroids: str | None = None
    """Centroid file for ``kmeans``; ``None`` picks the shipped file of the default encoder."""
    checkpoint: str | None = None
    """A ``final.ckpt`` that ``train.py`` wrote: its fine-tuned encoder, centroids and mean are
    used instead of ``encoder`` and ``centroids`` (leave ``centroids`` unset). See
    ``ksemstamp.checkpoint``."""
    lsh_bits: int = 3
    """SemStamp hyperplanes ``d`` (``2**d`` regions; paper: 3)."""
    lsh_seed: int = 0
    """Seed of the SemStamp hyperplanes."""
    gamma: float = 0.25
    """Share of valid regions (paper: 0.25)."""
    margin: float = 0.035
    """Rejection margin (k-SemStamp paper: 0.035; SemStamp paper: 0.02)."""
    valid_mode: ValidMode = "keyed"
    """``keyed`` (HMAC of the secret key) or ``paper`` (public table seeded by ``q * 15485863``)."""
    mark: MarkName = "direction"
    """What the key asks of a sentence. ``direction``: its centred embedding should point along
    the key's direction for the previous sentence's region (score >= ``threshold``); the
    detector sums the scores into an exact z (docs/study). ``region`` (k-SemStamp, SemStamp):
    its region should be in the key's valid set for the previous sentence's region, with the
    margin; ``gamma``, ``margin``, ``novelty_patience`` and ``margin_patience`` apply to it."""
    context: Context = "own"
    """``direction`` mark: whose context gives a sentence its direction. ``own``: the sentence's
    own, so its score does not depend on the sentences around it and survives reordering,
    merging and mixing with human text; ``previous``: the sentence before it (the chained
    design, ``configs/ksemstamp-chained.yaml``), which the paper's region rule uses too. The
    ``region`` mark always uses ``previous``."""
    context_temperature: float = 0.1
    """``direction`` mark: ``0`` takes the context region's direction alone; ``tau > 0`` the sum
    of every region's direction weighted by a softmax of the context sentence's cosine
    similarity to the centroids over ``tau``, so that a paraphrase which moves that sentence
    across a border changes the direction a little instead of entirely (see ``scheme``). 0.1
    with ``context: own`` kept the most evidence over the design study's edits and paraphrases
    (``research/order``); 0.05 with ``previous``. Soft weights need centroids: with
    ``partition: lsh`` sentences are scored on the context's region (``0``)."""
    whiten: int = 64
    """``direction`` mark with centroids: project this many of the domain's top principal
    components (stored in the centroid file) out of what is scored. Sentences on one topic
    share those components, so without them a text's scores under one key move together; 64
    raised the clean z by 0.5 and cut the share of human texts above alpha over keys in the
    design study (``research/order``). ``0``: none."""
    scan: bool = True
    """``direction`` mark: detection also scans spans of consecutive sentences for the one that
    carries the mark (a watermarked passage inside human text) and tests whether some sentences
    anywhere carry it (the mixture statistic), each with its own exact p-value; ``p_value``
    combines them with the whole text's (``ksemstamp.detection.scan``)."""
    threshold: float | None = None
    """``direction`` mark: accept the first candidate scoring at least this; after
    ``max_candidates`` draws keep the best-scoring one. ``None``: always the best of
    ``max_candidates`` (the candidates of a sentence are then drawn in one batched round)."""
    key: str | None = None
    """Secret key; falls back to ``$KSEMSTAMP_KEY``, then to a public demo key (with a warning).
    Make one with ``python watermark.py keygen``."""
    allow_weak_key: bool = False
    """Accept a guessable key (a test key): one that zxcvbn estimates to take under 2^128
    guesses. Otherwise such a key is refused, as its fingerprint in every record lets anyone
    recover it by trying guesses. ``KSEMSTAMP_ALLOW_WEAK_KEY=1`` allows it too."""
    max_candidates: int = 32
    """Candidates per sentence before giving up on the rule: the ``region`` mark then keeps the
    last one drawn (paper: 100), the ``direction`` mark the best-scoring one (of those that
    pruning lets finish; a pruned candidate does not count against the budget)."""
    selection: Selection = "text"
    """``direction`` mark: which candidate a sentence keeps. ``text``: the one that raises the
    whole text's z most, its score less what it repeats of the sentences kept before it
    (``marks.direction.text_gains``); ``sentence``: the best-scoring one. Ranked by its own
    score, a candidate that restates an earlier high-scoring sentence wins often, and the
    sentences of a text then move together under the key: they count like far fewer
    independent ones and the text's z stays low."""
    prune_tokens: int | None = 8
    """``direction`` mark without a threshold: every this many tokens of a round, the candidates
    still running are scored on their text so far, and ``prune_keep`` and ``prune_margin`` stop
    the unpromising ones (see ``ksemstamp.generation.pruning``; docs/study). ``None``: every candidate
    finishes."""
    prune_keep: int = 12
    """Candidates that go on after the first pruning check (those already finished count)."""
    prune_margin: float | None = 0.3
    """At every pruning check, a running candidate whose partial score is below the best
    finished candidate's score minus this stops; ``None`` never stops one this way."""
    novelty_patience: int = 10
    """Candidates after which a valid but already-used region transition is accepted; 0 is the
    paper's rule. Repeated transitions add no evidence for the default (exact) test."""
    margin_patience: int | None = 20
    """Candidates after which a candidate in a valid region is accepted without the margin;
    ``None`` keeps the margin to ``max_candidates`` (the paper's rule)."""
    sentence_time_budget: float | None = None
    """Seconds after which the search for one sentence falls back as at ``max_candidates`` (the
    last candidate drawn is kept); checked between rounds, so a sentence can overrun it by one
    round. ``None``: no limit (the paper's rule). With a budget, the text depends on the
    machine's speed, not only on the seed."""
    candidate_batch: int = 32
    """Most candidate rows per document in one batched decode."""
    adaptive_batch: bool = True
    """Size each round from the expected acceptance of the current valid set."""
    sampler_strategy: SamplerStrategy = "batched"
    """``batched`` (many rows over one prefill) or ``sequential`` (one ``generate`` call per
    candidate, as the reference code; a baseline for benchmarks)."""
    max_new_tokens: int = 200
    """Stop a continuation once it has this many tokens (paper: ~200)."""
    max_sentence_tokens: int = 64
    """Cut a candidate sentence that runs longer than this."""
    temperature: float = 0.7
    repetition_penalty: float = 1.05
    top_k: int = 0
    """0 disables top-k (paper: no top-k)."""
    top_p: float = 1.0
    seed: int | None = None
    """Sampling seed. ``None``: every call samples afresh (two users asking the same prompt get
    different texts) and each record carries the seed it drew (``seed``); a number: the same
    prompt and settings always give the same text (set it to a record's ``seed`` to reproduce
    that record). The evaluation, the golden tests and the benchmarks set theirs."""
    statistic: Statistic = "exact"
    """Detection p-value: ``exact`` (key randomisation, calibrated) or ``paper`` (normal tail)."""
    alpha: float = 0.01
    """A text is called watermarked when its p-value is at most this."""
    prompt_batch: int = 4
    """Prompts generated together in one batch."""
    chat: bool = False
    """Prompts are instructions: each is wrapped in the LM's chat template and the answer is
    generated from its first sentence, which a keyed start value seeds (no region of the
    instruction). Detection of an answer takes no prompt; its first sentence only seeds."""
    max_prompt_tokens: int | None = 512
    """Most prompt tokens the LM sees; the left part of a longer prompt is dropped (the record
    says how much). Never more than the LM's context less ``max_new_tokens`` and one sentence.
    ``None``: the LM's context is the only bound. Memory grows with it: every candidate row
    holds the prompt's key/value cache."""
    max_text_chars: int = 200_000
    """Longest input, in characters: a text to detect (with its prompt) or a prompt to continue;
    a longer one gets an error record at once. About 40 s of detection on 2 CPU cores. The web
    page (``serve``) takes the same limit unless given ``--max-chars``."""
    device: str = "cpu"
    """Where the models of one process are built (``cpu``, ``cuda``, ``cuda:1``). Commands that
    spread work over devices (``--devices``) build each process's models on its own device."""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be one of {list(choices)}, not {getattr(self, name)!r}"
            for name, choices in _choices(type(self)).items()
            if getattr(self, name) not in choices
        ]
        if self.threads is not None and self.threads < 1:
            problems.append(f"threads must be >= 1 or null, got {self.threads}")
        if self.checkpoint is not None and self.centroids is not None:
            problems.append(
                "checkpoint holds the centroids: give either checkpoint or centroids, not both"
            )
        if not 0 < self.gamma < 1:
            problems.append(f"gamma must be in (0, 1), got {self.gamma}")
        if self.margin < 0:
            problems.append(f"margin must be >= 0, got {self.margin}")
        if self.lsh_bits < 1:
            problems.append(f"lsh_bits must be >= 1 (2**lsh_bits regions), got {self.lsh_bits}")
        if self.whiten < 0:
            problems.append(f"whiten must be >= 0, got {self.whiten}")
        if self.context_temperature < 0:
            problems.append(f"context_temperature must be >= 0, got {self.context_temperature}")
        elif self.mark == "direction":
            if self.valid_mode != "keyed":
                problems.append("mark 'direction' needs valid_mode 'keyed' (a secret key)")
            if self.statistic == "paper":
                problems.append(
                    "statistic 'paper' is defined for mark 'region' only; the direction mark's "
                    "exact statistic is 'exact'"
                )
        for name in (
            "max_candidates",
            "candidate_batch",
            "max_new_tokens",
            "prompt_batch",
            "max_text_chars",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            problems.append(f"max_prompt_tokens must be >= 1 or null, got {self.max_prompt_tokens}")
        if self.prune_tokens is not None and self.prune_tokens < 1:
            problems.append(f"prune_tokens must be >= 1 or null, got {self.prune_tokens}")
        if self.prune_keep < 1:
            problems.append(f"prune_keep must be >= 1, got {self.prune_keep}")
        if self.prune_margin is not None and self.prune_margin < 0:
            problems.append(f"prune_margin must be >= 0 or null, got {self.prune_margin}")
        if self.margin_patience is not None and self.margin_patience < 0:
            problems.append(f"margin_patience must be >= 0 or null, got {self.margin_patience}")
        if self.sentence_time_budget is not None and self.sentence_time_budget <= 0:
            problems.append(
                f"sentence_time_budget must be > 0 or null, got {self.sentence_time_budget}"
            )
        if self.novelty_patience < 0:
            problems.append(
                f"novelty_patience must be >= 0 (0 = paper), got {self.novelty_patience}"
            )
        if not 0 < self.alpha < 1:
            problems.append(f"alpha must be in (0, 1), got {self.alpha}")
        if problems:
            raise ValueError("invalid settings:\n  " + "\n  ".join(problems))

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> WatermarkConfig:
        """Read a YAML file (keys as the fields here), then apply ``overrides``."""
        return cls.from_dict({**load_settings_file(path), **overrides})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WatermarkConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown settings {unknown}; known: {sorted(names)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """All settings except the key."""
        out = dataclasses.asdict(self)
        out.pop("key")
        return out

    def __repr__(self) -> str:
        return f"WatermarkConfig({self.to_dict()})"

    def centroid_path(self) -> Path:
        if self.centroids:
            path = Path(self.centroids)
            # A shipped file named relative to the checkout (configs/ksemstamp-paper.yaml names
            # checkpoints/...-k8.pt) is found from any working directory, and in a wheel install.
            if not path.is_absolute() and not path.exists():
                for candidate in (REPO_ROOT / path, PACKAGE_DATA / path.name):
                    if candidate.exists():
                        return candidate
            return path
        if self.encoder in DEFAULT_CENTROIDS:
            return DEFAULT_CENTROIDS[self.encoder]
        raise ValueError(
            f"no default centroids for encoder {self.encoder!r}: fit them with "
            f"`python -m ksemstamp.centroids --encoder {self.encoder} --output FILE` "
            f"and pass `centroids: FILE`"
        )


def load_settings_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML settings file into a dict.

    A YAML syntax error is re-raised as a ``ValueError`` naming only the file and position:
    PyYAML's own message quotes the offending line, which may hold the secret key.
    """
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ValueError(f"{path}: YAML error{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    return data


def _choices(cls: type) -> dict[str, tuple[str, ...]]:
    """The fields of dataclass ``cls`` typed with a ``Literal``, and their choices."""
    hints = get_type_hints(cls)
    return {
        f.name: get_args(hints[f.name])
        for f in dataclasses.fields(cls)
        if get_origin(hints[f.name]) is Literal
    }
