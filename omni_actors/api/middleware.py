"""Request gatekeeping before any handler runs: API-key auth and the body-size limit.

- Auth, the one check for every route (REST and the realtime WebSocket alike):
  when `server.api_keys` is non-empty every route except PUBLIC_PATHS needs
  `Authorization: Bearer <key>` (any case of "Bearer"), or `api-key: <key>`
  (Azure's header), or for browser WebSockets the subprotocol
  `openai-insecure-api-key.<key>`, naming one of them; otherwise 401. The
  presented key is compared with every configured key in constant time (both
  hashed first, so neither length nor position leaks) and never logged.
- Realtime client secrets (`ek_...`, realtime/client_secrets.py): accepted in the
  same places, on the realtime WebSocket route (REALTIME_PATH) only, never on a REST
  route, whether or not the server has keys: a live secret made with a key still
  configured (or on a server without keys) opens the socket, and the request carries
  it (CLIENT_SECRET_KEY) for the session to start from; an unknown, expired or
  orphaned one is a 401 before the upgrade.
- Body size: a declared `Content-Length` over `server.max_body_mb` is refused
  with 413 before a byte of the body is read; a chunked body is cut off by
  aiohttp's `client_max_size` (the same limit) while reading, also 413.
- Body time: the whole body must arrive within `server.body_timeout_s`, else
  408 and the connection is closed (a stalled or short body holds no handler).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac

from aiohttp import web

from omni_actors.api.errors import ApiError

PUBLIC_PATHS = frozenset({"/", "/health", "/metrics", "/openapi.json"})
"""Routes answered without an API key: probes, scrapers and the API description carry none,
and `/` is the (browser) playground page, which asks for a key itself."""
PUBLIC_PREFIXES = ("/playground/",)
"""The playground's static files: the page asks for a key itself when the API needs one."""
CAPABILITY_PREFIXES = ("/v1/files/images/",)
"""Image links (`response_format: "url"`): like OpenAI's signed URLs, the link's 128 random bits
are the credential, so an `<img src>` or a plain download works without the API key."""


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES + CAPABILITY_PREFIXES)


WS_KEY_PROTOCOL = "openai-insecure-api-key."
"""WebSocket subprotocol prefix carrying a key (browsers cannot set headers on a WebSocket)."""
REALTIME_PATH = "/v1/realtime"
"""The one route a client secret opens."""
CLIENT_SECRET_PREFIX = "ek_"
"""What every client secret's value starts with (OpenAI's `ek_...`): how a secret is told from an API key."""


def presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "").strip()
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if request.headers.get("api-key", "").strip():
        return request.headers["api-key"].strip()
    for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith(WS_KEY_PROTOCOL):
            return proto[len(WS_KEY_PROTOCOL):] or None
    return None


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def digest_matches(presented: bytes, digests: list[bytes]) -> bool:
    """Whether `presented` is one of `digests`, in time independent of which."""
    matched = False
    for digest in digests:  # every key, no early exit
        matched |= hmac.compare_digest(presented, digest)
    return matched


def key_matches(given: str, digests: list[bytes]) -> bool:
    """Whether `given` is one of the keys whose digests are `digests`, in time independent of which."""
    return digest_matches(key_digest(given), digests)


def _check_client_secret(request: web.Request, given: str, digests: list[bytes]) -> None:
    """A live client secret on the realtime route, put on the request; else a 401 (OpenAI's code for a bad key)."""
    # (late: the realtime package, which owns the secrets, imports this module)
    from omni_actors.api.realtime.client_secret_store import CLIENT_SECRET_KEY, client_secret_store

    secret = client_secret_store(request.app).find(given)
    if secret is None:
        raise ApiError(401, "invalid client secret: it is unknown or has expired", None, "invalid_api_key")
    if digests and (secret.minted_by is None or not digest_matches(secret.minted_by, digests)):
        raise ApiError(401, "invalid client secret: the API key that made it is no longer accepted", None,
                       "invalid_api_key")
    request[CLIENT_SECRET_KEY] = secret


def auth_middleware(api_keys: list[str]):
    digests = [key_digest(k) for k in api_keys]

    @web.middleware
    async def check_key(request: web.Request, handler) -> web.StreamResponse:
        if is_public(request.path):
            return await handler(request)
        given = presented_key(request)
        if (given is not None and given.startswith(CLIENT_SECRET_PREFIX) and request.path == REALTIME_PATH
                and not key_matches(given, digests)):
            _check_client_secret(request, given, digests)
        elif digests:
            if given is None:
                raise ApiError(401, "missing API key: send `Authorization: Bearer <key>`", None,
                               "missing_api_key")
            if not key_matches(given, digests):
                raise ApiError(401, "invalid API key", None, "invalid_api_key")
        return await handler(request)

    return check_key


def body_limit_middleware(max_bytes: int, timeout_s: float):
    @web.middleware
    async def check_body(request: web.Request, handler) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > max_bytes:
            raise ApiError(413, f"request body of {length} bytes is over the limit of {max_bytes} bytes",
                           None, "body_too_large")
        if request.body_exists and request.content_type != "multipart/form-data":
            # (an upload is parsed as it streams, by its route, within the same limits)
            try:  # read (and keep) the body now, within the time limit; handlers read it again
                async with asyncio.timeout(timeout_s):
                    await request.read()
            except TimeoutError:
                raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s", None,
                               "body_timeout", close=True) from None
            except web.RequestPayloadError:
                pass  # an undecodable body: the handler's own read reports it (400)
        return await handler(request)

    return check_body
