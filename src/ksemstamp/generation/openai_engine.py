"""``sampling.engine: openai``: candidates sampled by an OpenAI-compatible completions server.

``OpenAIStreamer`` is a ``stream.TokenStreamer`` that sends every extension as one request to
``{engine.base_url}/completions``: the prompt as token ids, ``n = 1``, its own ``seed``,
``max_tokens``, the sampling settings and the steering bias as a sparse ``logit_bias`` (the
``engine.bias_entries`` largest entries). ``vllm serve`` takes all of them and returns the
sampled ids (``return_token_ids``); a server that returns text only has it tokenised here. Up to
``engine.concurrency`` such requests are in flight at once; a refused connection, a timeout, a 429 or a 5xx is tried again
``engine.retries`` times with a growing pause, and then stops the run with one line naming the
server (``ServerError``): what was written before stays, and a resumed run goes on from there.

With ``engine.keep_rows`` (the default) a row is one streamed request instead (``"stream":
true``, a ``live.LiveStreamer``): its tokens arrive as the server samples them, read by a thread
per row, and a row that is done or pruned is stopped by closing its connection (vLLM then aborts
the request). A server that streams no token ids is named in one line
(``engine.keep_rows false`` then works with it).

The API key, if any, is read from the environment variable ``engine.api_key_env``; the
tokenizer is ``model.lm``'s, loaded here (it must be the served model's)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .engine import EngineUnavailable
from .live import Delta, LiveEngine
from .stream import Extension, Sampled, api_sampling, lm_facts, served_path

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
        self._live: dict[str, socket.socket | None] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[Delta | Exception] = queue.Queue()

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

    def start(self, key: str, job: Extension) -> None:
        """Stream ``job`` as one request, read by a thread of its own."""
        with self._lock:
            self._live[key] = None
        body = {**self.body(job), "stream": True}
        threading.Thread(target=self._read, args=(key, body), daemon=True).start()

    def _attach(self, key: str, sock: socket.socket) -> bool:
        with self._lock:
            if key not in self._live:
                return False
            self._live[key] = sock
            return True

    def _read(self, key: str, body: dict[str, Any]) -> None:
        finished = False
        try:
            for ids, logprobs, finished in self.client.stream(body, lambda c: self._attach(key, c)):
                if key not in self._live:
                    return
                self._queue.put(Delta(key, Sampled(ids, logprobs), finished))
            if not finished and key in self._live:  # the stream ended without saying so
                self._queue.put(Delta(key, Sampled([]), True))
        except ServerError as err:
            if key in self._live:
                self._queue.put(err)
        except (OSError, ValueError, http.client.HTTPException) as err:
            if key in self._live:  # not closed by ``stop``: the server broke off
                self._queue.put(
                    ServerError(f"{self.client.base_url}/completions broke off a stream: {err}")
                )
        except Exception as err:  # anything else: raised where the caller pulls, not lost
            self._queue.put(err)

    def pull(self) -> list[Delta]:
        """The tokens the running streams gave since the last pull (waits up to
        ``engine.timeout`` for the first)."""
        if not self._live:
            raise RuntimeError("pull with no request running")
        try:
            items = [self._queue.get(timeout=self.client.timeout)]
        except queue.Empty:
            self.stop(list(self._live))
            raise ServerError(
                f"{self.client.base_url}/completions sent no token in {self.client.timeout:g} s"
            ) from None
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        deltas = []
        for item in items:
            if isinstance(item, Exception):
                self.stop(list(self._live))
                raise item
            if item.key in self._live:
                if item.finished:
                    self.stop([item.key])
                deltas.append(item)
        return deltas

    def stop(self, keys: Sequence[str]) -> None:
        """Close the streams ``keys`` (a vLLM server aborts a request whose client left)."""
        with self._lock:
            socks = [self._live.pop(k, None) for k in keys]
        for sock in socks:
            if sock is not None:
                with contextlib.suppress(OSError):  # closed by the server already
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.stop(list(self._live))
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

    def stream(
        self, body: dict[str, Any], attach: Callable[[socket.socket], bool]
    ) -> Iterator[tuple[list[int], list[float] | None, bool]]:
        """The token ids, their log-probabilities and whether the request is finished, of each
        event of a streamed completion; connecting is tried again as ``call`` does. ``attach``
        sees the connection's socket first (``False``: the stream is not wanted any more)."""
        url = self.base_url + "/completions"
        parts = urllib.parse.urlsplit(url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(2.0 ** (attempt - 1), 30.0))
            conn = kind(parts.hostname or "", parts.port, timeout=self.timeout)
            try:
                conn.connect()
                # The socket itself: the connection lets go of it once a response is read.
                if conn.sock is None or not attach(conn.sock):
                    conn.close()
                    return
                conn.request("POST", parts.path, json.dumps(body), self._headers())
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                last = str(err)
                continue
            if response.status == 200:
                break
            last = f"HTTP {response.status}: {_cut(response.read())}"
            conn.close()
            if response.status not in RETRY_STATUS:
                raise ServerError(f"{url} refused the request ({last})")
        else:
            tries = self.retries + 1
            raise ServerError(f"{url} failed {tries} time(s): {last}; is the server running?")
        try:
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    choice = json.loads(data)["choices"][0]
                    ids = [int(i) for i in choice["token_ids"]]
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise ServerError(
                        f"{url} streamed no token ids ({_cut(data)}); set engine.keep_rows false"
                    ) from err
                yield (
                    ids,
                    choice_logprobs(choice, len(ids)),
                    choice.get("finish_reason") is not None,
                )
        finally:
            response.close()
            conn.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """The server's JSON answer, tried again on a passing failure."""
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers()
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


class OpenAIEngine(LiveEngine):
    """A ``live.LiveEngine`` over an OpenAI-compatible server (``sampling.engine: openai``)."""

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
