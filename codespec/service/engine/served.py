"""A served engine as the target: codespec's doors in front of vLLM (``serve --engine-url``).

Everything that needs the editor's machine stays here: the doors, the prompt formats and windows,
the index and history, request validation. Generation goes to the engine's OpenAI-compatible API
(``/v1/completions``, streamed) with the prompt as **token ids** rendered here, so the engine runs
exactly the prompt codespec built, and the engine's stop tokens are codespec's end markers.
The engine drafts on its side (codespec's proposer inside vLLM, ``vllm_proposer``; docs/vllm.md),
from the request's reference (a client's prediction) where it has one, sent in ``vllm_xargs``.

Each request is one HTTP connection, streamed on its own thread; a watcher closes the
connection of a request that is cancelled or past its deadline, which makes vLLM abort it (a
streaming request whose client went away is aborted, not run to its end). A refused connection,
an engine error or an engine that says nothing for ``READ_TIMEOUT_S`` fails only that request,
with a message naming the engine; the next request connects afresh, so the server keeps serving
when the engine comes back.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, cast

from codespec.core.config import SamplingParams
from codespec.core.decode import repeating_tail
from codespec.core.default_model import target_path
from codespec.core.draft import REFERENCE_ARG
from codespec.core.errors import CodespecError, InvalidRequestError
from codespec.core.finish import FinishReason
from codespec.core.model import locate_model
from codespec.core.prompts import PromptFormat, resolve_format
from codespec.core.stats import RequestStats, StepRecord
from codespec.core.target import TokenizerTarget
from codespec.service.engine.jobs import Job, JobEnding, PreparedPrompt
from codespec.service.engine.service import COMPLETION_STOP_REPEATS, EngineService

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 3.0  # an engine that does not accept a connection in this long is down
READ_TIMEOUT_S = 60.0  # an engine silent this long inside a request (without a deadline) is stuck
WATCH_INTERVAL_S = 0.02  # how often cancellations and deadlines are checked (the abort's delay)
REPEAT_WINDOW = 64  # output tokens a completion's loop check looks at


class EngineUnavailable(CodespecError):
    """The served engine refused, failed or did not answer."""


@dataclass(frozen=True)
class ServedDevice:
    type: str = "served"  # not "cpu": the engine's device sizes the default windows like a GPU's


@dataclass
class ServedTarget(TokenizerTarget):
    """The Target contract's prompt side for an engine that runs the model elsewhere: the local
    tokenizer (the engine's own files), its prompt format and the engine's context length."""

    prompt_format: PromptFormat | None = None
    max_context: int = 4096
    engine_model: str = ""
    device: ServedDevice = field(default_factory=ServedDevice)
    parameter_count: int = 0  # the engine's model, not measured here
    kv_capacity: int | None = None  # the engine keeps the caches
    threads: int | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def new_cache(self):
        raise CodespecError("a served target keeps no KV cache here (the engine does)")

    def forward(self, *args, **kwargs):
        raise CodespecError("a served target runs no forward here (the engine does)")

    forward_many = forward


class EngineEndpoint:
    """The engine's OpenAI-compatible HTTP API at ``url`` (``http://host:port``, optionally ``/v1``)."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise CodespecError(f"--engine-url {url!r}: expected http://HOST:PORT")
        self.url = url
        self.https = parsed.scheme == "https"
        self.host = parsed.hostname
        self.port = parsed.port or (443 if self.https else 80)
        base = parsed.path.rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.api_key = api_key

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout)

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def get_json(self, path: str, timeout: float = CONNECT_TIMEOUT_S) -> Any:
        return self.request_json("GET", path, None, timeout)

    def post_json(self, path: str, body: dict, timeout: float = CONNECT_TIMEOUT_S) -> Any:
        return self.request_json("POST", path, json.dumps(body), timeout)

    def request_json(self, method: str, path: str, payload: str | None, timeout: float) -> Any:
        connection = self.connect(timeout)
        try:
            connection.request(method, self.base + path, payload, headers=self.headers())
            response = connection.getresponse()
            data = response.read()
            if response.status != 200:
                raise EngineUnavailable(
                    f"the engine at {self.url} answered {path} with {response.status}: {data[:200]!r}"
                )
            return json.loads(data)
        except (OSError, http.client.HTTPException) as error:
            raise EngineUnavailable(f"the engine at {self.url} is unreachable ({error}); is it running?") from None
        finally:
            connection.close()

    def served_model(self, wanted: str | None = None) -> tuple[str, int | None]:
        """The model name to ask for and its context length (vLLM reports ``max_model_len``)."""
        models = self.get_json("/v1/models").get("data") or []
        if not models:
            raise EngineUnavailable(f"the engine at {self.url} serves no model")
        chosen = next((m for m in models if m.get("id") == wanted), None) if wanted else models[0]
        if chosen is None:
            names = ", ".join(str(m.get("id")) for m in models)
            raise CodespecError(f"the engine at {self.url} does not serve {wanted!r} (it serves {names})")
        return str(chosen["id"]), chosen.get("max_model_len")


