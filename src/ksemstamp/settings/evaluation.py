"""Settings of an evaluation run (``EvalSettings``): YAML files under ``configs/eval/`` mirror
its fields; ``ksemstamp evaluate`` takes them with ``--config`` and has a flag for each field
(``--num_prompts 50``, ``--algorithms ksemstamp,kgw``, ``--kgw.bias 2.0``). A run folder keeps
the settings that fix what its records mean in ``settings.json`` and refuses a run with others
(``keep_fixed_settings``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from ..io import write_json_atomic
from ..text.edits import EDITS
from .attacks import PARAPHRASER, AttackSettings
from .checks import SEED, Range, bound_problems, build_group, check
from .files import load_watermark_settings
from .groups import MARK_KINDS
from .watermark import WatermarkSettings

LABELS = {
    "ksemstamp": "k-SemStamp",
    "ksemstamp-paper": "k-SemStamp (paper)",
    "semstamp": "SemStamp",
    "kgw": "KGW",
    "none": "No watermark",
}
"""The report labels of the shipped algorithms (``EvalSettings.labels``' default); any other
name of ``watermark_configs`` is labelled as ``labels`` says, else by its name."""


@dataclass(frozen=True)
class KGWSettings:
    """KGW's parameters, as transformers' ``WatermarkingConfig`` names them (the paper's
    comparison: gamma 0.25, delta 2 and a one-token context)."""

    greenlist_ratio: float = 0.25
    """gamma: the share of the vocabulary on the green list."""
    bias: float = 2.0
    """delta: added to the logits of green tokens."""
    hashing_key: Annotated[int, SEED] = 15485863
    """The key of the green lists (public: KGW is the baseline)."""
    seeding_scheme: Literal["lefthash", "selfhash"] = "lefthash"
    """How the previous tokens seed the green list."""
    context_width: Annotated[int, Range(1, 64)] = 1
    """Previous tokens that seed the green list."""

    def __post_init__(self) -> None:
        check(self, [])

    def watermarking_config(self):
        from transformers import WatermarkingConfig

        return WatermarkingConfig(
            greenlist_ratio=self.greenlist_ratio,
            bias=self.bias,
            hashing_key=self.hashing_key,
            seeding_scheme=self.seeding_scheme,
            context_width=self.context_width,
        )


# Settings that change what the stored records mean: a run folder refuses a change to them.
FIXED_SETTINGS = (
    "prompt_words",
    "prompt_tokens",
    "min_human_sentences",
    "max_new_tokens",
    "watermark_configs",
    "watermark_overrides",
    "checkpoint",
    "num_keys",
    "kgw",
    "similarity_encoder",
    "oracle",
)


def _default_attacks() -> list[dict]:
    return [
        {
            "name": "lm-paraphrase",
            "paraphraser": "lm",
            "model": PARAPHRASER,
            "prompts": "reword",
            "num_candidates": 4,
            "select": "best",
        },
        {
            "name": "lm-bigram",
            "paraphraser": "lm",
            "model": PARAPHRASER,
            "prompts": "reword",
            "num_candidates": 8,
            "select": "bigram",
            "similarity_bound": 0.75,
        },
        {
            "name": "lm-rewrite",
            "paraphraser": "lm-rewrite",
            "model": PARAPHRASER,
            "num_candidates": 4,
            "window": [2, 4],
            "similarity_bound": 0.75,
            "max_overlap": 0.8,
        },
    ]


@dataclass(frozen=True)
class EvalSettings:
    """Settings of one evaluation run (mirrored by ``configs/eval/news.yaml``)."""

    entries: ClassVar[dict[str, type]] = {"attacks": AttackSettings}
    """The list settings whose entries are settings of their own (the help lists their fields)."""
    output_dir: str = "runs/eval-news"
    """Run folder (resumable)."""
    num_prompts: Annotated[int, Range(1, 1_000_000)] = 100
    """Held-out news prompts (paper: 1000 RealNews prompts)."""
    prompt_words: Annotated[int, Range(1, 10_000)] = 32
    """Prompt length in words, cut back to a sentence end (when ``prompt_tokens`` is unset)."""
    prompt_tokens: Annotated[int, Range(1, 100_000)] | None = None
    """Cut each prompt after this many generator tokens instead, mid-sentence as the paper's
    32-token prompts are: the generator completes the sentence first, and the human negative
    starts with the rest of that sentence. ``None``: whole sentences of ``prompt_words``."""
    min_human_sentences: Annotated[int, Range(0, 10_000)] = 3
    """Skip articles whose text after the prompt has fewer sentences than this."""
    max_new_tokens: Annotated[int, Range(1, 100_000)] = 200
    """Generation length, and the length human negatives are cut to (paper: ~200)."""
    algorithms: list[str] = field(
        default_factory=lambda: ["ksemstamp", "ksemstamp-paper", "semstamp", "kgw", "none"]
    )
    """Names of ``watermark_configs`` to run: ``kgw`` is KGW on the LM of its files, ``none``
    the sentence loop without a watermark, any other name the sentence-level watermark its
    files make."""
    watermark_configs: dict[str, list[str]] = field(
        default_factory=lambda: {
            "ksemstamp": ["configs/ksemstamp.yaml"],
            "ksemstamp-paper": ["configs/ksemstamp.yaml", "configs/ksemstamp-paper.yaml"],
            "semstamp": ["configs/ksemstamp.yaml", "configs/semstamp.yaml"],
            "kgw": ["configs/ksemstamp.yaml"],
            "none": ["configs/ksemstamp.yaml"],
        }
    )
    """Watermark settings files per algorithm (later files win)."""
    labels: dict[str, str] = field(default_factory=lambda: dict(LABELS))
    """How the report names each algorithm (an algorithm not here: by its name)."""
    watermark_overrides: dict[str, Any] = field(
        default_factory=lambda: {"detection": {"statistic": "exact"}}
    )
    """Watermark settings in the file's form applied on top of every algorithm's (e.g.
    ``search: {max_candidates: 20}``); fields of ``mark`` (without a ``kind``) reach the
    algorithms whose kind of mark has them. The default ``detection: {statistic: exact}``
    decides the paper's configuration too by its exact p-value (its z for the ROC stays the
    paper's); generation does not depend on it."""
    checkpoint: str | None = None
    """A ``final.ckpt`` that ``train.py`` wrote: the sentence-level algorithms (and ``none``)
    take its fine-tuned encoder, centroids and mean (``model.checkpoint``); KGW has no
    encoder."""
    num_keys: Annotated[int, Range(1, 10_000)] = 1
    """Watermark keys, taken by the prompts in turn: prompt ``i`` is generated and detected
    (with its human negative) under key ``i mod num_keys``, derived from the configured key
    (``key_for``). A design that works for one key and not another shows up in the averages
    instead of deciding them. ``1``: the configured key itself. KGW keeps its own seeding."""
    kgw: KGWSettings = field(default_factory=KGWSettings)
    """KGW's own settings (the paper's comparison: gamma 0.25, delta 2.0, a one-token context);
    its sampling is the watermark settings' (``sampling``)."""
    attacks: list[dict] = field(default_factory=_default_attacks)
    """Attacks by ``name``, each entry the fields of ``settings.attacks.AttackSettings`` it sets
    (listed below in ``--help``). Sentence by sentence: ``paraphraser`` (lm, wordnet,
    seq2seq), ``select`` (best, bigram) and the paraphraser's options (``model``,
    ``prompts``, ``num_candidates``, ...). The document-level rewrite: ``paraphraser:
    lm-rewrite``, with ``window``, ``similarity_bound``, ``max_overlap``,
    ``max_length_ratio`` and ``every_window`` (``evaluation.rewrite``). ``source: NAME``
    attacks the texts that the attack ``NAME`` (listed before) left, e.g. a second paraphrase
    pass; ``passes: 2`` does both passes in one attack. Defaults: the
    paraphrase and the bigram attack with Gemma-3-270M (``reword`` prompt) and the rewrite, as
    in ``configs/eval/news.yaml``."""
    edits: list[str] = field(default_factory=lambda: list(EDITS))
    """Edits without a language model applied to every watermarked text (``text.edits``:
    reorder, swap, merge, split, drop, crop, interleave-50, interleave-75, hard-wrap,
    homoglyphs, zero-width), each seeded by the prompt, the same for every algorithm; the
    interleavings take human sentences from the articles of the run's other prompts.
    Default: all of them; ``[]``: none."""
    similarity_encoder: str = "all-mpnet-base-v2"
    """Sentence encoder of the attacks' similarity filter and reported similarity (a stand-in
    for BERTScore): an encoder other than the watermark's (all-MiniLM-L6-v2), so the attacker
    does not pick its candidates with the detector's eyes."""
    oracle: str = "gemma3-270m"
    """Perplexity / Sem-Ent oracle LM (paper: OPT-2.7B)."""
    oracle_batch: Annotated[int, Range(1, 4096)] = 4
    """Texts per oracle pass."""
    sem_ent_k: Annotated[int, Range(1, 100_000)] = 50
    """k-means clusters for Sem-Ent (paper: 50); fewer when there are under 5 texts per
    cluster (``metrics.TEXTS_PER_CLUSTER``)."""
    devices: Annotated[int, Range(-1, 4096)] | str = 1
    """Devices generation spreads over, one process each (Lightning's ``devices``: a number,
    ``0,2``, ``auto`` or ``-1`` for all); each builds its models on its own device."""
    accelerator: str = "cpu"
    """Lightning accelerator of generation: cpu, gpu, auto."""
    device: str = "cpu"
    """Where this process runs the evaluation's own models: the attacks' paraphrasers and
    similarity encoder, the perplexity oracle and the detectors (``cuda``, ``cuda:1``);
    generation runs on the ``accelerator``'s devices."""
    strategy: str = "auto"
    """Lightning strategy, e.g. ddp, ddp_spawn."""
    prompt_batch: Annotated[int, Range(1, 4096)] = 4
    """Prompts generated together in one batch."""
    attack_batch: Annotated[int, Range(1, 4096)] = 8
    """Texts per attack call."""
    seed: Annotated[int, SEED] = 0
    """Sampling seed of every algorithm (it replaces the watermark files' ``seed``)."""

    def __post_init__(self) -> None:
        if isinstance(self.kgw, dict):
            object.__setattr__(self, "kgw", KGWSettings(**self.kgw))
        problems = bound_problems(self)
        missing = [a for a in self.algorithms if a not in self.watermark_configs]
        if missing:
            problems.append(
                f"unknown algorithms {missing}: watermark_configs has no entry for them "
                f"(it names {sorted(self.watermark_configs)})"
            )
        names = [a.get("name") if isinstance(a, dict) else None for a in self.attacks]
        if None in names or len(set(names)) != len(names) or "none" in names or "human" in names:
            problems.append("every attack needs a unique name other than 'none' and 'human'")
        unknown_edits = sorted(set(self.edits) - set(EDITS))
        if unknown_edits:
            problems.append(f"unknown edits {unknown_edits}; known: {list(EDITS)}")
        if len(set(self.edits)) != len(self.edits):
            problems.append(f"edits are named twice: {self.edits}")
        for i, spec in enumerate(self.attacks):
            if not isinstance(spec, dict):
                problems.append(f"attack {i + 1} must be a mapping of its settings, got {spec!r}")
                continue
            place = f"attacks.{spec.get('name', i + 1)}"
            problems += build_group(AttackSettings, spec, place, "an attack")[1]
            if "source" in spec and spec["source"] not in names[:i]:
                problems.append(
                    f"attack {spec.get('name')!r} attacks the output of {spec['source']!r}, "
                    "which must be an attack listed before it"
                )
        clash = sorted(set(names) & set(self.edits))
        if clash:
            problems.append(f"attacks and edits share the names {clash}")
        if self.devices == 0:
            problems.append("devices must be >= 1, -1 (all) or a string, got 0")
        if problems:
            raise ValueError("invalid evaluation settings:\n  " + "\n  ".join(problems))

    def select_attacks(self, names: Sequence[str]) -> EvalSettings:
        """The same settings with only the attacks named, in that order."""
        known = {a["name"]: a for a in self.attacks}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown attacks {unknown}; configured: {sorted(known)}")
        return dataclasses.replace(self, attacks=[known[n] for n in names])

    def watermark_config(self, algorithm: str, key_index: int = 0) -> WatermarkSettings:
        """The watermark settings of ``algorithm`` (its files, then the overrides, then this
        run's length, seed and checkpoint), with the ``key_index``-th evaluation key
        (``key_for``)."""
        fixed: dict[str, Any] = {
            "sampling": {"max_new_tokens": self.max_new_tokens, "seed": self.seed}
        }
        if self.checkpoint and algorithm != "kgw":
            fixed["model"] = {"checkpoint": self.checkpoint}
        settings = load_watermark_settings(self.watermark_configs[algorithm])
        overrides = dict(self.watermark_overrides)
        mark = overrides.get("mark")
        if isinstance(mark, dict) and "kind" not in mark:
            # The overrides reach algorithms of every kind of mark: each takes its own fields.
            own = {f.name for f in dataclasses.fields(settings.mark)}
            overrides["mark"] = {k: v for k, v in mark.items() if k in own}
        given = overrides.get("detection")
        if isinstance(given, dict):
            # ... and of the search and detection settings, those their mark reads.
            others = {n for cls in MARK_KINDS.values() for n in cls.options}
            others -= set(type(settings.mark).options)
            overrides["detection"] = {k: v for k, v in given.items() if k not in others}
        given = overrides.get("search")
        if isinstance(given, dict):
            mine = {f.name for f in dataclasses.fields(type(settings.mark).search)}
            theirs = {f.name for c in MARK_KINDS.values() for f in dataclasses.fields(c.search)}
            overrides["search"] = {k: v for k, v in given.items() if k in mine or k not in theirs}
        settings = settings.updated(overrides).updated(fixed)
        if self.num_keys > 1 and algorithm != "kgw":
            settings = dataclasses.replace(settings, key=key_for(settings.key, key_index))
        return settings


def keep_fixed_settings(settings: EvalSettings, root: Path) -> None:
    """Write the settings that fix what the records of run folder ``root`` mean
    (``FIXED_SETTINGS``, KGW's and the attacks) to its ``settings.json``, or raise ``ValueError``
    when the folder holds a run made with others.

    Attacks are kept by name: running a subset later is fine, redefining a name is not, and the
    file keeps every attack the folder has run."""
    fixed: dict[str, Any] = {k: getattr(settings, k) for k in FIXED_SETTINGS}
    fixed["kgw"] = dataclasses.asdict(settings.kgw)
    fixed["attacks"] = {a["name"]: a for a in settings.attacks}
    path = root / "settings.json"
    if path.exists():
        stored = json.loads(path.read_text())
        # KGW's settings as the run gave them, completed with their defaults.
        stored["kgw"] = dataclasses.asdict(KGWSettings(**(stored.get("kgw") or {})))
        changed = sorted(k for k in FIXED_SETTINGS if stored.get(k) != fixed[k])
        attacks = stored.get("attacks", {})
        # Compared as settings: an entry that spells out a default is the same attack.
        changed += sorted(
            f"attack {name}"
            for name, spec in fixed["attacks"].items()
            if name in attacks and AttackSettings(**attacks[name]) != AttackSettings(**spec)
        )
        if changed:
            raise ValueError(
                f"{root} holds a run with other settings ({', '.join(changed)}): "
                "use a new output_dir, or delete the folder to start over"
            )
        fixed["attacks"] = {**attacks, **fixed["attacks"]}
    write_json_atomic(path, fixed)


def key_for(key: str | None, index: int) -> str:
    """The ``index``-th evaluation key derived from ``key`` (``$KSEMSTAMP_KEY`` or the demo key
    when ``None``): distinct keys, none of them equal to ``key``, all rebuilt from it."""
    import hashlib

    from ..keys import resolve_key

    base = resolve_key(key)
    return hashlib.sha256(f"ksemstamp-eval-key|{index}|{base}".encode()).hexdigest()
