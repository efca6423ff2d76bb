"""The engine service both servers share: scheduling, cancellation, prompt caching, index wiring."""

from __future__ import annotations

import threading
import time

import pytest

from codespec.core.errors import CodespecError
from codespec.core.prompts import Fim
from codespec.service.engine import indexing
from codespec.service.engine.service import EngineService
from codespec.service.requests.schema import GenerationRequest, RequestKind

WAIT_S = 120
LONG_TEXT = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(10))


@pytest.fixture(scope="module")
def service(server_target):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    yield service
    service.close()


def test_long_edit_does_not_block_a_completion(service):
    edit = service.submit(GenerationRequest(prompt=LONG_TEXT, max_tokens=400, kind=RequestKind.EDIT))
    completion = service.submit(GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=4))
    result = completion.wait(WAIT_S)
    assert result.usage.completion_tokens == 4
    assert not edit.future.done()  # round-robin by cycle: the short request finished first
    edit.cancel()
    assert edit.wait(WAIT_S).reason == "cancelled"


def test_cancel_stops_within_a_cycle(service):
    first_delta = threading.Event()
    job = service.submit(
        GenerationRequest(prompt=LONG_TEXT, max_tokens=1000, kind=RequestKind.EDIT),
        on_delta=lambda text: first_delta.set(),
    )
    assert first_delta.wait(WAIT_S)
    job.cancel()
    result = job.wait(WAIT_S)
    assert result.reason == "cancelled"
    assert result.usage.completion_tokens < 1000
    # a job cancelled before it starts costs no forward at all
    idle = service.submit(GenerationRequest(prompt="x", max_tokens=5))
    idle.cancel()
    assert idle.wait(WAIT_S).stats["target_forwards"] in (0, 1)


def test_prompt_cache_reuses_the_common_prefix_and_changes_nothing(service):
    prompt = LONG_TEXT[:400]
    first = service.submit(GenerationRequest(prompt=prompt, max_tokens=6, cache_key="doc-a")).wait(WAIT_S)
    typed = service.submit(GenerationRequest(prompt=prompt + "de", max_tokens=6, cache_key="doc-a")).wait(WAIT_S)
    fresh = service.submit(GenerationRequest(prompt=prompt + "de", max_tokens=6, cache_key="doc-b")).wait(WAIT_S)
    assert first.usage.cached_prompt_tokens == 0
    assert typed.usage.cached_prompt_tokens >= typed.usage.prompt_tokens - 4  # only the keystroke is prefilled
    assert fresh.usage.cached_prompt_tokens == 0
    assert typed.text == fresh.text


def test_warming_a_document_prefills_what_its_completions_share(service):
    from codespec.service.requests.inline import completion_context, completion_prompt, warm_prompt

    text = LONG_TEXT
    warm = service.submit(
        GenerationRequest(
            prompt=warm_prompt(text, 4000, service.prompts),
            max_tokens=1,
            kind=RequestKind.PREFILL,
            cache_key="warm-doc",
            proposer="none",
        )
    ).wait(WAIT_S)
    assert warm.usage.cached_prompt_tokens == 0 and warm.reason == "length" and warm.text == ""
    offset = text.index("return value + 5")
    context = completion_context(text, offset, 4, 8, 4000, 200)
    request = GenerationRequest(
        prompt=completion_prompt(context, service.prompts), max_tokens=4, stop=context.stop, cache_key="warm-doc"
    )
    result = service.submit(request).wait(WAIT_S)
    prefix_tokens = len(service.target.encode(warm_prompt(context.prefix, len(context.prefix), service.prompts)))
    assert result.usage.cached_prompt_tokens >= prefix_tokens - 2  # only the suffix was prefilled


