"""The one place codespec touches pygls's private API (``codespec.lsp.rpc``), checked against the
installed pygls: every private method it overrides or calls and every private attribute it reads
must still exist with the parameters it was written against. A pygls release that changes any of
them fails here, by name, before it fails a user's editor."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pygls.protocol import LanguageServerProtocol
from pygls.server import JsonRPCServer

from codespec.lsp.server import build_server

RPC = Path(__file__).resolve().parents[2] / "codespec" / "lsp" / "rpc.py"

# private method -> its parameters (after self), as codespec.lsp.rpc overrides or calls it
METHODS = {
    "_send_data": ["data"],
    "_handle_request": ["msg_id", "method_name", "params"],
    "_handle_notification": ["method_name", "params"],
    "_execute_handler": ["msg_id", "handler", "callback", "args", "kwargs"],
    "_handle_cancel_notification": ["msg_id"],
    "_send_handler_result": ["future", "msg_id"],
    "_check_handler_result": ["future"],
    "_get_handler": ["feature_name"],
    "_serialize_message": ["data"],
    "_send_response": ["msg_id", "result", "error"],
}
SERVER_METHODS = {"_report_server_error": ["error", "source"]}
# private attributes a protocol (or its server) has once built
PROTOCOL_ATTRIBUTES = (
    "_converter",
    "_server",
    "_shutdown",
    "_request_futures",
    "_result_types",
    "_include_headers",
    "_ctx_msg_id",
)
SERVER_ATTRIBUTES = ("_stop_event",)


def parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def test_the_private_methods_rpc_overrides_or_calls_are_pygls_s():
    changed = {
        name: (
            None
            if getattr(LanguageServerProtocol, name, None) is None
            else parameters(getattr(LanguageServerProtocol, name))
        )
        for name in METHODS
    }
    changed = {name: found for name, found in changed.items() if found != METHODS[name]}
    assert not changed, f"pygls changed these private methods codespec.lsp.rpc relies on: {changed}"
    for name, expected in SERVER_METHODS.items():
        assert parameters(getattr(JsonRPCServer, name)) == expected, name


def test_the_private_attributes_rpc_reads_exist_on_a_built_server():
    server = build_server()
    missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(server.protocol, name)]
    missing += [name for name in SERVER_ATTRIBUTES if not hasattr(server, name)]
    assert not missing, f"pygls no longer has these private attributes: {missing}"


def test_this_list_is_every_private_name_rpc_uses_of_pygls():
    """A new private touch in rpc.py must be listed above (and so checked against pygls)."""
    tree = ast.parse(RPC.read_text(encoding="utf-8"))
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    own -= set(METHODS)  # overrides are pygls's names
    assigned = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr not in PROTOCOL_ATTRIBUTES
    }
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
    }
    pygls_names = set(METHODS) | set(SERVER_METHODS) | set(PROTOCOL_ATTRIBUTES) | set(SERVER_ATTRIBUTES)
    unlisted = sorted(used - own - assigned - pygls_names)
    assert not unlisted, f"rpc.py uses private names not checked against pygls: {unlisted}"
