"""The robustness study's statistics (research/robust: weights.py, check.py, projection.py), on
tiny inputs."""

import numpy as np
import pytest
import torch

from research.robust import weights
from research.robust.common import EmbeddingCache
from research.robust.projection import whitened_basis


def _cov(rng: np.random.Generator, n: int = 6, d: int = 5) -> np.ndarray:
    u = rng.standard_normal((n, d)) + 1.5 * rng.standard_normal(d)  # a shared topic
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return u @ u.T


@pytest.mark.parametrize("lam", [None, 1.0, 0.1])
def test_weighted_z_is_standard_normal_over_keys(lam) -> None:
    rng = np.random.default_rng(0)
    cov = _cov(rng)
    w = weights.gls_weights(cov, lam)
    factor = np.linalg.cholesky(cov + 1e-12 * np.eye(len(cov)))
    z = np.array(
        [weights.weighted_z(factor @ rng.standard_normal(len(cov)), cov, w) for _ in range(4000)]
    )
    assert abs(z.mean()) < 0.06 and abs(z.std() - 1.0) < 0.05


def test_no_shrinkage_is_the_shipped_sum_and_gls_counts_correlated_sentences_once() -> None:
    cov = np.array([[1.0, 0.99, 0.0], [0.99, 1.0, 0.0], [0.0, 0.0, 1.0]])
    s = np.array([1.0, 1.0, 2.0])
    assert np.allclose(weights.gls_weights(cov, None), 1.0)
    assert weights.weighted_z(s, cov, np.ones(3)) == pytest.approx(4.0 / np.sqrt(cov.sum()))
    w = weights.gls_weights(cov, 1e-9)
    # the pair weighs 1 / (1 + 0.99) each: together about as much as the third sentence
    assert w[0] == pytest.approx(w[1]) and w[2] == pytest.approx(1.99 * w[0])
    by_sum, by_gls = weights.effective_sentences(cov)
    assert by_sum == pytest.approx(9 / cov.sum()) and by_gls == pytest.approx(2.0, rel=1e-2)


