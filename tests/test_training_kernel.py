"""The kernel objective: its numerics, its features (the direction mark's own), units and
their masks, a toy case where training must raise retention, and the low-rank adapters."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ksemstamp.assets import encoder_fingerprint
from ksemstamp.scheme.adapter import (
    adapter_id,
    adapter_payload,
    add_adapters,
    base_fingerprint,
    load_adapter,
    merge_adapters,
)
from ksemstamp.scheme.centroids import CentroidFile, CentroidMismatchError
from ksemstamp.scheme.core import soft_context_weights
from ksemstamp.training.loss import kernel_alignment_loss, scored_features, unit_sums
from ksemstamp.training.units import Batch, read_units


def test_retention_and_correlation_terms_match_their_formula():
    anchor = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positive = torch.tensor([[math.cos(0.3), math.sin(0.3)], [0.0, 2.0]])  # any scale
    others = torch.tensor([[1.0, 1.0]])
    ok = torch.ones(2, 2, dtype=torch.bool)
    loss = kernel_alignment_loss(
        anchor, positive, others, ok, torch.ones(2, 1, dtype=torch.bool), 2.0
    )
    retention = (1 - math.cos(0.3)) / 2  # the second pair is retained whole
    # Cross pairs: anchor 0 with positive 1 (0), anchor 1 with positive 0 (sin 0.3), each anchor
    # with the column (1/2 each squared); one column, no pair among columns.
    cross = [0.0, math.sin(0.3) ** 2, 0.5, 0.5]
    assert float(loss) == pytest.approx(retention + 2.0 * sum(cross) / 4)
    # A column that is part of the anchor, or a positive sharing its source, is no negative.
    none_ok = torch.zeros(2, 2, dtype=torch.bool)
    alone = kernel_alignment_loss(
        anchor, positive, others, none_ok, torch.zeros(2, 1, dtype=torch.bool)
    )
    assert float(alone) == pytest.approx(retention)


def test_coherence_adds_the_signed_mean_correlation_within_a_text():
    anchor = torch.tensor([[1.0, 0.0]])
    positive = torch.tensor([[1.0, 0.0]])
    # Columns 0 and 1 are one text (cos 0.6), column 2 another (cos -0.8 with column 0).
    others = torch.tensor([[1.0, 0.0], [0.6, 0.8], [-0.8, 0.6]])
    ok = torch.ones(1, 1, dtype=torch.bool)
    others_ok = torch.zeros(1, 3, dtype=torch.bool)
    same = torch.tensor([[False, True, False], [True, False, False], [False, False, False]])
    plain = kernel_alignment_loss(anchor, positive, others, ok, others_ok, 1.0)
    with_term = kernel_alignment_loss(
        anchor, positive, others, ok, others_ok, 1.0, same_text=same, coherence=3.0
    )
    # Signed: only the pair of one text counts, and its cosine enters as it is (not squared).
    assert float(with_term - plain) == pytest.approx(3.0 * 0.6)
    same_neg = torch.zeros(3, 3, dtype=torch.bool)
    same_neg[0, 2] = same_neg[2, 0] = True
    assert float(
        kernel_alignment_loss(
            anchor, positive, others, ok, others_ok, 1.0, same_text=same_neg, coherence=3.0
        )
        - plain
    ) == pytest.approx(3.0 * -0.8)
    # The term sees only the first columns it is given (this rank's, under DDP).
    head_only = kernel_alignment_loss(
        anchor, positive, others, ok, others_ok, 1.0, same_text=same[:2, :2], coherence=3.0
    )
    assert float(head_only) == pytest.approx(float(with_term))


def test_scored_features_are_what_the_direction_mark_scores():
    torch.manual_seed(0)
    emb = F.normalize(torch.randn(5, 12), dim=-1)
    centroids = F.normalize(torch.randn(4, 12), dim=-1)
    mean = F.normalize(torch.randn(12), dim=-1) * 0.3
    components = torch.linalg.qr(torch.randn(12, 3)).Q.T.contiguous()
    phi = scored_features(emb, mean, components, centroids, 0.1).reshape(5, 4, 12)
    u = emb - mean
    u = F.normalize(u - (u @ components.T) @ components, dim=-1)
    a = soft_context_weights(emb, centroids, 0.1).float()
    assert torch.allclose(phi, a[:, :, None] * u[:, None, :], atol=1e-6)
    # Under a key's directions N (K, D) a sentence's score is <N, phi>, the scheme's score.
    directions = torch.randn(4, 12)
    assert torch.allclose(
        phi.flatten(1) @ directions.flatten(), ((a @ directions) * u).sum(-1), atol=1e-5
    )
    # One context: the processed vector itself.
    assert torch.allclose(scored_features(emb, mean, components, None, 0.0), u, atol=1e-6)


def test_units_of_a_sentence_merge_and_rewrite_and_their_masks(tmp_path):
    windows = [
        {
            "id": "w1",
            "sentences": ["A one.", "A two."],
            "units": [
                {"a": ["A one."], "b": ["One, A."]},
                {"a": ["A one.", "A two."], "b": ["A one and two."]},
            ],
        },
        {"id": "w2", "sentences": ["B one."], "units": [{"a": ["B one."], "b": ["One B."]}]},
    ]
    path = tmp_path / "units.jsonl"
    path.write_text("\n".join(json.dumps(w) for w in windows) + "\n")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"text": "C one.", "paraphrase": "One C."}) + "\n")
    assert read_units(path) == windows
    assert read_units(pairs)[0]["units"] == [{"a": ["C one."], "b": ["One C."]}]
    batch = Batch.of(windows)
    assert batch.num_units == 3 and len(batch.sentences) == len(set(batch.sentences)) == 6
    # Units 0 and 1 share "A one.": neither's positive is a negative of the other.
    assert batch.positive_ok.tolist() == [
        [False, False, True],
        [False, False, True],
        [True, True, False],
    ]
    # Sentence columns: "A one.", "A two." (w1), "B one." (w2).
    assert batch.others_ok.tolist() == [
        [False, True, True],
        [False, False, True],
        [True, True, False],
    ]
    assert batch.same_text.tolist() == [
        [False, True, False],
        [True, False, False],
        [False, False, False],
    ]
    with pytest.raises(ValueError, match="neither"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"x": 1}\n')
        read_units(bad)


def test_units_read_as_clauses_sum_their_clauses_and_meet_their_own_sentence():
    from ksemstamp.text.splitter import clauses

    windows = [
        {
            "id": "w1",
            "sentences": ["The mayor spoke on Monday, and the council voted later.", "It passed."],
            "units": [
                {
                    "a": ["The mayor spoke on Monday, and the council voted later."],
                    "b": ["On Monday the mayor spoke; later, the council held its vote."],
                },
                {"a": ["It passed."], "b": ["The vote carried."]},
            ],
        }
    ]
    batch = Batch.of(windows, lambda s: clauses(s, 4))
    rows = [batch.sentences[i] for i in batch.anchor_rows]
    assert rows == ["The mayor spoke on Monday,", "and the council voted later.", "It passed."]
    assert batch.anchor_owner.tolist() == [0, 0, 1]
    assert [batch.sentences[i] for i in batch.positive_rows] == [
        "On Monday the mayor spoke;",
        "later, the council held its vote.",  # "later" alone is too short to end a clause
        "The vote carried.",
    ]
    assert batch.positive_owner.tolist() == [0, 0, 1]
    # Clause columns: both clauses of the first sentence, then the second sentence. The first
    # unit's anchor holds the first two, so only the third is its negative; the second unit
    # meets both clauses of the other sentence.
    assert [batch.sentences[i] for i in batch.column_rows] == rows
    assert batch.others_ok.tolist() == [[False, False, True], [True, True, False]]
    assert batch.positive_ok.tolist() == [[False, True], [True, False]]
    # All three clauses are one text: every pair of different columns is one.
    assert batch.same_text.tolist() == [
        [False, True, True],
        [True, False, True],
        [True, True, False],
    ]
    # Without a split the same windows read whole sentences, as before.
    assert len(Batch.of(windows).anchor_rows) == 2


def test_training_on_the_objective_raises_retention_in_a_toy_world():
    # Sentences are content (dims 0-7) plus style (dims 8-15); a paraphrase keeps the content
    # and draws a new style. A linear encoder starting at the identity retains about half of a
    # sentence's evidence; trained on the objective it must learn to ignore the style.
    g = torch.Generator().manual_seed(0)

    def sample(n):
        content = torch.randn(n, 8, generator=g)
        return torch.cat([content, torch.randn(n, 8, generator=g)], 1), torch.cat(
            [content, torch.randn(n, 8, generator=g)], 1
        )

    encoder = nn.Linear(16, 16, bias=False)
    nn.init.eye_(encoder.weight)
    mean = torch.zeros(16)

    @torch.no_grad()
    def retention(x, y):
        fx = scored_features(encoder(x), mean, None, None, 0.0)
        fy = scored_features(encoder(y), mean, None, None, 0.0)
        return float(F.cosine_similarity(fx, fy).mean())

    held_x, held_y = sample(400)
    before = retention(held_x, held_y)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=0.05)
    for _ in range(150):
        x, y = sample(32)
        fx = scored_features(encoder(x), mean, None, None, 0.0)
        fy = scored_features(encoder(y), mean, None, None, 0.0)
        ok = ~torch.eye(32, dtype=torch.bool)
        loss = kernel_alignment_loss(fx, fy, fx[:0], ok, torch.zeros(32, 0, dtype=torch.bool))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = retention(held_x, held_y)
    assert before < 0.6 and after > 0.9
    # Different sentences stay apart (the correlation term keeps the encoder from collapsing).
    with torch.no_grad():
        fx = scored_features(encoder(held_x), mean, None, None, 0.0)
    cross = (fx @ fx.T)[~torch.eye(400, dtype=torch.bool)]
    assert float(cross.abs().mean()) < 0.35


def test_kernel_features_read_a_file_and_refit_on_new_embeddings():
    from ksemstamp.scheme.centroids import principal_components
    from ksemstamp.training.kernel import KernelFeatures

    g = torch.Generator().manual_seed(0)
    emb = F.normalize(torch.randn(200, 12, generator=g), dim=-1)
    centroids = F.normalize(torch.randn(5, 12, generator=g), dim=-1)
    mean = emb.mean(0)
    components = principal_components(emb, mean, 3)
    features = KernelFeatures(mean, components, centroids, 0.1)
    x = emb[:7]
    assert torch.allclose(features(x), scored_features(x, mean, components, centroids, 0.1))
    assert features(x).shape == (7, 5 * 12)
    # Refitted on other embeddings, with fewer centroids than before: the features are those
    # of the new mean, components and centroids.
    moved = F.normalize(emb + 0.5 * torch.randn(200, 12, generator=g), dim=-1)
    new_centroids = F.normalize(torch.randn(3, 12, generator=g), dim=-1)
    features.refit(moved, new_centroids)
    new_mean = moved.mean(0)
    expected = scored_features(
        x, new_mean, principal_components(moved, new_mean, 3), new_centroids, 0.1
    )
    assert features(x).shape == (7, 3 * 12)
    assert torch.allclose(features(x), expected, atol=1e-5)
    # Buffers, not parameters, and not saved: a checkpoint reads them again.
    assert not list(features.parameters()) and not features.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"units": "words"}, "units must be one of"),
        ({"clause_words": 0}, "clause_words"),
        ({"refit_every": -1}, "refit_every"),
        ({"coherence": -1.0}, "coherence must be >= 0"),
        ({"decorrelation": -1.0}, "decorrelation"),
    ],
)
def test_kernel_options_that_cannot_train_are_refused(change, message):
    from ksemstamp.training.objectives import KernelObjective

    good = {"units": "clauses", "clause_words": 4, "refit_every": 10, "refit_sentences": 4000}
    config = KernelObjective(**good).config()
    assert config["class_path"].endswith("KernelObjective")
    assert config["init_args"] == {**good, "decorrelation": 1.0, "temperature": 0.1} | {
        "whiten": 64,
        "base_centroids": None,
        "coherence": 0.0,
        "gather_negatives": True,
    }
    with pytest.raises(ValueError, match=message):
        KernelObjective(**{**good, **change})


@pytest.mark.e2e
def test_the_module_refits_its_kernel_features_on_the_current_encoder():
    from ksemstamp.training.module import EncoderModule
    from ksemstamp.training.objectives import KernelObjective

    objective = KernelObjective(refit_every=5, refit_sentences=60)
    module = EncoderModule(objective=objective, num_regions=8, embed_batch_size=32)
    assert module.kernel_features.centroids.shape[0] == 64  # the shipped file's K
    with pytest.raises(ValueError, match=r"num_regions \(64\)"):
        EncoderModule(objective=KernelObjective(refit_every=1, refit_sentences=10))
    module.on_train_batch_start([], 0)  # a refit is due at step 0
    emb = module.embed_sharded(module.domain_sentence_list(60))
    assert module.kernel_features.centroids.shape == (8, emb.shape[1])
    assert torch.allclose(module.kernel_features.mean, emb.mean(0), atol=1e-5)
    windows = [
        {
            "id": "w",
            "sentences": ["The council met on Monday.", "Floods hit the north."],
            "units": [
                {"a": ["The council met on Monday."], "b": ["On Monday the council met."]},
                {"a": ["Floods hit the north."], "b": ["The north was flooded."]},
            ],
        }
    ]
    anchor, positive, others, *_ = objective._terms(module, windows)
    assert anchor.shape == (2, 8 * emb.shape[1]) and others.shape == (2, 8 * emb.shape[1])
    logged = {}
    module.log = lambda name, value, **kw: logged.update({name: (value, kw["batch_size"])})
    loss = module.training_step(windows, 0)
    retained, units = logged["train/retention"]
    assert units == 2 and torch.isfinite(loss) and 0 < float(retained) <= 1
    # A refit is due at step 0 (no trainer: the step stays 0), once however many batches
    # share the step under gradient accumulation.
    calls = []
    module.kernel_features.refit = lambda emb, centroids: calls.append(module.global_step)
    objective._refit_step = None
    for batch_idx in range(3):
        module.on_train_batch_start(windows, batch_idx)
    assert calls == [0]


def test_unit_sums_add_the_rows_of_each_unit():
    rows = torch.arange(8.0).reshape(4, 2)
    sums = unit_sums(rows, torch.tensor([0, 1, 1, 0]), 3)
    assert sums.tolist() == [[6.0, 8.0], [6.0, 8.0], [0.0, 0.0]]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(6, 6)
        self.value = nn.Linear(6, 6)
        self.other = nn.Linear(6, 6)  # not a target: stays as it is

    def forward(self, x):
        return self.other(torch.relu(self.query(x)) + self.value(x))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layer = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.layer:
            x = block(x)
        return x


def test_adapters_train_merge_ship_and_load():
    base = Toy()
    model = Toy()
    plain = encoder_fingerprint(base)
    names = add_adapters(model, rank=2, alpha=4.0)
    assert sorted(names) == [f"layer.{i}.{n}" for i in (0, 1) for n in ("query", "value")]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        f"layer.{i}.{n}.{w}" for i in (0, 1) for n in ("query", "value") for w in ("a", "b")
    ]
    x = torch.randn(3, 6)
    assert torch.allclose(model(x), base(x))  # B starts at zero: the base encoder exactly
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    trained = model(x)
    assert not torch.allclose(trained, base(x))
    assert base_fingerprint(model) == plain
    payload = adapter_payload(model, 2, 4.0)
    merge_adapters(model)
    assert torch.allclose(model(x), trained, atol=1e-6)
    # Shipped: the base encoder plus the payload gives the trained outputs.
    fresh = load_adapter(Toy(), payload)
    assert torch.allclose(fresh(x), trained, atol=1e-6)
    assert fresh.ksemstamp_adapter == adapter_id(payload)

    # A centroid file carrying the adapter adapts the base encoder it names, once.
    fitted = CentroidFile(torch.randn(2, 6), "toy", plain, adapter=payload)
    loaded = CentroidFile.from_payload(fitted.to_payload(), "test")
    given = Toy()
    adapted = loaded.adapted(given, copy=True)
    assert adapted is not given and encoder_fingerprint(given) == plain  # the caller's is kept
    assert torch.allclose(adapted(x), trained, atol=1e-6)
    assert loaded.adapted(adapted) is adapted  # never twice
    with pytest.raises(CentroidMismatchError):
        loaded.adapted(Block())
