"""What a session has seen and written, kept for drafting its later requests.

Two stores: the index's session history (text, with the index's own tokens; drafted from by the
workspace lookup) when an index is attached, and the earlier outputs as token ids
(``proposers.outputs``; drafted from by auto's outputs lookup), with or without an index. Clearing
forgets both, so a benchmark or a user can ask a request as if for the first time.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Container, Sequence

from codespec.proposers.outputs import RecentOutputs, until_stop
from codespec.service.engine.bookkeeping import ServiceStats

log = logging.getLogger(__name__)
RECENT_HISTORY = 20  # history entries the stats show


class SessionHistory:
    """On the engine thread: the service adds and clears through ``EngineService.call``."""

    def __init__(self, stats: ServiceStats, stop_token_ids: Container[int]) -> None:
        self.stats = stats
        self.stop_token_ids = stop_token_ids
        # only the stats' view of the last entries, (kind, uri, text), newest last: the history the
        # proposers draft from is the index's (``index.add_history``)
        self.recent: collections.deque = collections.deque(maxlen=RECENT_HISTORY)
        self.outputs = RecentOutputs()  # what the model wrote for earlier requests, as token ids

    def add(self, kind: str, text: str, uri: str | None, index) -> None:
        self.recent.append((kind, uri, text))
        self.stats.history_entries += 1
        if index is not None:
            try:
                index.add_history(kind, text, uri)
            except Exception:  # history is a hint for drafting; never fail a request over it
                log.exception("index.add_history failed")

    def add_output(self, token_ids: Sequence[int]) -> None:
        """A finished output's tokens (a prompt's stop token and what follows it left out)."""
        self.outputs.add(until_stop(token_ids, self.stop_token_ids))

    def clear(self, index) -> None:
        self.recent.clear()
        self.outputs.clear()
        clear_index = getattr(index, "clear_history", None)
        if clear_index is not None:
            clear_index()
