"""GenerationEngine: chunked streaming decode equals whole decode, batching, abort.

A toy adapter checks the engine's window and sample accounting exactly; the
tiny Qwen3-Omni code2wav checks the same on a real causal codec decoder.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.generation import GenerationEngine  # noqa: E402
from omni_actors.workers.engines.generation_adapter import ChunkPolicy, GenerationAdapter  # noqa: E402

TOY = f"{__name__}:ToyAdapter"
QWEN3 = "omni_actors.models.qwen3_omni_moe.code2wav:Qwen3OmniMoeCode2WavAdapter"


class ToyAdapter(GenerationAdapter):
    """Sample j of code i = code[i] + 0.5 code[i-1] + 0.25 code[i+1] (lookahead), tail trimmed."""

    sample_rate = 100
    samples_per_code = 4
    chunk_size = 3
    first_chunk_size = 2
    left_context = 1
    right_context = 1
    trim = 3
    calls: list[int] = []
    lengths: list[int] = []

    def load(self) -> None:
        ToyAdapter.calls = []
        ToyAdapter.lengths = []

    def codes_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        return torch.as_tensor(inputs["codes"], dtype=torch.float32) if "codes" in inputs else None

    def decode(self, windows, starts, data):
        ToyAdapter.calls.append(len(windows))
        ToyAdapter.lengths.append(len(windows[0]))
        out = []
        for w in windows:
            prev = torch.cat([w[:1] * 0, w[:-1]])
            nxt = torch.cat([w[1:], w[:1] * 0])
            wav = (w + 0.5 * prev + 0.25 * nxt).repeat_interleave(self.samples_per_code)
            out.append(wav[: -self.trim])
        return out


class TrimToyAdapter(ToyAdapter):
    """ToyAdapter that decodes only the kept codes and one code either side (its reach)."""

    def decode_part(self, windows, starts, data, keep):
        out = []
        for w, (lo, hi) in zip(windows, keep, strict=True):
            first = max(0, lo - 1)
            last = len(w) if hi is None else min(len(w), hi + 1)
            wav = self.decode([w[first:last]], [0], [None])[0]
            out.append((wav, first * self.samples_per_code))
        return out


def _ctx(adapter: str, path: Path | None = None, **extras) -> EngineContext:
    return EngineContext(
        stage_id=2, replica=0, model_stage="code2wav", model_path=path, device="cpu",
        max_num_seqs=8, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": adapter, **extras},
    )  # fmt: skip


def _drain(engine: GenerationEngine, got: dict[str, list]) -> None:
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            got.setdefault(out.request_id, []).append(out)


def _one_at_a_time(engine: GenerationEngine, all_codes: dict[str, np.ndarray]) -> dict[str, list]:
    """Each request's whole codes, decoded alone: the reference for concurrent runs."""
    alone: dict[str, list] = {}
    for rid, codes in all_codes.items():
        engine.add(rid, {"codes": codes}, {})
        _drain(engine, alone)
    return alone


def _feed_round(engine: GenerationEngine, all_codes: dict[str, np.ndarray], start: int, size: int) -> None:
    """Codes [start, start + size) of every request still receiving, as async chunk delivers them."""
    for rid, codes in all_codes.items():
        if start < len(codes):
            engine.feed(rid, {"codes": codes[start : start + size]}, last=start + size >= len(codes))


def _audio(outs: list) -> np.ndarray:
    assert sum(o.finished for o in outs) == 1 and outs[-1].finished
    return np.concatenate([o.payload["audio"] for o in outs])


def _stream(
    engine: GenerationEngine, rid: str, codes: np.ndarray, sizes: list[int], got: dict
) -> None:
    engine.add(rid, {}, {}, streaming=True)
    pos = 0
    for i, size in enumerate(sizes):
        engine.feed(rid, {"codes": codes[pos : pos + size]}, last=i == len(sizes) - 1)
        pos += size
        _drain(engine, got)


