"""Realtime client secrets (POST /v1/realtime/client_secrets): made with the server's key, a browser's session opened
with them, refused anywhere else or once expired, kept across a restart (realtime/client_secrets.py)."""

from __future__ import annotations

import base64
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from omni_actors.api.app import build_app
from omni_actors.api.middleware import key_digest
from omni_actors.api.realtime.client_secret_store import CLIENT_SECRETS_KEY, ClientSecretStore
from omni_actors.api.server import start_server
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.store import DB_NAME, Store
from tests.api.conftest import API_KEY, post
from tests.api.realtime.conftest import STAGES, Client, RtServer, connect
from tests.conftest import make_deploy, running

PRESET = {"type": "realtime", "instructions": "answer in one word", "output_modalities": ["text"],
          "audio": {"input": {"turn_detection": None}}}
"""A session no connection starts with by default: text only, no VAD, instructions."""
HANDSHAKE = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}


@dataclass
class Served:
    """One orchestrator whose HTTP server (app, store) can be restarted on the same data directory."""

    orch: Orchestrator
    data: Path
    key: str | None
    srv: RtServer | None = None
    store: Store | None = None

    async def start(self) -> RtServer:
        self.store = Store(self.data)
        app = build_app(self.orch)
        app[CLIENT_SECRETS_KEY] = ClientSecretStore(self.store)
        http = await start_server(app, "127.0.0.1", 0, self.orch.deploy.server)
        self.srv = RtServer(self.orch, http.url, self.key, http, app)
        return self.srv

    async def stop(self) -> None:
        assert self.srv is not None and self.srv.http is not None and self.store is not None
        await self.srv.http.close()
        self.store.close()


async def _served(data: Path, key: str | None, pipeline: str = "synthetic", **raw: Any) -> AsyncIterator[Served]:
    deploy = make_deploy(pipeline, server={"api_keys": [key] if key else []}, **({"stages": STAGES} | raw))
    async with running(deploy) as orch:
        served = Served(orch, data, key)
        await served.start()
        try:
            yield served
        finally:
            await served.stop()


@pytest.fixture(scope="module")
async def keyed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    async for served in _served(tmp_path_factory.mktemp("secrets"), API_KEY):
        yield served


@pytest.fixture(scope="module")
async def keyless(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    async for served in _served(tmp_path_factory.mktemp("secrets-keyless"), None):
        yield served


@pytest.fixture(scope="module")
async def duplex(tmp_path_factory: pytest.TempPathFactory, tiny_moshi: Path) -> AsyncIterator[Served]:
    async for served in _served(tmp_path_factory.mktemp("secrets-duplex"), API_KEY, "moshi", model=str(tiny_moshi),
                                stages=[{"stage_id": 0, "engine_extras": {"frame_budget": 0}}]):
        yield served


def sdk(srv: RtServer, key: str) -> AsyncOpenAI:
    ws_url = srv.url.replace("http://", "ws://") + "/v1"
    return AsyncOpenAI(api_key=key, base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)


async def _secret(srv: RtServer, session: dict[str, Any] | None = PRESET, **body: Any) -> tuple[int, Any]:
    return await post(srv, "/v1/realtime/client_secrets", {**({"session": session} if session else {}), **body})


async def _open_with(srv: RtServer, headers: dict[str, str] | None = None, protocols: tuple[str, ...] = (),
                     http: aiohttp.ClientSession | None = None) -> Client:
    assert http is not None
    ws = await http.ws_connect(f"{srv.url}/v1/realtime?model=synthetic", headers=headers or {}, protocols=protocols,
                               max_msg_size=0, autoclose=False)
    return Client(ws)


async def _handshake(srv: RtServer, token: str) -> tuple[int, Any]:
    """A WebSocket upgrade request with `token` as the key: its HTTP status and JSON body (when refused)."""
    key = base64.b64encode(os.urandom(16)).decode()
    headers = {**HANDSHAKE, "Sec-WebSocket-Key": key, "Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/v1/realtime?model=synthetic",
                                                         headers=headers) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else None)


