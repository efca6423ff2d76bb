"""The OpenAI-compatible HTTP door (Starlette/uvicorn) to the engine service (docs/http.md).

What outside the door may use (``commands`` to serve it, ``bench`` to measure it end to end):
:func:`start_http_server` and :func:`parse_chat`, the wire-to-request translation the handler runs.
"""

from codespec.http_api.schema import parse_chat
from codespec.http_api.server import HttpServer, start_http_server

__all__ = ["HttpServer", "parse_chat", "start_http_server"]
