"""The token-streamer engine (``generation.stream``) over a scripted streamer: units cut by the
shared cutter, decoded tokens counted one way, rows seeded apart from their batch, steering as a
sparse bias; and the OpenAI-compatible client against a local fake server (down, slow, garbage).
No model and no vLLM: these run with the fast tests (``tests/test_vllm.py`` runs the real ones).
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from ksemstamp.generation.cutter import RowCut, UnitCutter
from ksemstamp.generation.draw import draw_round
from ksemstamp.generation.engine import EngineUnavailable, RoundRequest
from ksemstamp.generation.openai_engine import Client, OpenAIStreamer, ServerError
from ksemstamp.generation.stream import (
    MAX_BIAS,
    Extension,
    Sampled,
    StreamEngine,
    extension_seed,
    sparse_bias,
)
from ksemstamp.settings.groups import SamplingSettings
from ksemstamp.text.splitter import get_splitter

PIECES = [
    "<f>", " The", " cat", " sat", " on", " the", " mat", ".", " A", " dog", " ran", " away",
    " home", " Then", " it", " slept", "<eos>",
]  # fmt: skip
EOS = 16


class WordTokenizer:
    """One vocabulary entry per word piece of ``PIECES``; prompts are filler tokens (0)."""

    eos_token_id = EOS
    pad_token_id = None

    def __len__(self) -> int:
        return len(PIECES)

    def __call__(self, text: str, **_) -> dict[str, list[int]]:
        return {"input_ids": [0] * max(1, len(text.split()))}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(PIECES[i] for i in ids if not (skip_special_tokens and i in (0, EOS)))

    def batch_decode(self, rows) -> list[str]:
        return [self.decode(r, skip_special_tokens=False) for r in rows]


def _ids(text: str) -> list[int]:
    return [PIECES.index(" " + w if w != "." else w) for w in text.replace(".", " .").split()]


SCRIPTS = [
    _ids("The cat sat on the mat. Then it slept."),
    _ids("A dog ran away home. Then it slept."),
    _ids("The dog sat. Then it ran."),
]
"""A row's tokens: the script its first seed picks, then ``Then it slept.`` over and over."""


class ScriptedStreamer:
    """Row tokens by script (see ``SCRIPTS``); logs every job it got."""

    def __init__(self, logprobs: bool = False) -> None:
        self.jobs: list[Extension] = []
        self.returned = 0
        self.logprobs = logprobs

    def extend(self, jobs):
        self.jobs += jobs
        outs = []
        for job in jobs:
            row = [t for t in job.ids if t != 0]  # prompt tokens are filler
            script = next((s for s in SCRIPTS if row and s[: len(row)] == row), None)
            if script is None:
                script = SCRIPTS[job.seed % len(SCRIPTS)]
            tail = _ids("Then it slept.") * 8
            full = script + tail
            out = full[len(row) : len(row) + job.max_tokens]
            self.returned += len(out)
            # A token's log-probability: minus a tenth of its id (a number to average).
            outs.append(Sampled(out, [-t / 10 for t in out]) if self.logprobs else out)
        return outs

    def close(self) -> None:
        pass


def _engine(
    chunk: int = 4, bias_entries: int = 3, max_unit: int = 12, logprobs: bool = False
) -> StreamEngine:
    return StreamEngine(
        ScriptedStreamer(logprobs),
        WordTokenizer(),
        get_splitter("sentences"),
        len(PIECES),
        max_unit,
        chunk_tokens=chunk,
        bias_entries=bias_entries,
        suppress=[EOS],
    )


def _accept_all(places, texts):
    return [(bool(t), None) for t in texts]


def test_stream_rows_are_cut_by_the_shared_rule_and_counted_once():
    engine = _engine()
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    request = RoundRequest.of(["Once upon a time.", "Long ago."], [3, 2], gens)
    results = draw_round(engine, request, lambda p, t: [(False, None)] * len(t))
    texts = {c.text for r in results for c in r.candidates}
    assert texts <= {"The cat sat on the mat.", "A dog ran away home.", "The dog sat."}
    assert all(len(r.candidates) == n for r, n in zip(results, [3, 2], strict=True))
    # Every token the streamer returned is a decoded token of some row, and none twice.
    assert sum(r.decoded_tokens for r in results) == engine.streamer.returned
    # A row decodes past its end only to the chunk's end: 'The dog sat.' (3 + 1 tokens) and
    # the token that showed its end come from chunks of 4.
    for r in results:
        for c in r.candidates:
            assert c.num_tokens == len(_ids(c.text))


