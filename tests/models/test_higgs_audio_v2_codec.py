"""Higgs-Audio-V2's codec stage streaming: windows cut wherever the frames happen to have
arrived join up to one whole decode, so a seeded request's audio does not depend on timing.

Its decoder is not causal, so on CUDA a window is replayed only at a length captured for it
exactly (`FrameCodecAdapter.window_graphs`): on the CPU, the lengths a streamed request's windows
have are the policy's; marked `gpu`, the same stream served from graphs, nothing eager, nothing
captured while serving, equal to the eager decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.higgs_audio_v2.codec import HiggsCodecAdapter
from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.codec_graphs import CodecGraphs
from omni_actors.workers.engines.generation import GenerationEngine
from omni_actors.workers.engines.generation_adapter import ChunkPolicy

ADAPTER = "omni_actors.models.higgs_audio_v2.codec:HiggsCodecAdapter"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tiny("higgs_audio_v2", tmp_path_factory.mktemp("models") / "tiny-higgs", seed=0)


def _streamed(
    folder: Path, frames: torch.Tensor, bursts: list[int], device: str = "cpu", decodes: list | None = None,
    **extras: int,
) -> tuple[np.ndarray, int, HiggsCodecAdapter]:
    """The audio of `frames` fed in `bursts` (frames a feed), each burst decoded before the next,
    and how many frames were in when the first audio left; `decodes` gets the shape of each
    decode that ran (eagerly: not a graph replay)."""
    extras = {"adapter": ADAPTER, **extras}
    ctx = EngineContext(0, 0, "codec", folder, device, 4, "float32", 0.9, 1, engine_extras=extras)
    codec = GenerationEngine(ctx)
    if decodes is not None:
        graphs, decode = codec.adapter.graphs, codec.adapter.graphs.decode
        graphs.decode = lambda codes: decodes.append(tuple(codes.shape)) or decode(codes)
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
    exact = {"first_right_context": HiggsCodecAdapter.right_context}  # (the default cuts the first window short)
    one_by_one, first_at, adapter = _streamed(folder, frames, [1] * 60, **exact)
    assert isinstance(adapter, HiggsCodecAdapter)
    assert first_at == adapter.first_chunk_size + adapter.right_context
    want = adapter.decode([frames], [0], [None])[0].numpy()
    bursty, _, _ = _streamed(folder, frames, [13, 1, 21, 2, 5, 18], **exact)  # windows grow with what is ready
    peak = float(np.abs(want).max())
    for got in (one_by_one, bursty):
        assert got.shape == want.shape
        # 6 frames of right context left 8e-3 of the peak at each window's end
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * peak)


def test_a_short_first_window_is_cut_at_the_same_frame_whenever_it_is_decoded(folder) -> None:
    """first_right_context 3 (the default): first audio 6 frames sooner, the same audio however the frames
    arrive (the cut never moves), a whole decode's from the second window on, and the first
    window's end faded into it (no step at the join)."""
    frames = torch.randint(0, 1024, (60, 8), generator=torch.Generator().manual_seed(2))
    one_by_one, first_at, adapter = _streamed(folder, frames, [1] * 60, first_right_context=3)
    assert first_at == adapter.first_chunk_size + 3
    bursty, _, _ = _streamed(folder, frames, [59, 1], first_right_context=3)  # 59 in before the first decode
    exact, _, _ = _streamed(folder, frames, [59, 1], first_right_context=adapter.right_context)
    spc, f = adapter.samples_per_code, adapter.first_chunk_size
    whole = adapter.decode([frames], [0], [None])[0].numpy()
    peak = float(np.abs(whole).max())
    np.testing.assert_allclose(bursty, one_by_one, rtol=0, atol=1e-4 * peak)
    np.testing.assert_allclose(exact, whole, rtol=0, atol=1e-4 * peak)
    short = adapter.decode([frames[: f + 3]], [0], [None])[0].numpy()
    np.testing.assert_allclose(one_by_one[: f * spc], short[: f * spc], rtol=0, atol=1e-5 * peak)
    assert np.abs(one_by_one[: f * spc] - whole[: f * spc]).max() > 1e-3 * peak  # cut short: not exact
    np.testing.assert_allclose(one_by_one[(f + 1) * spc :], whole[(f + 1) * spc :], rtol=0, atol=1e-4 * peak)
    fade = one_by_one[f * spc : (f + 1) * spc]
    ramp = np.arange(1, spc + 1) / (spc + 1)
    want = short[f * spc : (f + 1) * spc] * (1 - ramp) + whole[f * spc : (f + 1) * spc] * ramp
    np.testing.assert_allclose(fade, want, rtol=0, atol=1e-4 * peak)


def test_a_streamed_requests_windows_are_the_policys_lengths(folder) -> None:
    """On the CPU nothing widens a window: the lengths a stream's windows have by themselves (all
    but its last) are the ones `window_graphs` captures on CUDA."""
    frames = torch.randint(0, 1024, (160, 8), generator=torch.Generator().manual_seed(1))
    for bursts, extras in (([1] * 160, {}), ([13, 1, 21, 2, 5, 18, 60, 40], {}), ([1] * 160, {"first_right_context": 9})):
        decodes: list[tuple[int, ...]] = []
        _, _, adapter = _streamed(folder, frames, bursts, decodes=decodes, **extras)
        lengths = ChunkPolicy.of(adapter, extras).window_lengths()
        assert decodes[0][2] == adapter.first_chunk_size + extras.get("first_right_context", adapter.first_right_context)
        assert [d[2] for d in decodes[:-1] if d[2] not in lengths] == []
        assert len(decodes) > 4


def test_exact_length_buckets_pad_rows_only() -> None:
    graphs = CodecGraphs(lambda c: c, 8, 960, "cpu", 8, False, lengths=(12, 29), pad_length=False)
    assert graphs.bucket(3, 12) == (4, 12) and graphs.bucket(8, 29) == (8, 29)
    assert graphs.bucket(1, 13) is None and graphs.bucket(1, 11) is None  # never padded in time
    small = CodecGraphs(lambda c: c, 8, 960, "cpu", 8, False, max_codes=64, lengths=(12, 29), pad_length=False)
    assert small.rows_per_replay(8, 12) == 4 and small.rows_per_replay(8, 29) == 2
    assert small.rows_per_replay(8, 30) is None


@pytest.mark.gpu
def test_on_cuda_a_stream_is_replayed_at_captured_lengths_and_equals_the_eager_decode(folder, monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 proper: replays change nothing
    frames = torch.randint(0, 1024, (200, 8), generator=torch.Generator().manual_seed(2))
    want, _, _ = _streamed(folder, frames, [1] * 200)
    for bursts in ([1] * 200, [13, 1, 21, 2, 5, 18, 60, 80]):
        eager: list[tuple[int, ...]] = []
        got, _, adapter = _streamed(folder, frames, bursts, "cuda", decodes=eager)
        assert adapter.graphs.enabled and adapter.window_lengths() == ChunkPolicy.of(adapter, {}).window_lengths()
        assert eager == []  # every window a replay, none captured while serving
        peak = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * peak)
