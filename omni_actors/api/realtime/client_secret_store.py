"""Realtime client secrets (`ek_...` ephemeral keys) in the data directory's SQLite store (store.py).

    realtime_client_secrets(digest, expires_at, minted_by, session)

Only the SHA-256 of a secret's value is stored, never the value: the database
alone opens no session. `minted_by` is the SHA-256 of the API key that made the
secret (NULL where the server had no keys), so a secret dies with its key;
`session` is the session the secret presets, as JSON (the checked `session.update`
body, client_events.SessionIn). A secret opens realtime WebSockets until it
expires, as many as its holder likes (as OpenAI's do); expired rows are removed as
new secrets are made. The lookup for one upgrade request is one indexed query.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

import msgspec
from aiohttp import web

from omni_actors.api.middleware import CLIENT_SECRET_PREFIX
from omni_actors.api.realtime import client_events as ce
from omni_actors.store import Store, get_store

FEATURE = "realtime_client_secrets"
DDL = (
    "CREATE TABLE IF NOT EXISTS realtime_client_secrets (digest BLOB PRIMARY KEY, expires_at INTEGER NOT NULL, "
    "minted_by BLOB, session TEXT)",
    "CREATE INDEX IF NOT EXISTS realtime_client_secrets_expiry ON realtime_client_secrets (expires_at)",
)
SECRET_BYTES = 32
"""Random bytes in a value (256 bits, url-safe base64 after PREFIX)."""

_session_decoder = msgspec.json.Decoder(ce.SessionIn)


def digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class ClientSecret:
    expires_at: int
    minted_by: bytes | None
    """SHA-256 of the API key that made it; None where the server had no keys then."""
    session: ce.SessionIn | None
    """The session it presets (checked at creation); None: the server's defaults."""


CLIENT_SECRET_KEY = web.RequestKey("realtime_client_secret", ClientSecret)
"""On an upgrade request authenticated with a client secret (middleware.py): the secret."""


class ClientSecretStore:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store or get_store()
        self.store.ensure(FEATURE, DDL)

    def add(self, seconds: int, minted_by: bytes | None, session: ce.SessionIn | None,
            created_at: float | None = None) -> tuple[str, int]:
        """A new secret valid `seconds` from `created_at` (default now): (its value, its expires_at)."""
        value = CLIENT_SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
        expires_at = int(time.time() if created_at is None else created_at) + seconds
        text = None if session is None else msgspec.json.encode(session).decode()
        self.store.transaction([
            ("DELETE FROM realtime_client_secrets WHERE expires_at <= ?", (int(time.time()),)),
            ("INSERT INTO realtime_client_secrets (digest, expires_at, minted_by, session) VALUES (?, ?, ?, ?)",
             (digest(value), expires_at, minted_by, text)),
        ])
        return value, expires_at

    def find(self, value: str) -> ClientSecret | None:
        """The live secret whose value is `value`; None for one unknown or expired."""
        row = self.store.query_one(
            "SELECT expires_at, minted_by, session FROM realtime_client_secrets WHERE digest = ? AND expires_at > ?",
            (digest(value), int(time.time())))
        if row is None:
            return None
        session = None if row["session"] is None else _session_decoder.decode(row["session"])
        return ClientSecret(row["expires_at"], row["minted_by"], session)


CLIENT_SECRETS_KEY = web.AppKey("realtime_client_secrets", ClientSecretStore)
"""The app's store if a test or embedder gives it one; else the process's (client_secret_store below)."""
_DEFAULT: list[ClientSecretStore] = []


def client_secret_store(app: web.Application) -> ClientSecretStore:
    """The app's store if it was given one, else the process's (opened on first use)."""
    given = app.get(CLIENT_SECRETS_KEY)
    if given is not None:
        return given
    if not _DEFAULT:
        _DEFAULT.append(ClientSecretStore())
    return _DEFAULT[0]