def test_toy_chunked_equals_whole_for_any_chunking():
    engine = GenerationEngine(_ctx(TOY))
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 100, 23).astype(np.float32)
    got: dict[str, list] = {}
    engine.add("whole", {"codes": codes}, {})
    _drain(engine, got)
    whole = _audio(got["whole"])
    assert whole.shape == (23 * 4 - 3,)
    for trial in range(5):
        sizes = []
        left = len(codes)
        while left:
            sizes.append(min(left, int(rng.integers(1, 7))))
            left -= sizes[-1]
        _stream(engine, f"s{trial}", codes, sizes, got)
        outs = got[f"s{trial}"]
        assert len(outs) > 2, "audio should come in several deltas"
        np.testing.assert_array_equal(_audio(outs), whole)
        assert outs[0].payload["sample_rate"] == 100


POLICIES = [
    {"chunk_growth": 1},  # fixed windows, as before chunk growth
    {},  # the adapter's defaults: growth 2, up to 4 chunks a window
    {"chunk_growth": 3, "max_chunk_size": 20, "first_chunk_size": 1},
    {"chunk_size": 1, "chunk_growth": 1.5, "max_chunk_size": 7, "left_context": 2},
    {"chunk_size": 5, "max_chunk_size": 5, "right_context": 3},
]


@pytest.mark.parametrize("policy", POLICIES)
def test_toy_chunked_equals_whole_for_every_chunk_policy(policy):
    engine = GenerationEngine(_ctx(TOY, **policy))
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 100, 61).astype(np.float32)
    got: dict[str, list] = {}
    engine.add("whole", {"codes": codes}, {})
    _drain(engine, got)
    whole = _audio(got["whole"])
    for trial, sizes in enumerate(([1] * 61, [5, 40, 16], [2, 3, 9, 1, 20, 26], [61])):
        _stream(engine, f"s{trial}", codes, sizes, got)
        np.testing.assert_array_equal(_audio(got[f"s{trial}"]), whole)


@pytest.mark.parametrize("policy", POLICIES[:3])
def test_adapter_that_decodes_only_the_kept_codes_joins_up_exactly(policy):
    engine = GenerationEngine(_ctx(f"{__name__}:TrimToyAdapter", **policy))
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 100, 47).astype(np.float32)
    got: dict[str, list] = {}
    engine.add("whole", {"codes": codes}, {})
    _drain(engine, got)
    for trial, sizes in enumerate(([1] * 47, [6, 30, 11], [2, 2, 40, 3])):
        _stream(engine, f"s{trial}", codes, sizes, got)
        np.testing.assert_array_equal(_audio(got[f"s{trial}"]), _audio(got["whole"]))


def test_chunk_policy_grows_windows_and_takes_ready_codes():
    pol = ChunkPolicy.of(ToyAdapter(None), {"max_chunk_size": 13})  # chunk 3, first 2: cap 12
    assert pol.cap == 12
    assert pol.new_codes(0, 1) == 0 and pol.new_codes(0, 50) == 2  # first chunk stays small
    assert [pol.new_codes(k, 100) for k in (1, 2, 3, 4, 9)] == [12] * 5
    assert [pol.new_codes(k, 3 * 2 ** (k - 1)) for k in (1, 2, 3)] == [3, 6, 12]
    assert pol.new_codes(2, 5) == 0  # wants 6
    assert pol.new_codes(1, 8) == 6  # wants 3, takes the ready codes in whole chunks
    with pytest.raises(ValueError, match="max_chunk_size"):
        ChunkPolicy.of(ToyAdapter(None), {"max_chunk_size": 2})
    with pytest.raises(ValueError, match="chunk_growth"):
        ChunkPolicy.of(ToyAdapter(None), {"chunk_growth": 0.5})
    with pytest.raises(ValueError, match="first_right_context"):  # ToyAdapter's right_context is 1
        ChunkPolicy.of(ToyAdapter(None), {"first_right_context": 2})
    assert ChunkPolicy.of(ToyAdapter(None), {}).first_window == ToyAdapter.first_chunk_size + 1