def test_a_rows_text_does_not_depend_on_its_batch():
    def texts(prefixes, rows):
        gens = [torch.Generator().manual_seed(7) for _ in prefixes]
        request = RoundRequest.of(prefixes, rows, gens)
        res = draw_round(_engine(), request, lambda p, t: [(False, None)] * len(t))
        return [[c.text for c in r.candidates] for r in res]

    alone = texts(["Once upon a time."], [4])
    together = texts(["Once upon a time.", "Long ago."], [4, 3])
    assert together[0] == alone[0]


def test_pruning_checks_see_rows_at_the_check_and_ordered_acceptance_holds():
    from ksemstamp.generation.engine import Pruner

    engine = _engine(chunk=16)
    seen_tokens = []

    def decide(tokens, rows, texts, finished):
        seen_tokens.append(tokens)
        return [True] * len(rows)

    gens = [torch.Generator().manual_seed(3)]
    request = RoundRequest.of(["Once upon a time."], [4], gens)
    results = draw_round(engine, request, _accept_all, Pruner(2, decide))
    assert seen_tokens and all(t % 2 == 0 for t in seen_tokens)
    # Every job asked for no more than the next check's tokens.
    assert all(job.max_tokens <= 2 for job in engine.streamer.jobs)
    assert results[0].accepted_index == 0  # the first row is accepted: rows after it stop


