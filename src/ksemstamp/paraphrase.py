"""The LM paraphraser shared by the training pairs, the evaluation attacks and the design study.

A small causal LM is shown a few example rewrites, then a sentence; each sentence gets
``num_candidates`` sampled replies and the first line of each reply is a candidate. Callers
filter the candidates (by similarity, by overlap): a 135M-parameter model often copies its
input or drifts.

The prompt styles (``PROMPTS``), as the jobs were built and their outputs recorded:

* ``FEW_SHOT`` (``few-shot``; the study, attacks with the generator): plain ``Original: ...
  Paraphrase: ...`` text, for base and instruct models alike. Its examples are the same for
  every sentence, and on a CPU running them through the LM for every row cost about three
  quarters of an attack: their key/value cache is computed once and copied to each batch's
  rows, and only the sentence part (left-padded after the shared examples) is new input.
* ``REWORD`` (``reword``; the evaluation's sentence attacks with Gemma-3-270M base): the same
  form with five examples that change more words; with the three of ``few-shot`` the base
  model copied its input more often.
* ``REWRITE`` (``rewrite``; the evaluation's document-level rewrite): ``Original: ...
  Rewrite: ...`` over passages of two to four sentences, whose examples merge, split and
  reorder sentences; the passage and its rewrite are each one line.
* ``CHAT`` (training pairs, ``ksemstamp.training.pairs``): the model's chat template with a
  system instruction and example turns; the reply is also stripped of quotes.

Generation stops once every row has ended its first line, the only part kept. Neither the
cache nor the stop changes the tokens a row samples before its first line break.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .generation.kvcache import cache_kwarg, output_cache

# Written for this project: short news-style pairs that change both wording and order.
_FEW_SHOT_EXAMPLES = (
    (
        "The mayor announced on Friday that the bridge will reopen next month.",
        "The bridge is set to reopen next month, the mayor said on Friday.",
    ),
    (
        "Shares of the carmaker fell after it reported weaker sales in Europe.",
        "After reporting slower European sales, the carmaker saw its stock drop.",
    ),
    (
        "Police are still searching for the driver who fled the scene.",
        "The driver who ran from the scene has not yet been found by police.",
    ),
)

# Written for this project: news-style rewordings that change most words and the order.
_REWORD_EXAMPLES = (
    *_FEW_SHOT_EXAMPLES,
    (
        "Officials said the new rules would take effect at the start of next year.",
        "According to officials, the regulations kick in when next year begins.",
    ),
    (
        "The team lost three of its last four games despite a strong start to the season.",
        "After opening the season well, the side has dropped three of its past four matches.",
    ),
)

# Written for this project: passages of two to four sentences rewritten as a whole, so that
# sentences merge (3 -> 1, 4 -> 2), split and change places (2 -> 3), every fact kept.
_REWRITE_EXAMPLES = (
    (
        "The city council voted on Tuesday to raise parking fees. The increase will take effect "
        "in March. Council members said the money would pay for road repairs.",
        "Parking will cost more from March after a Tuesday vote by the city council, whose "
        "members said the extra revenue is meant for fixing roads.",
    ),
    (
        "Heavy snow closed schools across the region on Monday, leaving thousands of homes "
        "without power. Crews worked through the night to clear the main roads.",
        "Road crews spent the night clearing the main routes. The storm had shut schools "
        "throughout the region on Monday. Thousands of households also lost electricity.",
    ),
    (
        "The company reported a loss of $2 billion for the quarter. Its chief executive blamed "
        "weak demand in Asia. Analysts had expected a smaller loss. The shares fell 6 percent "
        "in early trading.",
        "Weak Asian demand was behind a quarterly loss of $2 billion, the company's chief "
        "executive said, and the result was worse than analysts had forecast. Investors sent "
        "the stock down 6 percent soon after the market opened.",
    ),
)

_CHAT_SYSTEM = (
    "Paraphrase the user's sentence: keep its meaning, change the words and the word order. "
    "Reply with the paraphrase only."
)

# Written for this project; news-style, each rewording both words and order.
_CHAT_EXAMPLES = (
    (
        "The city council approved the new budget on Tuesday.",
        "On Tuesday, the new budget was passed by the city council.",
    ),
    (
        "Heavy rain caused flooding across the northern region.",
        "Floods hit the whole north of the region after strong rainfall.",
    ),
    (
        "The company said its profits rose sharply in the last quarter.",
        "According to the firm, its earnings climbed steeply over the past quarter.",
    ),
)


class Prompts(Protocol):
    """How sentences are put to the LM and how a reply is read."""

    def shared(self, tokenizer) -> str:
        """The text every prompt starts with (cached once when not empty)."""
        ...

    def query(self, sentence: str, tokenizer) -> str:
        """The rest of the prompt for ``sentence``."""
        ...

    def read(self, reply: str) -> str:
        """The candidate in a generated reply (empty when there is none)."""
        ...


def _first_line(reply: str) -> str:
    return reply.strip().split("\n")[0].strip()


class FewShotPrompts:
    """``Original: ... <label>: ...`` text prompts after shared examples.

    Args:
        examples: ``(original, rewrite)`` pairs, each on one line.
        label: the word that introduces a rewrite (``Paraphrase``, ``Rewrite``).
    """

    def __init__(
        self,
        examples: tuple[tuple[str, str], ...] = _FEW_SHOT_EXAMPLES,
        label: str = "Paraphrase",
    ) -> None:
        self.examples = examples
        self.label = label

    def shared(self, tokenizer=None) -> str:
        return "\n\n".join(f"Original: {a}\n{self.label}: {b}" for a, b in self.examples)

    def query(self, sentence: str, tokenizer=None) -> str:
        # It starts on a line break, a boundary BPE tokenizers do not merge across, so the two
        # parts tokenize apart as the whole prompt does (checked before the cache is used).
        return f"\n\nOriginal: {sentence.strip()}\n{self.label}:"

    def read(self, reply: str) -> str:
        return _first_line(reply)


class ChatPrompts:
    """The chat template: a system instruction, three example turns, then the sentence.

    The template is rendered whole for each sentence, so nothing is shared or cached.
    """

    def shared(self, tokenizer=None) -> str:
        return ""

    def query(self, sentence: str, tokenizer=None) -> str:
        messages = [{"role": "system", "content": _CHAT_SYSTEM}]
        for source, target in _CHAT_EXAMPLES:
            messages += [
                {"role": "user", "content": source},
                {"role": "assistant", "content": target},
            ]
        messages.append({"role": "user", "content": sentence})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def read(self, reply: str) -> str:
        return _first_line(reply).strip('"').strip()


FEW_SHOT = FewShotPrompts()
REWORD = FewShotPrompts(_REWORD_EXAMPLES)
REWRITE = FewShotPrompts(_REWRITE_EXAMPLES, label="Rewrite")
CHAT = ChatPrompts()
PROMPTS: dict[str, Prompts] = {
    "few-shot": FEW_SHOT,
    "reword": REWORD,
    "rewrite": REWRITE,
    "chat": CHAT,
}


class FirstLineDone(StoppingCriteria):
    """Stops a row once its generated text has a line break after some non-blank text: the
    candidate is the first non-blank line, so later tokens would be thrown away."""

    def __init__(self, tokenizer, prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(
            input_ids[:, self.prompt_width :], skip_special_tokens=True
        )
        return torch.tensor(
            ["\n" in t.lstrip() for t in texts], dtype=torch.bool, device=input_ids.device
        )


class LMParaphraser:
    """Sampled paraphrase candidates from a causal LM, ``num_candidates`` per sentence.

    Args:
        model: the LM (offline alias, folder or Hub id), unless ``lm`` is given.
        num_candidates: sampled replies per sentence; empty replies are dropped.
        temperature, top_p, max_new_tokens: sampling of each reply.
        batch_size: rows (sentence x candidate) per ``generate`` call; ``None``: all in one.
        seed: the torch seed set at the start of each call, so the same sentences give the
            same candidates on a rerun; ``None`` leaves torch's global stream as it is.
        lm: ``(model, tokenizer)`` already loaded.
        cache_shots: run the shared examples once (``False``: the full prompt for every row).
        prompts: a name of ``PROMPTS`` (see the module), or a ``Prompts``.
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        num_candidates: int = 4,
        temperature: float = 0.8,
        top_p: float = 0.95,
        max_new_tokens: int = 48,
        batch_size: int | None = 32,
        seed: int | None = 0,
        lm=None,
        cache_shots: bool = True,
        prompts: str | Prompts = "few-shot",
    ) -> None:
        from .assets import load_lm

        if isinstance(prompts, str):
            if prompts not in PROMPTS:
                raise ValueError(f"prompts must be one of {sorted(PROMPTS)}, not {prompts!r}")
            prompts = PROMPTS[prompts]
        self.model, self.tokenizer = lm or load_lm(model)
        self.num_candidates = num_candidates
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.seed = seed
        self.cache_shots = cache_shots
        self.prompts = prompts
        self._shots: tuple[torch.Tensor, object] | None = None

    def shots(self) -> str:
        """The text every prompt starts with (the few-shot examples; empty for chat)."""
        return self.prompts.shared(self.tokenizer)

    def query(self, sentence: str) -> str:
        """The part of a prompt after the shared examples."""
        return self.prompts.query(sentence, self.tokenizer)

    def prompt(self, sentence: str) -> str:
        return self.shots() + self.query(sentence)

    def _shots_cache(self) -> tuple[torch.Tensor, object]:
        """``(1, P)`` token ids of the examples and their key/value cache, computed once."""
        if self._shots is None:
            ids = self.tokenizer(self.shots(), return_tensors="pt")["input_ids"]
            ids = ids.to(self.model.device)
            out = self.model(input_ids=ids, use_cache=True)
            self._shots = (ids, output_cache(out))
        return self._shots

    def _inputs(self, queries: list[str]) -> dict:
        """Model inputs for one batch: full prompts, or the cached examples plus the queries."""
        device = self.model.device
        if self.cache_shots and self.shots():
            shot_ids, shot_cache = self._shots_cache()
            enc = self.tokenizer(
                queries, return_tensors="pt", padding=True, add_special_tokens=False
            )
            rows = len(queries)
            joint = [self.tokenizer(self.shots() + q)["input_ids"] for q in queries]
            split = [
                shot_ids[0].tolist() + [t for t, m in zip(ids, mask, strict=True) if m]
                for ids, mask in zip(
                    enc["input_ids"].tolist(), enc["attention_mask"].tolist(), strict=True
                )
            ]
            # Tokenizing the two parts apart must give the tokens of the whole prompt.
            if joint == split:
                cache = copy.deepcopy(shot_cache)
                cache.batch_repeat_interleave(rows)
                return {
                    "input_ids": torch.cat(
                        [shot_ids.expand(rows, -1), enc["input_ids"].to(device)], dim=1
                    ),
                    "attention_mask": torch.cat(
                        [
                            torch.ones(rows, shot_ids.shape[1], dtype=torch.long, device=device),
                            enc["attention_mask"].to(device),
                        ],
                        dim=1,
                    ),
                    cache_kwarg(self.model): cache,
                }
        enc = self.tokenizer([self.shots() + q for q in queries], return_tensors="pt", padding=True)
        return {k: v.to(device) for k, v in enc.items()}

    @torch.no_grad()
    def candidates(self, sentences: list[str]) -> list[list[str]]:
        """For each sentence, its non-empty candidates (at most ``num_candidates``)."""
        queries = [self.query(s) for s in sentences for _ in range(self.num_candidates)]
        replies: list[str] = []
        if self.seed is not None:
            torch.manual_seed(self.seed)
        step = self.batch_size or max(1, len(queries))
        for start in range(0, len(queries), step):
            inputs = self._inputs(queries[start : start + step])
            width = inputs["input_ids"].shape[1]
            out = self.model.generate(
                **inputs,
                do_sample=True,
                temperature=self.temperature,
                top_p=self.top_p,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                stopping_criteria=StoppingCriteriaList([FirstLineDone(self.tokenizer, width)]),
            )
            replies += self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        read = [self.prompts.read(r) for r in replies]
        n = self.num_candidates
        return [[c for c in read[i * n : (i + 1) * n] if c] for i in range(len(sentences))]
