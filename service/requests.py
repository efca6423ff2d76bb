"""The one way to build what the engine is asked: a completion request and an edit request.

Every door (LSP, websocket, HTTP, `codespec complete`, the benchmarks) builds its requests here,
so the window around the cursor, the stop rules and the proposer inputs (reference text, document
and cursor for the index) are the same whichever client asks. The request carries the prompt as
*what* is asked (``Fim`` / ``Rewrite``); the engine service renders it in the target's format.
"""

from __future__ import annotations

from typing import Any

from codespec.prompts import Fim, Prompt, Rewrite
from service.edit import EditPlan
from service.inline import CompletionContext, completion_context
from service.jobs import GenerationRequest
from service.options import ServerOptions
from service.schema import RequestKind, Sampling


def completion_request(
    text: str,
    offset: int,
    options: ServerOptions,
    windows: tuple[int, int],
    *,
    invoked: bool,
    uri: str | None = None,
    cache_key: str | None = None,
    reference: str | None = None,
    sampling: Sampling = Sampling(),
    deadline: bool = True,
    origin: str = "",
) -> tuple[GenerationRequest, CompletionContext]:
    """A completion at code point ``offset`` of ``text``; ``windows`` from ``EngineService.windows``.

    ``sampling.stop`` replaces the cursor's stop rule (a newline for a line, a blank line for a block);
    ``reference`` is a reference draft (the rest of a shown suggestion, a client's prediction).
    ``deadline``: stop at ``options.completion.deadline_ms`` (an editor no longer waits for a late completion).
    """
    context = completion_context(
        text,
        offset,
        options.completion.line_tokens,
        options.completion.block_tokens,
        *windows,
        invoked=invoked,
        mode=options.completion.mode,
    )
    request = _request(
        Fim(context.prefix, context.suffix),
        sampling.max_tokens or context.max_tokens,
        RequestKind.COMPLETE,
        sampling,
        context.stop if sampling.stop is None else sampling.stop,
        reference=reference,
        cache_key=cache_key,
        uri=uri,
        cursor=offset,
        deadline_s=options.completion.deadline_ms / 1000 if deadline else None,
        origin=origin,
    )
    return request, context


def edit_request(
    plan: EditPlan,
    *,
    sampling: Sampling = Sampling(),
    cache_key: str | None = None,
    uri: str | None = None,
    cursor: int | None = None,
    whole_budget: bool = False,
    edits: tuple[tuple[str, str], ...] = (),
    origin: str = "",
) -> GenerationRequest:
    """A rewrite of ``plan``'s region: its text (or the client's prediction) is the reference draft;
    ``edits``: the user's recent edits (next-edit drafting repeats them in the region).

    ``plan.max_tokens`` is a budget on top of the reference's length (a rewrite is about as long as
    its region), or with ``whole_budget`` the whole budget (OpenAI's ``max_tokens``); it is the
    budget (``sampling.max_tokens`` is not read).
    """
    kind = RequestKind.CHAT if whole_budget else RequestKind.EDIT
    return _request(
        Rewrite(plan.original, plan.instruction),
        plan.max_tokens,
        kind,
        sampling,
        sampling.stop or (),
        reference=plan.reference,
        edits=edits,
        cache_key=cache_key,
        uri=uri,
        cursor=cursor,
        origin=origin,
    )


def prompt_request(
    prompt: str,
    max_tokens: int,
    *,
    chat: bool = False,
    sampling: Sampling = Sampling(),
    reference: str | None = None,
    edits: tuple[tuple[str, str], ...] = (),
    cache_key: str | None = None,
    uri: str | None = None,
    origin: str = "",
) -> GenerationRequest:
    """A prompt the client rendered itself (an OpenAI plain completion, a chat rendered by the
    model's template), sent as it is; ``chat`` ends it without the completion's loop stop;
    ``edits``: the user's recent edits the prompt shows (a next-edit prompt)."""
    kind = RequestKind.CHAT if chat else RequestKind.COMPLETE
    return _request(
        prompt,
        max_tokens,
        kind,
        sampling,
        sampling.stop or (),
        reference=reference,
        edits=edits,
        cache_key=cache_key,
        uri=uri,
        origin=origin,
    )


def _request(
    prompt: Prompt, max_tokens: int, kind: RequestKind, sampling: Sampling, stop: tuple[str, ...], **where: Any
) -> GenerationRequest:
    """``where``: reference, edits, cache_key, uri, cursor, deadline_s, origin (``GenerationRequest``'s fields)."""
    return GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        kind=kind,
        stop=tuple(stop),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        proposer=sampling.proposer,
        **where,
    )
