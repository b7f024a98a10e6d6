"""Higgs-Audio-V2's codec stage streaming: windows cut wherever the frames happen to have
arrived join up to one whole decode, so a seeded request's audio does not depend on timing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.higgs_audio_v2.codec import HiggsCodecAdapter
from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.generation import GenerationEngine

ADAPTER = "omni_actors.models.higgs_audio_v2.codec:HiggsCodecAdapter"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tiny("higgs_audio_v2", tmp_path_factory.mktemp("models") / "tiny-higgs", seed=0)


def _streamed(folder: Path, frames: torch.Tensor, bursts: list[int]) -> tuple[np.ndarray, int, HiggsCodecAdapter]:
    """The audio of `frames` fed in `bursts` (frames a feed), each burst decoded before the next,
    and how many frames were in when the first audio left."""
    ctx = EngineContext(0, 0, "codec", folder, "cpu", 4, "float32", 0.9, 1, engine_extras={"adapter": ADAPTER})
    codec = GenerationEngine(ctx)
    deltas: list[np.ndarray] = []
    first_at, fed = 0, 0
    for i, n in enumerate(bursts):
        part = frames[fed : fed + n].numpy()
        fed += n
        if i == 0:
            codec.add("s", {"codes": part}, {}, streaming=True)
        else:
            codec.feed("s", {"codes": part}, last=fed == len(frames))
        while codec.has_work():
            for out in codec.step():
                assert out.error is None
                if len(out.payload["audio"]):
                    first_at = first_at or fed
                    deltas.append(np.asarray(out.payload["audio"]))
    adapter = codec.adapter
    codec.close()
    return np.concatenate(deltas), first_at, adapter


def test_windows_cut_anywhere_join_up_to_one_whole_decode(folder) -> None:
    frames = torch.randint(0, 1024, (60, 8), generator=torch.Generator().manual_seed(0))
    one_by_one, first_at, adapter = _streamed(folder, frames, [1] * 60)
    assert isinstance(adapter, HiggsCodecAdapter)
    assert first_at == adapter.first_chunk_size + adapter.right_context
    want = adapter.decode([frames], [0], [None])[0].numpy()
    bursty, _, _ = _streamed(folder, frames, [13, 1, 21, 2, 5, 18])  # windows grow with what is ready
    peak = float(np.abs(want).max())
    for got in (one_by_one, bursty):
        assert got.shape == want.shape
        # 6 frames of right context left 8e-3 of the peak at each window's end
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * peak)