class DenseBias:
    """Given ``(R, V)`` biases behaving as a ``steering.SteerBias`` does for an engine."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values
        self.weights = values  # what tells two biases apart
        self.shape = tuple(values.shape)

    def __len__(self) -> int:
        return len(self.values)

    def rows(self, index) -> DenseBias:
        return DenseBias(self.values[list(index)])

    def dense(self) -> torch.Tensor:
        return self.values


def test_steering_reaches_the_streamer_as_its_largest_entries_and_eos_stays_suppressed():
    bias = torch.zeros(2, len(PIECES))
    bias[0, [2, 5, 9, 11]] = torch.tensor([0.5, 3.0, 1.0, 200.0])
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    engine = _engine(bias_entries=3)
    request = RoundRequest.of(["Once.", "Twice."], [1, 1], gens, bias=DenseBias(bias))
    draw_round(engine, request, _accept_all)
    first = engine.streamer.jobs[0].bias
    assert first == {11: MAX_BIAS, 5: 3.0, 9: 1.0, EOS: -MAX_BIAS}
    assert engine.streamer.jobs[1].bias == {EOS: -MAX_BIAS}
    assert sparse_bias(None, 10) is None


def test_a_streamer_that_steers_at_every_step_gets_each_rows_own_bias_not_a_sparse_one():
    bias = torch.zeros(2, len(PIECES))
    bias[0, 5], bias[1, 9] = 3.0, 1.0
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    engine = _engine(bias_entries=3)
    engine.steers_per_step = True
    request = RoundRequest.of(["Once.", "Twice."], [2, 1], gens, bias=DenseBias(bias))
    draw_round(engine, request, _accept_all)
    jobs = engine.streamer.jobs
    assert all(job.bias == {EOS: -MAX_BIAS} for job in jobs)  # suppression only
    assert {job.steer_bias.shape for job in jobs} == {(1, len(PIECES))}
    # The first call extends every row in order: document 0's two rows, then document 1's.
    for job, g in zip(jobs[:3], [0, 0, 1], strict=True):
        assert torch.equal(job.steer_bias.values[0], bias[g])
    unsteered = _engine()
    unsteered.steers_per_step = True
    draw_round(unsteered, RoundRequest.of(["Once."], [1], gens[:1]), _accept_all)
    assert unsteered.streamer.jobs[0].steer_bias is None


@pytest.mark.parametrize("logprobs", [True, False])
def test_a_candidates_fluency_is_its_units_mean_logprob_where_the_streamer_gives_them(logprobs):
    engine = _engine(logprobs=logprobs)
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    request = RoundRequest.of(["Once upon a time.", "Long ago."], [3, 2], gens)
    results = draw_round(engine, request, lambda p, t: [(False, None)] * len(t))
    for c in (c for r in results for c in r.candidates):
        ids = _ids(c.text)  # the unit's own tokens: not the one that showed its end
        if logprobs:
            assert c.fluency == pytest.approx(sum(-t / 10 for t in ids) / len(ids))
        else:
            assert math.isnan(c.fluency)  # bare ids: unknown, never made up


def test_vllm_outputs_give_the_sampled_tokens_logprobs():
    from types import SimpleNamespace as NS

    from ksemstamp.generation.vllm_engine import sampled

    steps = [{7: NS(logprob=-0.25)}, {3: NS(logprob=-2.0), 9: NS(logprob=-0.1)}]
    assert sampled(NS(token_ids=[7, 3], logprobs=steps)) == ([7, 3], [-0.25, -2.0])
    assert sampled(NS(token_ids=(7, 3), logprobs=None)) == ([7, 3], None)
    assert sampled(NS(token_ids=[7, 4], logprobs=steps)) == ([7, 4], None)  # not the sampled id


def test_extension_seeds_differ_by_row_and_length():
    seeds = {extension_seed(s, n) for s in range(50) for n in range(0, 64, 8)}
    assert len(seeds) == 50 * 8


def test_cutter_counts_every_token_it_was_given():
    splitter = get_splitter("sentences")
    # A unit that ends: the token that showed its end is decoded, not part of the unit.
    cutter = UnitCutter(WordTokenizer(), splitter, len(PIECES), 12)
    row = RowCut()
    cuts = [cutter.push(row, t, "") for t in _ids("A dog ran away home. Then")]
    assert [c is not None for c in cuts] == [False] * 6 + [True]
    assert cuts[-1].text == "A dog ran away home." and cuts[-1].num_tokens == 6
    assert row.decoded == 7
    # A truncated row: every token it was given is decoded, none twice.
    short = UnitCutter(WordTokenizer(), splitter, len(PIECES), 5)
    row = RowCut()
    cuts = [short.push(row, t, "") for t in _ids("A dog ran away home")]
    assert cuts[-1] is not None and cuts[-1].truncated and cuts[-1].text == ""
    assert row.decoded == 5 == cuts[-1].num_tokens
    assert math.isnan(cuts[-1].fluency)  # no log-probability was given


def test_cutter_averages_the_units_own_tokens_logprobs():
    cutter = UnitCutter(WordTokenizer(), get_splitter("sentences"), len(PIECES), 12)
    row = RowCut()
    ids = _ids("A dog ran away home. Then")
    logprobs = [-1.0, -2.0, -3.0, -1.0, -2.0, -3.0, -50.0]
    cuts = [cutter.push(row, t, "", logprob=lp) for t, lp in zip(ids, logprobs, strict=True)]
    # six tokens of the unit; " Then" showed its end and belongs to the next one
    assert cuts[-1].fluency == pytest.approx(-2.0)


def test_engines_of_one_model_share_one_vllm_and_a_closed_one_is_built_anew(monkeypatch):
    """Watermarkers of several keys (the evaluation's, the lab's) each build an engine: one
    engine core for them all, not one left polling per key."""
    import sys
    import types

    from ksemstamp.generation import vllm_engine
    from ksemstamp.settings.engines import EngineSettings

    made = []

    class FakeLLM:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.llm_engine = types.SimpleNamespace(
                engine_core=types.SimpleNamespace(shutdown=lambda: made.append("shutdown"))
            )

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr(vllm_engine, "BUILT", {})
    eng = EngineSettings()
    first = vllm_engine.build_llm("model-dir", eng, "cpu", 0)
    assert vllm_engine.build_llm("model-dir", EngineSettings(), "cpu", 0) is first
    assert len(made) == 1 and made[0]["enable_prefix_caching"]
    other = vllm_engine.build_llm("model-dir", EngineSettings(chunk_tokens=8), "cpu", 0)
    assert other is not first and len(made) == 2
    vllm_engine.close_llm(first)
    assert made[-1] == "shutdown"
    assert vllm_engine.build_llm("model-dir", eng, "cpu", 0) is not first


# ---------------------------------------------------------------------- the server's client


class _Fake(BaseHTTPRequestHandler):
    mode = "ok"
    bodies: list[dict] = []
    failures = 0

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, payload: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._send(200, json.dumps({"data": [{"id": "served-lm"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        mode = type(self).mode
        if mode == "flaky" and type(self).failures < 2:
            type(self).failures += 1
            return self._send(503, b'{"error": "busy"}')
        if mode == "garbage":
            return self._send(200, b"<html>not an API</html>", "text/html")
        if mode == "refuse":
            return self._send(400, b'{"error": "bad token ids"}')
        if mode == "slow":
            time.sleep(1.5)
        ids = [13, 14, 15][: body["max_tokens"]]
        if body.get("stream"):
            return self._stream(ids, mode)
        if mode == "text":
            choice = {"text": " Then it slept"[: 5 * len(ids)]}
        else:
            choice = {"text": "", "token_ids": ids}
            if body.get("logprobs") == 0:
                choice["logprobs"] = {"token_logprobs": [-0.5, -1.0, -1.5][: len(ids)]}
        self._send(200, json.dumps({"choices": [choice]}).encode())

    def _stream(self, ids: list[int], mode: str) -> None:
        """Server-sent events, one token each (``slow``: 0.3 s apart), then ``[DONE]``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for k, token in enumerate(ids):
            if mode == "slow" and k:
                time.sleep(0.3)
            last = k == len(ids) - 1
            choice = {"text": PIECES[token], "finish_reason": "length" if last else None}
            if mode != "noids":
                choice["token_ids"] = [token]
                choice["logprobs"] = {"token_logprobs": [-0.5 * (k + 1)]}
            try:
                self.wfile.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
                self.wfile.flush()
            except OSError:  # the client closed the stream
                type(self).bodies.append({"closed_after": k})
                return
        self.wfile.write(b"data: [DONE]\n\n")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that timed out closed its socket: nothing to report."""


@pytest.fixture()
def fake_server():
    _Fake.mode, _Fake.bodies, _Fake.failures = "ok", [], 0
    server = _Server(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _client(url: str, retries: int = 0, timeout: float = 5.0, model: str | None = None) -> Client:
    return Client(url, model, "sk-test", timeout, retries, 4, WordTokenizer())


def test_client_sends_token_ids_seed_and_sparse_bias(fake_server):
    client = _client(fake_server)
    assert client.model == "served-lm"  # the server's first model
    streamer = OpenAIStreamer(client, SamplingSettings(top_k=0))
    jobs = [Extension([0, 0, 1], 2, 11, {5: 2.0, EOS: -100.0}), Extension([0, 2], 3, 12)]
    got = streamer.extend(jobs)
    assert [s.ids for s in got] == [[13, 14], [13, 14, 15]]
    # each sampled token's own log-probability, asked for with logprobs=0
    assert [s.logprobs for s in got] == [[-0.5, -1.0], [-0.5, -1.0, -1.5]]
    # The requests go out concurrently: found by their prompts.
    first = next(b for b in _Fake.bodies if b["prompt"] == [0, 0, 1])
    second = next(b for b in _Fake.bodies if b["prompt"] == [0, 2])
    assert first["seed"] == 11 and first["max_tokens"] == 2
    assert first["logit_bias"] == {"5": 2.0, str(EOS): -100.0}
    assert first["top_k"] == -1 and first["temperature"] == 0.7 and first["n"] == 1
    assert first["logprobs"] == 0
    assert second["seed"] == 12 and "logit_bias" not in second
    streamer.close()


def test_client_tokenises_a_text_only_answer(fake_server):
    _Fake.mode = "text"
    client = _client(fake_server, model="m")
    # the fake tokenizer: one filler id per word of " Then it slept"
    assert client.tokens({"max_tokens": 3, "prompt": [0]}) == ([0, 0, 0], None)


def test_client_retries_a_busy_server(fake_server):
    _Fake.mode = "flaky"
    assert _client(fake_server, retries=2, model="m").tokens({"max_tokens": 1}).ids == [13]
    assert _Fake.failures == 2


@pytest.mark.parametrize(
    ("mode", "said"),
    [("garbage", "answered with no JSON"), ("refuse", "refused the request (HTTP 400")],
)
def test_client_says_what_a_bad_answer_was(fake_server, mode, said):
    _Fake.mode = mode
    with pytest.raises(ServerError, match=said.replace("(", r"\(")):
        _client(fake_server, retries=1, model="m").tokens({"max_tokens": 1})


def test_client_gives_up_on_a_slow_or_absent_server(fake_server):
    _Fake.mode = "slow"
    with pytest.raises(EngineUnavailable, match="failed 1 time"):
        _client(fake_server, timeout=0.3, model="m").tokens({"max_tokens": 1})
    with pytest.raises(ServerError, match="is the server running"):
        _client("http://127.0.0.1:9/v1", model="m").tokens({"max_tokens": 1})


def _pulled(streamer, key: str) -> list:
    got = []
    while True:
        deltas = [d for d in streamer.pull() if d.key == key]
        got += deltas
        if any(d.finished for d in deltas):
            return got


def test_a_streamed_row_gives_its_tokens_as_they_come(fake_server):
    streamer = OpenAIStreamer(_client(fake_server), SamplingSettings())
    streamer.start("a", Extension([0, 1], 3, 11, {5: 2.0}))
    got = _pulled(streamer, "a")
    assert [i for d in got for i in d.new.ids] == [13, 14, 15]
    assert [x for d in got for x in d.new.logprobs] == [-0.5, -1.0, -1.5]
    body = _Fake.bodies[-1]
    assert body["stream"] is True and body["seed"] == 11 and body["logit_bias"] == {"5": 2.0}
    with pytest.raises(RuntimeError, match="no request running"):
        streamer.pull()  # a finished stream is not running any more
    streamer.close()


def test_a_stopped_stream_is_closed_and_gives_nothing_more(fake_server):
    _Fake.mode = "slow"
    streamer = OpenAIStreamer(_client(fake_server), SamplingSettings())
    streamer.start("a", Extension([0], 3, 1))
    first = streamer.pull()
    assert [d.key for d in first] == ["a"] and not first[0].finished
    streamer.stop(["a"])
    streamer.start("b", Extension([0], 2, 2))
    assert {d.key for d in _pulled(streamer, "b")} == {"b"}  # nothing more of "a"
    time.sleep(0.5)
    assert {"closed_after": 1} in _Fake.bodies or {"closed_after": 2} in _Fake.bodies, _Fake.bodies
    streamer.close()


def test_a_server_that_streams_no_token_ids_is_named(fake_server):
    _Fake.mode = "noids"
    streamer = OpenAIStreamer(_client(fake_server), SamplingSettings())
    streamer.start("a", Extension([0], 2, 1))
    with pytest.raises(ServerError, match="streamed no token ids.*keep_rows false"):
        streamer.pull()
    streamer.close()


@pytest.mark.e2e
def test_a_down_server_is_one_line_and_an_exit_code_and_nothing_is_written(tmp_path, capsys):
    from ksemstamp import cli

    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text('{"id": 1, "prompt": "The council met on Monday."}\n')
    down = ["--sampling.engine", "openai", "--engine.base_url", "http://127.0.0.1:9/v1"]
    down += ["--engine.retries", "0", "--engine.timeout", "2"]
    code = cli.main(["generate", "--prompt", "The council met on Monday.", *down])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: http://127.0.0.1:9/v1/models failed 1 time(s)")
    assert err[-1].endswith("is the server running?")
    # A named model: the first request fails instead, inside an --input run.
    named = [*down, "--engine.served_model", "m", "--quiet"]
    code = cli.main(["generate", "--input", str(prompts), "--output", str(out), *named])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: http://127.0.0.1:9/v1/completions failed")
    assert not out.exists() or out.read_text() == ""
