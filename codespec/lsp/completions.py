"""An inline completion at a position: the door's side of it (the document's text and offset in, the
item's text and anchor out, the suggestion kept so the next keystroke can type along it)."""

from __future__ import annotations

from typing import Any, Protocol

from lsprotocol import types

from codespec.core.finish import FinishReason
from codespec.lsp.workspace import Server, cancel_warm
from codespec.service.requests.inline import Suggestion, completion_request, trim_completion, typed_along


class CompletingServer(Server, Protocol):
    """What a completion reads and keeps on the language server (``lsp.server.CodespecServer``),
    beyond what ``lsp.workspace`` reads."""

    suggestions: dict[str, Suggestion]  # the last item shown per document
    inflight: Any  # service.engine.jobs.NewestJobs: the newest request per document

    @property
    def engine(self) -> Any: ...

    def offset_of(self, text: str, position: types.Position) -> int: ...


ACCEPTED_COMMAND = "codespec.accepted"


def accepted_command(uri: str, text: str) -> types.Command:
    """Run by the editor when the user accepts an item: the text goes to session history."""
    return types.Command(title="codespec: accepted", command=ACCEPTED_COMMAND, arguments=[uri, text])


async def complete_at(
    ls: CompletingServer, uri: str, position: types.Position, invoked: bool
) -> tuple[str, types.Position] | None:
    """The completion text at ``position`` (None when superseded, cancelled or empty)."""
    document = ls.documents.get(uri)
    cancel_warm(ls, uri)  # this request prefills what it needs itself
    text = document.text
    offset = ls.offset_of(text, position)
    options = ls.options
    request, context = completion_request(
        text,
        offset,
        options,
        ls.engine.target,
        invoked=invoked,
        uri=uri,
        cache_key=uri,
        reference=typed_along(ls.suggestions.get(uri), text, offset),
        origin="lsp",
    )
    result = await ls.inflight.run(ls.engine, uri, request)  # a newer request supersedes this one
    completion = trim_completion(result.text, context)
    if result.reason == FinishReason.CANCELLED or not completion:
        return None
    ls.suggestions[uri] = Suggestion(text[:offset], completion)
    # The item is anchored where it was asked for; the document may have moved on since.
    return completion, types.Position(position.line, position.character)
