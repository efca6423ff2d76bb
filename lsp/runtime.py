"""Starting and stopping the engine service: model loading, CPU threads, the index's close.

Shared by `codespec serve` (LSP and websocket) and `codespec complete`.
"""

from __future__ import annotations

import logging
import sys

from lsp.options import ServerOptions
from lsp.service import EngineService

log = logging.getLogger(__name__)


def _index_text(index, uri: str) -> str | None:
    """The index's copy of ``uri``, None when it holds none (other errors are real: raised)."""
    try:
        return index.document_text(uri)
    except KeyError:  # not in the index
        return None


def close_service(service: EngineService) -> None:
    """Stop a workspace scan (it installs nothing once cancelled), flush and close the index on
    the engine thread (ordered after the index updates already queued there), then stop."""
    from lsp.indexing import stop_indexing

    stop_indexing(service)
    index = service.index
    if index is not None and hasattr(index, "close"):
        try:
            service.call(index.close).result()
        except Exception as error:
            log.warning("closing the index failed: %s", error)
    service.close()


def start_service(options: ServerOptions) -> EngineService:
    """Load the model (blocking: runs in a worker thread during initialize) and start the engine."""
    from codespec.default_model import target_path
    from codespec.model import TargetModel

    model = options.model or str(target_path())
    _set_cpu_threads(options.threads)
    target = TargetModel.load(model, device=options.device, dtype=options.dtype, prompt_format=options.prompt_format)
    how = "detected from its tokenizer" if options.prompt_format == "auto" else "as configured"
    print(f"codespec: model {model}, prompt format {target.prompt_format.name} ({how})", file=sys.stderr, flush=True)
    from proposers.setup import DraftConfig, ProposerConfig

    proposer_config = ProposerConfig(draft=DraftConfig(path=options.draft))
    service = EngineService(target, options.proposer, options.max_draft, options.cached_documents,
                            proposer_config=proposer_config)
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
