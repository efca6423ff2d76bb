"""Workspace and session-history index: tokenized documents, suffix lookup, SQLite persistence."""
