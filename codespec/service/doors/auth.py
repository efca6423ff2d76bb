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
import stat
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
    """The token a server will require, where it came from, and whether its file is still to be
    written (a generated token: written only once the server listens, see :meth:`keep`)."""

    token: str
    origin: str  # "--token", "CODESPEC_TOKEN", or the path of the token file
    file: Path | None = None
    generated: bool = False  # a new token, not yet in ``file``

    def keep(self) -> None:
        """Write a generated token to its file; a server calls this once it listens, so one that
        fails to start (a port in use) leaves the running server's token in place."""
        if self.generated and self.file is not None:
            write_token_file(self.token, self.file)

    def describe(self) -> str:
        if self.file is None:
            return f"from {self.origin}"
        if self.generated:
            return f"written to {self.file} (readable by you only)"
        return f"read from {self.file}"


def default_token_file() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache" / "codespec"
    return base / "codespec-ws-token"


def resolve_token(
    cli_token: str | None,
    token_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    new: bool = False,
) -> TokenSource:
    """--token, else $CODESPEC_TOKEN, else the token file's token, else (or with ``new``) a fresh
    random token for that file. The file's token is kept across restarts so the clients that
    stored it (an editor's settings, ``export CODESPEC_TOKEN=$(cat FILE)``) keep working; a new
    one is only written by :meth:`TokenSource.keep`."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if cli_token:
        return TokenSource(cli_token, "--token")
    if env.get(TOKEN_ENV):
        return TokenSource(env[TOKEN_ENV], TOKEN_ENV)
    path = token_file or default_token_file()
    stored = None if new else read_token_file(path)
    if stored is not None:
        return TokenSource(stored, str(path), path)
    return TokenSource(secrets.token_urlsafe(32), str(path), path, generated=True)


def read_token_file(path: Path) -> str | None:
    """The token in ``path`` if it is one this user alone can read: a regular file of this user,
    mode 0600 or narrower, one non-empty line. Anything else (absent, wider permissions, another
    owner, empty) is not trusted, and a new token replaces it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.getuid():
            return None
        token = os.read(descriptor, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(descriptor)
    return token if token and "\n" not in token and len(token) >= 16 else None


def write_token_file(token: str, path: Path) -> Path:
    """Write ``token`` to ``path`` readable by the user only (created 0600, never world-readable),
    all at once: a reader sees the old token or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # a stale temporary file may have had wider permissions
        os.write(descriptor, (token + "\n").encode())
    finally:
        os.close(descriptor)
    os.replace(partial, path)
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
