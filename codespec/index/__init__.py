"""Workspace and session-history index: tokenized documents, suffix lookup, SQLite persistence.

``WorkspaceIndex`` is the facade (:mod:`index.store`); :mod:`index.ngram` explains the matching
structure (a shallow pyahocorasick trie of reversed n-grams over sorted position arrays).
"""

from codespec.index.history import HistoryRecord
from codespec.index.ranking import Continuation
from codespec.index.scan import IndexReport
from codespec.index.store import WorkspaceIndex
from codespec.index.tokens import TokenizerAdapter

__all__ = ["Continuation", "HistoryRecord", "IndexReport", "TokenizerAdapter", "WorkspaceIndex"]
