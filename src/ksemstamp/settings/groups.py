"""The groups of ``WatermarkSettings``: each field documented once, with its default.

``model`` (generator, encoder, device), ``partition`` (the regions), ``mark`` (what the key asks
of a sentence: ``DirectionSettings``, the default, or ``RegionSettings``, the paper's, chosen by
``kind``, each with only its own fields), ``search`` (how a sentence's candidates are drawn and
pruned), ``sampling``, ``detection`` and ``limits``. Paper values are the defaults where the
paper gives one and this project has not measured better (docs/design.md, "What the studies
found")."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Any, ClassVar, Literal

from ..assets import DEFAULT_ENCODER, DEFAULT_LM
from .checks import SEED, Range, check

TYPICAL_UNIT_Z = 1.5
"""The direction mark's typical z over the square root of a clean text's scored units, measured
(docs/design.md, "Constants measured once")."""
SCAN_TESTS = 4
"""Tests ``detection.scan`` combines into one p-value (whole text, span, mixture, weighted);
the combined p is at most this many times the smallest."""

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
    ``auto`` never picks ``int8``, which costs text quality (docs/design.md, "Constants measured
    once"). Outputs differ between formats: pin one to reproduce a text exactly (the
    evaluation's figures are ``fp32``)."""
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
    unit's score is its processed embedding projected on the direction of its context's
    regions (``marks.direction``); generation keeps high scorers, detection sums the scores into
    an exact z. These settings are what a detector must share with the generator; how hard
    generation tries is ``search``'s."""

    kind: Literal["direction"] = field(default="direction", init=False)
    mark: ClassVar[str] = "ksemstamp.marks.direction:DirectionMark"
    """The ``Mark`` class these settings make (``marks.build_mark``)."""
    keyed: ClassVar[bool] = True
    """The key draws the mark (its fingerprint names it in records)."""
    effort: ClassVar[tuple[str, ...]] = (
        "threshold",
        "selection",
        "prune_tokens",
        "prune_keep",
        "prune_margin",
        "steer",
    )
    """The ``search`` settings only this mark reads."""
    options: ClassVar[tuple[str, ...]] = ("scan",)
    """The ``detection`` settings only this mark reads."""
    statistics: ClassVar[tuple[str, ...]] = ("exact",)
    """The ``detection.statistic`` values its detector offers."""
    context: Context = "own"
    """Whose context gives a sentence its direction. ``own``: the sentence's own, so its score
    does not depend on the sentences around it and survives reordering, merging and mixing with
    human text; ``previous``: the sentence before it (the chained design,
    ``lab/configs/ksemstamp-chained.yaml``)."""
    context_temperature: float = 0.1
    """``0``: the context region's direction alone; ``tau > 0``: every region's direction
    weighted by a softmax of the context's cosines to the centroids over ``tau``, so that a
    paraphrase across a border changes the direction a little, not entirely (``scheme``; the
    default's measurement: docs/design.md, "Constants measured once"). Under
    ``partition.kind: lsh`` (no centroids) it is ``0``."""
    whiten: Annotated[int, Range(0, 4096)] = 64
    """With centroids: this many of the domain's top principal components (stored in the
    centroid file) are projected out of what is scored. Sentences on one topic share those
    components, so without them a text's scores under one key move together (the default's
    measurement: docs/design.md, "Constants measured once"). ``0``: none."""
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

    def partition_margin(self, search: SearchSettings) -> float:
        """The margin the partition reports (the direction mark reads none)."""
        return 0.0

    def domain_needs(self) -> dict[str, Any]:
        """What the mark needs of a centroid file: the domain's mean and ``whiten``
        principal components."""
        return {"mean": True, "components": self.whiten}

    def splitting(self) -> tuple[str, int]:
        """The units text is cut into, and the fewest words a clause holds (``units``,
        ``clause_words``)."""
        return self.units, self.clause_words

    @property
    def scores_first(self) -> bool:
        """A text's first unit is scored on its own context, with nothing before it."""
        return self.context == "own"

    def units_needed(self, detection: DetectionSettings) -> tuple[int, int]:
        """``(least, typical)`` scored units to reach ``detection.alpha``
        (``detection.detectable``): the scores are not bounded, so one unit can in principle
        reach any p; a clean text's z grows as about ``TYPICAL_UNIT_Z`` times the square root
        of its units, and with ``detection.scan`` the p-value combines ``SCAN_TESTS`` tests."""
        tests = SCAN_TESTS if detection.scan else 1
        z = NormalDist().inv_cdf(1 - detection.alpha / tests)
        return 1, max(1, math.ceil((z / TYPICAL_UNIT_Z) ** 2 - 1e-9))

    def without_centroids(self) -> DirectionSettings:
        """These settings on a partition without centroids (``lsh``): hard contexts."""
        return dataclasses.replace(self, context_temperature=0.0)

    def identity(self) -> dict[str, Any]:
        """What a detector must share with the generator, of these settings."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RegionSettings:
    """``mark: {kind: region}``: k-SemStamp's (and SemStamp's) rule. A sentence is valid when
    its region is in the valid set the key draws for the previous sentence's region and it lies
    at least ``margin`` from its region's border (``marks.region``)."""

    kind: Literal["region"] = field(default="region", init=False)
    mark: ClassVar[str] = "ksemstamp.marks.region:RegionMark"
    """The ``Mark`` class these settings make (``marks.build_mark``)."""
    effort: ClassVar[tuple[str, ...]] = ("margin", "novelty_patience", "margin_patience")
    """The ``search`` settings only this mark reads."""
    options: ClassVar[tuple[str, ...]] = ()
    """The ``detection`` settings only this mark reads."""
    statistics: ClassVar[tuple[str, ...]] = ("exact", "paper")
    """The ``detection.statistic`` values its detector offers."""
    gamma: float = 0.25
    """Share of valid regions per previous region (paper: 0.25)."""
    valid_mode: ValidMode = "keyed"
    """``keyed`` (HMAC of the secret key) or ``paper`` (the reference code's public table,
    seeded by ``q * 15485863``)."""

    @property
    def keyed(self) -> bool:
        """The key draws the table (``paper``: a public one, anyone can rebuild)."""
        return self.valid_mode == "keyed"

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.gamma < 1:
            problems.append(f"gamma must be in (0, 1), got {self.gamma}")
        check(self, problems)

    def partition_margin(self, search: SearchSettings) -> float:
        """The margin the partition reports: ``search.margin``."""
        return float(search.margin)

    def domain_needs(self) -> dict[str, Any]:
        """What the mark needs of a centroid file beyond its centroids: nothing."""
        return {}

    def splitting(self) -> tuple[str, int]:
        """The units text is cut into: sentences (the paper's)."""
        return "sentences", 4

    scores_first: ClassVar[bool] = False
    """A text's first unit only seeds: each is scored after the one before it."""

    def units_needed(self, detection: DetectionSettings) -> tuple[int, int]:
        """``(least, typical)`` scored units to reach ``detection.alpha``
        (``detection.detectable``): the exact test of ``n`` valid units, each after another
        region, gives ``p = gamma ** n``; the paper's z-test ``z = sqrt(n (1 - gamma) /
        gamma)``. Generated units are valid but for rare fallbacks: it needs the least."""
        alpha = detection.alpha
        if detection.statistic == "paper":
            z = NormalDist().inv_cdf(1 - alpha)
            least = math.ceil(z * z * self.gamma / (1 - self.gamma) - 1e-9)
        else:
            least = math.ceil(math.log(alpha) / math.log(self.gamma) - 1e-9)
        return max(1, least), max(1, least)

    def without_centroids(self) -> RegionSettings:
        """These settings on a partition without centroids: the same."""
        return self

    def identity(self) -> dict[str, Any]:
        """What a detector must share with the generator, of these settings."""
        return dataclasses.asdict(self)


