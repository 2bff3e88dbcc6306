"""``sampling.engine: openai``: candidates sampled by an OpenAI-compatible completions server.

``OpenAIStreamer`` is a ``stream.TokenStreamer`` that sends every extension as one request to
``{engine.base_url}/completions``: the prompt as token ids, ``n = 1``, its own ``seed``,
``max_tokens``, the sampling settings and the steering bias as a sparse ``logit_bias`` (the
``engine.bias_entries`` largest entries). ``vllm serve`` takes all of them and returns the
sampled ids (``return_token_ids``); a server that returns text only has it tokenised here. Up to ``engine.concurrency`` requests are in
flight at once; a refused connection, a timeout, a 429 or a 5xx is tried again
``engine.retries`` times with a growing pause, and then stops the run with one line naming the
server (``ServerError``): what was written before stays, and a resumed run goes on from there.

The API key, if any, is read from the environment variable ``engine.api_key_env``; the
tokenizer is ``model.lm``'s, loaded here (it must be the served model's)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .engine import EngineUnavailable
from .stream import Extension, Sampled, StreamEngine, api_sampling, lm_facts, served_path

SHOWN = 300
"""Characters of a server's answer an error message quotes."""
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ServerError(EngineUnavailable):
    """The completions server could not be used (down, refusing, or answering garbage)."""


class OpenAIStreamer:
    """Samples rows through an OpenAI-compatible completions server (see the module docstring).

    Args:
        client: a ``Client`` for the server.
        sampling: the sampling settings.
    """

    def __init__(self, client: Client, sampling: Any) -> None:
        self.client = client
        self.params = api_sampling(sampling)
        self.pool = ThreadPoolExecutor(max_workers=client.concurrency)

    def body(self, job: Extension) -> dict[str, Any]:
        """The request of one extension."""
        body: dict[str, Any] = {
            "model": self.client.model,
            "prompt": job.ids,
            "n": 1,
            "seed": job.seed,
            "max_tokens": job.max_tokens,
            "ignore_eos": True,
            "return_token_ids": True,
            "logprobs": 0,
            **self.params,
        }
        if job.bias:
            body["logit_bias"] = {str(k): v for k, v in job.bias.items()}
        return body

    def extend(self, jobs: Sequence[Extension]) -> list[Sampled]:
        return list(self.pool.map(lambda job: self.client.tokens(self.body(job)), jobs))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Client:
    """Requests to one server, with retries (see the module docstring).

    Args:
        base_url: the API root (``http://127.0.0.1:8000/v1``).
        model: the served model's name (``None``: the server's first model).
        api_key: sent as a bearer token when given.
        timeout: seconds one request may take.
        retries: tries after a failed one.
        concurrency: requests in flight at once.
        tokenizer: tokenises a choice that comes back as text only.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None,
        api_key: str | None,
        timeout: float,
        retries: int,
        concurrency: int,
        tokenizer: Any,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.concurrency = concurrency
        self.tokenizer = tokenizer
        self.model = model or self.first_model()

    def first_model(self) -> str:
        """The first model the server lists."""
        answer = self.call("GET", "/models", None)
        try:
            return str(answer["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as err:
            raise ServerError(
                f"{self.base_url}/models listed no model: {_cut(answer)}; set engine.served_model"
            ) from err

    def tokens(self, body: dict[str, Any]) -> Sampled:
        """The token ids of the first choice of a completion, with their log-probabilities
        where the server gave one per id."""
        answer = self.call("POST", "/completions", body)
        try:
            choice = answer["choices"][0]
            ids = choice.get("token_ids")
            if ids is None:
                ids = self.tokenizer(choice["text"], add_special_tokens=False)["input_ids"]
            ids = [int(i) for i in ids]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            raise ServerError(
                f"{self.base_url}/completions answered without a completion: {_cut(answer)}"
            ) from err
        ids = ids[: body["max_tokens"]]
        return Sampled(ids, choice_logprobs(choice, len(ids)))

    def call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """The server's JSON answer, tried again on a passing failure."""
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(2.0 ** (attempt - 1), 30.0))
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as err:
                detail = err.read().decode("utf-8", "replace")
                last = f"HTTP {err.code}: {_cut(detail)}"
                if err.code in RETRY_STATUS:
                    continue
                raise ServerError(f"{url} refused the request ({last})") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
                last = str(getattr(err, "reason", err))
                continue
            try:
                return json.loads(raw)
            except ValueError:
                raise ServerError(f"{url} answered with no JSON: {_cut(raw)}") from None
        tries = self.retries + 1
        raise ServerError(f"{url} failed {tries} time(s): {last}; is the server running?")


def _cut(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


class OpenAIEngine(StreamEngine):
    """A ``StreamEngine`` over an OpenAI-compatible server (``sampling.engine: openai``)."""

    @classmethod
    def from_settings(cls, settings: Any, splitter: Any, lm: Any = None) -> OpenAIEngine:
        """The engine of ``settings`` (``WatermarkSettings``): the server of the ``engine``
        group, with ``model.lm``'s tokenizer (``lm``: another name of it; a loaded pair is not
        used)."""
        name = lm if isinstance(lm, str) else settings.model.lm
        tokenizer, vocab, context = lm_facts(served_path(name))
        eng = settings.engine
        key = os.environ.get(eng.api_key_env) or None
        client = Client(
            eng.base_url,
            eng.served_model,
            key,
            eng.timeout,
            eng.retries,
            eng.concurrency,
            tokenizer,
        )
        streamer = OpenAIStreamer(client, settings.sampling)
        return cls.of(streamer, tokenizer, splitter, settings, vocab, context)


def choice_logprobs(choice: dict[str, Any], count: int) -> list[float] | None:
    """The sampled tokens' log-probabilities of a completion choice (``logprobs.token_logprobs``),
    or ``None`` when the server gave no number for each of its ``count`` ids."""
    try:
        values = [float(v) for v in choice["logprobs"]["token_logprobs"][:count]]
    except (KeyError, TypeError, ValueError):
        return None
    return values if len(values) == count else None
