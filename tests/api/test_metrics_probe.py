"""/metrics as an operator alerts on it: every outcome counted by route, status and error code, bounded labels,
the same counts as /v1/status and /health, and a Grafana dashboard that charts only series a scrape has."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from omni_actors.api import metrics
from omni_actors.api.metrics import LATENCY_BUCKETS_S
from omni_actors.api.realtime import duplex_stats
from omni_actors.config.deploy import ServerConfig
from tests.api.conftest import Server, eventually, idle, post, serve

CHAT = "/v1/chat/completions"
DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana-dashboard.json"
MAX_CHUNKS = 300
ODD_MODEL = "gpt-client-typo-7f3a9c"
ODD_PATH = "/v1/no-such-route/5d1e77b0"


@pytest.fixture(scope="module")
async def srv():
    stages = [{"stage_id": 0, "max_num_seqs": 1, "max_queue": 1,
               "engine_extras": {"chunks": 2, "step_delay_ms": 100, "max_chunks": MAX_CHUNKS}},
              {"stage_id": 1}, {"stage_id": 2}]
    async with serve("synthetic", key=None, stages=stages, server={"request_timeout_s": 1.0}) as s:
        yield s


def _chat(tokens: int) -> dict:
    return {"model": "synthetic", "messages": [{"role": "user", "content": "a b"}], "max_tokens": tokens}


async def _get(srv: Server, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(srv.url + path) as resp:
        return resp.status, await resp.text()


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value of a Prometheus text scrape."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def test_every_outcome_is_counted_by_code(srv: Server) -> None:
    client = srv.client()
    await client.chat.completions.create(**_chat(1))  # 200
    with pytest.raises(openai.BadRequestError) as bad:  # msgspec bound
        await client.chat.completions.create(**{**_chat(1), "temperature": 5})
    assert bad.value.code == "decimal_above_max_value"
    with pytest.raises(openai.BadRequestError) as refused:  # the stage refuses it at add
        await client.chat.completions.create(**_chat(MAX_CHUNKS + 1))
    assert refused.value.code == "rejected_by_stage"
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(**{**_chat(1), "model": ODD_MODEL})
    assert (await _get(srv, ODD_PATH))[0] == 404
    first = asyncio.ensure_future(post(srv, CHAT, _chat(4)))  # holds stage 0's one place
    await eventually(lambda: srv.orch.statistics().stage(0).in_flight == 1, 2.0)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(**_chat(1))
    assert (await first)[0] == 200
    status, out = await post(srv, CHAT, _chat(50))  # past server.request_timeout_s
    assert (status, out["error"]["code"]) == (504, "request_timeout")
    await eventually(lambda: idle(srv.orch), 2.0)

    samples = _samples((await _get(srv, "/metrics"))[1])
    route = {"route": CHAT}
    assert _value(samples, "omni_http_requests_total", status="200", **route) == 2
    for status, code in (("400", "decimal_above_max_value"), ("400", "rejected_by_stage"),
                         ("404", "model_not_found"), ("429", "queue_full"), ("504", "request_timeout")):
        assert _value(samples, "omni_http_errors_total", status=status, code=code, **route) == 1, code
    assert _value(samples, "omni_http_errors_total", route="unmatched", status="404", code="not_found") == 1
    assert _value(samples, "omni_orchestrator_requests_failed_total", pipeline="synthetic") >= 2  # refused, 504
    text = (await _get(srv, "/metrics"))[1]
    assert ODD_MODEL not in text and "5d1e77b0" not in text  # no client string becomes a label value


async def test_a_client_gone_is_counted_where_status_counts_it(srv: Server) -> None:
    before = _samples((await _get(srv, "/metrics"))[1])
    stream = await srv.client().chat.completions.create(**_chat(8), stream=True)
    async for _ in stream:
        break  # the client reads one chunk and hangs up
    await stream.close()
    await eventually(lambda: idle(srv.orch), 2.0)
    status = json.loads((await _get(srv, "/v1/status"))[1])
    after = _samples((await _get(srv, "/metrics"))[1])
    aborted = _value(after, "omni_orchestrator_requests_aborted_total", pipeline="synthetic")
    assert aborted == status["requests_aborted"] >= 1
    assert aborted - _value(before, "omni_orchestrator_requests_aborted_total") == 1
    gone = {"route": CHAT, "status": "499"}
    assert _value(after, "omni_http_requests_total", **gone) - _value(before, "omni_http_requests_total", **gone) == 1
    assert _value(after, "omni_http_errors_total", code="client_disconnected", **gone) >= 1
    for key, name in (("requests_total", "omni_orchestrator_requests_total"),
                      ("requests_failed", "omni_orchestrator_requests_failed_total")):
        assert _value(after, name, pipeline="synthetic") == status[key], key
    assert _value(after, "omni_pipeline_draining", pipeline="synthetic") == 0


async def test_a_dead_worker_is_a_worker_died_error(srv: Server) -> None:
    orch = srv.orch
    pending = asyncio.ensure_future(post(srv, CHAT, _chat(8)))
    await eventually(lambda: orch.statistics().stage(0).in_flight == 1, 2.0)
    os.kill(orch.workers[0][0].pid, signal.SIGKILL)
    status, out = await pending
    assert (status, out["error"]["code"]) == (503, "worker_died")
    await orch.wait_healthy(30.0)
    assert (await _get(srv, "/health"))[0] == 200
    samples = _samples((await _get(srv, "/metrics"))[1])
    assert _value(samples, "omni_http_errors_total", route=CHAT, status="503", code="worker_died") == 1
    assert _value(samples, "omni_stage_healthy", pipeline="synthetic") == 3  # as /health says


async def test_dashboard_charts_only_scraped_series(srv: Server) -> None:
    """Each name in the dashboard's queries, exactly as written (`_total`, `_bucket`), is a sample in a scrape."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    wanted = {n for e in exprs for n in re.findall(r"\bomni_[a-z0-9_]+", e)}
    assert {"omni_http_errors_total", "omni_orchestrator_requests_aborted_total"} <= wanted
    client = srv.client()
    await client.chat.completions.create(**_chat(2), modalities=["text", "audio"],
                                         audio={"voice": "alloy", "format": "wav"})
    await client.audio.speech.create(model="synthetic", input="a b", voice="alloy", response_format="wav")
    scraped = {name for name, _ in _samples((await _get(srv, "/metrics"))[1])}
    assert wanted - scraped == set()