MarkSettings = Any
"""A mark's settings: an instance of one of ``MARK_KINDS``' classes."""
MARK_KINDS: dict[str, type] = {
    "direction": DirectionSettings,
    "region": RegionSettings,
}
"""The kinds of mark, by the name ``mark.kind`` gives them; the first is the default. The one
registry of marks: each settings class names its ``Mark`` (``mark``), the ``search`` and
``detection`` settings only it reads (``effort``, ``options``), the statistics its detector
offers (``statistics``), whether the key draws it
(``keyed``), the margin its partition reports (``partition_margin``), what it needs of a
centroid file (``domain_needs``), the units it scores (``splitting``, ``scores_first``) and
how many a text needs (``units_needed``), its form on a
partition without centroids (``without_centroids``) and what a detector must share with its
generator (``identity``)."""


def register_mark(settings: type) -> type:
    """Add a kind of mark: a frozen settings dataclass with a ``kind`` field (its default the
    kind's name, ``init=False``) and the class attributes of ``MARK_KINDS``' classes. Returns
    the class (usable as a decorator)."""
    kind = dataclasses.fields(settings)[0].default if dataclasses.is_dataclass(settings) else None
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{settings.__name__} needs a kind field whose default names it")
    for name in (
        "mark",
        "effort",
        "options",
        "statistics",
        "keyed",
        "partition_margin",
        "identity",
    ):
        if not hasattr(settings, name):
            raise TypeError(f"{settings.__name__} has no {name!r}")
    MARK_KINDS[kind] = settings
    return settings


