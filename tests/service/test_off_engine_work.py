"""Nothing heavy on the engine thread: prompts are rendered and tokenized on the preparing thread,
and a large opened document is tokenized there too (with its own copy of the tokenizer) and then
installed by a short idle call, with the document's later index calls applied after it, in order.
Orderings here are decided by events and thread names, never by timing."""

from __future__ import annotations

import threading

import pytest

from codespec.service.engine import indexing
from codespec.service.engine.runtime import close_service
from codespec.service.engine.service import LARGE_DOCUMENT_CHARS, EngineService
from codespec.service.requests.schema import GenerationRequest

WAIT_S = 120


class EncodingThreads:
    """The server's target, noting which thread each encode ran on."""

    def __init__(self, target) -> None:
        self._target = target
        self.threads: list[str] = []

    def __getattr__(self, name):
        return getattr(self._target, name)

    def encode(self, text: str) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return self._target.encode(text)


def test_prompts_are_tokenized_off_the_engine_thread_in_submission_order(server_target):
    target = EncodingThreads(server_target)
    service = EngineService(target, proposer="context", max_draft=8)
    try:
        target.threads.clear()
        prompts = [f"def function_{i}(value):\n    return value + {i}\n" * (1 + i) for i in range(5)]
        jobs = [
            service.submit(GenerationRequest(prompt=p, max_tokens=6, cache_key=f"doc-{i}"))
            for i, p in enumerate(prompts)
        ]
        results = [job.wait(WAIT_S) for job in jobs]
        alone = EngineService(server_target, proposer="context", max_draft=8)
        try:
            expected = [alone.submit(GenerationRequest(prompt=p, max_tokens=6)).wait(WAIT_S).text for p in prompts]
        finally:
            alone.close()
    finally:
        service.close()
    assert [result.text for result in results] == expected
    assert [result.usage.prompt_tokens for result in results] == [len(server_target.encode(p)) for p in prompts]
    assert target.threads and all(name.startswith("codespec-prepare") for name in target.threads), set(target.threads)


def test_a_large_document_is_tokenized_off_the_engine_thread_and_its_updates_follow_it(server_target, tmp_path):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    try:
        index = indexing.open_index(service, tmp_path / "codespec.index.sqlite")
        assert index is not None
        engine_encodes: list[tuple[str, int]] = []
        original = index.adapter.encode_array

        def watched(text):
            engine_encodes.append((threading.current_thread().name, len(text)))
            return original(text)

        index.adapter.encode_array = watched  # the engine's own adapter: the large text must not pass here
        uri = "file:///big.py"
        unit = "def handler_{0}(request):\n    return respond(request, {0})\n\n"
        text = "".join(unit.format(i) for i in range(LARGE_DOCUMENT_CHARS // len(unit) + 50))
        assert len(text) >= LARGE_DOCUMENT_CHARS
        opened = service.index_document(uri, text, 1)
        start = text.index("respond(request, 7)")
        edit = service.call(
            lambda: index.update_document(uri, start, start + len("respond"), "answer", 2), idle=True, document=uri
        )
        opened.result(WAIT_S)
        edit.result(WAIT_S)
        expected = text[:start] + "answer" + text[start + len("respond") :]
        assert service.call(lambda: indexing.indexed_text(index, uri)).result(WAIT_S) == expected
        # the edit re-tokenizes a few lines around itself; the whole document never passed here
        assert engine_encodes and max(length for _, length in engine_encodes) < 1000, engine_encodes
        small = "x = 1\n"
        service.index_document("file:///small.py", small, 1).result(WAIT_S)
        assert service.call(lambda: indexing.indexed_text(index, "file:///small.py")).result(WAIT_S) == small
    finally:
        close_service(service)


def test_index_document_without_an_index_is_refused(server_target):
    from codespec.core.errors import CodespecError

    service = EngineService(server_target, proposer="none", max_draft=8)
    try:
        with pytest.raises(CodespecError, match="no index"):
            service.index_document("file:///a.py", "a = 1\n", 1)
    finally:
        service.close()
