"""The engine service: one model, one index, the proposers, and the jobs every door submits, in
three rooms that import one way, requests <- engine <- doors (docs/architecture.md):

- ``requests``: what a request is and how each kind is built and checked (values and plain functions);
- ``engine``: the engine thread, its scheduler, jobs and bookkeeping, starting and stopping it;
- ``doors``: what the doors share (the token and Origin check, safe logging, a broken message's id).

No door is imported here; the LSP (``lsp``), websocket (``websocket_api``) and HTTP (``http_api``)
doors translate their wire formats to the requests this package builds and validates.
"""
