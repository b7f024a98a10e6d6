"""/v1/batches with the unmodified openai SDK on the synthetic pipeline: a batch's lines answered as direct
calls are, output and error files in input order, line errors that fail a batch, 400s naming the field,
cancel, and a batch carried on by a restarted server without running a line twice.

The synthetic text stage answers with the words of the last message (so an answer says what reached it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from omni_actors.api.batches import RUNNER_KEY
from omni_actors.store import DB_NAME
from tests.api.conftest import Server, eventually, idle, make_deploy, serve_deploy

KEY = "batches-test-key"
BATCH_WAIT_S = 30.0
"""Longest a test waits for a batch to reach a state."""
POLL_S = 0.05
"""Between a test's polls of a batch (as an API client polls)."""
SLOW_STEP_MS = 10
SLOW_TOKENS = 40
"""A slow line: SLOW_TOKENS tokens at SLOW_STEP_MS a token (0.4 s)."""
CHAT = "/v1/chat/completions"
DEEP = 990
"""Arrays nested in a line's body: within what the input check reads (in a thread), past what a decoder reads
on a running batch's deeper stack."""


@contextlib.asynccontextmanager
async def serve_batches(data: Path, step_delay_ms: int = 0, **stage: Any) -> AsyncIterator[Server]:
    """The synthetic pipeline with its files and batches under `data` (a server's data dir); its text stage
    taking `step_delay_ms` a token, with the deploy fields `stage`."""
    stages = [{"stage_id": 0, "engine_extras": {"step_delay_ms": step_delay_ms}, **stage}] if step_delay_ms else []
    deploy = make_deploy("synthetic", server={"api_keys": [KEY]}, **({"stages": stages} if stages else {}))
    async with serve_deploy(deploy, KEY, data) as srv:
        yield srv


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
async def srv(data: Path) -> AsyncIterator[Server]:
    async with serve_batches(data) as s:
        yield s
        await eventually(lambda: idle(s.orch))


def chat_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "synthetic", "messages": [{"role": "user", "content": text}], **body}}


async def upload(client: AsyncOpenAI, lines: list[Any], purpose: str = "batch") -> str:
    raw = b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)
    return (await client.files.create(file=("input.jsonl", raw, "application/jsonl"), purpose=purpose)).id  # type: ignore[arg-type]


