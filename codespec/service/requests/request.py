"""The request every door hands the engine: one typed value, built by ``request_of`` (through the
builders beside it: ``inline``, ``edit``, ``next_edit``) or ``prompt_request``; the engine renders
its prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codespec.core.config import SamplingParams
from codespec.core.prompts import Prompt
from codespec.service.requests.schema import RequestKind, Sampling

REQUEST_LOG = "codespec.requests"  # the engine's one line per request, on stderr (`serve --quiet`: none)


@dataclass(frozen=True)
class GenerationRequest:
    """One completion or rewrite, built by :func:`request_of` (through ``service.inline`` for
    completions, ``service.edit`` for rewrites, ``service.next_edit`` for next edits); the service
    renders its prompt."""

    prompt: Prompt  # what is asked (codespec.prompts.Fim / Rewrite), or a plain string
    max_tokens: int
    kind: RequestKind = RequestKind.COMPLETE  # each kind's rules: service.schema.RequestKind
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()  # greedy by default
    reference: str | None = None  # reference draft: the text being rewritten, a prediction, a shown suggestion
    cache_key: str | None = None  # document whose KV cache to reuse
    uri: str | None = None  # for the index proposer's locality ranking
    cursor: int | None = None  # code point offset of the cursor in ``uri``
    edits: tuple[tuple[str, str], ...] = ()  # the user's recent edits (next-edit drafting), oldest first
    # the target's token ids of text sent beside the prompt to draft from (llama.vim's input_extra chunks)
    material: tuple[tuple[int, ...], ...] = ()
    deadline_s: float | None = None
    proposer: str | None = None  # None: the service default
    origin: str = ""  # who asked: lsp, websocket, http (the request log names it)
    ahead: bool = False  # asked ahead of the user (a speculated next edit): background, whatever its kind

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", RequestKind(self.kind))  # a kind's name is accepted too

    @property
    def interactive(self) -> bool:
        """A user waits on it now (``RequestKind.interactive``, unless asked ahead): the scheduler
        admits it first and has the other requests mostly sit out beside it."""
        return self.kind.interactive and not self.ahead


def request_of(
    prompt: Prompt, max_tokens: int, kind: RequestKind, sampling: Sampling, stop: tuple[str, ...], **where: Any
) -> GenerationRequest:
    """The one place a client's request is built from a prompt and the client's sampling;
    ``where``: reference, edits, cache_key, uri, cursor, deadline_s, origin (``GenerationRequest``'s fields)."""
    return GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        kind=kind,
        stop=tuple(stop),
        sampling=sampling.params(),
        proposer=sampling.proposer,
        **where,
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
    return request_of(
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
