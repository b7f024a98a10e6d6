"""`stream_progress` on a real diffusers pipeline (tiny Stable Diffusion) through the openai SDK: a progress event
for every denoising step, the last one included (phase "decode": it goes as the VAE decode starts), then the
image. Before, the last step had no event: steps 1..N-1 only, and none at all for a 1-step request."""

from __future__ import annotations

import aiohttp
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, serve_family

MODEL = "diffusion"


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family(MODEL, tmp_path_factory.mktemp("progress")) as s:
        yield s


@pytest.mark.parametrize("steps", [1, 3])
async def test_every_step_has_a_progress_event_before_the_image(srv, steps: int) -> None:
    stream = await srv.client().images.generate(
        model=MODEL, prompt="a red cube", size="32x32", stream=True,
        extra_body={"num_inference_steps": steps, "seed": 1, "stream_progress": True})
    events = [e async for e in stream]
    *progress, last = events
    assert [e.type for e in progress] == ["image_generation.progress"] * steps, [e.type for e in events]
    want = [(i, steps, "denoise") for i in range(1, steps)] + [(steps, steps, "decode")]
    assert [(e.step, e.total, e.phase) for e in progress] == want
    assert [e.progress for e in progress] == pytest.approx([i / steps for i in range(1, steps + 1)])
    assert last.type == "image_generation.completed" and decode(last.b64_json).shape == (32, 32, 3)
    await eventually(lambda: idle(srv.orch))


async def test_progress_and_a_preview_interleave_in_step_order(srv) -> None:
    stream = await srv.client().images.generate(
        model=MODEL, prompt="a red cube", size="32x32", stream=True, partial_images=1,
        extra_body={"num_inference_steps": 4, "seed": 1, "stream_progress": True})
    kinds = [(e.type.rsplit(".", 1)[1], getattr(e, "step", None)) async for e in stream]
    assert kinds == [("progress", 1), ("progress", 2), ("partial_image", None), ("progress", 3), ("progress", 4),
                     ("completed", None)], kinds
    await eventually(lambda: idle(srv.orch))


async def test_each_streamed_event_is_named_by_its_type(srv) -> None:
    """As OpenAI's image stream: `event: image_generation.partial_image` before each `data:`."""
    client = srv.client()
    async with aiohttp.ClientSession() as http, http.post(
            f"{client.base_url}images/generations", headers={"Authorization": f"Bearer {client.api_key}"},
            json={"model": MODEL, "prompt": "a red cube", "size": "32x32", "stream": True, "partial_images": 1,
                  "num_inference_steps": 2, "seed": 1}) as resp:
        blocks = [b for b in (await resp.text()).split("\n\n") if b.strip()]
    names = [b.split("\n")[0] for b in blocks]
    assert names == ["event: image_generation.partial_image", "event: image_generation.completed"], blocks
    assert all(f'"type":"{n.removeprefix("event: ")}"' in b for n, b in zip(names, blocks, strict=True))
    await eventually(lambda: idle(srv.orch))
