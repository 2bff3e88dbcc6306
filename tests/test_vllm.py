"""The served engines on a real vLLM (``make setup-vllm && make test-vllm``): text made through
vLLM in this process and through ``vllm serve`` is found by the unchanged detector, steered or
not; an interrupted run resumes; a server that is down is one line.

Marked ``vllm``: collected only where vLLM is installed (``.venv-vllm``), and there they must run
(``KSEMSTAMP_REQUIRE_VLLM=1``, which ``make test-vllm`` sets, turns a missing vLLM into an error).
The in-process tests share one engine; the server test starts its own ``vllm serve``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.vllm_server import SERVED_NAME
from ksemstamp import WatermarkSettings, build_detector, build_watermarker

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
PROMPT = (
    "The city council met on Monday to discuss the new budget. "
    "The mayor said the plan would cut costs without closing any libraries."
)
TOKENS = 120


def _settings(
    steer: float = 0.5, kind: str = "vllm", plausible: float = 0.0, **engine
) -> WatermarkSettings:
    """``steer`` > 0 with ``plausible`` 0: every entry steered through the sparse bias; with
    ``plausible`` > 0 (the default settings' way): among each step's plausible entries, inside
    vLLM's sampler (``generation.vllm_steer``), which a server cannot do."""
    sampling = {"engine": kind, "seed": 11, "max_new_tokens": TOKENS}
    if steer > 0:
        sampling["steer_plausible"] = plausible
    return WatermarkSettings.from_dict(
        {
            "key": "test-suite-key",
            "sampling": sampling,
            "search": {"steer": steer},
            "engine": engine,
        }
    )


@pytest.fixture(scope="module")
def llm():
    """One engine for the in-process tests, built to steer among plausible entries (the other
    requests pass it by)."""
    from ksemstamp.generation.stream import served_path
    from ksemstamp.generation.vllm_engine import build_llm, close_llm

    settings = _settings()
    engine = build_llm(served_path(settings.model.lm), settings.engine, "cpu", 0, steer=True)
    yield engine
    close_llm(engine)


@pytest.fixture(scope="module")
def detector():
    return build_detector(_settings())


@pytest.mark.parametrize(
    ("steer", "plausible", "keep_rows"),
    [(0.5, 0.1, True), (0.5, 0.1, False), (0.5, 0.0, True), (0.0, 0.0, True), (0.0, 0.0, False)],
)
def test_text_made_through_vllm_is_detected(llm, detector, steer, plausible, keep_rows):
    from ksemstamp.generation import vllm_steer

    settings = _settings(steer, plausible=plausible, keep_rows=keep_rows)
    watermarker = build_watermarker(settings, lm=llm)
    assert (watermarker.mark.steering is not None) == (steer > 0)
    assert watermarker.engine.steers_per_step == (plausible > 0)
    applied = vllm_steer.APPLIED[0]
    result = watermarker.generate([PROMPT])[0]
    # Rows steered at every step inside vLLM's sampler, and only where asked.
    assert (vllm_steer.APPLIED[0] - applied >= result.num_tokens) == (plausible > 0)
    assert not vllm_steer.STEERED  # every finished or stopped request's handle released
    assert llm.llm_engine.get_num_unfinished_requests() == 0  # no row left running
    assert result.num_tokens >= TOKENS and result.decoded_tokens >= result.num_tokens
    found = detector.detect(result.text, PROMPT)
    assert found.p_value <= 0.01, (found.z_score, result.text)
    plain = watermarker.generate([PROMPT], watermark=False)[0]
    assert detector.detect(plain.text, PROMPT).p_value > 0.01 or plain.text != result.text


def test_vllm_steers_the_rows_it_is_given_among_their_plausible_entries():
    """``vllm_steer.PlausibleSteer`` on a batch of three rows, two steered: each steered row as
    ``decoding.steer_logits`` steers it, the other untouched, moves followed, an unknown handle
    an error."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from ksemstamp.generation.decoding import steer_logits
    from ksemstamp.generation.steering import SteerBias
    from ksemstamp.generation.vllm_steer import HANDLE, PlausibleSteer, Steered, register, release

    class Table:  # a Steering: each entry's value is its row of a fixed table times the weights
        vocab = 50
        directions = torch.zeros(4, 8)
        device = torch.device("cpu")
        table = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))

        def values(self, weights, ids):
            return weights @ self.table[:, ids]

    table = Table()
    weights = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    handles = [register(Steered(SteerBias(table, weights[i : i + 1]), 0.1, 0.7)) for i in (0, 1)]

    def params(handle):
        return SamplingParams(extra_args=None if handle is None else {HANDLE: handle})

    steer = PlausibleSteer(None, torch.device("cpu"), False)
    added = [
        (0, params(handles[0]), None, []),
        (1, params(None), None, []),
        (2, params(handles[1]), None, []),
    ]
    steer.update_state(BatchUpdate(3, [], added, []))
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2)) * 0.5  # many plausible
    got = steer.apply(logits.clone())
    for row, w in ((0, 0), (2, 1)):
        want = steer_logits(logits[row : row + 1], SteerBias(table, weights[w : w + 1]), 0.1, 0.7)
        assert torch.allclose(got[row], want[0]) and not torch.equal(got[row], logits[row])
    assert torch.equal(got[1], logits[1])
    steer.update_state(BatchUpdate(3, [], [], [(0, 1, MoveDirectionality.SWAP)]))
    moved = steer.apply(logits.clone())
    want = steer_logits(logits[1:2], SteerBias(table, weights[:1]), 0.1, 0.7)
    assert torch.equal(moved[0], logits[0]) and torch.allclose(moved[1], want[0])
    release(handles[0])
    with pytest.raises(RuntimeError, match="engine core in this process"):
        steer.apply(logits.clone())
    release(handles[1])


@pytest.fixture(scope="module")
def server(llm):
    """``vllm serve`` of the default LM on a free local port, stopped after the module."""
    from benchmarks.vllm_server import vllm_server
    from ksemstamp.generation.stream import served_path

    with vllm_server(served_path(_settings().model.lm)) as url:
        yield url


def test_text_made_through_a_server_is_detected(server, detector):
    watermarker = build_watermarker(_settings(kind="openai", base_url=server))
    assert watermarker.engine.streamer.client.model == SERVED_NAME
    result = watermarker.generate([PROMPT])[0]
    assert result.num_tokens >= TOKENS
    found = detector.detect(result.text, PROMPT)
    assert found.p_value <= 0.01, (found.z_score, result.text)


def test_both_streamers_give_the_lms_raw_logprob_of_each_sampled_token(llm, server):
    """A candidate's fluency averages these: the LM's own log-probability of each token (raw
    logits, temperature 1), as the Hugging Face model gives it in fp32 (vLLM runs bf16)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ksemstamp.generation.openai_engine import Client, OpenAIStreamer
    from ksemstamp.generation.stream import Extension, lm_facts, served_path
    from ksemstamp.generation.vllm_engine import VllmStreamer

    settings = _settings()
    path = served_path(settings.model.lm)
    tokenizer = lm_facts(path)[0]
    ids = tokenizer(PROMPT)["input_ids"]
    job = Extension(ids, 12, 5)
    client = Client(server, None, None, 120.0, 0, 1, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for streamer in (
        VllmStreamer(llm, settings.sampling),
        OpenAIStreamer(client, settings.sampling),
    ):
        (got,) = streamer.extend([job])
        assert len(got.ids) == 12 and got.logprobs is not None and len(got.logprobs) == 12
        with torch.inference_mode():
            logits = model(torch.tensor([ids + got.ids])).logits[0, len(ids) - 1 : -1]
        want = logits.log_softmax(-1)[torch.arange(12), torch.tensor(got.ids)]
        # raw, not tempered: at temperature 0.7 they would sit ~40% further from 0
        gap = (torch.tensor(got.logprobs) - want).abs().mean()
        assert gap < 0.15, (got.logprobs, want.tolist())


def test_each_running_vllm_request_is_steered_by_its_own_bias_as_others_come_and_go(llm):
    """In the real engine, three requests steered toward three different tokens (a bias of 40
    on one token each, every entry plausible): each writes its own token, before and after
    another request is stopped and a new one joins (vLLM moves rows within its batch)."""
    import torch

    from ksemstamp.generation import vllm_steer
    from ksemstamp.generation.steering import SteerBias
    from ksemstamp.generation.stream import Extension, lm_facts, served_path
    from ksemstamp.generation.vllm_engine import VllmStreamer

    settings = _settings(plausible=1e-30)  # every entry plausible: the bias alone decides
    tokenizer, width, _ = lm_facts(served_path(settings.model.lm))
    ids = tokenizer(PROMPT)["input_ids"]
    targets = [
        tokenizer(w, add_special_tokens=False)["input_ids"][0]
        for w in (" red", " sea", " owl", " map")
    ]

    class OneToken:  # a Steering whose k-th weight lifts target k's logit by 40
        vocab = int(width)

        def values(self, weights, entries):
            table = torch.zeros(len(targets), self.vocab)
            table[torch.arange(len(targets)), torch.tensor(targets)] = 40.0
            return weights.float() @ table[:, entries.cpu()]

    table = OneToken()
    streamer = VllmStreamer(llm, settings.sampling)

    def steered(k: int) -> SteerBias:
        return SteerBias(table, torch.eye(len(targets))[k : k + 1])

    for k in range(3):
        streamer.start(f"steer-{k}", Extension(ids, 8, k, steer_bias=steered(k)))
    got: dict[str, list[int]] = {f"steer-{k}": [] for k in range(4)}
    for delta in streamer.pull():
        got[delta.key] += delta.new.ids
    streamer.stop(["steer-0"])
    streamer.start("steer-3", Extension(ids, 8, 3, steer_bias=steered(3)))
    running = {"steer-1", "steer-2", "steer-3"}
    while running:
        for delta in streamer.pull():
            got[delta.key] += delta.new.ids
            if delta.finished:
                running.discard(delta.key)
    for k in range(4):
        tokens = got[f"steer-{k}"]
        assert tokens and set(tokens) == {targets[k]}, (k, tokens)
    assert not vllm_steer.STEERED and llm.llm_engine.get_num_unfinished_requests() == 0


def test_a_running_vllm_request_gives_what_one_call_gives_and_stops_when_told(llm):
    from ksemstamp.generation.stream import Extension, lm_facts, served_path
    from ksemstamp.generation.vllm_engine import VllmStreamer

    settings = _settings()
    ids = lm_facts(served_path(settings.model.lm))[0](PROMPT)["input_ids"]
    streamer = VllmStreamer(llm, settings.sampling)
    job = Extension(ids, 12, 5)
    (want,) = streamer.extend([job])
    streamer.start("live-test", job)
    got, logprobs, finished = [], [], False
    while not finished:
        for delta in streamer.pull():
            assert delta.key == "live-test"
            got += delta.new.ids
            logprobs += delta.new.logprobs
            finished = delta.finished
    assert got == want.ids
    assert logprobs == pytest.approx(want.logprobs, abs=1e-3)
    streamer.start("live-stop", Extension(ids, 40, 6))
    streamer.pull()
    streamer.stop(["live-stop"])
    assert llm.llm_engine.get_num_unfinished_requests() == 0
    with pytest.raises(RuntimeError, match="nothing running|no request"):
        streamer.pull()


def _cli(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "watermark.py"), "generate", *args]


def test_an_interrupted_vllm_run_resumes(tmp_path):
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    lines = [{"id": i, "prompt": f"Story {i}. {PROMPT}"} for i in range(3)]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = _cli("--input", str(prompts), "--output", str(out), "--sampling.engine", "vllm")
    argv += ["--sampling.seed", "5", "--sampling.max_new_tokens", "30"]
    argv += ["--search.prompt_batch", "1", "--quiet"]
    run = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 400
    while (not out.exists() or out.read_text().count("\n") < 1) and time.monotonic() < deadline:
        assert run.poll() is None, run.stderr.read()
        time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    err = run.communicate(timeout=120)[1]
    assert run.returncode == 130 and "Traceback" not in err, err
    first = out.read_text().splitlines()
    assert 1 <= len(first) < 3
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [0, 1, 2]
    assert out.read_text().splitlines()[: len(first)] == first  # what was written stays


@pytest.mark.gpu
def test_text_made_through_vllm_on_a_gpu_is_detected_on_the_cpu(detector):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device is visible")
    settings = _settings().updated({"model": {"device": "cuda"}})
    watermarker = build_watermarker(settings)  # its own vLLM engine, on the GPU
    try:
        result = watermarker.generate([PROMPT])[0]
    finally:
        watermarker.engine.close()
    found = detector.detect(result.text, PROMPT)  # the CPU's detector
    assert found.p_value <= 0.01, (found.z_score, result.text)
