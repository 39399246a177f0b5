"""The serving token: read from a file or ``DUPLEXCADENCE_TOKEN``, checked in constant time.

A server never runs without a token, and a client sends it as ``Authorization: Bearer TOKEN`` on
the WebSocket handshake. The server checks it before it reads a single message, so a client with
no token or a wrong one never causes any model work.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import Mapping, Optional

from engine import safeload

ENV = "DUPLEXCADENCE_TOKEN"
MIN_LENGTH = 16


class TokenError(ValueError):
    """No usable token (the message says where one was looked for and what to do)."""


def read_token(token_file: Optional[str] = None, environ: Optional[Mapping[str, str]] = None,
               role: str = "server") -> str:
    """The token from ``token_file`` (first line, stripped) or else from ``$DUPLEXCADENCE_TOKEN``.

    A server's token must be at least :data:`MIN_LENGTH` characters (``openssl rand -hex 32`` makes
    a good one); a client's is sent as it is.
    """
    env = os.environ if environ is None else environ
    if token_file:
        p = Path(token_file).expanduser()
        try:                                   # a regular file only (a FIFO, /dev/zero refused at once), capped
            text = safeload.read_text(p, safeload.CAPS["token"], "the token file")
        except safeload.FileCheckError as e:
            raise TokenError(str(e)) from None
        lines = text.strip().splitlines()
        token = lines[0].strip() if lines else ""
        where = f"the token file {p}"
    else:
        token = str(env.get(ENV, "")).strip()
        where = f"${ENV}"
    if not token:
        raise TokenError(f"no token: {where} is empty or unset — a token is required "
                         f"(give --token-file FILE or set {ENV})")
    if role == "server" and len(token) < MIN_LENGTH:
        raise TokenError(f"the token from {where} is {len(token)} characters; use at least {MIN_LENGTH} "
                         "(for example: openssl rand -hex 32 > token.txt)")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise TokenError(f"the token from {where} holds spaces or control characters")
    return token


def bearer(headers: Mapping[str, str]) -> Optional[str]:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    value = None
    for k, v in headers.items():
        if str(k).lower() == "authorization":
            value = str(v)
            break
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def check(expected: str, headers: Mapping[str, str]) -> Optional[str]:
    """None when the headers carry the expected token; else the reason to refuse (one sentence)."""
    got = bearer(headers)
    if got is None:
        return "no token: send 'Authorization: Bearer TOKEN' (the server's token file or $DUPLEXCADENCE_TOKEN)"
    if not hmac.compare_digest(got.encode("utf-8"), expected.encode("utf-8")):
        return "wrong token: the server refused it"
    return None


def auth_headers(token: str) -> dict:
    """The handshake header a client sends."""
    return {"Authorization": f"Bearer {token}"}
