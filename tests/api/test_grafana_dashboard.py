"""examples/grafana-dashboard.json charts only metrics the server really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from tests.api.conftest import serve

DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana-dashboard.json"
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


async def test_every_dashboard_metric_is_exported() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    wanted = {_base(n) for e in exprs for n in re.findall(r"\bomni_[a-z0-9_]+", e)}
    assert len(wanted) >= 10
    async with serve("synthetic", key=None) as srv:
        await srv.client().chat.completions.create(model="synthetic", messages=[{"role": "user", "content": "hi"}])
        async with aiohttp.ClientSession() as session, session.get(f"{srv.url}/metrics") as resp:
            text = await resp.text()
    exported = {_base(m) for m in re.findall(r"^(?:# TYPE )?(omni_[a-z0-9_]+)", text, re.M)}
    assert wanted - exported == set()
