"""Rows kept running across pruning checks (``generation.live``) over a scripted backend that
runs ahead of its caller: the same candidates as the chunked rounds, pruning checks at exactly
their token, every sampled token counted once, and no request left running after a round.
No model and no vLLM (``tests/test_vllm.py`` runs the real engine).
"""

from __future__ import annotations

import pytest
import torch

from ksemstamp.generation.draw import draw_round
from ksemstamp.generation.engine import Pruner, PruneVerdict, RoundRequest
from ksemstamp.generation.live import Delta, LiveEngine, LiveRound, LiveStreamer
from ksemstamp.generation.stream import MAX_BIAS, Sampled, StreamEngine, StreamRound
from ksemstamp.text.splitter import get_splitter
from tests.test_stream_engine import (
    EOS,
    PIECES,
    DenseBias,
    ScriptedStreamer,
    WordTokenizer,
    _ids,
)


class LiveScripted(ScriptedStreamer):
    """The scripted rows of ``ScriptedStreamer``, kept running: every pull gives each running
    request its next ``ahead`` tokens (a backend that runs ahead of the caller)."""

    def __init__(self, ahead: int = 3) -> None:
        super().__init__(logprobs=True)
        self.ahead = ahead
        self.queues: dict[str, list[int]] = {}
        self.started: list[tuple[str, object]] = []
        self.stopped: list[str] = []

    def start(self, key, job) -> None:
        self.started.append((key, job))
        self.queues[key] = self.extend([job])[0].ids
        self.returned -= len(self.queues[key])  # counted as they are pulled

    def pull(self) -> list[Delta]:
        assert self.queues, "pulled with nothing running"
        out = []
        for key in list(self.queues):
            new, rest = self.queues[key][: self.ahead], self.queues[key][self.ahead :]
            self.returned += len(new)
            self.queues[key] = rest
            if not rest:
                del self.queues[key]
            out.append(Delta(key, Sampled(new, [-t / 10 for t in new]), not rest))
        return out

    def stop(self, keys) -> None:
        self.stopped += list(keys)
        for key in keys:
            self.queues.pop(key, None)


def _engine(streamer, chunk: int = 4, keep_rows: bool = True, context=None) -> StreamEngine:
    return LiveEngine(
        streamer,
        WordTokenizer(),
        get_splitter("sentences"),
        len(PIECES),
        12,
        context_length=context,
        chunk_tokens=chunk,
        bias_entries=3,
        suppress=[EOS],
        keep_rows=keep_rows,
    )


def _request(bias=None) -> RoundRequest:
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    return RoundRequest.of(["Once upon a time.", "Long ago."], [3, 2], gens, bias=bias)


def _reject_all(places, texts):
    return [(False, None)] * len(texts)


def _candidates(results):
    return [[(c.text, c.num_tokens, c.pruned, c.fluency) for c in r.candidates] for r in results]


def test_a_live_streamer_gets_live_rounds_unless_rows_are_not_kept():
    assert isinstance(LiveScripted(), LiveStreamer)
    assert isinstance(_engine(LiveScripted()).open(_request()), LiveRound)
    chunked = _engine(LiveScripted(), keep_rows=False).open(_request())
    assert type(chunked) is StreamRound
    assert type(_engine(ScriptedStreamer()).open(_request())) is StreamRound


@pytest.mark.parametrize("ahead", [1, 3, 20])
def test_live_rows_give_the_chunked_rounds_candidates_and_count_every_token_once(ahead):
    live = _engine(LiveScripted(ahead))
    chunked = _engine(ScriptedStreamer(logprobs=True))
    got = draw_round(live, _request(), _reject_all)
    want = draw_round(chunked, _request(), _reject_all)
    assert _candidates(got) == _candidates(want)
    # Every token the backend sampled is some row's decoded token, tokens past an end too.
    assert sum(r.decoded_tokens for r in got) == live.streamer.returned
    assert not live.streamer.queues  # nothing left running
    if ahead == 1:  # one token a step, as vLLM's engine: a row stops at its unit's end,
        assert live.streamer.returned < chunked.streamer.returned  # not at a chunk's


def test_a_pruner_sees_each_row_at_its_check_though_the_backend_runs_ahead():
    streamer = LiveScripted(ahead=5)
    seen = []

    def decide(tokens, rows, texts, finished):
        seen.extend((tokens, len(_ids(t))) for t in texts)
        return [i % 2 == 0 for i in range(len(rows))]  # every other row stops

    draw_round(_engine(streamer), _request(), _reject_all, Pruner(2, decide))
    assert seen and all(tokens == n for tokens, n in seen)
    assert streamer.stopped  # pruned rows are stopped in the backend ...
    assert not streamer.queues  # ... and the round leaves nothing running


def test_steering_a_row_anew_restarts_it_from_its_tokens_with_the_new_bias():
    streamer = LiveScripted(ahead=4)

    def decide(tokens, rows, texts, finished):
        bias = torch.zeros(len(rows), len(PIECES))
        bias[:, 9] = 2.0
        return PruneVerdict([True] * len(rows), DenseBias(bias))

    draw_round(_engine(streamer), _request(), _reject_all, Pruner(2, decide))
    restarted = [job for _, job in streamer.started if job.bias and 9 in job.bias]
    assert restarted
    for job in restarted:
        assert job.bias[9] == 2.0 and len([t for t in job.ids if t != 0]) == 2
    assert not streamer.queues


def test_a_request_the_backend_ends_early_is_an_empty_candidate_not_a_hang():
    # A context of prompt + 3 tokens: no unit fits, the backend ends every row's request.
    streamer = LiveScripted(ahead=2)
    engine = _engine(streamer, context=4 + 3)  # the prompt is 4 filler tokens
    results = draw_round(engine, RoundRequest.of(["Once upon a time."], [2]), _reject_all)
    assert [c.text for c in results[0].candidates] == ["", ""]
    assert not streamer.queues


@pytest.mark.parametrize("same", [False, True])
def test_a_row_steered_at_every_step_restarts_only_when_its_bias_changes(same):
    streamer = LiveScripted(ahead=4)
    engine = _engine(streamer)
    engine.steers_per_step = True
    start = torch.zeros(2, len(PIECES))
    start[:, 9] = 1.0

    def decide(tokens, rows, texts, finished):
        bias = start[[p[0] for p in rows]].clone()
        if not same:
            bias[:, 9] = 2.0
        return PruneVerdict([True] * len(rows), DenseBias(bias))

    draw_round(engine, _request(DenseBias(start)), _reject_all, Pruner(2, decide))
    restarted = [job for _, job in streamer.started if job.steer_bias.values[0, 9] == 2.0]
    assert bool(restarted) != same
    assert len(streamer.started) == (5 if same else 5 + len(restarted))
    for job in restarted:  # from the row's tokens so far, the sparse bias only suppresses
        assert len([t for t in job.ids if t != 0]) == 2 and job.bias == {EOS: -MAX_BIAS}
    assert not streamer.queues
