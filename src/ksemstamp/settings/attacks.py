"""One attack of an evaluation (an entry of ``EvalSettings.attacks``), typed, and the one registry
of the kinds of attack (``ATTACK_KINDS``, ``register_attack``).

An entry names only what it sets (``{name: lm-bigram, paraphraser: lm, select: bigram}``); the
evaluation checks it against ``AttackSettings`` (an unknown field or a value out of bounds is
refused by name) and builds the attack its ``paraphraser`` names. A new kind of attack is one
module with a builder ``(settings, lm, encoder, splitter) -> attack`` and one
``register_attack`` call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from .checks import SEED, Range, check

PARAPHRASER = "gemma3-270m"
"""The strongest paraphraser offline (Gemma-3-270M base, few-shot); never the generator, whose
rewrites would lean towards its own (watermarked) choices."""


@dataclass(frozen=True)
class AttackKind:
    """A kind of attack: its builder (``"module:function"``, called with the attack's
    ``AttackSettings``, the loaded LM or ``None``, the similarity encoder and the splitter) and
    whether it needs an LM (``model``)."""

    builder: str
    uses_lm: bool = False


ATTACK_KINDS: dict[str, AttackKind] = {
    "lm": AttackKind("ksemstamp.evaluation.attacks:sentence_attack", uses_lm=True),
    "wordnet": AttackKind("ksemstamp.evaluation.attacks:sentence_attack"),
    "seq2seq": AttackKind("ksemstamp.evaluation.attacks:sentence_attack"),
    "lm-rewrite": AttackKind("ksemstamp.evaluation.rewrite:rewrite_attack", uses_lm=True),
}
"""The kinds of attack by the name ``paraphraser`` gives them: an LM's paraphrase sentence by
sentence (``lm``), WordNet substitution (``wordnet``), a seq2seq model's beams (``seq2seq``),
and the document-level rewrite of windows of sentences (``lm-rewrite``)."""


def load_attack_plugins() -> None:
    """Register the attacks installed packages offer (``settings.plugins``): an ``AttackKind``,
    or a builder (which then needs no LM)."""
    from .plugins import ATTACKS, register_plugins

    def add(point: Any) -> None:
        if point.name not in ATTACK_KINDS:
            found = point.load()
            kind = found if isinstance(found, AttackKind) else AttackKind(point.value)
            register_attack(point.name, kind)

    register_plugins(ATTACKS, add)


def register_attack(name: str, kind: AttackKind) -> None:
    """Make ``paraphraser: name`` build attacks with ``kind``."""
    if not name or not isinstance(name, str):
        raise ValueError(f"an attack needs a name, got {name!r}")
    ATTACK_KINDS[name] = kind


@dataclass(frozen=True)
class AttackSettings:
    """One attack: what it is, what it reads, how hard it tries. Fields left at ``None`` take
    the paraphraser's own default."""

    name: str
    """How results name the attack (unique; not ``none`` or ``human``)."""
    paraphraser: str = "lm"
    """The kind of attack (``ATTACK_KINDS``): ``lm``, ``wordnet``, ``seq2seq`` (sentence by
    sentence) or ``lm-rewrite`` (windows of sentences rewritten at once)."""
    source: str | None = None
    """Attack the texts the attack of this name (listed before) left: a paraphrase of a
    paraphrase."""
    passes: Annotated[int, Range(1, 100)] = 1
    """Sentence attacks: paraphrase the whole text this many times in one attack."""
    select: Literal["best", "bigram"] = "best"
    """Sentence attacks: keep the candidate most similar to the original (``best``) or, among
    those at least ``similarity_bound`` similar, the one sharing the fewest bigrams with it."""
    similarity_bound: float | None = None
    """The similarity a kept candidate needs (``None``: 0.8 for a sentence attack, 0.75 for
    the rewrite)."""
    model: str = PARAPHRASER
    """The paraphrasing LM (``lm``, ``lm-rewrite``) or seq2seq model: offline alias, folder or
    Hub id."""
    prompts: str | None = None
    """The LM's prompts (``paraphrase.PROMPTS``: ``few-shot``, ``reword``, ``chat``,
    ``rewrite``); ``None``: ``few-shot``, the rewrite ``rewrite``."""
    num_candidates: Annotated[int, Range(1, 256)] = 4
    """Candidates drawn per sentence (or window)."""
    temperature: float | None = None
    """The LM's sampling temperature."""
    top_p: float | None = None
    """The LM's nucleus share."""
    max_new_tokens: Annotated[int, Range(1, 4096)] | None = None
    """Most tokens of one candidate."""
    batch_size: Annotated[int, Range(1, 4096)] | None = None
    """Sentences per LM call."""
    seed: Annotated[int, SEED] | None = None
    """The attack's sampling seed."""
    window: tuple[int, int] = (2, 4)
    """The rewrite: the smallest and largest window, in sentences."""
    max_overlap: float = 0.8
    """The rewrite: the largest share of the original's word bigrams a kept rewrite may keep."""
    max_length_ratio: float = 1.5
    """The rewrite: the most words a kept rewrite may have, over its window's."""
    every_window: bool = False
    """The rewrite: a window no candidate qualifies for takes a complete new candidate anyway
    (``false``: it keeps its text)."""
    rate: float = 0.4
    """``wordnet``: the share of words replaced by a synonym."""
    num_beams: Annotated[int, Range(1, 256)] | None = None
    """``seq2seq``: beams searched (at least ``num_candidates``)."""
    prefix: str = ""
    """``seq2seq``: text put before each sentence (``paraphrase: `` for T5-style models)."""

    def __post_init__(self) -> None:
        if isinstance(self.window, list):
            object.__setattr__(self, "window", tuple(self.window))
        problems = []
        if self.paraphraser not in ATTACK_KINDS:
            load_attack_plugins()
        if self.paraphraser not in ATTACK_KINDS:
            problems.append(
                f"paraphraser must be one of {sorted(ATTACK_KINDS)}, got {self.paraphraser!r}"
            )
        if len(self.window) != 2 or not 1 <= self.window[0] <= self.window[1]:
            problems.append(f"window must be [low, high] with 1 <= low <= high, got {self.window}")
        for name in ("similarity_bound", "max_overlap"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                problems.append(f"{name} must be in [0, 1], got {value}")
        if not 0 <= self.rate <= 1:
            problems.append(f"rate must be in [0, 1], got {self.rate}")
        check(self, problems)

    @property
    def kind(self) -> AttackKind:
        """The registered kind this attack's ``paraphraser`` names."""
        return ATTACK_KINDS[self.paraphraser]

    def given(self, *names: str) -> dict[str, Any]:
        """Those of ``names`` that are set (not ``None``), as keyword arguments."""
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @classmethod
    def fields(cls) -> list[str]:
        """The names an attack entry may hold."""
        return [f.name for f in dataclasses.fields(cls)]
