"""The websocket door: JSON messages over ``websockets`` to the engine service (docs/protocol.md).

What outside the door may use (``commands`` to serve it, ``bench`` to measure it end to end):
:func:`start_ws_server` and :func:`bound_port`.
"""

from codespec.websocket_api.server import bound_port, start_ws_server

__all__ = ["bound_port", "start_ws_server"]