def test_check_compare_pairs_the_same_prompts(tmp_path, monkeypatch) -> None:
    import json

    from research.robust import check

    monkeypatch.setattr(check, "RUNS", tmp_path)
    for name, shift in (("a", 0.0), ("b", 1.0)):
        folder = tmp_path / f"check-{name}"
        folder.mkdir()
        rows = [
            {
                "id": f"t{i}",
                "variant": v,
                "z": 2.0 + i + (shift if v == "attacked" else 0.0) * i,
                "similarity": 0.7 + 0.1 * shift,
            }
            for i in range(3)
            for v in ("clean", "attacked")
        ]
        if name == "b":
            rows.append({"id": "t9", "variant": "attacked", "z": 50.0, "similarity": 0.5})
        (folder / "detections.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = check.compare("a", "b")
    assert out["clean"]["pairs"] == 3 and out["clean"]["mean_z_difference"] == 0.0
    assert out["attacked"]["pairs"] == 3  # t9 has no counterpart
    assert out["attacked"]["mean_z_difference"] == pytest.approx(1.0)
    assert out["attacked"]["second_higher"] == 2
    assert out["attacked"]["similarity"] == pytest.approx([0.7, 0.8])


def test_the_whitened_basis_keeps_what_varies_and_drops_what_a_paraphrase_moves() -> None:
    # axes 0 and 1 vary alike between sentences; a paraphrase moves axis 0 a lot, axis 1 little
    signal = torch.diag(torch.tensor([4.0, 4.0, 0.1], dtype=torch.float64))
    noise = torch.diag(torch.tensor([3.0, 0.1, 0.1], dtype=torch.float64))
    w = whitened_basis(signal, noise, dim=1, eps=0.0)
    assert abs(float(w[1, 0])) > 10 * max(abs(float(w[0, 0])), abs(float(w[2, 0])))
    # the basis whitens the regularised noise, so every kept direction moves by one unit
    w = whitened_basis(signal, noise, dim=3, eps=0.5)
    q = noise + 0.5 * torch.trace(noise) / 3 * torch.eye(3, dtype=torch.float64)
    torch.testing.assert_close(w.T @ q @ w, torch.eye(3, dtype=torch.float64))


def test_two_embedding_caches_on_one_file_keep_each_others_entries(tmp_path) -> None:
    path = tmp_path / "emb.pt"
    first, second = EmbeddingCache(path=path), EmbeddingCache(path=path)
    first.store["a"] = torch.ones(3)
    first.save()
    second.store["b"] = torch.zeros(3)
    second.save()  # opened before "a" was written, so it must merge rather than overwrite
    on_disk = torch.load(path, weights_only=True)
    assert set(on_disk) == {"a", "b"} and torch.equal(on_disk["a"], torch.ones(3))
    assert [f.name for f in tmp_path.iterdir()] == ["emb.pt"]  # no temporary file left


def test_a_scaled_adapter_moves_the_weights_that_fraction_of_the_way() -> None:
    from torch import nn

    from ksemstamp.adapter import adapter_payload, add_adapters, load_adapter
    from research.robust.scaled import scaled_adapter

    torch.manual_seed(0)
    block = nn.Module()
    block.layer = nn.ModuleList([nn.Module()])
    block.layer[0].query = nn.Linear(6, 4)
    base = block.layer[0].query.weight.detach().clone()
    add_adapters(block, rank=2, alpha=4.0, targets=("query",))
    nn.init.normal_(block.layer[0].query.b)
    payload = adapter_payload(block, rank=2, alpha=4.0)

    def merged(p: dict) -> torch.Tensor:
        fresh = nn.Module()
        fresh.layer = nn.ModuleList([nn.Module()])
        fresh.layer[0].query = nn.Linear(6, 4)
        fresh.layer[0].query.weight.data.copy_(base)
        return load_adapter(fresh, p).layer[0].query.weight.detach()

    full = merged(payload) - base
    assert full.abs().max() > 0.1
    torch.testing.assert_close(merged(scaled_adapter(payload, 0.5)) - base, 0.5 * full)
    assert payload["alpha"] == 4.0  # the original is left as it was
    with pytest.raises(ValueError, match="no adapter"):
        scaled_adapter(None, 0.5)
    with pytest.raises(ValueError, match="scale"):
        scaled_adapter(payload, 0.0)


def test_the_map_toward_identity_fits_a_paraphrase_and_shrinks_to_leaving_it_alone() -> None:
    from research.robust.selection import toward_identity

    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=g, dtype=torch.float64)
    true = torch.eye(5, dtype=torch.float64) + 0.3 * torch.randn(
        5, 5, generator=g, dtype=torch.float64
    )
    y = x @ true
    torch.testing.assert_close(toward_identity(x, y, 1e-9), true)
    # a heavy penalty leaves the embedding as it is, whatever the pairs say
    far = toward_identity(x, y, 1e6)
    assert (far - torch.eye(5, dtype=torch.float64)).abs().max() < 1e-4


def test_a_unit_score_has_unit_variance_over_keys() -> None:
    from research.robust.selection import unit_score

    g = torch.Generator().manual_seed(1)
    u = torch.nn.functional.normalize(torch.randn(3, 8, generator=g, dtype=torch.float64), dim=-1)
    a = torch.softmax(torch.randn(3, 4, generator=g, dtype=torch.float64), dim=-1)
    draws = np.stack(
        [
            unit_score(torch.randn(4, 8, generator=g, dtype=torch.float64), (u, a))
            for _ in range(4000)
        ]
    )
    assert np.abs(draws.std(0) - 1.0).max() < 0.05 and np.abs(draws.mean(0)).max() < 0.06


