"""Every path follows the device of its models.

A tensor made on the CPU meets a model on a GPU only on a GPU, and CI has none. These tests run
each path (detection with the scan, calibration, generation, the web page's detector) with the
models on an accelerator and compare with the CPU:

* ``virtual``: the stand-in of ``tests/virtual_device.py``, on any machine. It fails where CUDA
  fails (a CPU tensor in an operation with the device's, a CPU generator drawing on the device,
  ``.numpy()`` of a device tensor) and computes the same numbers as the CPU, so the outputs must
  be equal;
* ``cuda``: the real thing, when a GPU is visible (``-m gpu``, ``make test-gpu``); outputs then
  differ by the GPU's rounding only, and the tests say how far.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from ksemstamp.builders import build_detector, build_scheme
from ksemstamp.scheme.core import WatermarkScheme
from ksemstamp.settings import WatermarkSettings
from tests.virtual_device import DeviceMixError, VirtualTensor, virtual_device

TEXTS = [
    "The river rose overnight. Farmers moved their cattle to the hills. By noon the bridge was "
    "closed, and the school sent the children home. Officials said the water would fall by "
    "Friday. Nobody believed them.",
    "A new library opened downtown. It holds forty thousand books. The mayor cut the ribbon.",
    "Short one.",
    "Prices climbed again in March, the third rise this year. Bakers blamed flour; shops blamed "
    "the bakers. Customers blamed everyone. A survey found that most families now buy less "
    "bread, and some bake their own. The union asked for a meeting.",
]
PROMPTS = [None, "The city council met on Monday.", None, "Inflation is back."]


class TinyEncoder(torch.nn.Module):
    """A sentence encoder with weights and no download: hashed words looked up in a random
    table, mean-pooled. Like a ``SentenceTransformer`` it answers ``encode`` on its device."""

    def __init__(self, dim: int = 32, buckets: int = 256) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(buckets, dim, generator=generator))
        self.buckets = buckets

    @property
    def device(self) -> torch.device:
        return self.table.device

    def get_embedding_dimension(self) -> int:
        return self.table.shape[1]

    def _ids(self, sentence: str) -> list[int]:
        words = sentence.lower().split() or [""]
        return [int(hashlib.sha256(w.encode()).hexdigest()[:6], 16) % self.buckets for w in words]

    def encode(self, sentences, batch_size=32, convert_to_tensor=True, show_progress_bar=False):
        ids = [self._ids(s) for s in sentences]
        width = max(len(i) for i in ids)
        index = torch.tensor([i + [0] * (width - len(i)) for i in ids], device=self.device)
        mask = torch.tensor(
            [[1.0] * len(i) + [0.0] * (width - len(i)) for i in ids], device=self.device
        )
        return (self.table[index] * mask[..., None]).sum(dim=1) / mask.sum(dim=1, keepdim=True)


@pytest.fixture(params=["virtual", pytest.param("cuda", marks=pytest.mark.gpu)])
def accelerator(request):
    """The device models are moved to (the stand-in, or CUDA when visible)."""
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device is visible")
        yield torch.device("cuda")
        return
    with virtual_device() as device:
        yield device


def _plain(x):
    """A result's tensors as CPU tensors (the stand-in's wrappers unwrapped)."""
    if isinstance(x, VirtualTensor):
        return x.elem
    return x.cpu() if isinstance(x, torch.Tensor) else x


@pytest.fixture
def centroids(tmp_path):
    """A centroid file of ``TinyEncoder`` (K = 8, with a mean and two components), as
    ``ksemstamp centroids`` writes one: a scheme is built from it as users build theirs."""
    from ksemstamp.assets import encoder_fingerprint
    from ksemstamp.scheme.centroids import CentroidFile

    generator = torch.Generator().manual_seed(1)
    encoder = TinyEncoder()
    dim = encoder.get_embedding_dimension()
    path = tmp_path / "tiny-centroids.pt"
    CentroidFile(
        torch.nn.functional.normalize(torch.randn(8, dim, generator=generator), dim=-1),
        "tiny",
        encoder_fingerprint(encoder),
        transition=torch.rand(8, 8, generator=generator, dtype=torch.float64),
        mean=torch.randn(dim, generator=generator) * 0.1,
        components=torch.randn(2, dim, generator=generator),
    ).save(path)
    return path


def _settings(centroids, mark: str, device) -> WatermarkSettings:
    return WatermarkSettings.from_dict(
        {
            "key": "device-test-key-for-detection",
            "model": {"device": str(device)},
            "partition": {"centroids": str(centroids)},
            **MARKS[mark],
        }
    )


def _scheme(encoder, centroids, mark: str, device="cpu") -> WatermarkScheme:
    return build_scheme(_settings(centroids, mark, device), encoder=encoder)


def _fields(result) -> dict:
    keep = ("status", "z_score", "p_value", "verdicts", "regions")
    details = {name: result.details.get(name) for name in ("span", "mixture_p_value")}
    return {name: getattr(result, name) for name in keep} | details | {"scores": result.scores}


def _close(got: dict, want: dict, rel: float) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, float):
            assert got[name] == pytest.approx(value, rel=rel, abs=rel), name
        elif name == "scores" and value is not None:
            assert [x is None for x in got[name]] == [x is None for x in value]
            pairs = [(g, w) for g, w in zip(got[name], value, strict=True) if w is not None]
            assert [g for g, _ in pairs] == pytest.approx([w for _, w in pairs], rel=rel, abs=rel)
        else:
            assert got[name] == value, name


MARKS = {
    "direction": {"mark": {"remove_components": 2}},
    "direction-previous": {
        "mark": {"remove_components": 2, "context": "previous", "context_temperature": 0.0}
    },
    "region": {"mark": {"kind": "region", "gamma": 0.25}, "search": {"margin": 0.0}},
}


@pytest.mark.parametrize("mark", sorted(MARKS))
def test_detection_on_the_accelerator_gives_the_cpus_results(accelerator, centroids, mark):
    encoder = TinyEncoder()
    settings = _settings(centroids, mark, "cpu")
    want = build_detector(settings, encoder=encoder).detect_batch(TEXTS, PROMPTS)
    settings = _settings(centroids, mark, accelerator)
    detector = build_detector(settings, encoder=copy.deepcopy(encoder).to(accelerator))
    got = detector.detect_batch(TEXTS, PROMPTS)
    exact = accelerator.type != "cuda"
    for g, w in zip(got, want, strict=True):
        _close(_fields(g), _fields(w), rel=1e-12 if exact else 1e-4)
    assert any(g.details.get("span") for g in got) == mark.startswith("direction")
    assert detector.scheme.partition.centroids.device.type == accelerator.type


def test_calibration_on_the_accelerator_gives_the_cpus_p_values(accelerator, centroids):
    import numpy as np

    from ksemstamp.calibration.scoring import calibration_keys, p_values, score_texts

    labels = ["x"] * len(TEXTS)
    encoder = TinyEncoder()
    cpu = _scheme(encoder, centroids, "direction")
    want = score_texts(cpu, TEXTS, labels, PROMPTS, scan=True)
    scheme = _scheme(copy.deepcopy(encoder).to(accelerator), centroids, "direction", accelerator)
    got = score_texts(scheme, TEXTS, labels, PROMPTS, scan=True)
    for directions in calibration_keys(want.mark, 2, seed=0):
        p_want = p_values(want, directions)["exact"]
        p_got = p_values(got, directions)["exact"]
        assert np.allclose(p_got, p_want, rtol=1e-9 if accelerator.type != "cuda" else 1e-4)


def test_the_stand_in_fails_where_cuda_fails():
    with virtual_device() as device:
        on_device = torch.ones(3).to(device)
        assert on_device.device == device
        with pytest.raises(DeviceMixError, match="same device"):
            on_device + torch.ones(3)
        with pytest.raises(DeviceMixError, match="generator"):
            torch.rand(2, generator=torch.Generator(), device=device)
        with pytest.raises(RuntimeError, match="numpy"):
            on_device.numpy()
        # what CUDA allows: scalars, CPU indices, moves, and lists
        assert (on_device * torch.tensor(2.0)).tolist() == [2.0, 2.0, 2.0]
        assert on_device[torch.tensor([0, 2])].tolist() == [1.0, 1.0]
        assert on_device[[1]].tolist() == [1.0]
        assert on_device.cpu().numpy().tolist() == [1.0, 1.0, 1.0]
        assert torch.zeros(2, device=on_device.device).device == device


def test_a_model_computes_on_the_stand_in_what_it_computes_on_the_cpu():
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
    with virtual_device() as device:
        moved = copy.deepcopy(model).to(device)  # outside inference mode, as any model
        with torch.inference_mode():
            got = moved(input_ids=ids.to(device)).logits
        assert got.device == device
        assert torch.equal(_plain(got), want)


def test_metrics_on_the_accelerator_give_the_cpus(accelerator):
    from ksemstamp.evaluation.metrics import auroc, roc_curve

    scores = [3.1, -0.2, 2.5, 0.4, 1.9, -1.1, 0.4, 5.0]
    labels = [1, 0, 1, 0, 1, 0, 1, 1]
    assert auroc(scores, labels, device=accelerator) == pytest.approx(auroc(scores, labels))
    for got, want in zip(
        roc_curve(scores, labels, accelerator), roc_curve(scores, labels), strict=True
    ):
        assert got.tolist() == pytest.approx(want.tolist())


def test_the_web_pages_detector_on_the_accelerator_gives_the_cpus(accelerator):
    from ksemstamp.serve import create_app
    from ksemstamp.settings import WatermarkSettings

    def view(encoder, device):
        settings = WatermarkSettings.from_dict(
            {
                "key": "device-test-key-for-the-web-page",
                "partition": {"kind": "lsh"},
                "model": {"device": str(device)},
            }
        )
        state = create_app(settings, encoder=encoder, generation=False).state.serve
        assert state.scheme.device.type == torch.device(device).type
        return state.view(state.detector.detect(TEXTS[0], PROMPTS[0]), TEXTS[0], 0.0)

    encoder = TinyEncoder()
    want = view(encoder, "cpu")
    got = view(copy.deepcopy(encoder).to(accelerator), accelerator)
    assert got.keys() == want.keys()
    assert got["p_value"] == pytest.approx(want["p_value"], rel=1e-4)
    assert got["status"] == want["status"] == "ok"


@pytest.mark.e2e
def test_generation_on_the_accelerator_gives_the_cpus_text(accelerator, encoder, lm):
    from ksemstamp.builders import build_detector, build_watermarker
    from ksemstamp.settings import WatermarkSettings

    prompt = "The city council met on Monday to discuss the new budget."

    def run(device, models):
        settings = WatermarkSettings.from_dict(
            {
                "key": "device-test-key-for-generation",
                "model": {"device": str(device)},
                "sampling": {"seed": 0, "max_new_tokens": 20},
                "search": {"max_candidates": 6, "candidate_batch": 6, "prune_keep": 3},
            }
        )
        watermarker = build_watermarker(settings, lm=models[1], encoder=models[0])
        result = watermarker.generate([prompt])[0]
        detection = build_detector(settings, watermarker.scheme).detect(result.text, prompt)
        return result, detection

    want, want_detection = run("cpu", (encoder, lm))
    model, tokenizer = lm
    moved = (
        copy.deepcopy(encoder).to(accelerator),
        (copy.deepcopy(model).to(accelerator), tokenizer),
    )
    got, got_detection = run(accelerator, moved)
    assert got.status == "ok" and got_detection.status == "ok"
    if accelerator.type != "cuda":  # the stand-in computes the CPU's numbers
        assert got.text == want.text
        assert got_detection.p_value == pytest.approx(want_detection.p_value, rel=1e-9)
    # Detected on the CPU, a text made on the accelerator scores as it does there.
    again = run_detection_on_cpu(encoder, got.text, prompt)
    assert again.z_score == pytest.approx(got_detection.z_score, rel=1e-3, abs=1e-3)


def run_detection_on_cpu(encoder, text: str, prompt: str):
    from ksemstamp.builders import build_detector
    from ksemstamp.settings import WatermarkSettings

    settings = WatermarkSettings.from_dict({"key": "device-test-key-for-generation"})
    return build_detector(settings, encoder=encoder).detect(text, prompt)


@pytest.mark.e2e
def test_gpucheck_reads_the_training_device_while_training(tmp_path, monkeypatch):
    # Lightning's teardown moves the model back to the CPU after `fit`; here it is moved to
    # another device ("meta") instead, so that a check made after `fit` would see it.
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from ksemstamp.cli.gpucheck import train
    from ksemstamp.io import write_text_atomic
    from ksemstamp.text.corpusfile import export_source

    teardown = SingleDeviceStrategy.teardown

    def moving_teardown(self):
        teardown(self)
        self.lightning_module.to("meta")

    monkeypatch.setattr(SingleDeviceStrategy, "teardown", moving_teardown)
    corpus = tmp_path / "corpus.txt"
    write_text_atomic(corpus, "".join(d + "\n" for d in export_source("parliament")))
    checkpoint, device = train(tmp_path, corpus, "cpu", steps=2)
    assert device == "cpu" and checkpoint.is_file()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_cast_encoder_is_checked_as_loaded_and_scores_nearly_alike(centroids, dtype):
    encoder = TinyEncoder()
    plain = _settings(centroids, "direction", "cpu")
    cast = plain.updated({"model": {"encoder_dtype": dtype}})
    # The centroid file's fingerprint is of the fp32 weights: the cast comes after the check.
    scheme = build_scheme(cast, encoder=encoder)
    assert next(scheme.encoder.parameters()).dtype != torch.float32
    assert encoder.table.dtype == torch.float32  # the caller's encoder is left as it was
    want = build_detector(plain, encoder=encoder).detect_batch(TEXTS, PROMPTS)
    got = build_detector(cast, scheme).detect_batch(TEXTS, PROMPTS)
    for g, w in zip(got, want, strict=True):
        assert g.z_score == pytest.approx(w.z_score, abs=0.05)
