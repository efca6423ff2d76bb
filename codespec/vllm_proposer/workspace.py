"""The workspace index the vLLM drafter drafts from, opened when vLLM builds the drafter."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from codespec.vllm_proposer.options import DrafterOptions

log = logging.getLogger("vllm.codespec")  # under vLLM's logger: its lines land in vLLM's log


def open_index(tokenizer: Any, options: DrafterOptions):
    """The workspace index the options name (scanned at start; the store keeps its tokens, so a
    workspace ``codespec serve`` indexed is not tokenized again), or None."""
    if not options.workspace:
        return None
    from codespec.index import WorkspaceIndex
    from codespec.index.persist import default_index_path

    roots = [Path(folder).expanduser().resolve() for folder in options.workspace]
    store = Path(options.index).expanduser() if options.index else default_index_path(roots)
    store.parent.mkdir(parents=True, exist_ok=True)
    index = WorkspaceIndex(tokenizer, str(store), memory_budget_tokens=options.index_max_tokens)
    began = time.perf_counter()
    report = index.index_workspace(roots)
    log.info("codespec: indexed %s in %.1f s (store %s)", report, time.perf_counter() - began, store)
    return index
