"""Offered load: N concurrent websocket clients against the real websocket server, in process.

The server is what `codespec serve --ws` runs (``EngineService`` + ``websocket_api.start_ws_server``), bound
to 127.0.0.1 with a fresh token, serving the bench's target (in replay mode the recordings of
the requests are registered on it, keyed by the prompt the server will build, so the load has the
workload's real output lengths and acceptance). Each client is closed-loop: it sends its next
request when the previous one ends. Per concurrency level: request throughput, latency and
time-to-first-token percentiles as the client sees them, and errors; the report names the largest
level whose p95 TTFT stays within the stated objective.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

from bench.replay import Recording
from codespec.core.stats import percentile


def max_within_slo(levels: list[dict], slo_ttft_ms: float) -> int | None:
    """Largest concurrency whose p95 TTFT is within the objective (None if no level is)."""
    good = [
        level["concurrency"]
        for level in levels
        if level["ttft_ms_p95"] is not None and level["ttft_ms_p95"] <= slo_ttft_ms and not level["errors"]
    ]
    return max(good) if good else None


def run_load(target, raw, models, cases, plan, settings, say) -> dict:
    return asyncio.run(_run_load(target, raw, models, cases, plan, settings, say))


def _messages_and_recordings(target, cases, options, settings, end_id):
    from codespec.core.prompts import PromptRenderer, Rewrite
    from codespec.service.requests.inline import completion_request

    prompts = PromptRenderer(target.tokenizer, target.prompt_format)  # as the server renders them
    messages, recordings = [], []
    for case in cases:
        if case.kind == "edit":
            message = {"type": "edit", "text": case.reference, "max_tokens": settings.max_new_tokens}
            if case.instruction:
                message["instruction"] = case.instruction
            prompt = prompts.render(Rewrite(case.reference, case.instruction)).text
        else:
            message = {"type": "complete", "prefix": case.prefix, "suffix": case.suffix, "path": case.uri}
            request, _ = completion_request(
                case.prefix + case.suffix, len(case.prefix), options, target, invoked=True
            )  # as the websocket server builds it
            prompt = prompts.render(request.prompt).text
        messages.append(message)
        if settings.mode == "replay":
            recordings.append(Recording(tuple(target.encode(prompt)), tuple(target.encode(case.output)), end_id))
    return messages, recordings


async def _run_load(target, raw, models, cases, plan, settings, say) -> dict:
    from codespec.service.doors.auth import Listen
    from codespec.service.engine.runtime import close_service
    from codespec.service.engine.service import EngineService
    from codespec.service.requests.options import CompletionOptions, EngineOptions, ServerOptions, WsLimits
    from codespec.websocket_api import bound_port, start_ws_server

    options = ServerOptions(
        engine=EngineOptions(max_draft=settings.draft_len), completion=CompletionOptions(deadline_ms=600_000)
    )
    from codespec.proposers.setup import DraftConfig, ProposerConfig

    config = ProposerConfig(draft=DraftConfig(path=models.draft_path))
    service = await asyncio.to_thread(
        EngineService, target, "auto", settings.draft_len, options.engine.cached_documents, None, config
    )
    eos = raw.tokenizer.eos_token_id
    messages, recordings = _messages_and_recordings(raw, cases, options, settings, eos)
    for recording in recordings:
        target.recordings.add(recording)
    token = secrets.token_urlsafe(24)
    server = await start_ws_server(service, Listen(token), options, WsLimits(max_in_flight=1))
    url = f"ws://127.0.0.1:{bound_port(server)}/"
    levels = []
    try:
        await asyncio.to_thread(service.warm_up)
        for concurrency in plan.concurrency:
            # each level a first sight of its requests: the session's outputs would hold the level
            # before's answers to the same messages
            await asyncio.to_thread(lambda: service.clear_history().result())
            # a message sent twice in one level drafts from its own answer: no more than there are,
            # unless the clients outnumber them (then the level says so)
            count = max(min(plan.load_requests, len(messages)), concurrency)
            level = await _level(url, token, messages, concurrency, count)
            level["distinct_requests"] = min(count, len(messages))
            say(
                f"bench: load {concurrency} clients: {level['requests_per_s']:.2f} req/s, "
                f"TTFT p95 {level['ttft_ms_p95']} ms, latency p95 {level['latency_ms_p95']} ms"
            )
            levels.append(level)
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.to_thread(close_service, service)
        for recording in recordings:
            target.recordings.remove(recording)
    return {
        "mode": settings.mode,
        "proposer": "auto",
        "slo_ttft_ms": plan.slo_ttft_ms,
        "levels": levels,
        "max_concurrency_within_slo": max_within_slo(levels, plan.slo_ttft_ms),
    }


async def _level(url: str, token: str, messages: list[dict], concurrency: int, count: int) -> dict:
    from websockets.asyncio.client import connect

    queue: asyncio.Queue = asyncio.Queue()
    for number in range(count):
        queue.put_nowait((number, messages[number % len(messages)]))
    latencies, ttfts, tokens, errors = [], [], [], []
    proposers: dict[str, int] = {}  # what the server actually ran (it falls back when one is unavailable)

    async def client() -> None:
        async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None) as socket:
            while True:
                try:
                    number, message = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                start = time.perf_counter()
                first = None
                await socket.send(json.dumps({**message, "id": number}))
                while True:
                    reply = json.loads(await socket.recv())
                    if first is None and reply.get("type") in ("delta", "done"):
                        first = time.perf_counter()
                    if reply.get("type") in ("done", "cancelled", "error"):
                        break
                end = time.perf_counter()
                if reply["type"] != "done":
                    errors.append(reply.get("message") or reply["type"])
                    continue
                latencies.append((end - start) * 1e3)
                ttfts.append(((first or end) - start) * 1e3)
                tokens.append(reply.get("usage", {}).get("completion_tokens", 0))
                name = str(reply.get("proposer"))
                proposers[name] = proposers.get(name, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started

    def p(values, q):
        return round(percentile(values, q), 1) if values else None

    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": len(errors),
        "wall_s": round(wall, 2),
        "requests_per_s": len(latencies) / wall if wall else 0.0,
        "tokens_per_s": sum(tokens) / wall if wall else 0.0,
        "latency_ms_p50": p(latencies, 50),
        "latency_ms_p95": p(latencies, 95),
        "ttft_ms_p50": p(ttfts, 50),
        "ttft_ms_p95": p(ttfts, 95),
        "error_messages": errors[:3],
        "proposers": proposers,
    }
