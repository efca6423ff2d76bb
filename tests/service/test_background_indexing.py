"""Workspace scans run on the indexing thread: completions go on meanwhile, the result equals a
synchronous scan, the tokenizer is not shared, and a cancelled or shut-down scan changes nothing.

The scan is held mid-way by its own progress callback (an event the test releases), so every
ordering below is decided by events, never by timing.
"""

from __future__ import annotations

import threading

import pytest

from codespec.index import WorkspaceIndex
from codespec.index.ingest import ScanCancelled
from codespec.service.engine import indexing
from codespec.service.engine.runtime import close_service
from codespec.service.engine.service import EngineService
from codespec.service.requests.schema import GenerationRequest

WAIT_S = 60  # a hang guard only
FILES = 300  # three tokenizer batches (index.scan.BATCH_FILES = 128)
PROBES = ["    return value * 1", "def helper_7(value", "offset_3\n"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("many-files")
    for i in range(FILES):
        package = root / f"package_{i % 10}"
        package.mkdir(exist_ok=True)
        (package / f"module_{i}.py").write_text(
            f"def helper_{i}(value):\n    return value * {i} + offset_{i % 7}\n\n\nclass Thing{i}:\n    size = {i}\n"
        )
    return root


class HeldScan:
    """A progress callback that holds the scan at its first report until ``release()``."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self._release = threading.Event()
        self.reports: list[tuple[int, int]] = []
        self.threads: set[str] = set()

    def __call__(self, done: int, total: int) -> None:
        self.reports.append((done, total))
        self.threads.add(threading.current_thread().name)
        if not self.held.is_set():
            self.held.set()
            assert self._release.wait(WAIT_S)

    def release(self) -> None:
        self._release.set()


def open_service(target, db_path) -> EngineService:
    service = EngineService(target, proposer="auto", max_draft=8)
    assert indexing.open_index(service, db_path) is not None
    return service


def index_summary(index: WorkspaceIndex, target) -> tuple[dict, list]:
    """Documents with their tokens, and what lookups find (scores aside: they count recency)."""
    documents = {uri: index.document_tokens(uri) for uri in sorted(index.documents())}
    found = [
        [(c.token_ids, c.match_len, c.source, c.position) for c in index.lookup(target.encode(p), 6)] for p in PROBES
    ]
    return documents, found


def test_completions_run_while_the_workspace_is_indexed(server_target, workspace, tmp_path):
    service = open_service(server_target, tmp_path / "index.db")
    held = HeldScan()
    events = []
    try:
        scan = indexing.index_workspace(service, [workspace], (), 1_000_000, held)
        assert held.held.wait(WAIT_S)  # the scan is mid-way, between two tokenizer batches
        uri = (workspace / "package_1" / "module_1.py").as_uri()
        result = service.submit(
            GenerationRequest(prompt="def helper_1(value):\n    return", max_tokens=4, uri=uri, cursor=30)
        ).wait(WAIT_S)
        events.append("completion")
        found = service.call(lambda: service.index.lookup(server_target.encode("def helper_1(value"), 4)).result(WAIT_S)
        events.append("lookup")
        assert not scan.done()  # both were served while the scan was still running
        held.release()
        report = scan.result(WAIT_S)
        events.append("scan")
        assert events == ["completion", "lookup", "scan"]
        assert result.usage.completion_tokens == 4
        assert isinstance(found, list)
        assert report.tokenized == FILES and report.files == FILES
        assert held.reports[-1] == (FILES, FILES) and len(held.reports) >= 3
        assert held.threads == {"codespec-indexer"}  # progress comes from the indexing thread
        service.call(lambda: service.index.check_integrity(deep=True)).result(WAIT_S)
        background = service.call(lambda: index_summary(service.index, server_target)).result(WAIT_S)
    finally:
        held.release()
        close_service(service)

    synchronous = WorkspaceIndex(server_target.tokenizer)  # the engine thread is gone: nothing shares it now
    synchronous.index_workspace([str(workspace)])
    assert len(background[0]) == FILES
    assert background == index_summary(synchronous, server_target)
    assert any(background[1])  # the probes do match: the comparison is not of empty lists


def test_the_scan_tokenizes_with_its_own_tokenizer(server_target, workspace, tmp_path):
    service = open_service(server_target, tmp_path / "index.db")
    try:
        indexing.index_workspace(service, [workspace], (), 1_000_000).result(WAIT_S)
        own = service.indexer.adapter
        shared = service.index.adapter
        assert shared.tokenizer is server_target.tokenizer  # the engine thread's
        assert own.tokenizer is not server_target.tokenizer
        assert own.tokenizer.backend_tokenizer is not server_target.tokenizer.backend_tokenizer
        assert own.fingerprint == shared.fingerprint
    finally:
        close_service(service)


def test_a_cancelled_scan_leaves_the_index_as_it_was(server_target, workspace, tmp_path):
    db_path = tmp_path / "index.db"
    service = open_service(server_target, db_path)
    held = HeldScan()
    open_uri = "file:///open/buffer.py"
    try:
        service.call(lambda: service.index.add_document(open_uri, "def buffer():\n    pass\n", 1)).result(WAIT_S)
        scan = indexing.index_workspace(service, [workspace], (), 1_000_000, held)
        assert held.held.wait(WAIT_S)
        scan.cancel()
        held.release()
        with pytest.raises(ScanCancelled):
            scan.result(WAIT_S)
        assert service.call(service.index.documents).result(WAIT_S) == [open_uri]
        service.call(lambda: service.index.check_integrity(deep=True)).result(WAIT_S)
        # the indexing thread is still usable: the next scan runs to the end
        assert indexing.index_workspace(service, [workspace], (), 1_000_000).result(WAIT_S).tokenized == FILES
    finally:
        held.release()
        close_service(service)


def test_shutdown_during_a_scan_stops_it_and_the_database_stays_consistent(server_target, workspace, tmp_path):
    db_path = tmp_path / "index.db"
    service = open_service(server_target, db_path)
    held = HeldScan()
    closer = threading.Thread(target=close_service, args=(service,))
    try:
        scan = indexing.index_workspace(service, [workspace], (), 1_000_000, held)
        assert held.held.wait(WAIT_S)
        closer.start()
        assert service.indexer.closing.wait(WAIT_S)  # close_service asked the scan to stop
        held.release()
        closer.join(WAIT_S)
        assert not closer.is_alive()
        with pytest.raises(ScanCancelled):
            scan.result(WAIT_S)
        with pytest.raises(ScanCancelled):  # a scan asked for after close is refused, not left pending
            indexing.index_workspace(service, [workspace], (), 1_000_000).result(WAIT_S)
    finally:
        held.release()
        if not closer.is_alive() and closer.ident is None:
            close_service(service)

    reopened = open_service(server_target, db_path)
    try:
        report = indexing.index_workspace(reopened, [workspace], (), 1_000_000).result(WAIT_S)
        assert report.reused == 0 and report.tokenized == FILES  # nothing half-written was left behind
        reopened.call(lambda: reopened.index.check_integrity(deep=True)).result(WAIT_S)
    finally:
        close_service(reopened)


def test_a_scan_refuses_a_tokenizer_that_tokenizes_differently(server_target, workspace):
    from bench.shapes import build_tokenizer
    from codespec.index import TokenizerAdapter

    other = TokenizerAdapter(build_tokenizer(["def other(x):\n    return x\n" * 20], vocab_size=300))
    index = WorkspaceIndex(server_target.tokenizer)
    with pytest.raises(ValueError, match="does not tokenize like"):
        index.index_workspace([str(workspace)], adapter=other)
    assert index.documents() == []


def test_a_queued_scan_that_is_cancelled_ends_with_scan_cancelled(server_target, workspace, tmp_path):
    """Not as a cancelled Future: a waiter (the server's progress task) gets ScanCancelled and
    reports "cancelled", instead of an asyncio CancelledError that would end it silently."""
    service = open_service(server_target, tmp_path / "index.db")
    held = HeldScan()
    try:
        running = indexing.index_workspace(service, [workspace], (), 1_000_000, held)
        assert held.held.wait(WAIT_S)
        queued = indexing.index_workspace(service, [workspace], (), 1_000_000)  # behind the held one
        assert queued.cancel() is False and not queued.cancelled()
        held.release()
        assert running.result(WAIT_S).tokenized == FILES
        with pytest.raises(ScanCancelled):
            queued.result(WAIT_S)
    finally:
        held.release()
        close_service(service)


def test_the_memory_budget_reaches_the_index_and_evicts(server_target, workspace, tmp_path):
    """`index.maxTokens` (IndexOptions.max_tokens) bounds what the server's index keeps in
    memory: the least recently used documents go, the database keeps them all."""
    from codespec.service.requests.options import parse_options

    options, messages = parse_options({"index": {"maxTokens": 2000}})
    assert options.index.max_tokens == 2000 and not messages
    assert parse_options({"index": {"maxTokens": 0}})[1]  # refused with a message, default kept
    service = EngineService(server_target, proposer="auto", max_draft=8)
    try:
        index = indexing.open_index(service, tmp_path / "index.db", options.index.max_tokens)
        report = indexing.index_workspace(service, [workspace], (), 1_000_000).result(WAIT_S)
        assert report.files == FILES and report.tokens > 3 * 2000
        resident = service.call(index.documents).result(WAIT_S)
        assert 0 < len(resident) < FILES
        assert sum(len(index.document_tokens(uri)) for uri in resident) <= 2000
        service.call(lambda: index.check_integrity(deep=True)).result(WAIT_S)
    finally:
        close_service(service)
