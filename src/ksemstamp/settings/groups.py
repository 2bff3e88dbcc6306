"""The groups of ``WatermarkSettings``: each field documented once, with its default.

``model`` (generator, encoder, device), ``partition`` (the regions), ``mark`` (what the key asks
of a sentence: ``DirectionSettings``, the default, or ``RegionSettings``, the paper's, chosen by
``kind``, each with only its own fields), ``search`` (how a sentence's candidates are drawn and
pruned), ``sampling``, ``detection`` and ``limits``. Paper values are the defaults where the
paper gives one and this project has not measured better (docs/design.md, "What the studies
found")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from ..assets import DEFAULT_ENCODER, DEFAULT_LM
from .checks import SEED, Range, check

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
ValidMode = Literal["keyed", "paper"]
Context = Literal["own", "previous"]
Selection = Literal["text", "sentence"]
Strategy = Literal["batched", "sequential"]
Statistic = Literal["exact", "paper"]


@dataclass(frozen=True)
class ModelSettings:
    """The generator, the sentence encoder, and where they run."""

    lm: str = DEFAULT_LM
    """Generator: offline alias, local folder, ``.gguf`` file or Hub id (paper: OPT-1.3B). The
    builders also take a loaded model and tokenizer (``build_watermarker(lm=...)``)."""
    lm_dtype: LmDtype = "auto"
    """Generator weights: ``fp32``, ``bf16``, ``int8`` (dynamic int8 attention and output head,
    CPU only) or ``auto``: ``bf16`` where the device computes bfloat16 natively, else ``fp32``.
    bf16 read human news as fp32 does and was detected as often; ``int8`` kept the test's power
    but raised perplexity by 10%, so ``auto`` never picks it
    (``benchmarks/results/levers-quality*.json``). Outputs differ between formats: pin one to
    reproduce a text exactly (the evaluation's figures are ``fp32``)."""
    encoder: str = DEFAULT_ENCODER
    """Sentence encoder: offline alias, local folder or Hub id (paper: a fine-tuned
    all-mpnet-base-v1). The builders also take a loaded ``SentenceTransformer``."""
    encoder_dtype: EncoderDtype = "fp32"
    """The encoder's weights once loaded and checked against the centroids' fingerprint
    (which is of the weights as loaded, in fp32): ``fp16`` or ``bf16`` run it faster on a GPU;
    its embeddings are then rounded more, which moves a text's scores a little (docs/gpu.md
    says how far). The statistic itself is computed in float64 either way."""
    checkpoint: str | None = None
    """A ``final.ckpt`` that ``train.py`` wrote: its fine-tuned encoder, centroids, mean and
    principal components are used instead of ``encoder`` and ``partition.centroids`` (leave
    those unset). See ``ksemstamp.training.checkpoint``."""
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
    (``mark.whiten``), and the encoder's low-rank adapter when training made one."""
    lsh_bits: Annotated[int, Range(1, 12)] = 3
    """``lsh``: hyperplanes ``d`` (``2**d`` regions, at most 4,096; paper: 3)."""
    lsh_seed: Annotated[int, SEED] = 0
    """``lsh``: seed of the hyperplanes."""

    def __post_init__(self) -> None:
        check(self, [])


@dataclass(frozen=True)
class DirectionSettings:
    """``mark: {kind: direction}``, the default: the key draws a direction per region, and a
    sentence's score is its whitened embedding projected on the direction of its context's
    regions (``scheme``); generation keeps high scorers, detection sums the scores into an exact
    z (``detection.stats.direction_z``)."""

    kind: Literal["direction"] = field(default="direction", init=False)
    context: Context = "own"
    """Whose context gives a sentence its direction. ``own``: the sentence's own, so its score
    does not depend on the sentences around it and survives reordering, merging and mixing with
    human text; ``previous``: the sentence before it (the chained design,
    ``configs/ksemstamp-chained.yaml``)."""
    context_temperature: float = 0.1
    """``0``: the context region's direction alone; ``tau > 0``: every region's direction
    weighted by a softmax of the context's cosines to the centroids over ``tau``, so that a
    paraphrase across a border changes the direction a little, not entirely (``scheme``). 0.1
    with ``own`` kept the most evidence in the design study (docs/design.md, "Contexts: soft and own"); 0.05 with
    ``previous``. Under ``partition.kind: lsh`` (no centroids) it is ``0``."""
    whiten: Annotated[int, Range(0, 4096)] = 64
    """With centroids: this many of the domain's top principal components (stored in the
    centroid file) are projected out of what is scored. Sentences on one topic share those
    components, so without them a text's scores under one key move together; 64 raised the
    clean z by 0.5 and cut the share of human texts above alpha over keys in the design study
    (docs/design.md, "What the studies found"). ``0``: none."""
    threshold: float | None = None
    """Accept the first candidate scoring at least this; after ``search.max_candidates`` draws
    keep the best-scoring one. ``None``: always the best of ``search.max_candidates`` (a
    sentence's candidates are then drawn in one batched round, and ``search.prune_*`` apply)."""
    selection: Selection = "text"
    """Which candidate a sentence keeps. ``text``: the one that raises the whole text's z most,
    its score less what it repeats of the sentences kept before it
    (``marks.direction.text_gains``); ``sentence``: the best-scoring one. Ranked by its own
    score, a candidate that restates an earlier high-scoring sentence wins often, and the
    sentences of a text then move together under the key: they count like far fewer
    independent ones and the text's z stays low."""
    scan: bool = True
    """Detection also scans spans of consecutive sentences for the one that carries the mark (a
    watermarked passage inside human text), tests for marked sentences anywhere (the mixture
    statistic) and counts sentences that move together about once (the weighted z), each with
    an exact p-value; ``p_value`` combines them with the whole text's (``detection.scan``)."""

    units: Literal["sentences", "clauses"] = "clauses"
    """What generation draws and detection scores: ``clauses`` (cut after , ; : once ``clause_words``
    words precede: more evidence after a paraphrase, a third more decoding) or ``sentences``."""
    clause_words: Annotated[int, Range(1, 100)] = 4
    """``clauses``: the fewest words a clause holds before a comma, semicolon or colon may end
    it (a shorter piece runs on into the next); a sentence's last clause may be shorter."""

    def __post_init__(self) -> None:
        problems = []
        if self.context_temperature < 0:
            problems.append(f"context_temperature must be >= 0, got {self.context_temperature}")
        check(self, problems)


@dataclass(frozen=True)
class RegionSettings:
    """``mark: {kind: region}``: k-SemStamp's (and SemStamp's) rule. A sentence is valid when
    its region is in the valid set the key draws for the previous sentence's region and it lies
    at least ``margin`` from its region's border (``marks.region``)."""

    kind: Literal["region"] = field(default="region", init=False)
    gamma: float = 0.25
    """Share of valid regions per previous region (paper: 0.25)."""
    margin: float = 0.035
    """Rejection margin (k-SemStamp paper: 0.035; SemStamp paper: 0.02)."""
    valid_mode: ValidMode = "keyed"
    """``keyed`` (HMAC of the secret key) or ``paper`` (the reference code's public table,
    seeded by ``q * 15485863``)."""
    novelty_patience: Annotated[int, Range(0, 10_000)] = 10
    """Candidates after which a valid but already-used region transition is accepted; 0 is the
    paper's rule. A repeated transition adds no evidence for the exact test."""
    margin_patience: Annotated[int, Range(0, 10_000)] | None = 20
    """Candidates after which a candidate in a valid region is accepted without the margin;
    ``None`` keeps the margin to ``search.max_candidates`` (the paper's rule)."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.gamma < 1:
            problems.append(f"gamma must be in (0, 1), got {self.gamma}")
        if self.margin < 0:
            problems.append(f"margin must be >= 0, got {self.margin}")
        check(self, problems)


MarkSettings = DirectionSettings | RegionSettings
MARK_KINDS: dict[str, type[DirectionSettings] | type[RegionSettings]] = {
    "direction": DirectionSettings,
    "region": RegionSettings,
}
"""The kinds of mark, by the name ``mark.kind`` gives them; the first is the default."""


@dataclass(frozen=True)
class SearchSettings:
    """How the candidates of a sentence are drawn, and pruned."""

    max_candidates: Annotated[int, Range(1, 10_000)] = 32
    """Candidates per sentence before giving up on the rule: the region mark then keeps the
    last one drawn (paper: 100), the direction mark the best-scoring one (of those that pruning
    lets finish; a pruned candidate does not count against the budget)."""
    candidate_batch: Annotated[int, Range(1, 4096)] = 32
    """Most candidate rows per document in one batched decode: 32 rows decode in about 2.9x
    one row's time on a CPU (``generation.rounds.ROW_COST``), and more rarely pay off."""
    adaptive_batch: bool = True
    """Size each round from the expected acceptance of the current valid set (region mark);
    ``false``: always ``candidate_batch`` rows."""
    strategy: Strategy = "batched"
    """``batched`` (many rows over one prefill) or ``sequential`` (one ``generate`` call per
    candidate, as the reference code; a baseline for benchmarks)."""
    prune_tokens: Annotated[int, Range(1, 4096)] | None = 8
    """Direction mark without a threshold: every this many tokens of a round, the candidates
    still running are scored on their text so far, and ``prune_keep`` and ``prune_margin`` stop
    the unpromising ones (``generation.pruning``; docs/studies/prune.md). ``None``: every candidate
    finishes."""
    prune_keep: Annotated[int, Range(1, 10_000)] = 12
    """Candidates that go on after the first pruning check (those already finished count)."""
    prune_margin: float | None = 0.3
    """At every pruning check, a running candidate whose partial score is below the best
    finished candidate's score minus this stops; ``None`` never stops one this way."""
    steer: float = 0.0
    """Direction mark: while candidates are sampled, every token's logit gains this many
    standard deviations of its meaning's projection on the key's direction for the context
    being written toward (the previous unit's, then, from the first pruning check, each row's
    own text so far: ``generation.steering``), so that candidates start nearer the key and
    selection needs fewer. ``0``: candidates are sampled as the LM alone would. Detection does
    not depend on it. Costs perplexity as it grows."""
    sentence_time_budget: float | None = None
    """Seconds after which the search for one sentence falls back as at ``max_candidates``,
    checked between rounds (a sentence can overrun it by one round). ``None``: no limit (the
    paper's rule). With a budget, the text depends on the machine's speed, not only the seed."""
    prompt_batch: Annotated[int, Range(1, 4096)] = 4
    """Prompts generated together in one batch."""

    def __post_init__(self) -> None:
        problems = []
        if self.steer < 0:
            problems.append(f"steer must be >= 0, got {self.steer}")
        if self.prune_margin is not None and self.prune_margin < 0:
            problems.append(f"prune_margin must be >= 0 or null, got {self.prune_margin}")
        if self.sentence_time_budget is not None and self.sentence_time_budget <= 0:
            problems.append(
                f"sentence_time_budget must be > 0 or null, got {self.sentence_time_budget}"
            )
        check(self, problems)


@dataclass(frozen=True)
class SamplingSettings:
    """How the LM samples a candidate sentence (paper: temperature 0.7, repetition penalty
    1.05, no top-k, about 200 new tokens)."""

    temperature: float = 0.7
    """Softmax temperature (paper: 0.7)."""
    repetition_penalty: float = 1.05
    """Penalty of the tokens the prompt and the row hold already (paper: 1.05)."""
    top_k: Annotated[int, Range(0, 1_000_000)] = 0
    """Keep only the ``top_k`` most likely tokens; 0 disables it (paper: no top-k)."""
    top_p: float = 1.0
    """Nucleus sampling's share of probability; 1 disables it."""
    max_new_tokens: Annotated[int, Range(1, 100_000)] = 200
    """Stop a continuation once it has this many tokens (paper: about 200) and ends a
    sentence: with clause units, the sentence the budget falls in is finished, by more clauses
    drawn while the text is fewer than ``max_sentence_tokens`` tokens over (so a text overruns
    by less than twice that, most often by one or two clauses), never starting a new one."""
    max_sentence_tokens: Annotated[int, Range(1, 4096)] = 64
    """A candidate with no sentence end within this many tokens is discarded."""
    seed: Annotated[int, SEED] | None = None
    """Sampling seed. ``None``: every call samples afresh (two users asking the same prompt get
    different texts) and each record carries the seed it drew (``seed``); a number: the same
    prompt and settings always give the same text (set it to a record's ``seed`` to reproduce
    that record). The evaluation, the golden tests and the benchmarks set theirs."""

    def __post_init__(self) -> None:
        problems = []
        if self.temperature <= 0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        check(self, problems)


@dataclass(frozen=True)
class DetectionSettings:
    """The p-value a text is decided by."""

    statistic: Statistic = "exact"
    """``exact`` (key randomisation, calibrated) or ``paper`` (the paper's z with a normal
    tail; region mark only)."""
    alpha: float = 0.01
    """A text is called watermarked when its p-value is at most this."""

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
