"""Baselines of the comparison: KGW (token-level green lists) and SemStamp (LSH partition).

KGW runs through transformers' own implementation: a ``WatermarkingConfig`` passed to
``model.generate`` biases the green list while sampling, and ``transformers.WatermarkDetector``
scores a text's tokens. Nothing of KGW is re-implemented here.

SemStamp is this project's watermarker with ``partition: lsh`` (``configs/semstamp.yaml``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from ..settings.evaluation import KGWSettings
from ..settings.groups import SamplingSettings
from ..text.normalize import normalize_text


class KGWGenerator:
    """Samples continuations with a KGW watermark, with the same sampling settings as ours.

    ``sampling`` gives the temperature, repetition penalty, length and seed. Each prompt is
    generated on its own with a generator seeded by the seed and the prompt, so a text never
    depends on its batch or on a restart (as the project's watermarker); a ``None`` seed is
    drawn once, when the generator is made.
    """

    def __init__(
        self,
        model,
        tokenizer,
        settings: KGWSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> None:
        sampling = sampling or SamplingSettings()
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings or KGWSettings()
        self.max_new_tokens = sampling.max_new_tokens
        self.temperature = sampling.temperature
        self.repetition_penalty = sampling.repetition_penalty
        self.seed = secrets.randbits(63) if sampling.seed is None else sampling.seed

    def generate(self, prompts: Sequence[str]) -> list[dict]:
        """One record per prompt: ``text``, ``num_tokens`` and ``status``."""
        import torch  # here: importing KGW's generator loads no model library

        with torch.no_grad():
            return self._generate(prompts)

    def _generate(self, prompts: Sequence[str]) -> list[dict]:
        import torch

        out = []
        config = self.settings.watermarking_config()
        for prompt in prompts:
            digest = hashlib.sha256(f"kgw|{self.seed}|{prompt}".encode()).digest()
            torch.manual_seed(int.from_bytes(digest[:8], "little"))
            enc = self.tokenizer(prompt.strip(), return_tensors="pt")
            ids = self.model.generate(
                **enc,
                watermarking_config=config,
                do_sample=True,
                top_k=0,
                temperature=self.temperature,
                repetition_penalty=self.repetition_penalty,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            new = ids[0, enc["input_ids"].shape[1] :]
            text = self.tokenizer.decode(new, skip_special_tokens=True).strip()
            out.append({"text": text, "num_tokens": int(new.numel()), "status": "ok"})
        return out


class KGWDetector:
    """Scores texts with ``transformers.WatermarkDetector`` built from the generating config.

    The text is re-tokenized without special tokens (detection sees text, not the generator's
    ids), after the same Unicode normalisation the sentence-level detectors apply (invisible
    characters, compatibility forms, look-alike letters; line breaks are kept, as they are
    tokens of their own), so edits that re-type a text are compared like for like. A text too
    short to score gets ``z_score=None``.
    """

    def __init__(self, model_config, tokenizer, settings: KGWSettings | None = None) -> None:
        from transformers import WatermarkDetector

        self.tokenizer = tokenizer
        self.detector = WatermarkDetector(
            model_config=model_config,
            device="cpu",
            watermarking_config=(settings or KGWSettings()).watermarking_config(),
        )

    def detect_batch(self, texts: Sequence[str]) -> list[dict]:
        out = []
        for text in texts:
            text = normalize_text(text, lines=False).text
            ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            if ids.shape[1] < 2:
                out.append(
                    {"z_score": None, "p_value": None, "num_scored": 0, "status": "too_short"}
                )
                continue
            res = self.detector(ids, return_dict=True)
            out.append(
                {
                    "z_score": float(res.z_score[0]),
                    "p_value": float(res.p_value[0]),
                    "num_scored": int(res.num_tokens_scored[0]),
                    "status": "ok",
                }
            )
        return out