def _underruns(pol: ChunkPolicy, frame_ms: float, audio_ms: float, frames: int) -> list[int]:
    """Frames at which a window was decoded after the audio sent so far had played out, for codes
    made one every `frame_ms` (each `audio_ms` of audio) and decodes taking no time."""
    done, chunks, first_at, late = 0, 0, None, []
    for made in range(1, frames + 1):
        new = pol.new_codes(chunks, made - done)
        if not new:
            continue
        now = made * frame_ms
        if first_at is None:
            first_at = now
        elif now > first_at + done * audio_ms:
            late.append(made)
        done, chunks = done + new, chunks + 1
    return late


def test_the_qwen3_codecs_one_frame_start_never_runs_dry_below_40_ms_a_frame():
    """The graphed windows (the class's sizes); eager decodes keep the old ones (next test)."""
    from omni_actors.models.qwen3_omni_moe.code2wav import Qwen3OmniMoeCode2WavAdapter
    from omni_actors.models.qwen3_tts.codec import Qwen3TTSCodecAdapter

    for cls in (Qwen3OmniMoeCode2WavAdapter, Qwen3TTSCodecAdapter):
        pol = ChunkPolicy.of(cls, {})
        assert pol.new_codes(0, 1) == 1  # first audio after one frame
        assert _underruns(pol, 39.0, 80.0, 400) == []
        assert _underruns(pol, 45.0, 80.0, 400)  # past 40 ms a frame the doubling cannot keep up
    old = ChunkPolicy.of(Qwen3OmniMoeCode2WavAdapter, {"first_chunk_size": 5, "chunk_size": 25})
    assert _underruns(old, 25.0, 80.0, 400)  # the old windows ran dry at a 25 ms talker frame


def test_eager_qwen3_codecs_keep_the_old_windows_and_extras_still_win(qwen3_dir):
    engine = GenerationEngine(_ctx(QWEN3, qwen3_dir))
    assert not engine.adapter.graphs.enabled  # the CPU
    assert (engine.policy.first_chunk_size, engine.policy.chunk_size, engine.policy.cap) == (5, 25, 100)
    engine = GenerationEngine(_ctx(QWEN3, qwen3_dir, first_chunk_size=1, chunk_size=2))
    assert (engine.policy.first_chunk_size, engine.policy.chunk_size, engine.policy.cap) == (1, 2, 100)


def test_streaming_windows_grow_and_fixed_policy_does_not():
    codes = np.arange(60, dtype=np.float32)
    for extras, want in (
        ({}, [2 + 1, 1 + 3 + 1, 1 + 6 + 1, 1 + 12 + 1, 1 + 12 + 1]),
        ({"chunk_growth": 1}, [2 + 1] + [1 + 3 + 1] * 12),
    ):
        engine = GenerationEngine(_ctx(TOY, **extras))
        got: dict[str, list] = {}
        _stream(engine, "s", codes, [1] * 40 + [0], got)  # one code at a time
        assert ToyAdapter.lengths[:-1] == want  # then the rest, input ended


def test_codes_arriving_faster_than_decoded_make_larger_windows():
    engine = GenerationEngine(_ctx(TOY, chunk_growth=1, max_chunk_size=9))
    got: dict[str, list] = {}
    codes = np.arange(40, dtype=np.float32)
    _stream(engine, "s", codes, [3, 30, 7], got)  # 30 codes at once: windows of 9 new, not 3
    assert ToyAdapter.lengths == [3, 1 + 9 + 1, 1 + 9 + 1, 1 + 9 + 1, 1 + 3 + 1, 1 + 8]


class LengthsToyAdapter(ToyAdapter):
    """ToyAdapter that decodes windows of 5 and 9 codes cheapest (as if captured as graphs)."""

    def window_lengths(self) -> tuple[int, ...]:
        return (5, 9)