@dataclass
class Stream:
    """One request streaming from the engine (the watcher's view of it)."""

    job: Job
    deadline: float | None  # time.monotonic() past which it stops
    connection: http.client.HTTPConnection | None = None
    stopped: FinishReason | None = None  # why the watcher closed it: cancelled, deadline or repetition
    cached: int = 0  # prompt tokens the engine's prefix cache held (its usage says)


class ServedGeneration:
    """Generation by a served engine (see the module doc): each request one streamed HTTP call,
    ended through the engine service it is attached to (``EngineService.finish_job``)."""

    def __init__(self, target: ServedTarget, endpoint: EngineEndpoint, max_batch: int = 8) -> None:
        self.endpoint = endpoint
        self.served = target
        self._streams: dict[int, Stream] = {}
        self._streams_lock = threading.Lock()
        self._closed = False
        self._engine: JobEnding | None = None
        self._stop_token_ids: frozenset[int] = frozenset()
        # one thread per request in flight; the engine batches them (the doors bound how many arrive)
        self._streamers = concurrent.futures.ThreadPoolExecutor(4 * max_batch, thread_name_prefix="codespec-served")
        self._watcher = threading.Thread(target=self._watch, name="codespec-served-watch", daemon=True)
        self._watcher.start()

    def attach(self, engine: JobEnding) -> None:
        self._engine = engine
        self._stop_token_ids = frozenset(engine.stop_token_ids)

    @property
    def engine(self) -> JobEnding:
        assert self._engine is not None, "attach() comes first (EngineService does it)"
        return self._engine

    # ---- engine thread: a request leaves for the engine at once ---------------------------------
    def start(self, job: Job, prepared: PreparedPrompt) -> None:
        request = job.request
        prompt_ids = prepared.prompt_ids
        if not request.kind.decodes:  # a background prefill: one token warms the engine's prefix cache
            body = self._body(prompt_ids, 1, SamplingParams(), ())
        else:
            assert prepared.rendered is not None
            max_tokens = request.max_tokens + prepared.reference_tokens
            max_tokens = max(1, min(max_tokens, self.served.max_context - len(prompt_ids)))
            sampling = request.sampling
            stop = (*request.stop, *prepared.rendered.stop)
            body = self._body(prompt_ids, max_tokens, sampling, stop, request.reference)
        deadline = None if request.deadline_s is None else time.monotonic() + request.deadline_s
        stream = Stream(job, deadline)
        with self._streams_lock:
            self._streams[id(job)] = stream
        self._streamers.submit(self._stream, stream, body)

    def _body(
        self, prompt_ids: list[int], max_tokens: int, sampling, stop: tuple[str, ...], reference: str | None = None
    ) -> dict:
        body: dict[str, Any] = {
            "model": self.served.engine_model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            # vLLM's extensions: codespec's end markers as stop tokens, the ids of each delta
            "stop_token_ids": sorted(self._stop_token_ids),
            "return_token_ids": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if stop:
            body["stop"] = list(stop)
        if reference:  # the prediction (or the code being rewritten): codespec's proposer in vLLM drafts it
            body["vllm_xargs"] = {REFERENCE_ARG: reference}
        return body

    # ---- a streaming thread per request ----------------------------------------------------------
    def _stream(self, stream: Stream, body: dict) -> None:
        job = stream.job
        started = time.perf_counter()
        stats = RequestStats()
        pieces: list[str] = []
        tokens: list[int] = []
        reason: FinishReason = FinishReason.LENGTH
        try:
            reason = self._read(stream, body, stats, pieces, tokens, started)
        except Exception as error:
            if stream.stopped is None:
                self.engine.fail_job(job, error)
                self._forget(stream)
                return
        if stream.stopped is not None:
            reason = stream.stopped
        self._forget(stream)
        if pieces or reason != FinishReason.LENGTH or stats.steps:
            stats.ttft_s.append(stats.steps[0].end_s if stats.steps else time.perf_counter() - started)
        text = "".join(pieces) if job.request.kind.decodes else ""
        job.cached_len = stream.cached
        self.engine.finish_job(job, text, reason, stats)

    def _read(
        self, stream: Stream, body: dict, stats: RequestStats, pieces: list, tokens: list, started: float
    ) -> FinishReason:
        job = stream.job
        timeout = READ_TIMEOUT_S
        if stream.deadline is not None:
            timeout = max(0.05, min(timeout, stream.deadline - time.monotonic()))
        # The watcher can only shut a socket that exists: a stream it stopped before this thread
        # connected (cancelled at once, a keystroke later) is checked here, before and after connecting.
        if stream.stopped is not None:
            return stream.stopped
        connection = self.endpoint.connect(min(timeout, CONNECT_TIMEOUT_S))
        stream.connection = connection
        try:
            connection.request(
                "POST", self.endpoint.base + "/v1/completions", json.dumps(body), self.endpoint.headers()
            )
            if stream.stopped is not None:
                return stream.stopped
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            if stream.stopped is not None:
                return stream.stopped
            if isinstance(error, TimeoutError | socket.timeout):
                raise EngineUnavailable(
                    f"the engine at {self.endpoint.url} did not answer within {timeout:.1f} s"
                ) from None
            raise EngineUnavailable(
                f"the engine at {self.endpoint.url} is unreachable ({error}); is it running?"
            ) from None
        if response.status != 200:
            raise engine_error(self.endpoint.url, response.status, response.read())
        reason: FinishReason = FinishReason.LENGTH
        last = started
        repeats = COMPLETION_STOP_REPEATS if job.request.kind.stops_on_repeats else 0
        while True:
            if stream.stopped is not None:
                return stream.stopped
            try:
                line = response.readline()
            except (OSError, http.client.HTTPException) as error:
                if stream.stopped is not None:
                    return stream.stopped
                if isinstance(error, TimeoutError | socket.timeout):
                    raise EngineUnavailable(
                        f"the engine at {self.endpoint.url} sent nothing for {timeout:.1f} s"
                    ) from None
                raise EngineUnavailable(f"the engine at {self.endpoint.url} broke the stream ({error})") from None
            if not line:
                return stream.stopped or reason
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return reason
            chunk = json.loads(data)
            if "error" in chunk:
                raise engine_error(self.endpoint.url, 500, data)
            usage = chunk.get("usage")
            if usage:
                stream.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or ""
                ids = choice.get("token_ids") or []
                now = time.perf_counter()
                if text or ids:
                    stats.steps.append(StepRecord("", 0, 0, len(ids) or 1, 0.0, now - last, now - started))
                    last = now
                    tokens.extend(ids)
                    if text:
                        pieces.append(text)
                        if job.on_delta is not None and job.request.kind.decodes:
                            job.on_delta(text)
                finish = choice.get("finish_reason")
                if finish is not None:
                    reason = finish_reason(finish, choice.get("stop_reason"))
                if repeats and tokens and _repeating(tokens, repeats):
                    stream.stopped = FinishReason.REPETITION
                    return FinishReason.REPETITION

    def _forget(self, stream: Stream) -> None:
        with self._streams_lock:
            self._streams.pop(id(stream.job), None)
        if stream.connection is not None:
            stream.connection.close()

    def _watch(self) -> None:
        """Close the connection of each stream that is cancelled or past its deadline (vLLM aborts it)."""
        while not self._closed or self._streams:
            now = time.monotonic()
            with self._streams_lock:
                streams = list(self._streams.values())
            for stream in streams:
                if stream.stopped is not None:
                    continue
                if stream.job.cancelled or self._closed:
                    stream.stopped = FinishReason.CANCELLED
                elif stream.deadline is not None and now >= stream.deadline:
                    stream.stopped = FinishReason.DEADLINE
                else:
                    continue
                connection = stream.connection
                if connection is not None and connection.sock is not None:
                    try:
                        connection.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            time.sleep(WATCH_INTERVAL_S)

    def close(self) -> None:
        """After the engine service closed: every stream stops (the watcher marks it cancelled),
        the queued ones too, and each job still gets its answer."""
        self._closed = True
        self._streamers.shutdown(wait=True)
        self._watcher.join(timeout=5)


def finish_reason(finish: str, stop_reason: Any) -> FinishReason:
    """The engine's finish reason in codespec's words: vLLM says "stop" for an end token (its
    ``stop_reason`` is then None or the token id) and for a stop string (the string)."""
    if finish == "length":
        return FinishReason.LENGTH
    if finish == "stop":
        return FinishReason.STOP if isinstance(stop_reason, str) else FinishReason.EOS
    if finish == "abort":
        return FinishReason.CANCELLED
    return FinishReason.STOP  # a reason this codespec does not know: the engine ended the text


def engine_error(url: str, status: int, body: bytes) -> CodespecError:
    """The engine's error as the door's: its 400s are the request's fault, the rest the engine's."""
    try:
        parsed = json.loads(body)
        error = parsed.get("error", parsed)
        message = error.get("message") if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = body[:300].decode("utf-8", "replace")
    if status in (400, 422):
        return InvalidRequestError(f"the engine refused the request: {message}")
    return EngineUnavailable(f"the engine at {url} failed the request ({status}): {message}")


def _repeating(tokens: list[int], repeats: int) -> bool:
    return repeating_tail(tokens[-REPEAT_WINDOW:], repeats)


def load_served(options, engine_url: str, engine_model: str | None = None, api_key: str | None = None) -> EngineService:
    """The engine service for ``serve --engine-url``: the local tokenizer (``--model``, default
    the shipped model's) checked against the engine's, the engine's context length."""
    from transformers import AutoTokenizer

    endpoint = EngineEndpoint(engine_url, api_key)
    name, max_len = endpoint.served_model(engine_model)
    tokenizer = AutoTokenizer.from_pretrained(
        locate_model(options.engine.model or str(target_path())), local_files_only=True
    )
    check_tokenizer(endpoint, name, tokenizer)
    target = ServedTarget(
        tokenizer,
        name=f"{name} at {engine_url}",
        prompt_format=resolve_format(tokenizer, options.engine.prompt_format),
        max_context=int(max_len or 4096),
        engine_model=name,
    )
    return EngineService(
        cast(Any, target),  # the prompt side of the Target contract; the engine runs the model
        proposer="none",
        cached_documents=options.engine.cached_documents,
        max_batch=options.engine.max_batch,
        max_cached_tokens=options.engine.max_cached_tokens,
        generation=ServedGeneration(target, endpoint, options.engine.max_batch or 8),
    )


PROBE = "def probe(x):\n    return x  # codespec<|file_sep|>"


def check_tokenizer(endpoint: EngineEndpoint, model: str, tokenizer) -> None:
    """Prompts go to the engine as token ids, so its tokenizer must be this one: compared on a probe
    through vLLM's ``/tokenize`` (an engine without it is trusted, with a warning)."""
    mine = tokenizer.encode(PROBE, add_special_tokens=False)
    try:
        theirs = endpoint.post_json("/tokenize", {"model": model, "prompt": PROBE, "add_special_tokens": False})
    except EngineUnavailable as error:
        log.warning("could not compare tokenizers with the engine (%s); prompts are sent as token ids", error)
        return
    if list(theirs.get("tokens") or []) != mine:
        raise CodespecError(
            f"the engine's model {model!r} tokenizes differently from the local tokenizer; pass --model "
            "with the engine's checkpoint (its tokenizer files are enough)"
        )