async def test_sdk_secret_opens_sessions_preset_with_its_session(keyed: Served) -> None:
    srv = keyed.srv
    assert srv is not None
    made = await sdk(srv, API_KEY).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 600}, session=PRESET)
    assert made.value.startswith("ek_") and abs(made.expires_at - (time.time() + 600)) < 60
    assert made.session.type == "realtime" and made.session.instructions == "answer in one word"
    assert made.session.output_modalities == ["text"] and made.session.audio.input.turn_detection is None
    for _ in range(2):  # (usable until it expires, as OpenAI's are: not single-use)
        async with sdk(srv, made.value).realtime.connect(model="synthetic") as conn:
            created = await anext(e async for e in conn if e.type == "session.created")
            assert created.session.instructions == "answer in one word"
            assert created.session.output_modalities == ["text"]
            assert created.session.audio.input.turn_detection is None
            await conn.session.update(session={"type": "realtime", "instructions": "changed"})
            updated = await anext(e async for e in conn if e.type == "session.updated")
            assert updated.session.instructions == "changed" and updated.session.output_modalities == ["text"]
            await conn.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
            await conn.response.create()
            types = []
            async for event in conn:
                types.append(event.type)
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    break
            assert "response.output_text.delta" in types and "response.output_audio.delta" not in types


async def test_browser_subprotocol_secret_without_the_server_key(keyed: Served) -> None:
    srv = keyed.srv
    assert srv is not None
    status, body = await _secret(srv)
    assert status == 200, body
    async with aiohttp.ClientSession() as http:
        client = await _open_with(srv, protocols=("realtime", f"openai-insecure-api-key.{body['value']}"), http=http)
        assert client.ws.protocol == "realtime"
        created = await client.recv()
        assert created["type"] == "session.created" and created["session"]["instructions"] == "answer in one word"
        await client.ws.close()


async def test_a_secret_opens_no_rest_route_and_makes_no_secret(keyed: Served) -> None:
    srv = keyed.srv
    assert srv is not None
    status, body = await _secret(srv)
    assert status == 200, body
    ek = {"Authorization": f"Bearer {body['value']}"}
    async with aiohttp.ClientSession() as http:
        for method, path, payload in (("GET", "/v1/models", None), ("POST", "/v1/realtime/client_secrets", {}),
                                      ("POST", "/v1/chat/completions", {"model": "synthetic", "messages": []})):
            async with http.request(method, srv.url + path, headers=ek, json=payload) as resp:
                assert resp.status == 401, path
                assert (await resp.json())["error"]["code"] == "invalid_api_key"
        async with http.post(srv.url + "/v1/realtime/client_secrets", json={}) as resp:  # no key at all
            assert resp.status == 401
    with pytest.raises(openai.AuthenticationError):
        await sdk(srv, body["value"]).realtime.client_secrets.create()


async def test_unknown_expired_and_orphaned_secrets_are_refused_at_the_handshake(keyed: Served) -> None:
    srv, store = keyed.srv, keyed.store
    assert srv is not None and store is not None
    secrets = ClientSecretStore(store)
    expired, _ = secrets.add(600, key_digest(API_KEY), None, created_at=time.time() - 601)
    orphaned, _ = secrets.add(600, key_digest("a key no longer configured"), None)
    unkeyed, _ = secrets.add(600, None, None)  # (made while the server had no keys)
    live, _ = secrets.add(600, key_digest(API_KEY), None)
    for token in ("ek_" + "x" * 43, expired, orphaned, unkeyed, live[:-1]):
        status, body = await _handshake(srv, token)
        assert status == 401, token
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "authentication_error"
    assert (await _handshake(srv, live))[0] == 101
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await _open_with(srv, {"Authorization": f"Bearer {expired}"}, http=http)
        assert refused.value.status == 401