def test_clause_evidence_adds_up_over_independent_clauses_and_keeps_what_the_attack_keeps() -> None:
    from research.robust.clauses import CHOSEN, evidence

    # Every text its own orthogonal direction, one context: independent clauses.
    texts: dict[str, int] = {}

    def emb(sentences):
        return [texts.setdefault(s, len(texts)) for s in sentences]

    def feat(ids):
        u = torch.zeros(len(ids), 16, dtype=torch.float64)
        u[range(len(ids)), ids] = 1.0
        return u, torch.ones(len(ids), 1, dtype=torch.float64)

    sentence = "The court met on Monday, and the judge ruled at once."
    same = evidence([{"text": sentence, "attack": sentence}], emb, feat, 4)
    # two independent clauses, each chosen at g: 2g over a null sd of sqrt(2)
    assert same["clauses_per_sentence"] == 2
    assert same["clause_units"]["clean"] == pytest.approx(CHOSEN * np.sqrt(2))
    assert same["clause_units"]["attacked"] == pytest.approx(CHOSEN * np.sqrt(2))
    assert same["sentence_units"]["attacked"] == pytest.approx(CHOSEN)
    # an attack that keeps the first clause and rewrites the second keeps the first one's share
    half = {"text": sentence, "attack": "The court met on Monday, and then nobody ruled on it."}
    kept = evidence([half], emb, feat, 4)
    assert kept["clause_units"]["attacked"] == pytest.approx(CHOSEN / np.sqrt(2))
    assert kept["sentence_units"]["attacked"] == pytest.approx(0.0)


def test_check_attacks_resume_and_the_recursive_pass_reads_the_paraphrases(
    tmp_path, monkeypatch
) -> None:
    import json
    from types import SimpleNamespace

    from research.robust import check

    calls: list[list[str]] = []

    def fake_attack(spec, *_):
        def run(texts):
            calls.append(list(texts))
            return [SimpleNamespace(text=t + " +", sentence_similarity=0.5) for t in texts]

        return run

    monkeypatch.setattr(check, "build_attack", fake_attack)
    monkeypatch.setattr(check, "load_lm", lambda *a, **k: None)
    monkeypatch.setattr(check, "load_encoder", lambda *a, **k: None)
    gens = [{"id": f"t{i}", "text": f"text {i}"} for i in range(3)]
    check.run_attack(tmp_path, "reword", gens, {"t0", "t1"})
    assert calls == [["text 0", "text 1"]]  # only the prompts asked for
    check.run_attack(tmp_path, "reword", gens, {"t0", "t1", "t2"})
    assert calls[-1] == ["text 2"]  # resumes: t0 and t1 are kept
    check.run_attack(tmp_path, "recursive", gens, {"t0", "t1", "t2"})
    assert calls[-1] == ["text 0 +", "text 1 +", "text 2 +"]
    rows = [
        json.loads(x) for x in (tmp_path / "attacked-recursive.jsonl").read_text().split("\n") if x
    ]
    assert [r["text"] for r in rows] == ["text 0 + +", "text 1 + +", "text 2 + +"]
    n = len(calls)
    check.run_attack(tmp_path, "recursive", gens, {"t0", "t1", "t2"})
    assert len(calls) == n  # nothing left to attack: no model loaded, no call


def test_each_judge_keeps_its_most_similar_differing_candidate_and_random_none_of_the_copies() -> (
    None
):
    from research.robust.judges import chosen

    rec = {
        "id": "doc:3",
        "text": "The council met on Monday.",
        "candidates": ["The council met on Monday.", "On Monday the council met.", "It rained."],
        "similarity": {"mpnet": [1.0, 0.9, 0.2], "minilm": [1.0, 0.4, 0.6]},
    }
    assert chosen(rec, "mpnet") == 1  # the copy of the original is never kept
    assert chosen(rec, "minilm") == 2  # each judge by its own similarities
    picks = {chosen(dict(rec, id=f"doc:{i}"), "random") for i in range(40)}
    assert picks == {1, 2}  # drawn among the differing ones, by the sentence's id
    assert chosen(dict(rec, id="doc:7"), "random") == chosen(dict(rec, id="doc:7"), "random")
    assert chosen(dict(rec, candidates=[rec["text"]], similarity={"mpnet": [1.0]}), "mpnet") is None