def test_latency_buckets_reach_the_default_request_timeout() -> None:
    assert LATENCY_BUCKETS_S[-1] >= ServerConfig().request_timeout_s


async def test_every_exported_metric_is_documented(srv: Server) -> None:
    """Each family of a scrape is listed, by the name PromQL uses, where operators read the list."""
    documented = set(re.findall(r"\bomni_[a-z0-9_]+", (metrics.__doc__ or "") + (duplex_stats.__doc__ or "")))
    docs = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    families = list(text_string_to_metric_families((await _get(srv, "/metrics"))[1]))
    names = {f.name + ("_total" if f.type == "counter" else "") for f in families
             if f.name.startswith("omni_") and not f.name.endswith("_created")}  # (prometheus_client's own)
    assert len(names) >= 30
    assert names - documented == set()
    for name in ("omni_http_requests_total", "omni_http_errors_total", "omni_orchestrator_requests_aborted_total"):
        assert name in docs, name


async def test_an_in_band_stream_error_is_counted_by_code(srv: Server) -> None:
    # an SSE `error` event after the 200 headers was counted as a plain 200
    before = _value(_samples((await _get(srv, "/metrics"))[1]), "omni_http_errors_total", route=CHAT,
                    status="200", code="request_timeout")
    stream = await srv.client().chat.completions.create(**_chat(50), stream=True)
    with pytest.raises(openai.APIError, match="timed out"):
        async for _ in stream:
            pass
    await eventually(lambda: idle(srv.orch), 2.0)
    samples = _samples((await _get(srv, "/metrics"))[1])
    assert _value(samples, "omni_http_errors_total", route=CHAT, status="200", code="request_timeout") == before + 1
