"""Generation over many prompts with ``Trainer.predict``: one process per device under DDP.

Each rank generates its share of the prompts and appends every record to its own shard file as
soon as it exists (``ksemstamp.parallel``); ``merge_shards`` then folds the shards into the
stage file, in prompt order, keeping the first record of each id.

The generator is built inside each process, on that process's device, from a picklable
``GeneratorFactory`` (models are loaded per rank, never pickled across ``ddp_spawn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..parallel import Job, merge_shards, predict_to_shards, read_records, shard_paths
from ..settings.evaluation import KGWSettings
from ..settings.identity import identity_fields

__all__ = [
    "GeneratorFactory",
    "merge_shards",
    "predict_to_shards",
    "read_records",
    "shard_paths",
]


@dataclass
class GeneratorFactory:
    """Everything needed to build one algorithm's generators in a fresh process.

    ``algorithm`` is ``ksemstamp``/``semstamp`` (the project's watermarker with the settings of
    ``watermark_configs``), ``none`` (the same sentence-by-sentence sampler, unwatermarked) or
    ``kgw`` (transformers' KGW watermark over the settings' ``model.lm``). ``watermark_configs``
    holds one ``WatermarkSettings`` dict (``to_dict`` and the key) per evaluation key; a prompt
    record's ``key_index`` picks its own (default 0). The LM is loaded once and shared by every
    key. ``kgw``: ``KGWSettings`` fields.
    """

    algorithm: str
    watermark_configs: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    kgw: dict[str, Any] = field(default_factory=dict)

    def __call__(self, device: torch.device) -> Job:
        from ..assets import load_lm
        from ..builders import build_scheme, build_watermarker, load_scheme_encoder
        from ..settings.watermark import WatermarkSettings

        configs = [
            WatermarkSettings.from_dict(c).updated({"model": {"device": str(device)}})
            for c in self.watermark_configs
        ]
        model, tokenizer = load_lm(configs[0].model.lm, device, configs[0].model.lm_dtype)
        models: dict[str, torch.nn.Module] = {"lm": model}
        if self.algorithm != "kgw":  # one encoder for every key's scheme
            models["encoder"] = load_scheme_encoder(configs[0])
        built: dict[int, Any] = {}

        def generator(key_index: int):
            if key_index in built:
                return built[key_index]
            cfg = configs[key_index]
            if self.algorithm == "kgw":
                from .baselines import KGWGenerator

                built[key_index] = KGWGenerator(
                    model, tokenizer, KGWSettings(**self.kgw), cfg.sampling
                ).generate
            else:
                scheme = build_scheme(cfg, encoder=models["encoder"])
                models.setdefault("partition", scheme.partition)
                watermarker = build_watermarker(cfg, scheme, lm=(model, tokenizer))
                built[key_index] = _watermark_generate(watermarker, self.algorithm != "none")
            return built[key_index]

        generator(0)  # built now, so that its models are checked before the first batch

        def process(rows: list[dict]) -> list[dict]:
            out: dict[int, dict] = {}
            for key_index in sorted({row.get("key_index", 0) for row in rows}):
                group = [i for i, row in enumerate(rows) if row.get("key_index", 0) == key_index]
                records = generator(key_index)([rows[i]["prompt"] for i in group])
                out.update(zip(group, records, strict=True))
            return [
                {"id": row["id"], "algorithm": self.algorithm, **out[i]}
                for i, row in enumerate(rows)
            ]

        return Job(process, models)


def _watermark_generate(watermarker, watermark: bool):
    fingerprint = watermarker.scheme.key_fingerprint if watermark else None
    # As every generated record: what a detector must share with the generator.
    identity = identity_fields(watermarker.scheme.identity) if watermark else {}

    def generate(prompts: list[str]) -> list[dict]:
        results = watermarker.generate(prompts, watermark=watermark)
        return [{**r.to_record(), "key_fingerprint": fingerprint, **identity} for r in results]

    return generate
