"""llama.cpp server's API on the HTTP door, for the editor plugins written for it (llama.vim,
llama.vscode): ``POST /infill``, ``POST /completion``, ``GET /health``, ``GET /props``,
``POST /tokenize``, ``POST /detokenize`` (docs/http.md "llama.cpp server API").

The same engine, token and Origin rules as the OpenAI routes (``http_api.server``'s Guard runs
first; both plugins send ``Authorization: Bearer`` from their ``api_key`` setting). An ``/infill``
is codespec's completion at the cursor (``service.inline``), the document being ``input_prefix +
prompt + input_suffix``. Its ``input_extra`` chunks are not put in the prompt, so the output is what
it would be without them; they are drafting material: their tokens go with the request to the
material lookup (``proposers.material``), and each new chunk goes once into the workspace's session
history when the server has an index. The plugins resend the same chunks every keystroke, so each
chunk is tokenized once (an LRU here) and its n-gram table built once (``proposers.material``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from codespec import __version__
from codespec.http_api.llama_schema import (
    CompletionBody,
    ExtraChunk,
    InfillBody,
    LlamaCall,
    Timings,
    parse_completion,
    parse_detokenize,
    parse_infill,
    parse_tokenize,
    props_body,
    select_fields,
    stop_type,
)
from codespec.http_api.routes import SSE_HEADERS, HttpDoor, JobRun, job_failure, send_json
from codespec.http_api.schema import ApiError, sse
from codespec.proposers.token_bytes import TokenBytes
from codespec.service.engine.jobs import JobResult
from codespec.service.requests.inline import completion_request
from codespec.service.requests.schema import GenerationRequest, prompt_request

MATERIAL_CACHE_CHUNKS = 256  # chunks whose tokens are kept (llama.vim resends its 16 every request)
MAX_MATERIAL_TOKENS = 1 << 16  # the newest chunks' tokens a request drafts from, at most
HISTORY_KIND = "input_extra"  # the session history's kind for the chunks


class ChunkTokens:
    """Each chunk's token ids, tokenized once with the door's own tokenizer (an LRU)."""

    def __init__(self, door: HttpDoor, max_chunks: int = MATERIAL_CACHE_CHUNKS) -> None:
        self.door = door
        self.max_chunks = max_chunks
        self._tokens: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    async def material(self, chunks: Sequence[ExtraChunk]) -> tuple[tuple[int, ...], ...]:
        """The chunks' token ids, newest last, at most ``MAX_MATERIAL_TOKENS`` in all (the oldest
        chunks go first); a chunk not seen before also goes into the session history."""
        texts = [chunk.text for chunk in chunks if chunk.text]
        new = [text for text in dict.fromkeys(texts) if text not in self._tokens]
        if new:

            def encode(tokenizer) -> list[tuple[int, ...]]:
                return [tuple(tokenizer.encode(text, add_special_tokens=False)) for text in new]

            for text, ids in zip(new, await self.door.tokenizer.run(encode), strict=True):
                self._remember(text, ids)
                self._record_history(text)
        picked: list[tuple[int, ...]] = []
        total = 0
        for text in reversed(texts):
            kept = self._tokens.get(text)
            if kept is None:  # evicted meanwhile by a burst of new chunks: drafted without it
                continue
            ids = kept
            self._tokens.move_to_end(text)
            if total + len(ids) > MAX_MATERIAL_TOKENS:
                break
            picked.append(ids)
            total += len(ids)
        return tuple(reversed(picked))

    def _remember(self, text: str, ids: tuple[int, ...]) -> None:
        with self._lock:
            self._tokens[text] = ids
            while len(self._tokens) > self.max_chunks:
                self._tokens.popitem(last=False)

    def _record_history(self, text: str) -> None:
        service = self.door.service
        if getattr(service, "index", None) is not None:
            service.record_history(HISTORY_KIND, text)  # on the engine thread, between cycles


class Cutoff:
    """llama-server's two FIM stop rules, applied to the text as it streams: ``n_indent`` (a new
    line indented less than that ends the completion, cut before its first non-blank character)
    and ``t_max_predict_ms`` (past that time since the first token, the completion ends at its
    next newline)."""

    def __init__(self, n_indent: int, t_max_predict_ms: float) -> None:
        self.n_indent = n_indent
        self.limit_s = t_max_predict_ms / 1e3
        self.text = ""
        self.first_s: float | None = None
        self.scan = 0  # where the next line to check for its indentation may start
        self.cut = False

    def add(self, delta: str, now: float) -> str:
        """Take ``delta``; return the part of it that stays (all of it, unless a rule cut here)."""
        if self.cut:
            return ""
        if self.first_s is None:
            self.first_s = now
        start = len(self.text)
        text = self.text + delta
        while self.n_indent > 0 and not self.cut:
            newline = text.find("\n", self.scan)
            if newline < 0:
                break
            position = newline + 1
            while position < len(text) and text[position] in " \t":
                position += 1
            if position >= len(text):
                break  # the line's indentation is not complete yet: looked at again with the next delta
            if position - (newline + 1) < self.n_indent:
                self.cut = True
                text = text[:position]
            self.scan = newline + 1
        if not self.cut and self.limit_s > 0 and now - self.first_s > self.limit_s and "\n" in text:
            self.cut = True  # past the time limit with a newline made: end here (as llama-server does)
        kept = text[start:]
        self.text = text
        return kept


class LlamaGeneration(JobRun):
    """One /infill or /completion: JSON (or llama-server's event stream) of its result."""

    def __init__(self, door: HttpDoor, request: GenerationRequest, call: LlamaCall, prompt_param: str) -> None:
        self.door = door
        self.request = request
        self.call = call
        self.prompt_param = prompt_param
        self.cutoff = Cutoff(call.n_indent, call.t_max_predict_ms)

    async def answer(self, send, job, deltas: asyncio.Queue, result: asyncio.Future, gone: asyncio.Future) -> None:
        started = time.perf_counter()
        streaming = False
        while True:
            getter = asyncio.ensure_future(deltas.get())
            await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                return  # the client is gone (llama.vim stops its curl on the next keystroke)
            item = getter.result()
            if item is None:
                break
            kept = self.cutoff.add(item, time.perf_counter())
            if self.call.stream and kept:
                if not streaming:
                    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                    streaming = True
                chunk = {"index": 0, "content": kept, "tokens": [], "stop": False, "id_slot": -1}
                await send({"type": "http.response.body", "body": sse(chunk), "more_body": True})
            if self.cutoff.cut:
                job.cancel()  # stops at its next cycle; what it makes meanwhile is dropped
                await asyncio.wait({result})
                break
        failure = self._failure(result)
        if failure is not None:
            if streaming:
                await send({"type": "http.response.body", "body": sse(failure.body()), "more_body": False})
            else:
                await send_json(send, failure.status, failure.body())
            return
        body = self._body(result.result(), time.perf_counter() - started)
        if streaming:
            await send({"type": "http.response.body", "body": sse(body), "more_body": False})
        else:
            answer = [{**body, "index": i} for i in range(self.call.completions)] if self.call.completions > 1 else body
            await send_json(send, 200, answer)  # type: ignore[arg-type]

    def _failure(self, result: asyncio.Future) -> ApiError | None:
        if result.exception() is None and self.cutoff.cut:
            return None  # cancelled here, by n_indent or t_max_predict_ms: what it made is the answer
        return job_failure(result, self.prompt_param)

    def _body(self, job: JobResult, elapsed_s: float) -> dict:
        usage, stats = job.usage, job.stats
        first_ms = float(stats.get("ttft_ms") or 0.0) if job.usage.completion_tokens else elapsed_s * 1e3
        reason = "limit" if self.cutoff.cut else stop_type(job.reason)
        timings = Timings(
            prompt_n=usage.prompt_tokens - usage.cached_prompt_tokens,
            prompt_ms=first_ms,
            predicted_n=usage.completion_tokens,
            predicted_ms=max(0.0, elapsed_s * 1e3 - first_ms),
        )
        body = {
            "index": 0,
            "content": self.cutoff.text,
            "tokens": [],
            "id_slot": -1,
            "stop": True,
            "model": self.door.model_id,
            "tokens_predicted": usage.completion_tokens,
            "tokens_evaluated": usage.prompt_tokens,
            "generation_settings": {**self.call.settings, "model": self.door.model_id},
            "has_new_line": "\n" in self.cutoff.text,
            "truncated": job.reason == "context",
            "stop_type": reason,
            "stopping_word": "",
            "tokens_cached": usage.cached_prompt_tokens,
            "timings": timings.body(),
            "codespec": {
                "finish_reason": job.reason,
                "proposer": job.proposer,
                "material_tokens": sum(len(chunk) for chunk in self.request.material),
                "speculation": {
                    "drafted_tokens": stats.get("drafted_tokens", 0),
                    "accepted_tokens": stats.get("accepted_tokens", 0),
                    "target_forwards": stats.get("target_forwards", 0),
                    "tokens_per_forward": stats.get("tokens_per_forward", 0.0),
                },
            },
        }
        return body if self.call.stream else select_fields(body, self.call.response_fields)


def _no_generation(door: HttpDoor, call: LlamaCall, material: tuple[tuple[int, ...], ...]) -> dict:
    """``n_predict: 0``: the plugins' way to hand over new chunks ahead of the next completion
    (llama-server evaluates them into its cache; codespec tokenizes them and keeps their tables)."""
    body = {
        "index": 0,
        "content": "",
        "tokens": [],
        "id_slot": -1,
        "stop": True,
        "model": door.model_id,
        "tokens_predicted": 0,
        "tokens_evaluated": 0,
        "generation_settings": {**call.settings, "model": door.model_id},
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": 0,
        "timings": Timings(0, 0.0, 0, 0.0).body(),
        "codespec": {"material_tokens": sum(len(chunk) for chunk in material)},
    }
    return select_fields(body, call.response_fields)


def llama_routes(door: HttpDoor, read_json: Callable[..., Awaitable[dict]]) -> list:
    """The routes, for ``http_api.server.build_app`` to mount beside the OpenAI ones."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    chunk_tokens = ChunkTokens(door)

    def infill_request(body: InfillBody, material: tuple[tuple[int, ...], ...]) -> GenerationRequest:
        before = body.prefix + body.middle
        request, _ = completion_request(
            before + body.suffix,
            len(before),
            door.options,
            door.service.target,
            invoked=True,
            cache_key="llama:infill" if body.call.cache_prompt else None,
            sampling=body.call.sampling,
            deadline=False,
            origin="http",
        )
        return dataclasses.replace(request, material=material)

    def completion_prompt_request(body: CompletionBody) -> GenerationRequest:
        call = body.call
        budget = call.sampling.max_tokens or door.service.target.max_context  # the service caps it at the context
        sampling = dataclasses.replace(call.sampling, stop=call.sampling.stop or ())
        cache_key = "llama:completion" if call.cache_prompt else None
        return prompt_request(body.prompt, budget, sampling=sampling, cache_key=cache_key, origin="http")

    async def infill(request: Request):
        body = parse_infill(await read_json(request))
        material = await chunk_tokens.material(body.extra)
        if body.call.n_predict == 0:
            return JSONResponse(_no_generation(door, body.call, material))
        generation = infill_request(body, material)
        door.check_fits(generation, "input_prefix")  # a 400 at once, never a 429 first
        door.acquire()
        return LlamaGeneration(door, generation, body.call, "input_prefix")

    async def completion(request: Request):
        body = parse_completion(await read_json(request))
        if body.call.n_predict == 0:
            return JSONResponse(_no_generation(door, body.call, ()))
        generation = completion_prompt_request(body)
        door.check_fits(generation, "prompt")
        door.acquire()
        return LlamaGeneration(door, generation, body.call, "prompt")

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    async def props(request: Request):
        body = props_body(
            door.model_id, door.service.target.max_context, door.limits.max_requests, door.running > 0, __version__
        )
        return JSONResponse(body)

    async def tokenize(request: Request):
        body = parse_tokenize(await read_json(request))

        def encode(tokenizer) -> dict:
            ids = tokenizer(
                body.content, add_special_tokens=body.add_special, split_special_tokens=not body.parse_special
            )["input_ids"]
            if not body.with_pieces:
                return {"tokens": ids}
            return {"tokens": [{"id": token, "piece": _piece(tokenizer, token)} for token in ids]}

        return JSONResponse(await door.tokenizer.run(encode))

    async def detokenize(request: Request):
        tokens = parse_detokenize(await read_json(request))

        def decode(tokenizer) -> dict:
            size = len(tokenizer)
            bad = next((token for token in tokens if not 0 <= token < size), None)
            if bad is not None:
                raise ApiError(
                    400, f"token id {bad} is outside the vocabulary (0..{size - 1})", "tokens", "invalid_value"
                )
            return {"content": tokenizer.decode(tokens)}

        return JSONResponse(await door.tokenizer.run(decode))

    return [
        Route("/infill", infill, methods=["POST"]),
        Route("/completion", completion, methods=["POST"]),
        Route("/completions", completion, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]


def _piece(tokenizer, token: int) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (llama-server's ``piece``)."""
    text = tokenizer.decode([token])
    if "\ufffd" not in text:
        return text
    return list(TokenBytes(tokenizer).token(token))
