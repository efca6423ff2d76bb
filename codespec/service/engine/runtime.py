"""Starting and stopping the engine service: model loading, CPU threads, the index's close.

Shared by `codespec serve` (LSP, websocket and HTTP) and `codespec complete`.

One process, one model: when `codespec serve` runs the language server together with the
websocket or HTTP endpoint, it loads the service from the command line first and *shares* it
(:func:`share_service`); the language server's ``initialize`` then gets that service from
:func:`start_service` instead of loading a second model, and its ``shutdown`` only releases it
(:func:`close_service` closes a shared service when its last user lets go).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import threading
from collections.abc import Coroutine
from typing import Any

from codespec.core.backends import load_target
from codespec.core.default_model import target_path
from codespec.proposers.setup import DraftConfig, ProposerConfig
from codespec.service.engine.indexing import stop_indexing
from codespec.service.engine.service import EngineService
from codespec.service.requests.options import DEFAULT_MAX_CACHED_TOKENS, EngineOptions, ServerOptions

log = logging.getLogger(__name__)


_shared_lock = threading.Lock()
_shared: EngineService | None = None
_shared_users = 0
_shared_options: ServerOptions | None = None


def share_service(service: EngineService, options: ServerOptions) -> None:
    """Make ``service`` the process's one service: :func:`start_service` returns it from now on
    (one more user each time) and :func:`close_service` closes it when its last user lets go. The
    caller is its first user."""
    global _shared, _shared_users, _shared_options
    with _shared_lock:
        _shared, _shared_users, _shared_options = service, 1, options


def close_service(service: EngineService) -> None:
    """Stop a workspace scan (it installs nothing once cancelled), flush and close the index on
    the engine thread (ordered after the index updates already queued there), then stop.

    A shared service (:func:`share_service`) is only released here while others still use it."""
    global _shared, _shared_users, _shared_options
    with _shared_lock:
        if service is _shared:
            _shared_users -= 1
            if _shared_users > 0:
                return
            _shared, _shared_options = None, None
    _close(service)


def _close(service: EngineService) -> None:
    stop_indexing(service)
    index = service.index
    if index is not None and hasattr(index, "close"):
        try:
            service.call(index.close).result()
        except Exception as error:
            log.warning("closing the index failed: %s", error)
    service.close()


def start_service(options: ServerOptions) -> EngineService:
    """Load the model (blocking: runs in a worker thread during initialize) and start the engine;
    the shared service instead, if the process has one (:func:`share_service`)."""
    global _shared_users
    with _shared_lock:
        if _shared is not None and _shared_options is not None:
            _shared_users += 1
            # A door that asks for other engine options while a service is shared gets the shared one.
            differing = [
                field.name
                for field in dataclasses.fields(EngineOptions)
                if getattr(options.engine, field.name) != getattr(_shared_options.engine, field.name)
            ]
            if differing:
                print(
                    f"codespec: this process serves one model, loaded from the command line; "
                    f"{', '.join(differing)} from the client ignored",
                    file=sys.stderr,
                    flush=True,
                )
            return _shared
    return load_service(options)


def load_service(options: ServerOptions) -> EngineService:
    """Load the model and start a new engine service (never the shared one); with an engine URL,
    a service whose requests the served engine generates (service.engine.served)."""
    if options.engine.engine_url:
        import os

        from codespec.service.engine.served import load_served

        served = load_served(
            options, options.engine.engine_url, options.engine.engine_model, os.environ.get("CODESPEC_ENGINE_API_KEY")
        )
        print(f"codespec: generating on {served.target.name}", file=sys.stderr, flush=True)
        return served

    model = options.engine.model or str(target_path())
    _set_cpu_threads(options.engine.threads)

    asked_tokens = options.engine.max_cached_tokens
    target = load_target(
        model,
        device=options.engine.device,
        dtype=options.engine.dtype,
        prompt_format=options.engine.prompt_format,
        threads=options.engine.threads,  # llama.cpp's (a GGUF model); torch's are set above
        kv_tokens=asked_tokens if asked_tokens != DEFAULT_MAX_CACHED_TOKENS else None,
    )
    how = "detected from its tokenizer" if options.engine.prompt_format == "auto" else "as configured"
    print(f"codespec: model {model}, prompt format {target.prompt_format.name} ({how})", file=sys.stderr, flush=True)

    proposer_config = ProposerConfig(draft=DraftConfig(path=options.engine.draft))
    service = EngineService(
        target,
        options.engine.proposer,
        options.engine.max_draft,
        options.engine.cached_documents,
        proposer_config=proposer_config,
        max_batch=options.engine.max_batch,
        max_cached_tokens=options.engine.max_cached_tokens,
    )
    service.warm_up()
    return service


def _set_cpu_threads(threads: int | None) -> None:
    """Decode steps are tiny matmuls: with every core busy (an editor, a build, other servers)
    torch's default of one thread per core spends more time synchronising threads than computing
    (measured on 2 loaded cores: 120 ms per step with 2 threads, 0.5 ms with 1). Half the cores,
    at most 8, unless the user says otherwise.

    The tokenizer's batch encoding (a workspace scan, on the indexing thread) would otherwise
    spread over every core and slow the decode cycles running meanwhile: serial, it takes one
    core (measured on 2 loaded cores, 8-token completions while 480 files, 1.6M tokens, were
    scanned in ~4 s: p50 28 ms, max 90-100 ms; with parallel batches 45 ms and 100-200 ms, the
    scan no faster; idle 11 ms). An explicit TOKENIZERS_PARALLELISM setting is kept."""
    import os

    import torch

    torch.set_num_threads(threads or max(1, min(8, (os.cpu_count() or 2) // 2)))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class LoopThread:
    """An asyncio event loop on a daemon thread, for servers that run beside a blocking one (the
    HTTP and websocket endpoints beside the language server on the main thread)."""

    def __init__(self, name: str = "codespec-http") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
