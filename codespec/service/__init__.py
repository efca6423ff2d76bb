"""The engine service: one model, one index, the proposers, and the jobs every door submits.

No door is imported here; the LSP (``lsp``), websocket (``websocket_api``) and HTTP (``http_api``)
doors translate their wire formats to the requests this package builds and validates
(docs/architecture.md).
"""