def test_last_window_is_widened_to_a_preferred_length_with_more_left_context():
    engine = GenerationEngine(_ctx(f"{__name__}:LengthsToyAdapter", chunk_growth=1))
    codes = np.arange(1, 14, dtype=np.float32)
    got: dict[str, list] = {}
    engine.add("whole", {"codes": codes}, {})
    _drain(engine, got)
    # 13 codes whole: longer than every preferred length, so decoded as it is.
    assert ToyAdapter.lengths == [13]
    ToyAdapter.lengths = []
    _stream(engine, "s", codes, [3, 3, 3, 3, 1], got)
    # Windows 2+1, 1+3+1 (x3), then the rest: 2 codes + 1 left = 3, widened to 5; and the
    # audio is the whole decode's, as with any chunking.
    assert ToyAdapter.lengths == [3, 5, 5, 5, 5]
    np.testing.assert_array_equal(_audio(got["s"]), _audio(got["whole"]))
    ToyAdapter.lengths = []
    _stream(engine, "short", codes[:4], [3, 1], got)
    # 4 codes: the rest (2 new + 1 left) cannot widen to 5, there are not 5 codes.
    assert ToyAdapter.lengths == [3, 3]
    np.testing.assert_array_equal(_audio(got["short"]), _audio(_decode_whole(engine, codes[:4])))


def test_a_window_before_the_last_is_widened_with_more_right_context_from_codes_already_here():
    engine = GenerationEngine(_ctx(f"{__name__}:LengthsToyAdapter", chunk_growth=1, max_chunk_size=6))
    codes = np.arange(1, 17, dtype=np.float32)
    got: dict[str, list] = {}
    _stream(engine, "s", codes, [3, 8, 5], got)
    # 2 new + 1 right; then 6 new after 1 left + 1 right = 8, not a preferred length: 11 codes
    # are here, so it reads one more on the right (9); then the rest, 8 new + 1 left = 9.
    assert ToyAdapter.lengths == [3, 9, 9]
    np.testing.assert_array_equal(_audio(got["s"]), _audio(_decode_whole(engine, codes)))
    ToyAdapter.lengths = []
    _stream(engine, "short", codes[:10], [3, 6, 1], got)
    # 9 codes when the second window is cut: [1, 9) cannot reach 9 codes, so it stays 8.
    assert ToyAdapter.lengths[:2] == [3, 8]
    np.testing.assert_array_equal(_audio(got["short"]), _audio(_decode_whole(engine, codes[:10])))


def _decode_whole(engine: GenerationEngine, codes: np.ndarray) -> list:
    got: dict[str, list] = {}
    engine.add("ref", {"codes": codes}, {})
    _drain(engine, got)
    return got["ref"]


def test_one_batch_per_step_most_urgent_first():
    engine = GenerationEngine(_ctx(TOY, first_chunk_priority=False))  # deadlines alone
    engine.add("a", {"codes": np.arange(10, dtype=np.float32)}, {})
    engine.add("b", {"codes": np.arange(6, dtype=np.float32)}, {})
    assert [o.request_id for o in engine.step()] == ["a"]  # arrived first
    assert [o.request_id for o in engine.step()] == ["b"]
    assert not engine.has_work()
    # A streaming request whose audio runs out goes before a later arrival.
    got: dict[str, list] = {}
    engine.add("s", {}, {}, streaming=True)
    engine.feed("s", {"codes": np.arange(3, dtype=np.float32)}, last=False)
    _drain(engine, got)  # the first chunk: 2 codes, 0.08 s of audio
    time.sleep(0.1)
    engine.add("late", {"codes": np.arange(10, dtype=np.float32)}, {})
    engine.feed("s", {"codes": np.arange(20, dtype=np.float32)}, last=False)
    assert [o.request_id for o in engine.step()] == ["s"]
    assert [o.request_id for o in engine.step()] == ["late"]


def test_toy_concurrent_streams_equal_alone_under_growth_and_a_batch_cap():
    engine = GenerationEngine(_ctx(TOY, max_batch_codes=12))
    rng = np.random.default_rng(5)
    all_codes = {f"r{i}": rng.integers(0, 100, 10 + 9 * i).astype(np.float32) for i in range(4)}
    alone = _one_at_a_time(engine, all_codes)
    together: dict[str, list] = {}
    for rid in all_codes:
        engine.add(rid, {}, {}, streaming=True)
    for start in range(0, 40, 4):
        _feed_round(engine, all_codes, start, 4)
        for out in engine.step():  # one batch, then more codes arrive (a busy worker)
            together.setdefault(out.request_id, []).append(out)
    _drain(engine, together)
    for rid in all_codes:
        np.testing.assert_array_equal(_audio(together[rid]), _audio(alone[rid]))