def test_a_request_takes_over_a_documents_background_prefill(service):
    """A completion arriving while its document is being prefilled neither waits for the whole
    prefill nor starts from an empty cache: it takes the cache over with the chunks done so far."""
    from codespec.service.engine.scheduler import PREFILL_CHUNK
    from codespec.service.requests.inline import completion_context, completion_prompt, warm_prompt

    text = LONG_TEXT * 6
    prompt = warm_prompt(text, len(text), service.prompts)
    prompt_tokens = len(service.target.encode(prompt))
    assert PREFILL_CHUNK * 4 < prompt_tokens < service.target.max_context
    context = completion_context(text, text.rindex("return value + 5"), 4, 8, len(text), 200)
    request = GenerationRequest(
        prompt=completion_prompt(context, service.prompts), max_tokens=4, stop=context.stop, cache_key="big-doc"
    )
    prefill = service.submit(
        GenerationRequest(prompt=prompt, max_tokens=1, kind=RequestKind.PREFILL, cache_key="big-doc")
    )
    prefilling = lambda: any(job is prefill for job in service.scheduler.active)  # noqa: E731 (engine thread)
    while not service.call(prefilling).result(WAIT_S):  # each call waits for the top of a cycle
        pass
    # Hold the engine thread (no chunk runs) until the completion is prepared and queued, so it takes
    # the prefill over whatever the machine's load; without the hold a busy machine can let the
    # prefill finish first.
    gate = threading.Event()
    blocked = service.call(gate.wait)
    completion = service.submit(request)
    while completion.prepared is None:
        time.sleep(0.01)
    gate.set()
    blocked.result(WAIT_S)
    result = completion.wait(WAIT_S)
    superseded = prefill.wait(WAIT_S)
    assert superseded.reason == "cancelled"  # stopped early: the completion took its cache over
    assert PREFILL_CHUNK <= result.usage.cached_prompt_tokens < superseded.usage.prompt_tokens
    fresh = service.submit(
        GenerationRequest(
            prompt=completion_prompt(context, service.prompts), max_tokens=4, stop=context.stop, cache_key="other-doc"
        )
    ).wait(WAIT_S)
    assert result.text == fresh.text  # a partial prefill changes nothing in the output


def test_a_failing_request_does_not_hurt_the_service(service, server_target):
    too_long = service.submit(GenerationRequest(prompt="word " * (server_target.max_context + 10), max_tokens=3))
    with pytest.raises(CodespecError, match="context"):
        too_long.wait(WAIT_S)
    assert service.submit(GenerationRequest(prompt="ok = ", max_tokens=2)).wait(WAIT_S).usage.completion_tokens == 2
    assert service.snapshot()["errors"] >= 1


def test_a_caller_cancelling_the_future_itself_does_not_hurt_the_service(service):
    dropped = service.submit(GenerationRequest(prompt="x = 1", max_tokens=1))
    failing = service.submit(GenerationRequest(prompt="", max_tokens=1))  # fails: an empty prompt
    assert dropped.future.cancel() and failing.future.cancel()  # nobody will read these results
    assert dropped.cancelled  # the engine sees it as a cancellation and does no work for it
    after = service.submit(GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=4))
    assert after.wait(WAIT_S).usage.completion_tokens == 4
    then = service.submit(GenerationRequest(prompt="ok = ", max_tokens=2))  # the engine thread is alive
    assert then.wait(WAIT_S).usage.completion_tokens == 2


def test_fim_prompt_is_narrowed_to_the_context(service, server_target):
    prefix = "value = compute(value)\n" * 800
    request = GenerationRequest(prompt=Fim(prefix, ""), max_tokens=3)
    result = service.submit(request).wait(WAIT_S)
    assert result.usage.prompt_tokens < server_target.max_context
    assert result.usage.completion_tokens == 3


def test_the_index_proposer_centres_on_the_cursor_the_editor_sent(server_target):
    from codespec.index import WorkspaceIndex

    service = EngineService(server_target, proposer="index")
    try:
        service.attach_index(WorkspaceIndex(server_target.tokenizer, db_path=None))
        uri, text = "file:///doc.py", LONG_TEXT
        cursor = text.index("def function_7")  # a code point offset, as requests carry it
        service.call(lambda: service.index.add_document(uri, text, 1)).result(WAIT_S)
        request = GenerationRequest(prompt=text[:cursor], max_tokens=1, uri=uri, cursor=cursor)
        proposer = service.call(lambda: service._make_proposer(request)).result(WAIT_S)
        expected = service.call(lambda: service.index.token_offset(uri, cursor)).result(WAIT_S)
        assert proposer.name == "index" and proposer.cursor == expected
        assert server_target.decode(service.index.document_tokens(uri)[expected:][:16]).startswith("def function_7")
    finally:
        service.close()