async def reached(client: AsyncOpenAI, bid: str, done: Any) -> Any:
    """The batch once `done(batch)` holds (polled, as a client of the API does)."""
    deadline = time.monotonic() + BATCH_WAIT_S
    while True:
        batch = await client.batches.retrieve(bid)
        if done(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {bid} stayed {batch.status}, {batch.request_counts}"
        await asyncio.sleep(POLL_S)


def ended(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


async def lines_of(client: AsyncOpenAI, fid: str | None) -> list[dict[str, Any]]:
    if fid is None:
        return []
    found = await client.files.retrieve(fid)
    assert found.purpose == "batch_output"
    return [json.loads(x) for x in (await client.files.content(fid)).read().splitlines()]


async def test_a_batch_answers_each_line_as_a_direct_call_does(srv: Server) -> None:
    client = srv.client()
    bad = chat_line("bad", "x", max_tokens=-1)
    fid = await upload(client, [chat_line("a", "red green", max_tokens=2), bad, chat_line("b", "blue", max_tokens=1),
                                chat_line("streamed", "x", stream=True), chat_line("c", "one two three", max_tokens=3)])
    made = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h",
                                       metadata={"run": "first"},
                                       output_expires_after={"anchor": "created_at", "seconds": 3600})
    assert made.status == "validating" and made.id.startswith("batch_") and made.metadata == {"run": "first"}
    assert (made.endpoint, made.input_file_id, made.model, made.request_counts.total) == (CHAT, fid, "synthetic", 5)
    assert made.expires_at == made.created_at + 24 * 3600
    done = await reached(client, made.id, ended)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed, done.request_counts.total) == (3, 2, 5)
    assert made.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    out, err = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
    kept = await client.files.retrieve(done.error_file_id)  # type: ignore[arg-type]
    assert kept.expires_at == kept.created_at + 3600 and kept.filename == f"{done.id}_error.jsonl"
    assert [x["custom_id"] for x in out] == ["a", "b", "c"] and [x["custom_id"] for x in err] == ["bad", "streamed"]
    direct = await client.chat.completions.create(model="synthetic", max_tokens=3,
                                                  messages=[{"role": "user", "content": "one two three"}])
    answer = out[2]["response"]
    assert answer["status_code"] == 200 and answer["request_id"].startswith("req_") and out[2]["error"] is None
    assert answer["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content == "one two three"
    assert answer["body"]["usage"]["completion_tokens"] == direct.usage.completion_tokens
    assert len({x["id"] for x in out + err}) == 5 and all(x["id"].startswith("batch_req_") for x in out + err)
    with pytest.raises(openai.BadRequestError) as refused:  # the line's answer is the direct call's, word for word
        await client.chat.completions.create(**bad["body"])
    assert err[0]["error"] is None and err[0]["response"]["status_code"] == 400
    assert err[0]["response"]["body"] == {"error": refused.value.body}
    assert err[1]["response"] is None and "stream" in err[1]["error"]["message"]
    usage = sum(x["response"]["body"]["usage"]["completion_tokens"] for x in out)
    assert done.usage is not None and done.usage.output_tokens == usage
    listed = await client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [done.id]
    assert (await client.batches.retrieve(done.id)).output_file_id == done.output_file_id


async def test_a_responses_batch_answers_responses(srv: Server) -> None:
    client = srv.client()
    url = "/v1/responses"
    lines = [{"custom_id": "r", "method": "POST", "url": url,
              "body": {"model": "synthetic", "input": "alpha beta", "max_output_tokens": 2}},
             {"custom_id": "bg", "method": "POST", "url": url,
              "body": {"model": "synthetic", "input": "x", "background": True}}]
    made = await client.batches.create(input_file_id=await upload(client, lines), endpoint=url,
                                       completion_window="24h")
    done = await reached(client, made.id, ended)
    (out,), (err,) = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
    body = out["response"]["body"]
    assert (body["object"], body["output"][0]["content"][0]["text"]) == ("response", "alpha beta")
    assert (await client.responses.retrieve(body["id"])).output_text == "alpha beta"  # stored, as a direct call's
    assert err["custom_id"] == "bg" and err["response"] is None and "background" in err["error"]["message"]


async def test_bad_lines_fail_the_batch_naming_each(srv: Server) -> None:
    client = srv.client()
    fid = await upload(client, [
        chat_line("a", "x"), b"{not json", chat_line("a", "again"), {**chat_line("u", "x"), "url": "/v1/responses"},
        {**chat_line("m", "x"), "method": "GET"}, {"custom_id": "n", "method": "POST", "url": CHAT},
        chat_line("model", "x") | {"body": {"model": "nope", "messages": []}}, b"[1, 2]", b"  "])
    made = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h")
    assert made.status == "failed" and made.failed_at is not None and made.output_file_id is None
    got = [(e.line, e.code, e.param) for e in made.errors.data]
    assert got == [(2, "invalid_json_line", None), (3, "duplicate_custom_id", "custom_id"), (4, "url_mismatch", "url"),
                   (5, "invalid_value", "method"), (6, "missing_required_parameter", "body"),
                   (7, "model_not_found", "body.model"), (8, "invalid_json_line", None)], got
    assert (await client.batches.retrieve(made.id)).errors.data[0].message == made.errors.data[0].message
    empty = await client.batches.create(input_file_id=await upload(client, []), endpoint=CHAT, completion_window="24h")
    assert empty.status == "failed" and [e.code for e in empty.errors.data] == ["empty_file"]


async def test_a_line_that_is_not_utf8_fails_the_batch_naming_it(srv: Server) -> None:
    """Bytes that are not UTF-8 inside a line's `body` (which is kept as it is, unread) are that line's error,
    not a 500 for the whole create."""
    client = srv.client()
    bad = json.dumps(chat_line("b", "PLACEHOLDER")).encode().replace(b"PLACEHOLDER", b"\xff\xfe")
    fid = await upload(client, [chat_line("a", "x"), bad])
    made = await client.batches.create(input_file_id=fid, endpoint=CHAT, completion_window="24h")
    assert made.status == "failed", made
    assert [(e.line, e.code) for e in made.errors.data] == [(2, "invalid_json_line")], made.errors


async def test_a_deeply_nested_line_is_answered_by_its_route_not_an_internal_error(srv: Server) -> None:
    """A body as deep as a batch's input check lets through (just under msgspec's nesting limit) is sent to its
    route, which answers it as a direct call (a 400), not read by the runner into an internal error."""
    client = srv.client()
    deep = b"[" * DEEP + b"]" * DEEP
    line = json.dumps(chat_line("deep", "x", extra="PLACEHOLDER")).encode().replace(b'"PLACEHOLDER"', deep)
    made = await client.batches.create(input_file_id=await upload(client, [line]), endpoint=CHAT,
                                       completion_window="24h")
    done = await reached(client, made.id, ended)
    (answer,) = await lines_of(client, done.error_file_id)
    assert answer["error"] is None and answer["response"]["status_code"] == 400, answer
    assert answer["response"]["body"]["error"]["type"] == "invalid_request_error", answer


@pytest.mark.parametrize(("fields", "param", "code"), [
    pytest.param({"endpoint": "/v1/audio/speech"}, "endpoint", "invalid_value", id="not-a-batch-endpoint"),
    pytest.param({"endpoint": "/v1/embeddings"}, "endpoint", "unsupported_endpoint", id="not-served"),
    pytest.param({"completion_window": "1h"}, "completion_window", "invalid_value", id="window"),
    pytest.param({"input_file_id": "file-missing"}, "input_file_id", "file_not_found", id="no-file"),
    pytest.param({"metadata": {"k": 1}}, "metadata[...]", "invalid_type", id="metadata"),
    pytest.param({"output_expires_after": {"anchor": "created_at", "seconds": 5}}, "output_expires_after.seconds",
                 "invalid_value", id="expiry"),
    pytest.param({"colour": "red"}, "colour", "unknown_parameter", id="unknown"),
])
async def test_a_bad_create_is_a_400_naming_the_field(srv: Server, fields: dict[str, Any], param: str,
                                                      code: str) -> None:
    client = srv.client()
    body = {"input_file_id": await upload(client, [chat_line("a", "x")]), "endpoint": CHAT, "completion_window": "24h",
            **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.post("/batches", body=body, cast_to=object)
    assert (refused.value.body["param"], refused.value.body["code"]) == (param, code), refused.value.body


async def test_unknown_ids_wrong_purposes_and_pages_are_refused(srv: Server) -> None:
    client = srv.client()
    vision = await upload(client, [chat_line("a", "x")], purpose="vision")
    with pytest.raises(openai.BadRequestError) as purpose:
        await client.batches.create(input_file_id=vision, endpoint=CHAT, completion_window="24h")
    assert purpose.value.body["param"] == "input_file_id" and "purpose" in purpose.value.body["message"]
    for call in (client.batches.retrieve, client.batches.cancel):
        with pytest.raises(openai.NotFoundError) as missing:
            await call("batch_missing")
        assert missing.value.body["param"] == "batch_id"
    for query, param in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"after": "batch_nope"}, "after")):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.batches.list(**query)
        assert bad.value.body["param"] == param


