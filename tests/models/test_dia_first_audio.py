"""Dia's time to first audio in steps (not seconds): the decoder's first frame, the codec's first window.

Decoder: a new request's prompt and its first decode position run in one engine step, so
its first audio frame (complete once the delay pattern's longest delay has passed) comes
out of its `max_delay`-th step, with or without a reference clip, whether it arrives
alone or joins running requests. Codec (streaming, async chunk): the first audio leaves
once `first_chunk_size + right_context` frames are in, and the streamed audio joins up to
what one whole decode gives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.dia.codec import DacCodecAdapter
from omni_actors.models.dia.engine import DiaEngine
from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.generation import GenerationEngine

CLIP = (0.3 * np.sin(np.arange(11025) / 44100 * 2 * np.pi * 220)).astype(np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tiny("dia", tmp_path_factory.mktemp("models") / "tiny-dia", seed=0)


def _ctx(folder: Path, stage: str, **extras) -> EngineContext:
    return EngineContext(0, 0, stage, folder, "cpu", 4, "float32", 0.9, 1, engine_extras=extras)


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_the_first_frame_comes_out_of_the_max_delay_th_step(folder, kv_cache: str) -> None:
    engine = DiaEngine(_ctx(folder, "decoder", kv_cache=kv_cache))
    delay = engine.tok.max_delay
    first: dict[str, int] = {}
    arrivals = {0: [("a", {})], 5: [("b", {"reference_audio": CLIP, "reference_text": "A hum."}), ("c", {})]}
    step = 0
    while step <= max(arrivals) or engine.has_work():
        for rid, extra in arrivals.get(step, []):
            engine.add(rid, {"text": "Hello there.", "voice": "S1", **extra}, {"seed": 1, "max_tokens": 30})
        for out in engine.step():
            assert out.error is None
            if "codes" in out.payload:
                first.setdefault(out.request_id, step)
        step += 1
    # steps are counted from 0: the request's own step k is its (k + 1)-th
    assert first == {"a": delay - 1, "b": 5 + delay - 1, "c": 5 + delay - 1}
    engine.close()


@pytest.mark.parametrize("warmup", [False, True])
def test_streamed_codec_audio_starts_after_the_first_chunk_and_joins_up(folder, warmup: bool) -> None:
    """warmup (default on CUDA only) decodes one first window at load and changes nothing after."""
    adapter_name = "omni_actors.models.dia.codec:DacCodecAdapter"
    codec = GenerationEngine(_ctx(folder, "codec", adapter=adapter_name, warmup=warmup))
    adapter = codec.adapter
    assert isinstance(adapter, DacCodecAdapter)
    frames = torch.randint(0, 1024, (60, adapter.groups), generator=torch.Generator().manual_seed(0))
    want = adapter.decode([frames], [0], [None])[0].numpy()

    codec.add("s", {"codes": frames[:1].numpy()}, {}, streaming=True)
    deltas: list[np.ndarray] = []
    first_at = None
    for n in range(1, len(frames) + 1):
        if n > 1:
            codec.feed("s", {"codes": frames[n - 1 : n].numpy()}, last=n == len(frames))
        while codec.has_work():
            for out in codec.step():
                assert out.error is None
                if len(out.payload["audio"]):
                    first_at = first_at or n
                    deltas.append(np.asarray(out.payload["audio"]))
    assert first_at == adapter.first_chunk_size + adapter.right_context
    assert len(deltas[0]) == adapter.first_chunk_size * adapter.samples_per_code
    got = np.concatenate(deltas)
    assert got.shape == want.shape
    # joins: right_context covers what a frame's audio depends on (8 frames left ~2e-3 of the peak here)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