def test_toy_requests_of_equal_windows_share_a_decode():
    engine = GenerationEngine(_ctx(TOY))
    codes = np.arange(10, dtype=np.float32)
    for rid in "abcd":
        engine.add(rid, {"codes": codes}, {})
    got: dict[str, list] = {}
    _drain(engine, got)
    assert ToyAdapter.calls == [4]
    assert all(np.array_equal(_audio(got[r]), _audio(got["a"])) for r in "bcd")


def test_batches_are_capped_at_max_batch_codes():
    engine = GenerationEngine(_ctx(TOY, max_batch_codes=25))  # 10-code windows: 2 a decode
    codes = np.arange(10, dtype=np.float32)
    for rid in "abcde":
        engine.add(rid, {"codes": codes}, {})
    got: dict[str, list] = {}
    _drain(engine, got)
    assert ToyAdapter.calls == [2, 2, 1]
    assert all(np.array_equal(_audio(got[r]), _audio(got["a"])) for r in "bcde")


def test_abort_and_empty_input():
    engine = GenerationEngine(_ctx(TOY))
    engine.add("gone", {}, {}, streaming=True)
    engine.feed("gone", {"codes": np.arange(8, dtype=np.float32)}, last=False)
    assert engine.has_work()
    engine.abort("gone")
    engine.abort("unknown")
    engine.feed("gone", {"codes": np.arange(3)}, last=True)  # late input of an aborted request
    assert not engine.has_work()
    engine.add("empty", {}, {}, streaming=True)
    engine.feed("empty", {}, last=True)
    got: dict[str, list] = {}
    _drain(engine, got)
    assert _audio(got["empty"]).size == 0


def test_missing_adapter_is_an_error():
    with pytest.raises(ValueError, match="adapter"):
        GenerationEngine(_ctx(""))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from omni_actors.models.tiny import make_tiny

    return make_tiny("qwen3_omni_moe", tmp_path_factory.mktemp("q3"), seed=0)


@pytest.mark.parametrize(
    "policy",
    [{"chunk_growth": 1}, {}, {"chunk_size": 4, "max_chunk_size": 16, "first_chunk_size": 2}],
)
def test_qwen3_code2wav_chunked_equals_whole_decode_in_float32(qwen3_dir, policy):
    engine = GenerationEngine(_ctx(QWEN3, qwen3_dir, left_context=30, **policy))
    model = engine.adapter.model
    assert model.dtype == torch.float32
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2048, (40, 16))
    with torch.inference_mode():
        whole = model(torch.as_tensor(codes).T[None]).reshape(-1).numpy()
    got: dict[str, list] = {}
    _stream(engine, "s", codes, [3, 7, 1, 12, 9, 8], got)
    chunked = _audio(got["s"])
    assert len(got["s"]) >= 3 and got["s"][0].payload["sample_rate"] == 24000
    assert chunked.shape == whole.shape
    np.testing.assert_allclose(chunked, whole, atol=1e-4)


def test_qwen3_code2wav_concurrent_equals_alone(qwen3_dir):
    engine = GenerationEngine(_ctx(QWEN3, qwen3_dir))
    rng = np.random.default_rng(2)
    all_codes = {f"r{i}": rng.integers(0, 2048, (12 + 7 * i, 16)) for i in range(4)}
    alone = _one_at_a_time(engine, all_codes)
    together: dict[str, list] = {}
    for rid in all_codes:
        engine.add(rid, {}, {}, streaming=True)
    for start in range(0, 40, 5):  # interleaved feeds, as async chunk delivers them
        _feed_round(engine, all_codes, start, 5)
        _drain(engine, together)
    for rid in all_codes:
        np.testing.assert_allclose(_audio(together[rid]), _audio(alone[rid]), atol=1e-4)


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False  # as the bus hands a payload's arrays to an engine
    return a