async def test_a_cancel_stops_the_batch_and_keeps_what_was_answered(tmp_path: Path) -> None:
    async with serve_batches(tmp_path, SLOW_STEP_MS) as slow:
        client = slow.client()
        slow.http.runner.app[RUNNER_KEY].lines_in_flight = 1  # type: ignore[union-attr]
        lines = [chat_line(f"r{i}", f"w{i}", max_tokens=SLOW_TOKENS) for i in range(6)]
        made = await client.batches.create(input_file_id=await upload(client, lines), endpoint=CHAT,
                                           completion_window="24h")
        await reached(client, made.id, lambda b: b.request_counts.completed >= 1)
        cancelling = await client.batches.cancel(made.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        done = await reached(client, made.id, ended)
        assert done.status == "cancelled" and done.cancelled_at is not None and done.completed_at is None
        out = await lines_of(client, done.output_file_id)
        assert 1 <= len(out) == done.request_counts.completed < 6 and done.request_counts.failed == 0
        assert [x["custom_id"] for x in out] == [f"r{i}" for i in range(len(out))]  # in input order
        assert (await client.batches.cancel(made.id)).status == "cancelled"  # again: the same
        small = await client.batches.create(input_file_id=await upload(client, [chat_line("a", "x", max_tokens=1)]),
                                            endpoint=CHAT, completion_window="24h")
        await reached(client, small.id, ended)
        with pytest.raises(openai.ConflictError) as late:
            await client.batches.cancel(small.id)
        assert late.value.body["code"] == "batch_not_cancellable"
        await eventually(lambda: idle(slow.orch))


async def test_a_restarted_server_carries_on_with_the_lines_not_answered(tmp_path: Path) -> None:
    total = 8
    lines = [chat_line(f"r{i}", f"w{i}", max_tokens=SLOW_TOKENS) for i in range(total)]
    async with serve_batches(tmp_path, SLOW_STEP_MS) as first:
        client = first.client()
        first.http.runner.app[RUNNER_KEY].lines_in_flight = 1  # type: ignore[union-attr]
        made = await client.batches.create(input_file_id=await upload(client, lines), endpoint=CHAT,
                                           completion_window="24h")
        await reached(client, made.id, lambda b: b.request_counts.completed >= 2)
    with sqlite3.connect(tmp_path / DB_NAME) as db:  # what the stopped server had answered
        answered = db.execute("SELECT COUNT(*) FROM batch_lines WHERE batch_id = ? AND result IS NOT NULL",
                              (made.id,)).fetchone()[0]
    assert 2 <= answered < total
    async with serve_batches(tmp_path, SLOW_STEP_MS) as second:  # a new server on the same data directory
        client = second.client()
        done = await reached(client, made.id, ended)
        assert done.status == "completed" and done.request_counts.completed == total, done
        out = await lines_of(client, done.output_file_id)
        assert [x["custom_id"] for x in out] == [f"r{i}" for i in range(total)]
        assert all(x["response"]["body"]["choices"][0]["message"]["content"].startswith(f"w{i}")
                   for i, x in enumerate(out))
        assert second.orch.statistics().requests_total == total - answered  # no line ran twice
        await eventually(lambda: idle(second.orch))


async def test_a_batch_past_its_window_expires_with_its_answers_kept(tmp_path: Path) -> None:
    lines = [chat_line(f"r{i}", f"w{i}", max_tokens=SLOW_TOKENS) for i in range(4)]
    async with serve_batches(tmp_path, SLOW_STEP_MS) as first:
        client = first.client()
        first.http.runner.app[RUNNER_KEY].lines_in_flight = 1  # type: ignore[union-attr]
        made = await client.batches.create(input_file_id=await upload(client, lines), endpoint=CHAT,
                                           completion_window="24h")
        await reached(client, made.id, lambda b: b.request_counts.completed >= 1)
    with sqlite3.connect(tmp_path / DB_NAME) as db:  # its 24 hours have passed while no server ran
        db.execute("UPDATE batches SET body = json_set(body, '$.expires_at', 1) WHERE id = ?", (made.id,))
        answered = db.execute("SELECT completed FROM batches WHERE id = ?", (made.id,)).fetchone()[0]
    assert 1 <= answered < 4
    async with serve_batches(tmp_path) as second:
        client = second.client()
        done = await reached(client, made.id, ended)
        assert done.status == "expired" and done.expired_at is not None and done.completed_at is None, done
        out, err = await lines_of(client, done.output_file_id), await lines_of(client, done.error_file_id)
        assert [x["custom_id"] for x in out] == [f"r{i}" for i in range(answered)]
        assert [x["custom_id"] for x in err] == [f"r{i}" for i in range(answered, 4)]
        assert all(x["response"] is None and x["error"]["code"] == "batch_expired" for x in err)
        assert second.orch.statistics().requests_total == 0


async def test_a_line_answered_queue_full_is_sent_again(tmp_path: Path) -> None:
    lines = [chat_line(f"r{i}", f"w{i}", max_tokens=10) for i in range(3)]
    async with serve_batches(tmp_path, SLOW_STEP_MS, max_queue=1) as srv:  # one request at a time in the stage
        client = srv.client()
        made = await client.batches.create(input_file_id=await upload(client, lines), endpoint=CHAT,
                                           completion_window="24h")
        done = await reached(client, made.id, ended)
        assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 3, 0), done
        async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/metrics") as resp:
            metrics = await resp.text()
        full = re.search(r'omni_http_errors_total\{code="queue_full",route="/v1/chat/completions",status="429"\} '
                         r"(\S+)", metrics)
        assert full is not None and float(full.group(1)) >= 1, "no line met a full queue"
        await eventually(lambda: idle(srv.orch))