def test_warm_up_is_neither_history_nor_a_completion(server_target):
    service = EngineService(server_target, proposer="context")
    try:
        service.warm_up()
        snapshot = service.snapshot()
        assert snapshot["last_requests"] and snapshot["last_requests"][-1]["tokens"] > 0  # it did decode
        assert not service.history.recent and snapshot["history_entries"] == 0
        assert snapshot["requests"].get("complete", 0) == 0
    finally:
        service.close()


def test_index_is_reused_after_a_restart_and_history_reaches_it(server_target, tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    for i in range(3):
        (root / f"module_{i}.py").write_text(f"def helper_{i}(x):\n    return x * {i}\n")
    db_path = tmp_path / "index.db"
    reports, history_hits = [], []
    accepted = "answer = unusual_name_42 + 7"
    for _ in range(2):
        service = EngineService(server_target, proposer="auto")
        try:
            assert indexing.open_index(service, db_path) is not None
            reports.append(indexing.index_workspace(service, [root], (), 1_000_000, lambda d, t: None).result(WAIT_S))
            context = server_target.encode("answer = unusual_name_42")
            found = service.call(lambda: service.index.lookup(context, 4)).result(WAIT_S)
            history_hits.append(any(c.source == "history:accepted" for c in found))
            service.record_history("accepted", accepted, (root / "module_0.py").as_uri()).result(WAIT_S)
            result = service.submit(
                GenerationRequest(
                    prompt="def helper_1(x):\n", max_tokens=3, uri=(root / "module_1.py").as_uri(), cursor=5
                )
            ).wait(WAIT_S)
            assert result.usage.completion_tokens == 3
        finally:
            from codespec.service.engine.runtime import close_service

            close_service(service)
    assert reports[0].tokenized == 3
    assert reports[1].tokenized == 0 and reports[1].reused == 3  # nothing re-tokenized on restart
    assert history_hits == [False, True]  # the accepted text was persisted and drafts after a restart


def test_what_a_request_generated_drafts_for_later_ones_without_an_index(server_target):
    """The session's earlier outputs (proposers/outputs.py): auto drafts a later request from what
    the model wrote before, as vLLM's ``suffix`` drafts from its earlier responses; no index needed."""
    service = EngineService(server_target, proposer="auto", max_draft=8)
    try:
        prompt = "import numpy as np\n\n\ndef normalize("
        first = service.submit(GenerationRequest(prompt=prompt, max_tokens=32)).wait(WAIT_S)
        again = service.submit(GenerationRequest(prompt=prompt, max_tokens=32)).wait(WAIT_S)
        assert again.text == first.text and first.usage.completion_tokens >= 16, first.text
        assert len(service.history.outputs) == 2 and service.index is None
        forwards = first.stats["target_forwards"], again.stats["target_forwards"]
        assert forwards[1] <= forwards[0] - 3, forwards
        service.clear_history().result(WAIT_S)  # the LSP's codespec.clearHistory: the outputs too
        assert len(service.history.outputs) == 0
    finally:
        service.close()


def test_idle_calls_wait_for_running_requests_but_keep_their_order(service):
    """Indexing an opened or edited document must not delay the completion after a keystroke: an
    idle call runs when no request is waiting or running (or after IDLE_CALL_MAX_WAIT_S), in order."""
    import time

    from codespec.service.engine.service import IDLE_CALL_MAX_WAIT_S

    runs: list[tuple[str, bool, float]] = []

    def record(name: str, enqueued: float):
        def fn():
            busy = any(job.request.kind != "prefill" for job in service.scheduler.active)  # engine thread: safe
            runs.append((name, busy, time.monotonic() - enqueued))
            return name

        return fn

    job = service.submit(GenerationRequest(prompt=LONG_TEXT, max_tokens=300, kind=RequestKind.EDIT))
    now = time.monotonic()
    idle_a = service.call(record("idle-a", now), idle=True)
    idle_b = service.call(record("idle-b", now), idle=True)
    urgent = service.call(record("urgent", now))
    assert urgent.result(WAIT_S) == "urgent"
    assert idle_a.result(WAIT_S) == "idle-a" and idle_b.result(WAIT_S) == "idle-b"
    job.cancel()
    job.wait(WAIT_S)
    names = [name for name, _, _ in runs]
    assert names.index("urgent") < names.index("idle-a") < names.index("idle-b")
    for name, busy, waited in runs:
        if name.startswith("idle") and busy:  # ran beside a request only once it had waited long enough
            assert waited >= IDLE_CALL_MAX_WAIT_S


def test_with_nothing_running_idle_calls_go_before_later_calls(service):
    """A stats call right after a didSave must see the index update the save queued."""
    gate = threading.Event()
    order: list[str] = []
    blocked = service.call(gate.wait)  # hold the engine thread so both land in one cycle
    update = service.call(lambda: order.append("index update"), idle=True)
    stats = service.call(lambda: order.append("stats"))
    gate.set()
    blocked.result(WAIT_S), update.result(WAIT_S), stats.result(WAIT_S)
    assert order == ["index update", "stats"]


def test_a_request_runs_its_own_documents_idle_calls_first(service):
    """A completion on a just-opened document drafts from that document: its pending index call
    runs before the request starts, in order; other documents' idle calls still wait."""
    gate = threading.Event()
    order: list[str] = []
    running = service.submit(GenerationRequest(prompt=LONG_TEXT, max_tokens=300, kind=RequestKind.EDIT))
    blocked = service.call(gate.wait)  # hold the engine thread so everything lands in one cycle
    other = service.call(lambda: order.append("index other.py"), idle=True, document="file:///other.py")
    own_a = service.call(lambda: order.append("index mine.py"), idle=True, document="file:///mine.py")
    own_b = service.call(lambda: order.append("update mine.py"), idle=True, document="file:///mine.py")

    def started() -> str:
        order.append("request")
        return "ok"

    request = GenerationRequest(prompt="def f(x):\n    return", max_tokens=2, uri="file:///mine.py")
    original_start = service._start

    def start(job):  # engine thread: note when the request starts, then start it
        if job.request is request:
            started()
        original_start(job)

    service._start = start
    try:
        job = service.submit(request)
        gate.set()
        blocked.result(WAIT_S), own_a.result(WAIT_S), own_b.result(WAIT_S)
        job.wait(WAIT_S)
        assert order[:3] == ["index mine.py", "update mine.py", "request"]
        assert "index other.py" not in order[:3]
    finally:
        service._start = original_start
        running.cancel()
        running.wait(WAIT_S)
        other.result(WAIT_S)


def test_each_user_request_is_one_line_of_the_request_log_unless_quiet(server_target):
    import logging

    from codespec.service.doors import logsafe

    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(logsafe.REQUEST_LOG)
    collect, level = Collect(), logger.level
    logger.addHandler(collect)
    logger.setLevel(logging.INFO)
    service = EngineService(server_target, proposer="context")
    try:
        service.warm_up()  # not a user request: no line
        request = GenerationRequest(prompt="def f(x):\n    return ", max_tokens=3, origin="test")
        result = service.submit(request).wait(WAIT_S)
        assert len(lines) == 1 and lines[0].startswith("test complete model=")
        assert (
            f"prompt={result.usage.prompt_tokens} " in lines[0]
            and f"output={result.usage.completion_tokens} " in lines[0]
        )
        logsafe.quiet_requests()
        service.submit(request).wait(WAIT_S)
        assert len(lines) == 1
    finally:
        service.close()
        logger.removeHandler(collect)
        logger.setLevel(level)


def test_a_rewrite_budget_is_counted_from_the_original_not_from_its_draft(service):
    """The draft never changes the answer: a short prediction drafts a rewrite, but the budget is
    the original's length plus ``max_tokens``, as without it (a budget counted from the draft cut
    next edits drafted from a speculated answer short)."""
    import dataclasses

    from codespec.service.requests.edit import EditPlan, edit_request

    original = LONG_TEXT[:160]

    def rewrite(prediction: str) -> GenerationRequest:
        return edit_request(EditPlan(original, None, prediction, 0, len(original), max_tokens=4))

    plain = service.submit(rewrite(original)).wait(WAIT_S)
    predicted = service.submit(rewrite("x = 1\n")).wait(WAIT_S)
    assert predicted.text == plain.text
    assert predicted.usage.completion_tokens == plain.usage.completion_tokens
    # the field is what keeps it: the same draft with the budget counted from the draft stops sooner
    short = dataclasses.replace(rewrite("x = 1\n"), budget_text=None)
    assert service.submit(short).wait(WAIT_S).usage.completion_tokens < plain.usage.completion_tokens
