"""What both Hugging Face engines (``batched``, ``sequential``) read of a causal LM and its
tokenizer, without changing either: end-of-sequence and pad ids, the context length, the
vocabulary's size; ``LMEngine``, what both engines
hold of it."""

from __future__ import annotations

from typing import Any


def load(lm: Any, model_settings: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)``: ``lm`` itself when it is a loaded pair, used as it is, else the
    LM it names (``None``: ``model_settings.lm``) loaded on ``model_settings.device`` in
    ``model_settings.lm_dtype``."""
    if lm is None or isinstance(lm, str):
        from ..assets import load_lm

        return load_lm(lm or model_settings.lm, model_settings.device, model_settings.lm_dtype)
    model, tokenizer = lm
    return model, tokenizer


def eos_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's end-of-sequence ids (one, several, or none)."""
    eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def pad_id(tokenizer: Any) -> int | None:
    """The id ``generate`` pads with: the tokenizer's pad token, else its first end-of-sequence
    id (the tokenizer is not given a pad token)."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    ids = eos_ids(tokenizer)
    return ids[0] if ids else None


def context_length(model: Any) -> int | None:
    """The LM's context length in tokens, when its config says it."""
    return config_context_length(getattr(model, "config", None))


def config_context_length(config: Any) -> int | None:
    """The context length in tokens a model config says, if any."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def vocab_size(model: Any) -> int:
    """Entries of the LM's next-token logits (also for a quantised head)."""
    return model.get_output_embeddings().out_features


class LMEngine:
    """The fields both Hugging Face engines hold: the model and tokenizer (only read), the
    splitter, the sampling settings and what they read of the LM once.

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer (only read).
        splitter: the sentence splitter shared with detection.
        config: the sampling settings (``None``: their defaults).
        suppress_eos: the LM never ends its text (a unit ends at the splitter's end, the text
            at ``max_new_tokens``).
    """

    steers_per_step = True
    """A steering bias is applied at every step, among that step's plausible entries
    (``decoding.steer_logits``)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        splitter: Any,
        config: Any = None,
        suppress_eos: bool = True,
    ) -> None:
        from ..settings.groups import SamplingSettings

        self.model = model
        self.tokenizer = tokenizer
        self.splitter = splitter
        self.config = config or SamplingSettings()
        self.suppress_eos = suppress_eos
        self.device = next(model.parameters()).device
        self.eos_ids = eos_ids(tokenizer)
        self.context_length = context_length(model)
        self.max_unit_tokens = self.config.max_sentence_tokens
        self.vocab_size = vocab_size(model)
        self.pieces: list[str] | None = None
        self.prepare()

    def prepare(self) -> None:
        """What an engine builds once over the fields above (its own caches and tables)."""

    @classmethod
    def from_settings(cls, settings: Any, splitter: Any, lm: Any = None):
        """The engine of ``settings`` (``WatermarkSettings``) over ``lm``: a loaded
        ``(model, tokenizer)``, used as it is, or a name (default: ``model.lm``)."""
        model, tokenizer = load(lm, settings.model)
        return cls(model, tokenizer, splitter, settings.sampling)
