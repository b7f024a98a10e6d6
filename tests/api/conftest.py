"""API test helpers: a real orchestrator (real workers) behind a real aiohttp server on a free port."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from omni_actors.api.app import build_app
from omni_actors.api.file_store import FileStore
from omni_actors.api.files import FILES_KEY
from omni_actors.api.realtime.client_secret_store import CLIENT_SECRETS_KEY, ClientSecretStore
from omni_actors.api.responses import RESPONSES_KEY
from omni_actors.api.responses_store import ResponseStore
from omni_actors.api.server import ApiServer, start_server
from omni_actors.api.voice_store import VoiceStore
from omni_actors.api.voices import VOICES_KEY
from omni_actors.config.deploy import DeployConfig
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.store import Store
from tests.conftest import eventually, make_deploy, running  # noqa: F401 - re-exported

API_KEY = "test-key"


@dataclass
class Server:
    orch: Orchestrator
    url: str
    key: str | None
    http: ApiServer | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.key or "none", max_retries=0, timeout=30)


@contextlib.asynccontextmanager
async def serve(pipeline: str, key: str | None = API_KEY, **raw: Any) -> AsyncIterator[Server]:
    """Start workers and an HTTP server; on exit stop both and check nothing leaked."""
    server = {"api_keys": [key] if key else [], **raw.pop("server", {})}
    async with serve_deploy(make_deploy(pipeline, server=server, **raw), key) as srv:
        yield srv


@contextlib.asynccontextmanager
async def serve_deploy(deploy: DeployConfig, key: str | None, data: Path | None = None) -> AsyncIterator[Server]:
    """Real workers and a real HTTP server on a free port for `deploy`; leak-checked on exit. Stored
    responses, uploaded files, custom voices and realtime client secrets go to `data` (a server's data
    directory), else a temporary one, never the user's."""
    with tempfile.TemporaryDirectory(prefix="omni-test-data-") as tmp:
        store = Store(data or tmp)
        async with running(deploy) as orch:
            app = build_app(orch)
            app[RESPONSES_KEY] = ResponseStore(store)
            app[FILES_KEY] = FileStore(store)
            app[VOICES_KEY] = VoiceStore(store)
            app[CLIENT_SECRETS_KEY] = ClientSecretStore(store)
            http = await start_server(app, "127.0.0.1", 0, deploy.server)
            try:
                yield Server(orch, http.url, key, http)
            finally:
                await http.close()
                store.close()


async def post(srv: Server, path: str, body: Any = None, *, data: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """Raw HTTP POST; returns (status, parsed JSON or bytes)."""
    hdrs = {**srv.headers, **(headers or {})}
    async with aiohttp.ClientSession() as session:
        kwargs: dict[str, Any] = {"data": data} if data is not None else {"json": body}
        async with session.post(srv.url + path, headers=hdrs, **kwargs) as resp:
            raw = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, raw


def idle(orch: Orchestrator) -> bool:
    """No run, no lease, and every stage has no in-flight or engine-held request."""
    stats = orch.statistics()
    return (stats.requests_in_flight == 0 and stats.leases_held == 0
            and all(s.in_flight == 0 and s.engine_requests == 0 for s in stats.stages))
