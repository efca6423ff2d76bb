"""Who may talk to the websocket endpoint: a token, and no foreign browser pages.

Any web page the user visits can open a websocket to 127.0.0.1, so binding loopback is not
enough. Every connection must present the token (``Authorization: Bearer TOKEN`` or
``?token=TOKEN``), and a connection that carries an ``Origin`` header (browsers always send one)
is refused unless that origin is on the allow-list. Tools that are not browsers send no Origin and
are judged by the token alone.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

TOKEN_ENV = "CODESPEC_TOKEN"


@dataclass(frozen=True)
class Listen:
    """Where a network door listens (port 0: any free one) and the token every request must bring."""

    token: str
    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class TokenSource:
    token: str
    origin: str  # "--token", "CODESPEC_TOKEN", or the path of the file a generated token was written to
    file: Path | None = None


def default_token_file() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache" / "codespec"
    return base / "codespec-ws-token"


def resolve_token(
    cli_token: str | None, token_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> TokenSource:
    """--token, else $CODESPEC_TOKEN, else a fresh random token written to a 0600 file."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if cli_token:
        return TokenSource(cli_token, "--token")
    if env.get(TOKEN_ENV):
        return TokenSource(env[TOKEN_ENV], TOKEN_ENV)
    token = secrets.token_urlsafe(32)
    path = write_token_file(token, token_file or default_token_file())
    return TokenSource(token, str(path), path)


def write_token_file(token: str, path: Path) -> Path:
    """Write ``token`` to ``path`` readable by the user only (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # an older file may have had wider permissions
        os.write(descriptor, (token + "\n").encode())
    finally:
        os.close(descriptor)
    return path


def presented_token(path: str, authorization: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    values = parse_qs(urlsplit(path).query).get("token")
    return values[0] if values else None


def refusal(path: str, headers, token: str, allowed_origins: tuple[str, ...]) -> tuple[HTTPStatus, str] | None:
    """Why this handshake must be refused (status, reason), or None to accept it."""
    origin = headers.get("Origin")
    if origin is not None and origin not in allowed_origins:
        return HTTPStatus.FORBIDDEN, f"origin {origin!r} is not allowed (see --allow-origin)\n"
    offered = presented_token(path, headers.get("Authorization"))
    if offered is None:
        return HTTPStatus.UNAUTHORIZED, "missing token: send Authorization: Bearer TOKEN or ?token=TOKEN\n"
    if not hmac.compare_digest(offered.encode(), token.encode()):
        return HTTPStatus.UNAUTHORIZED, "wrong token\n"
    return None
