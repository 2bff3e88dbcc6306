"""The evaluation run's stages: one ``Run`` over a run folder, each stage resumable.

Each stage (``prompts``, ``generate``, ``attack``, ``detect``, ``quality``) writes one JSONL file
per algorithm (and attack) in the run folder, one record per prompt id, appended and flushed as
it is made; a rerun skips the ids already there. A stage returns the records of this run's
prompts only. The folder's layout and how ``run_evaluation`` assembles the stages: ``run``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from ..io import ResumableWriter, write_jsonl_atomic
from ..plots import progress_bar
from ..settings.evaluation import EvalSettings, keep_fixed_settings
from .prompt_set import build_prompts

logger = logging.getLogger(__name__)


class Run:
    """One evaluation run in ``settings.output_dir``; each stage method is resumable."""

    def __init__(self, settings: EvalSettings, progress: bool = True) -> None:
        self.settings = settings
        self.progress = progress
        """Progress bars."""
        self.root = Path(settings.output_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        keep_fixed_settings(settings, self.root)
        self._lms: dict[str, tuple] = {}
        self._encoders: dict[str, Any] = {}
        self.key_index: dict[Any, int] = {}
        """Prompt id -> index of its evaluation key (set by ``prompts``)."""

    def _progress(self, **kwargs) -> Any:
        return progress_bar(disable=not self.progress, **kwargs)

    def lm(self, spec: str):
        from ..assets import load_lm

        if spec not in self._lms:
            self._lms[spec] = load_lm(spec, self.settings.device)
        return self._lms[spec]

    def encoder(self, spec: str):
        from ..assets import load_encoder

        if spec not in self._encoders:
            self._encoders[spec] = load_encoder(spec, self.settings.device)
        return self._encoders[spec]

    # -- prompts
    def prompts(self) -> list[dict]:
        from transformers import AutoTokenizer

        from ..assets import resolve_lm_path

        path = self.root / "prompts.jsonl"
        from .predict import read_records

        stored = read_records(path)
        if len(stored) >= self.settings.num_prompts:
            return self._assign_keys(stored[: self.settings.num_prompts])
        lm = self.settings.watermark_config(
            "ksemstamp" if "ksemstamp" in self.settings.algorithms else self.settings.algorithms[0]
        ).model.lm
        tokenizer = AutoTokenizer.from_pretrained(resolve_lm_path(lm))

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        def starts(text: str) -> list[int]:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            return [a for a, _ in enc["offset_mapping"]]

        rows = build_prompts(self.settings, count, starts)
        write_jsonl_atomic(path, rows)
        return self._assign_keys(rows)

    def _assign_keys(self, prompts: list[dict]) -> list[dict]:
        self.key_index = {p["id"]: i % self.settings.num_keys for i, p in enumerate(prompts)}
        return prompts

    # -- generation
    def generate(self, algorithm: str, prompts: list[dict]) -> dict[str, dict]:
        from .predict import GeneratorFactory, merge_shards, predict_to_shards, shard_paths

        folder = self.root / "generations"
        target = folder / f"{algorithm}.jsonl"
        order = [p["id"] for p in prompts]
        # Shards left by an interrupted run hold finished prompts: fold them in first.
        done = {r["id"] for r in merge_shards(shard_paths(folder, algorithm), target, order)}
        # Grouped by key (stable: input order within a key), so that a batch of prompts is
        # generated in one call under one key; the merge restores the input order.
        pending = sorted(
            (
                {"id": p["id"], "prompt": p["prompt"], "key_index": self.key_index.get(p["id"], 0)}
                for p in prompts
                if p["id"] not in done
            ),
            key=lambda row: row["key_index"],
        )
        if pending:
            logger.info("generate %s: %d prompts", algorithm, len(pending))
        configs = [
            self.settings.watermark_config(algorithm, k) for k in range(self.settings.num_keys)
        ]
        factory = GeneratorFactory(
            algorithm,
            [{**c.to_dict(), "key": c.key} for c in configs],
            dataclasses.asdict(self.settings.kgw),
        )
        # One predict call for every key: under `ddp` each call starts the other processes.
        predict_to_shards(
            factory,
            pending,
            folder,
            algorithm,
            devices=self.settings.devices,
            accelerator=self.settings.accelerator,
            strategy=self.settings.strategy,
            batch_size=self.settings.prompt_batch,
            progress=self.progress,
        )
        records = merge_shards(shard_paths(folder, algorithm), target, order)
        return {r["id"]: r for r in records if r["id"] in set(order)}

    # -- attacks
    def attack(
        self,
        algorithm: str,
        spec: dict,
        generations: dict[str, dict],
        source: dict[str, dict] | None = None,
    ) -> dict[str, dict]:
        """Attack the generations, or with ``source`` (the records of the attack that
        ``spec["source"]`` names) the texts that attack left: a paraphrase of a paraphrase,
        whose similarities are then measured against the original generation."""
        from ..settings.attacks import AttackSettings
        from ..text.splitter import get_splitter
        from .attacks import build_attack, embed_unit

        path = self.root / "attacks" / f"{algorithm}.{spec['name']}.jsonl"
        inputs = {i: g["text"] for i, g in generations.items() if g.get("status") == "ok"}
        if source is not None:
            inputs = {i: source[i]["text"] for i in inputs if i in source}
        with ResumableWriter(path) as out:
            pending = [i for i in inputs if not out.has_id(i)]
            if pending:
                attack_settings = AttackSettings(**spec)
                lm = self.lm(attack_settings.model) if attack_settings.kind.uses_lm else None
                encoder = self.encoder(self.settings.similarity_encoder)
                attack = build_attack(attack_settings, lm, encoder, get_splitter())
                bar = self._progress(total=len(pending), desc=f"attack {algorithm}/{spec['name']}")
                step = self.settings.attack_batch
                for start in range(0, len(pending), step):
                    chunk = pending[start : start + step]
                    results = attack([inputs[i] for i in chunk])
                    if source is not None:
                        originals = [generations[i]["text"] for i in chunk]
                        whole = embed_unit(encoder, originals + [r.text for r in results])
                        for n, (i, res) in enumerate(zip(chunk, results, strict=True)):
                            res.similarity = float(whole[n] @ whole[len(chunk) + n])
                            if hasattr(res, "sentence_similarity"):
                                res.sentence_similarity *= source[i]["sentence_similarity"]
                    for i, res in zip(chunk, results, strict=True):
                        out.write({"id": i, **dataclasses.asdict(res)})
                    bar.update(len(chunk))
                bar.close()
        from .predict import read_records

        return {r["id"]: r for r in read_records(path) if r["id"] in inputs}

    # -- detection
    def detect(
        self, algorithm: str, name: str, texts: dict[str, str], prompts: dict[str, str]
    ) -> dict[str, dict]:
        path = self.root / "detections" / f"{algorithm}.{name}.jsonl"
        with ResumableWriter(path) as out:
            pending = [i for i in texts if not out.has_id(i)]
            for key_index in range(self.settings.num_keys):
                group = [i for i in pending if self.key_index.get(i, 0) == key_index]
                if not group:
                    continue
                detect = self._detector(algorithm, key_index)
                for start in range(0, len(group), 64):
                    chunk = group[start : start + 64]
                    for i, res in zip(
                        chunk,
                        detect([texts[i] for i in chunk], [prompts[i] for i in chunk]),
                        strict=True,
                    ):
                        out.write({"id": i, "key_index": key_index, **res})
        from .predict import read_records

        return {r["id"]: r for r in read_records(path) if r["id"] in texts}

    def statistic_label(self, algorithm: str) -> str:
        """What an algorithm's p-value is, in words (its mark's own description)."""
        if algorithm == "kgw":
            from .report import KGW_STATISTIC

            return KGW_STATISTIC
        detector = self._sentence_detector(algorithm)
        described = detector.mark.describe(detector.scan)["statistic"]
        return described[detector.statistic]

    def _sentence_detector(self, algorithm: str, key_index: int = 0):
        """The ``Detector`` of a sentence-level algorithm under its ``key_index``-th key, on
        the evaluation's device (loaded once)."""
        from ..builders import build_detector, build_scheme

        cfg = self.settings.watermark_config(algorithm, key_index)
        key = (algorithm, "detector", key_index)
        cfg = dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, device=self.settings.device)
        )
        if key not in self._encoders:
            encoder = None if cfg.model.checkpoint else self.encoder(cfg.model.encoder)
            self._encoders[key] = build_detector(cfg, build_scheme(cfg, encoder))
        return self._encoders[key]

    def _detector(self, algorithm: str, key_index: int = 0):
        cfg = self.settings.watermark_config(algorithm, key_index)
        if algorithm == "kgw":
            from .baselines import KGWDetector

            model, tokenizer = self.lm(cfg.model.lm)
            kgw = KGWDetector(model.config, tokenizer, self.settings.kgw)
            return lambda texts, prompts: kgw.detect_batch(texts)
        detector = self._sentence_detector(algorithm, key_index)

        def run(texts: list[str], prompts: list[str]) -> list[dict]:
            return [
                {
                    k: v
                    for k, v in r.to_record().items()
                    if k in ("z_score", "p_value", "num_scored", "num_valid", "status")
                }
                for r in detector.detect_batch(texts, prompts)
            ]

        return run

    # -- quality
    def quality(self, name: str, texts: dict[str, str], prompts: dict[str, str]) -> dict[str, dict]:
        from .metrics import Oracle

        path = self.root / "quality" / f"{name}.jsonl"
        with ResumableWriter(path) as out:
            pending = [i for i in texts if not out.has_id(i)]
            if pending:
                oracle = Oracle(
                    *self.lm(self.settings.oracle), batch_size=self.settings.oracle_batch
                )
                bar = self._progress(total=len(pending), desc=f"oracle {name}")
                step = self.settings.oracle_batch
                for start in range(0, len(pending), step):
                    chunk = pending[start : start + step]
                    scores = oracle.score([prompts[i] for i in chunk], [texts[i] for i in chunk])
                    for i, s in zip(chunk, scores, strict=True):
                        out.write({"id": i, **dataclasses.asdict(s)})
                    bar.update(len(chunk))
                bar.close()
        from .predict import read_records

        return {r["id"]: r for r in read_records(path) if r["id"] in texts}
