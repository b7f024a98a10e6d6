"""POST /v1/images/generations on the synthetic image pipeline, with the openai SDK."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

from tests.api.conftest import Server, idle, post, serve


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic_image") as s:
        yield s


def _decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


async def test_generate(srv: Server) -> None:
    client = srv.client()
    kw = {"model": "synthetic_image", "prompt": "a red cube", "n": 2, "size": "64x48",
          "response_format": "b64_json", "extra_body": {"num_inference_steps": 3, "seed": 7}}
    out = await client.images.generate(**kw)
    assert len(out.data) == 2
    first = [_decode(d.b64_json) for d in out.data]
    assert all(img.shape == (48, 64, 3) and img.dtype == np.uint8 for img in first)
    again = await client.images.generate(**kw)  # same seed, same pixels
    assert np.array_equal(first[0], _decode(again.data[0].b64_json))
    other = await client.images.generate(**{**kw, "extra_body": {"seed": 8, "num_inference_steps": 2}})
    assert not np.array_equal(first[0], _decode(other.data[0].b64_json))
    lowest = await client.images.generate(**{**kw, "extra_body": {"seed": -(2**63), "num_inference_steps": 2}})
    assert len(lowest.data) == 2  # any 64-bit seed, negative too (schemathesis found a 500 here)
    assert idle(srv.orch)


async def test_stream_progress_sends_each_step_before_the_image(srv: Server) -> None:
    """This server's `stream_progress`: step events the unmodified SDK passes through, then the image;
    without it the stream is OpenAI's events only."""
    client = srv.client()
    kw = {"model": "synthetic_image", "prompt": "a red cube", "size": "16x16", "stream": True}
    events = [e async for e in await client.images.generate(
        **kw, extra_body={"num_inference_steps": 3, "seed": 1, "stream_progress": True})]
    *progress, last = events
    assert [e.type for e in progress] == ["image_generation.progress"] * 3
    assert last.type == "image_generation.completed"
    assert [(e.step, e.total, e.phase) for e in progress] == [(1, 3, "denoise"), (2, 3, "denoise"), (3, 3, "decode")]
    assert _decode(events[-1].b64_json).shape == (16, 16, 3)
    plain = [e.type async for e in await client.images.generate(**kw, extra_body={"num_inference_steps": 3})]
    assert plain == ["image_generation.completed"]
    assert idle(srv.orch)


async def test_diffusion_fields_at_top_level_and_in_extra_body(srv: Server) -> None:
    body = {"prompt": "x", "size": "16x16", "seed": 3, "num_inference_steps": 2, "guidance_scale": 4.5,
            "negative_prompt": "blur", "output_format": "jpeg"}
    status, out = await post(srv, "/v1/images/generations", body)
    assert status == 200 and out["output_format"] == "jpeg" and out["size"] == "16x16"
    nested = {"prompt": "x", "size": "16x16", "output_format": "jpeg",
              "extra_body": {"seed": 3, "num_inference_steps": 2, "guidance_scale": 4.5}}
    status, out2 = await post(srv, "/v1/images/generations", nested)
    assert status == 200 and out2["data"] == out["data"]


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "size": "big"}, "size"),
    ({"prompt": "x", "size": "0x10"}, "size"),
    ({"prompt": "x", "response_format": "link"}, "response_format"),
    ({"prompt": "x", "n": 11}, "n"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "extra_body": {"num_inference_steps": 0}}, "extra_body.num_inference_steps"),
    ({"prompt": "x", "stream_progress": True}, "stream_progress"),  # (only with stream)
])
async def test_image_400s(srv: Server, body: dict, param: str) -> None:
    status, out = await post(srv, "/v1/images/generations", body)
    assert status == 400 and out["error"]["param"] == param, out


async def test_chat_on_an_image_pipeline_is_a_clear_400(srv: Server) -> None:
    status, out = await post(srv, "/v1/chat/completions",
                             {"model": "synthetic_image", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and out["error"]["param"] == "modalities"


async def test_variations_say_they_are_not_served_and_what_serves_the_need(srv: Server) -> None:
    """DALL-E 2's variations route through the SDK: a 404 naming edits, not "unknown route"."""
    with pytest.raises(openai.NotFoundError) as missing:
        await srv.client().images.create_variation(model="synthetic_image", image=("a.png", _png()))
    body = missing.value.body
    assert (body["code"], body["param"]) == ("unsupported_endpoint", None), body
    assert "/v1/images/variations" in body["message"] and "/v1/images/edits" in body["message"], body


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG")
    return buf.getvalue()


def _zlib_header(png: bytes) -> bytes:
    """The first two bytes of a PNG's image data stream (zlib's CMF and FLG: FLG names the level)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos = 8
    while pos < len(png):
        length, kind = int.from_bytes(png[pos:pos + 4], "big"), png[pos + 4:pos + 8]
        if kind == b"IDAT":
            return png[pos + 8:pos + 10]
        pos += 12 + length
    raise AssertionError("no IDAT chunk")


async def test_png_answers_use_the_fast_zlib_level_and_keep_their_order(srv: Server) -> None:
    """Each image is encoded on its own thread at zlib level 1 (FLG 0x01, "fastest"); the answers
    still decode, in request order, the same as base64 and as links, and the same for one seed."""
    client = srv.client()
    kw = {"model": "synthetic_image", "prompt": "a green cone", "n": 3, "size": "40x24",
          "response_format": "b64_json", "extra_body": {"num_inference_steps": 2, "seed": 11}}
    out = await client.images.generate(**kw)
    blobs = [base64.b64decode(d.b64_json) for d in out.data]
    assert [_zlib_header(b) for b in blobs] == [b"\x78\x01"] * 3
    images = [_decode(d.b64_json) for d in out.data]
    assert all(img.shape == (24, 40, 3) for img in images)
    assert not np.array_equal(images[0], images[1]) or not np.array_equal(images[1], images[2])
    linked = await client.images.generate(**{**kw, "response_format": "url"})
    for d, want in zip(linked.data, images, strict=True):
        resp = await client._client.get(d.url)  # the link is the credential: no API key (as OpenAI's)
        assert resp.status_code == 200
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(resp.content))), want)
    guessed = await client._client.get(linked.data[0].url.rsplit("/", 1)[0] + "/img_" + "0" * 32 + ".png")
    assert guessed.status_code == 404
    assert idle(srv.orch)
