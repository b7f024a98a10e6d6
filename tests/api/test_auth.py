"""One API-key check for every route: the same credentials on REST and on the realtime WebSocket."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import Server, serve

KEYS = ["key-one", "second-key-longer"]
GOOD = [
    {"Authorization": "Bearer key-one"},
    {"Authorization": "bearer second-key-longer"},
    {"Authorization": "BEARER  key-one "},
    {"api-key": "key-one"},
    {"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.second-key-longer"},
]
BAD = [
    {},
    {"Authorization": "Bearer"},
    {"Authorization": "Basic key-one"},
    {"Authorization": "Bearer key-on"},
    {"Authorization": "Bearer key-one-and-more"},
    {"api-key": "KEY-ONE"},
    {"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.nope"},
]
PUBLIC = ["/health", "/openapi.json"]


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic_text", key=KEYS[0], server={"api_keys": KEYS}) as s:
        yield s


async def _status(session: aiohttp.ClientSession, srv: Server, method: str, path: str,
                  headers: dict[str, str]) -> int:
    kwargs = {"json": {"model": "synthetic_text", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1}} if method == "POST" else {}
    async with session.request(method, srv.url + path, headers=headers, **kwargs) as resp:
        return resp.status


async def _ws_status(session: aiohttp.ClientSession, srv: Server, headers: dict[str, str]) -> int:
    """101 when the realtime WebSocket opens (a session.created arrives), else the HTTP status."""
    protocols = [p.strip() for p in headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    plain = {k: v for k, v in headers.items() if k != "Sec-WebSocket-Protocol"}
    try:
        async with session.ws_connect(srv.url + "/v1/realtime?model=synthetic_text", headers=plain,
                                      protocols=protocols) as ws:
            event = await ws.receive_json(timeout=30)
            assert event["type"] == "session.created"
            return 101
    except aiohttp.WSServerHandshakeError as err:
        return err.status


async def test_every_route_accepts_the_same_credentials(srv: Server) -> None:
    async with aiohttp.ClientSession() as session:
        for headers in GOOD:
            assert await _status(session, srv, "GET", "/v1/models", headers) == 200, headers
            assert await _status(session, srv, "POST", "/v1/chat/completions", headers) == 200, headers
            assert await _ws_status(session, srv, headers) == 101, headers


async def test_every_route_refuses_the_same_credentials(srv: Server) -> None:
    async with aiohttp.ClientSession() as session:
        for headers in BAD:
            assert await _status(session, srv, "GET", "/v1/models", headers) == 401, headers
            assert await _status(session, srv, "POST", "/v1/chat/completions", headers) == 401, headers
            assert await _ws_status(session, srv, headers) == 401, headers
        async with session.get(srv.url + "/v1/realtime", headers={"api-key": "nope"}) as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
            assert (await resp.json())["error"]["code"] == "invalid_api_key"


async def test_public_routes_need_no_key(srv: Server) -> None:
    async with aiohttp.ClientSession() as session:
        for path in PUBLIC:
            assert await _status(session, srv, "GET", path, {}) == 200, path
        assert await _status(session, srv, "GET", "/", {}) != 401  # the playground's page, when there is one


async def test_openai_sdk_rest_and_realtime_with_each_key(srv: Server) -> None:
    ws_url = srv.url.replace("http://", "ws://") + "/v1"
    for key in KEYS:
        client = AsyncOpenAI(api_key=key, base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)
        assert (await client.models.list()).data
        async with client.realtime.connect(model="synthetic_text") as conn:
            event = await conn.recv()
            assert event.type == "session.created"
    wrong = AsyncOpenAI(api_key="wrong", base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.models.list()
    with pytest.raises(Exception, match="401"):
        async with wrong.realtime.connect(model="synthetic_text") as conn:
            await conn.recv()