@dataclass(frozen=True)
class SearchSettings:
    """How the candidates of a sentence are drawn, and pruned."""

    max_candidates: Annotated[int, Range(1, 10_000)] = 32
    """Candidates per sentence before giving up on the rule: the region mark then keeps the
    last one drawn (paper: 100), the direction mark the best-scoring one (of those that pruning
    lets finish; a pruned candidate does not count against the budget)."""
    candidate_batch: Annotated[int, Range(1, 4096)] = 32
    """Most candidate rows per document in one batched decode (a round's cost per row:
    ``generation.rounds.ROW_COST``)."""
    adaptive_batch: bool = True
    """Size each round from the expected acceptance of the current valid set (region mark);
    ``false``: always ``candidate_batch`` rows."""
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
    threshold: float | None = None
    """Direction mark: accept the first candidate scoring at least this; after
    ``max_candidates`` draws keep the best-scoring one. ``None``: always the best of
    ``max_candidates`` (a unit's candidates are then drawn in one batched round, and
    ``prune_*`` apply)."""
    selection: Selection = "text"
    """Direction mark: which candidate a unit keeps. ``text``: the one that raises the whole
    text's z most, its score less what it repeats of the units kept before it
    (``marks.direction_stats.text_gains``); ``sentence``: the best-scoring one. Ranked by its
    own score, a candidate that restates an earlier high-scoring unit wins often, and the units
    of a text then move together under the key: they count like far fewer independent ones and
    the text's z stays low."""
    margin: float = 0.035
    """Region mark: a candidate is accepted only at least this far from its region's border
    (k-SemStamp paper: 0.035; SemStamp paper: 0.02). Detection applies no margin."""
    novelty_patience: Annotated[int, Range(0, 10_000)] = 10
    """Region mark: candidates after which a valid but already-used region transition is
    accepted; 0 is the paper's rule. A repeated transition adds no evidence for the exact
    test."""
    margin_patience: Annotated[int, Range(0, 10_000)] | None = 20
    """Region mark: candidates after which a candidate in a valid region is accepted without
    the margin; ``None`` keeps the margin to ``max_candidates`` (the paper's rule)."""
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
        if self.margin < 0:
            problems.append(f"margin must be >= 0, got {self.margin}")
        if self.steer < 0:
            problems.append(f"steer must be >= 0, got {self.steer}")
        if self.prune_margin is not None and self.prune_margin < 0:
            problems.append(f"prune_margin must be >= 0 or null, got {self.prune_margin}")
        if self.sentence_time_budget is not None and self.sentence_time_budget <= 0:
            problems.append(
                f"sentence_time_budget must be > 0 or null, got {self.sentence_time_budget}"
            )
        check(self, problems)


ENGINES: dict[str, Any] = {
    "batched": "ksemstamp.generation.batched:BatchedEngine",
    "sequential": "ksemstamp.generation.sequential:SequentialEngine",
}
"""The generation engines ``sampling.engine`` names: ``generation.engine.Engine`` classes (or
their ``"module:Class"`` paths) with a ``from_settings(settings, splitter, lm)`` constructor."""


def register_engine(name: str, engine: Any) -> None:
    """Make ``engine`` (an ``Engine`` class or its ``"module:Class"`` path) the one
    ``sampling.engine: name`` selects."""
    if not name or not isinstance(name, str):
        raise ValueError(f"an engine needs a name, got {name!r}")
    ENGINES[name] = engine


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
    engine: str = "batched"
    """What samples the candidates (``ENGINES``): ``batched`` (a Hugging Face causal LM, all
    rows of all documents decoded together over a shared prefix cache) or ``sequential`` (one
    ``generate`` call per candidate, as the reference code: a baseline for benchmarks)."""
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
