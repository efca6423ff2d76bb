"""Fuzzing `codespec serve` over stdio with hypothesis: batches of random, truncated and mutated
JSON-RPC messages (valid methods with wrong types, huge strings, deep nesting, positions out of
range, unknown URIs, interleaved cancels, broken frames). After each batch the server must be
alive, have answered every request it owes an answer exactly once, and keep its memory bounded.

The message generator is bench/soak.py's (the 10,000-message soak of docs/benchmarks.md), driven
here by hypothesis's random source, plus hypothesis-drawn JSON values put into valid messages.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.soak import LspState, Send, check_lsp_batch, in_sequence, lsp_message, settle
from bench.soak_stdio import StdioServer
from bench.soak_values import Tally, frame

pytestmark = pytest.mark.slow  # a subprocess server under fuzzing: `python -m pytest --full` runs it

EXAMPLES = 40  # batches; ~400 messages in all
ANSWER_S = 60  # a hang guard: every owed answer normally arrives within a second
MEMORY_BOUND_MB = 500  # peak RSS growth allowed over the whole module (a 5 MB document indexed: 1.2 GB)

SURROGATES = st.sampled_from(["\ud800", "x = \udfff\n", "\udc00\ud800", "😀\ud83d"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | SURROGATES
    | st.sampled_from([2**31, -1, 2**31 - 1, "", "a" * 70_000])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.text(max_size=6) | st.sampled_from(["line", "character", "uri", "text", "textDocument", "position"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)

TEMPLATES = {  # method -> params builder(uri); requests and notifications, all valid as built
    "textDocument/inlineCompletion": lambda uri: {
        "textDocument": {"uri": uri},
        "position": {"line": 1, "character": 2},
        "context": {"triggerKind": 1},
    },
    "textDocument/completion": lambda uri: {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}},
    "codespec/edit": lambda uri: {
        "textDocument": {"uri": uri},
        "range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}},
    },
    "codespec/stats": lambda uri: {},
    "workspace/executeCommand": lambda uri: {"command": "codespec.accepted", "arguments": [uri, "x = 1"]},
    "textDocument/didOpen": lambda uri: {
        "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "def f(x):\n    return x\n"}
    },
    "textDocument/didChange": lambda uri: {
        "textDocument": {"uri": uri, "version": 2},
        "contentChanges": [
            {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 3}}, "text": "async def"}
        ],
    },
    "textDocument/didClose": lambda uri: {"textDocument": {"uri": uri}},
}
REQUESTS = {
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "codespec/edit",
    "codespec/stats",
    "workspace/executeCommand",
}


def paths(value, prefix=()):
    """Every path to a value inside ``value`` (dict keys, list indexes), the root included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def replaced(value, path, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


def typed_message(data, state: LspState) -> list[Send]:
    """A valid method whose params have one value replaced by a hypothesis-drawn JSON value (or
    left as they are), as a request or a notification; sometimes cancelled right away."""
    method = data.draw(st.sampled_from(sorted(TEMPLATES)), label="method")
    uri = data.draw(st.sampled_from([*state.uris, "file:///unknown.py", "untitled:1"]), label="uri")
    params = TEMPLATES[method](uri)
    if data.draw(st.booleans(), label="mutate"):
        path = data.draw(st.sampled_from(list(paths(params))), label="path")
        params = replaced(params, path, data.draw(JSON, label="value"))
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    if method not in REQUESTS:
        return [Send(frame(message), kind=f"typed:{method}")]
    state.next_id += 1
    message["id"] = f"typed-{state.next_id}"
    sends = [Send(frame(message), must=[message["id"]], kind=f"typed:{method}")]
    if data.draw(st.integers(0, 3), label="cancel") == 0:
        sends.append(
            Send(frame({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": message["id"]}}), kind="cancel")
        )
    return sends


@pytest.fixture(scope="module")
def fuzzed(server_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-workspace")
    (root / "a.py").write_text("def helper(value):\n    return value * 2\n")
    server = StdioServer(
        server_model_dir,
        root,
        {
            "limits": {"lineTokens": 6, "blockTokens": 8, "editTokens": 8, "deadlineMs": 30_000},
            "maxDocumentBytes": 200_000,
        },
        stderr_path=tmp_path_factory.mktemp("fuzz-logs") / "stderr.log",
    )
    server.initialize()
    uris = [(root / f"doc{i}.py").as_uri() for i in range(4)]
    tally = Tally()
    tally.first_rss_mb = server.memory()["VmRSS"]
    yield server, uris, tally
    server.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(data=st.data())
def test_every_batch_is_answered_and_the_server_stays_up(fuzzed, data):
    server, uris, tally = fuzzed
    # A fresh generator state each example (hypothesis replays examples: what it draws may not
    # depend on earlier ones); ids stay unique across examples through the tally's count.
    state = LspState(list(uris), next_id=tally.sent * 10)
    rng = data.draw(st.randoms(use_true_random=False), label="rng")
    sends: list[Send] = []
    for source in data.draw(
        st.lists(st.sampled_from(["generator", "generator", "typed"]), min_size=6, max_size=14), label="sources"
    ):
        new = [lsp_message(rng, state)] if source == "generator" else typed_message(data, state)
        sends += [in_sequence(state, send) for send in new]
    check_lsp_batch(server, sends, tally, ANSWER_S)
    assert server.alive, server.stderr_text()[-3000:]
    assert not tally.pending and not tally.duplicates and not tally.internal, tally.failures[-5:]
    assert tally.peak_rss_mb - tally.first_rss_mb < MEMORY_BOUND_MB, tally.as_dict()


def test_after_the_fuzzing_the_server_is_whole(fuzzed):
    server, _, tally = fuzzed
    settle(server, tally, ANSWER_S)
    assert tally.batches >= EXAMPLES // 2 and tally.sent > 250 and tally.owed > 150 and tally.unanswered == 0, (
        tally.as_dict()
    )
    reply = server.request("codespec/stats", {}, msg_id="after-fuzz")
    assert "result" in reply and server.alive
    log = server.stderr_text()
    assert max((len(line) for line in log.splitlines()), default=0) < 5000, "a log line quotes too much"
    assert "Traceback" not in log, log[log.index("Traceback") - 500 :][:4000]  # no handler failed
