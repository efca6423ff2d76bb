"""The engine-URL mode's failures before any request: a clear message, a non-zero exit, no hang."""

import socket
import subprocess
import sys

import pytest

from codespec.service.engine.served import EngineEndpoint, EngineUnavailable


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed once the probe goes


def test_an_engine_that_is_not_running_is_named_in_the_error():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(EngineUnavailable, match="unreachable.*is it running"):
        EngineEndpoint(url).served_model()


@pytest.mark.parametrize(
    ("url", "message"),
    [("ftp://host:1", "expected http://HOST:PORT"), (None, "is unreachable")],
)
def test_serve_with_a_bad_engine_url_exits_with_the_reason(url, message):
    url = url or f"http://127.0.0.1:{closed_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "codespec.commands.cli", "serve", "--http", "--engine-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


class StreamingEngine:
    """An OpenAI-style completions endpoint that streams 30 deltas 50 ms apart (vLLM's wire format,
    scripted: what codespec's served generation reads), on a real socket."""

    CHUNKS = 30

    def __enter__(self):
        import http.server
        import json
        import socketserver
        import threading
        import time

        chunks = self.CHUNKS

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i in range(chunks):
                        chunk = {"choices": [{"text": f"x{i} ", "token_ids": [i + 1000], "finish_reason": None}]}
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        self.wfile.flush()
                        time.sleep(0.05)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


class Ending:
    """What a ServedGeneration hands its jobs back to (EngineService's JobEnding side), recorded."""

    stop_token_ids: frozenset[int] = frozenset()

    def __init__(self) -> None:
        import threading

        self.ended: dict[int, tuple] = {}
        self.done = threading.Condition()

    def finish_job(self, job, text, reason, stats) -> None:
        with self.done:
            self.ended[id(job)] = (reason, text)
            self.done.notify_all()

    def fail_job(self, job, error) -> None:
        with self.done:
            self.ended[id(job)] = ("failed", repr(error))
            self.done.notify_all()

    def wait(self, jobs, timeout: float = 30.0) -> None:
        with self.done:
            assert self.done.wait_for(lambda: all(id(job) in self.ended for job in jobs), timeout), "unanswered jobs"


def served(engine: StreamingEngine, max_batch: int):
    from types import SimpleNamespace

    from codespec.service.engine.served import ServedGeneration

    target = SimpleNamespace(engine_model="m", max_context=4096)
    generation = ServedGeneration(target, EngineEndpoint(engine.url), max_batch=max_batch)  # type: ignore[arg-type]
    ending = Ending()
    generation.attach(ending)
    return generation, ending


def started(generation, count: int):
    from types import SimpleNamespace

    from codespec.service.engine.jobs import Job, PreparedPrompt
    from codespec.service.requests.schema import GenerationRequest

    jobs = [Job(GenerationRequest(prompt="x", max_tokens=64), None) for _ in range(count)]
    for job in jobs:
        generation.start(job, PreparedPrompt(SimpleNamespace(stop=()), [1, 2, 3], 0))
    return jobs


def test_a_request_cancelled_as_it_leaves_for_the_engine_is_stopped_not_run_to_its_end():
    """The watcher can shut only a socket that exists: a job cancelled before its thread connected
    (an editor's next keystroke) must still stop, not stream the engine's whole answer."""
    from codespec.core.finish import FinishReason

    with StreamingEngine() as engine:
        generation, ending = served(engine, max_batch=1)
        try:
            [job] = started(generation, 1)
            job.cancel()
            ending.wait([job])
            reason, text = ending.ended[id(job)]
            assert reason == FinishReason.CANCELLED
            assert text.count("x") < StreamingEngine.CHUNKS  # stopped, not the whole stream
        finally:
            generation.close()


def test_closing_answers_every_request_also_those_still_queued():
    with StreamingEngine() as engine:
        generation, ending = served(engine, max_batch=1)  # 4 streaming threads: 2 of 6 queue
        jobs = started(generation, 6)
        generation.close()
        ending.wait(jobs)
        assert {ending.ended[id(job)][0] for job in jobs} == {"cancelled"}


def test_a_requests_reference_travels_to_the_engine_in_vllm_xargs():
    """Predicted Outputs on vLLM: the prediction leaves in the body where codespec's proposer inside
    vLLM reads it (SamplingParams.extra_args); a request without one sends no such field."""
    from codespec.core.config import SamplingParams
    from codespec.core.draft import REFERENCE_ARG

    with StreamingEngine() as engine:
        generation, _ = served(engine, max_batch=1)
        try:
            body = generation._body([1, 2], 8, SamplingParams(), (), "def total(items):\n")
            assert body["vllm_xargs"] == {REFERENCE_ARG: "def total(items):\n"}
            assert "vllm_xargs" not in generation._body([1, 2], 8, SamplingParams(), ())
        finally:
            generation.close()
