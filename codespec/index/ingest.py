"""Filling the index from a thread other than the one that queries and edits it.

:class:`~index.store.WorkspaceIndex` guards its state with one lock, and
:meth:`~index.store.WorkspaceIndex.index_workspace` reads, hashes, tokenizes and sorts without
holding it, so a workspace scan may run on its own thread while another thread looks up and
edits. Two things make that safe in practice:

- **a tokenizer per thread.** A Hugging Face fast tokenizer is one Rust object behind a borrow
  flag; a call on one thread that touches its settings (truncation, padding) while another
  thread encodes fails with "Already borrowed". The scanning thread therefore tokenizes with
  its own copy (:func:`thread_adapter`), checked to tokenize exactly like the index's.
- **cancellation that changes nothing.** The scan checks its ``cancel`` callable between stages
  and tokenizer batches and raises :class:`ScanCancelled` before it installs anything, so a
  scan stopped at shutdown leaves the index (and its database) as they were.
"""

from __future__ import annotations

import copy

from codespec.index.tokens import TokenizerAdapter


class ScanCancelled(Exception):
    """A workspace scan stopped by its ``cancel`` check; the index is unchanged."""


def thread_adapter(adapter: TokenizerAdapter) -> TokenizerAdapter:
    """An adapter over a private copy of ``adapter``'s tokenizer, for use by one other thread.

    A deep copy, not a reload: the tokenizer may have no files (built in memory), and copying
    is cheap (a few milliseconds for a 4k vocabulary). The copy must tokenize identically, which
    the fingerprint (the serialised tokenizer) confirms.
    """
    private = TokenizerAdapter(copy.deepcopy(adapter.tokenizer))
    if private.fingerprint != adapter.fingerprint:
        raise ValueError("a copy of the tokenizer does not tokenize like the original")
    return private