def test_read_only_codes_are_copied_once_not_shared_and_decode_the_same(qwen3_dir):
    """torch.as_tensor shared a read-only bus array (UserWarning "The given NumPy array is not writable")."""
    engine = GenerationEngine(_ctx(QWEN3, qwen3_dir))
    codes = np.random.default_rng(3).integers(0, 2048, (10, 16))
    frames_of = engine.adapter.frames_of
    shared = frames_of({"codes": codes}, "codes", 16)
    assert np.shares_memory(shared.numpy(), codes)  # writable and int64 already: no copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for given in (_read_only(codes), _read_only(codes.astype(np.int32))):
            got = frames_of({"codes": given}, "codes", 16)
            assert got.dtype == torch.long and not np.shares_memory(got.numpy(), given)
            assert np.array_equal(got.numpy(), codes)
        alone = _one_at_a_time(engine, {"w": codes})
        bus = _one_at_a_time(engine, {"r": _read_only(codes)})
    np.testing.assert_array_equal(_audio(bus["r"]), _audio(alone["w"]))


QWEN3_TTS = "omni_actors.models.qwen3_tts.codec:Qwen3TTSCodecAdapter"


@pytest.mark.parametrize("policy", [{}, {"first_chunk_size": 5, "chunk_size": 25}])
def test_qwen3_tts_codec_streamed_equals_whole_without_silence_between_windows(tmp_path, policy):
    """A streamed window's short tail (the transposed convolutions trim it) is decoded again by the
    next window, never sent as padding; only the last window is padded to whole frames."""
    from omni_actors.models.tiny import make_tiny
    from omni_actors.models.tiny.qwen3_tts import CODEBOOK

    engine = GenerationEngine(_ctx(QWEN3_TTS, make_tiny("qwen3_tts", tmp_path / "q3tts"), left_context=30, **policy))
    adapter = engine.adapter
    codes = np.random.default_rng(3).integers(0, CODEBOOK, (40, adapter.groups))
    with torch.inference_mode():
        whole = adapter.decode([torch.as_tensor(codes)], [0], [None])[0].numpy()
    assert whole.shape[0] < 40 * adapter.samples_per_code  # the decoder trims its tail
    got: dict[str, list] = {}
    _stream(engine, "s", codes, [1, 1, 3, 7, 12, 16], got)
    chunked = _audio(got["s"])
    assert len(got["s"]) >= 2
    assert chunked.shape[0] == 40 * adapter.samples_per_code  # whole frames: the end padded
    np.testing.assert_allclose(chunked[: whole.shape[0]], whole, atol=1e-4)
    assert not chunked[whole.shape[0] :].any()


class ContextToyAdapter(ToyAdapter):
    """ToyAdapter whose first payload may carry context codes (a clip the model continued)."""

    def context_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        return torch.as_tensor(inputs["context"], dtype=torch.float32) if "context" in inputs else None


@pytest.mark.parametrize("sizes", [[17], [1] * 17, [4, 9, 4]])
def test_context_codes_are_left_context_and_never_sent(sizes):
    """The audio after context codes is the whole decode's from their end on: nothing of theirs is sent."""
    engine = GenerationEngine(_ctx(f"{__name__}:ContextToyAdapter"))
    rng = np.random.default_rng(5)
    context, codes = (rng.integers(1, 100, n).astype(np.float32) for n in (6, 17))
    got: dict[str, list] = {}
    engine.add("whole", {"codes": np.concatenate([context, codes])}, {})
    engine.add("added", {"context": context, "codes": codes}, {})
    _drain(engine, got)
    tail = _audio(got["whole"])[6 * 4 :]
    np.testing.assert_array_equal(_audio(got["added"]), tail)
    engine.add("fed", {}, {}, streaming=True)
    pos = 0
    for i, size in enumerate(sizes):
        first = {"context": context} if i == 0 else {}
        engine.feed("fed", {**first, "codes": codes[pos : pos + size]}, last=i == len(sizes) - 1)
        pos += size
        _drain(engine, got)
    np.testing.assert_array_equal(_audio(got["fed"]), tail)
    engine.add("late", {"codes": codes[:2]}, {}, streaming=True)
    with pytest.raises(ValueError, match="context codes"):
        engine.feed("late", {"context": context}, last=True)