BAD_EXPIRY = [
    ({"seconds": 9}, "expires_after.seconds", "integer_below_min_value"),
    ({"seconds": 7201}, "expires_after.seconds", "integer_above_max_value"),
    ({"seconds": "600"}, "expires_after.seconds", "invalid_type"),
    ({"anchor": "updated_at"}, "expires_after.anchor", "invalid_value"),
]
BAD_SESSIONS = [  # each refused by session.update too, with the same field and code
    {"type": "conversation"},
    {"type": "realtime", "audio": {"output": {"speed": 9.0}}},
    {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
    {"type": "realtime", "audio": {"input": {"format": {"type": "audio/flac"}}}},
    {"type": "realtime", "output_modalities": []},
    {"type": "transcription"},
    {"type": "realtime", "temperature": "hot"},
    {"type": "realtime", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
]


async def test_bad_expiry_and_sessions_are_400s_naming_the_field_as_session_update_does(keyed: Served) -> None:
    srv = keyed.srv
    assert srv is not None
    for expires_after, param, code in BAD_EXPIRY:
        status, body = await _secret(srv, expires_after=expires_after)
        assert status == 400 and body["error"]["param"] == param and body["error"]["code"] == code, body
        assert param in body["error"]["message"]
    status, body = await _secret(srv, {"instructions": "no type"})
    assert status == 400 and body["error"]["param"] == "session.type", body
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        for session in BAD_SESSIONS:
            status, body = await _secret(srv, session)
            assert status == 400, (session, body)
            await client.send("session.update", session=session)
            error = (await client.until("error"))[-1]["error"]
            assert (body["error"]["param"], body["error"]["code"]) == (error["param"], error["code"]), session
            assert error["param"] in body["error"]["message"]
        await client.ws.close()


async def test_the_session_answered_is_the_one_a_connection_starts_with_whatever_the_query(keyed: Served) -> None:
    """The POST's query is not a connection's: `?intent=transcription` there neither makes the answer claim a
    transcription session (this pipeline makes no transcripts) nor changes what the secret opens."""
    srv = keyed.srv
    assert srv is not None
    status, body = await post(srv, "/v1/realtime/client_secrets?intent=transcription", {})
    assert status == 200 and body["session"]["type"] == "realtime", body
    async with aiohttp.ClientSession() as http:
        client = await _open_with(srv, {"Authorization": f"Bearer {body['value']}"}, http=http)
        created = (await client.until("session.created"))[-1]["session"]
        assert created.get("type", "realtime") == "realtime" and created["object"] == "realtime.session", created
        await client.ws.close()


async def test_a_secret_survives_a_restart_and_only_its_hash_is_stored(keyed: Served) -> None:
    srv = keyed.srv
    assert srv is not None
    status, body = await _secret(srv, expires_after={"seconds": 10})
    assert status == 200, body
    await keyed.stop()
    srv = await keyed.start()  # a new app and a new store on the same data directory
    async with sdk(srv, body["value"]).realtime.connect(model="synthetic") as conn:
        created = await anext(e async for e in conn if e.type == "session.created")
        assert created.session.instructions == "answer in one word"
    with sqlite3.connect(keyed.data / DB_NAME) as db:
        rows = db.execute("SELECT * FROM realtime_client_secrets").fetchall()
    assert rows and not any(body["value"] in str(row) or body["value"].encode() in row for row in rows)
    assert key_digest(body["value"]) in {row[0] for row in rows}


async def test_without_keys_a_secret_presets_sessions(keyless: Served) -> None:
    srv = keyless.srv
    assert srv is not None
    made = await sdk(srv, "unused").realtime.client_secrets.create(session=PRESET)
    assert abs(made.expires_at - (time.time() + 600)) < 60  # (the default: 10 minutes)
    async with sdk(srv, made.value).realtime.connect(model="synthetic") as conn:
        created = await anext(e async for e in conn if e.type == "session.created")
        assert created.session.instructions == "answer in one word"
    plain = await sdk(srv, "unused").realtime.client_secrets.create()  # no session: the server's defaults
    assert plain.session.type == "realtime" and plain.session.instructions == ""
    assert (await _handshake(srv, "unused"))[0] == 101  # any other token: the server's defaults, as before
    status, body = await _handshake(srv, "ek_" + "x" * 43)  # a secret it never made: refused, not ignored
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


async def test_a_duplex_model_checks_a_secret_as_its_session_update(duplex: Served) -> None:
    srv = duplex.srv
    assert srv is not None
    for session, param in (({"type": "realtime", "audio": {"output": {"speed": 1.5}}}, "session.audio.output.speed"),
                           ({"type": "realtime", "audio": {"input": {"transcription": {"language": "en"}}}},
                            "session.audio.input.transcription")):  # (both fine for a turn-based model)
        status, body = await _secret(srv, session)
        assert status == 400 and body["error"]["param"] == param, body
    preset = {"type": "realtime", "instructions": "duplex", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    status, body = await _secret(srv, preset)
    assert status == 200 and body["session"]["audio"]["input"]["turn_detection"] is None, body  # (never a VAD)
    async with aiohttp.ClientSession() as http:
        client = await _open_with(srv, {"Authorization": f"Bearer {body['value']}"}, http=http)
        created = await client.recv()
        assert created["type"] == "session.created" and created["session"]["instructions"] == "duplex"
        assert created["session"]["audio"]["input"]["turn_detection"] is None
        await client.ws.close()
