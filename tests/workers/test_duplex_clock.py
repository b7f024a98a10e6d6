"""The duplex engine's frame clock with a model whose frame can take longer than a frame: a late step
skips the ticks it overran (none is queued behind it), says so in `late`, and drops the user audio of
those ticks beyond JITTER_FRAMES; a session buffers at most MAX_INPUT_S of audio; a session with
nothing buffered steps on silence; a standing backlog is cut to JITTER_FRAMES. The adapter here is a
stand-in model (DuplexAdapter's real interface, its frame an echo of the input after a set delay), so the
clock's arithmetic is exact."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.duplex import (
    BACKLOG_WINDOW_FRAMES,
    JITTER_FRAMES,
    MAX_INPUT_S,
    DuplexAdapter,
    DuplexEngine,
    SlotOutput,
)

RATE = 8000
FRAME = 640
"""80 ms frames, as Moshi's."""
FRAME_S = FRAME / RATE


class EchoAdapter(DuplexAdapter):
    """Two slots; each frame returns the slot's input frame, after `delay_s` (settable between steps)."""

    slots, sample_rate, frame_samples = 2, RATE, FRAME

    def __init__(self, ctx: EngineContext) -> None:
        self.delay_s = 0.0

    def start(self, slot: int, params: dict[str, Any]) -> None:
        pass

    def stop(self, slot: int) -> None:
        pass

    def step(self, frames: np.ndarray) -> list[SlotOutput]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [SlotOutput(frames[s].copy(), "") for s in range(self.slots)]


def _engine() -> DuplexEngine:
    return DuplexEngine(EngineContext(
        stage_id=0, replica=0, model_stage="duplex", model_path=None, device="cpu", max_num_seqs=2,
        dtype="float32", gpu_memory_utilization=0.0, tensor_parallel_size=1,
        engine_extras={"adapter": f"{__name__}:EchoAdapter"},
    ))  # fmt: skip


def _frames(n: int, start: int = 0) -> np.ndarray:
    """n frames whose samples say their frame number (frame k is all k / 1000)."""
    return np.repeat(np.arange(start, start + n, dtype=np.float32) / 1000, FRAME)


def test_a_late_step_skips_its_ticks_and_the_audio_of_them_past_the_jitter_frames() -> None:
    engine = _engine()
    engine.add("s", {"audio": _frames(10), "sample_rate": RATE}, {}, streaming=True)
    first = engine.step()[0].payload  # on time: frame 0
    assert first["late"] == 0 and first["audio"][0] == 0.0 and "input_to_output_ms" in first
    engine.adapter.delay_s = 2.5 * FRAME_S  # this step overruns two ticks (three on a slow box)
    late = engine.step()[0].payload
    skipped = late["late"]
    assert skipped in (2, 3) and late["audio"][0] == 0.001  # frame 1 was stepped, late
    assert late["dropped_input_s"] == skipped * FRAME_S  # (said with the late frame itself)
    engine.adapter.delay_s = 0.0
    # 8 frames were buffered (2..9): each skipped tick drops one of them, JITTER_FRAMES stay ahead
    after = engine.step()[0].payload
    assert after["audio"][0] == (2 + skipped) / 1000 and after["dropped_input_s"] == 0.0, after["audio"][0]
    assert len(engine.sessions["s"].buffer) == (7 - skipped) * FRAME >= JITTER_FRAMES * FRAME
    engine.abort("s")
    assert not engine.sessions and sorted(engine.free) == [0, 1]


def test_a_late_step_never_drops_the_jitter_frames() -> None:
    engine = _engine()
    engine.add("s", {"audio": _frames(3), "sample_rate": RATE}, {}, streaming=True)
    engine.adapter.delay_s = 3.5 * FRAME_S
    assert engine.step()[0].payload["late"] >= 3  # stepped frame 0; frames 1, 2 stay (the jitter frames)
    engine.adapter.delay_s = 0.0
    after = engine.step()[0].payload
    assert after["audio"][0] == 0.001 and after["dropped_input_s"] == 0.0
    engine.abort("s")


def test_input_past_max_input_s_drops_the_oldest_and_an_empty_buffer_steps_silence() -> None:
    engine = _engine()
    frames = int(MAX_INPUT_S / FRAME_S) + 5  # 5 frames over the cap
    engine.add("full", {"audio": _frames(frames), "sample_rate": RATE}, {}, streaming=True)
    engine.add("quiet", {}, {}, streaming=True)
    out = {o.request_id: o.payload for o in engine.step()}
    assert out["full"]["audio"][0] == 0.005 and abs(out["full"]["dropped_input_s"] - 5 * FRAME_S) < 1e-9
    assert not out["quiet"]["audio"].any() and "input_to_output_ms" not in out["quiet"]
    engine.feed("full", {"audio": _frames(1), "sample_rate": RATE}, last=True)
    ends = {o.request_id: o.finished for o in engine.step()}
    assert ends == {"full": True, "quiet": False} and list(engine.sessions) == ["quiet"]
    engine.abort("quiet")


def test_a_standing_backlog_is_cut_to_the_jitter_frames() -> None:
    """A client that bursts (a network stall, then the audio it held) and then streams in real time stayed
    that far behind for the rest of its session: a frame taken per tick never drains a backlog. A buffer
    that held more than JITTER_FRAMES frames at every tick of BACKLOG_WINDOW_FRAMES is cut to JITTER_FRAMES,
    the audio cut counted as dropped."""
    engine = _engine()
    burst, steps = 12, BACKLOG_WINDOW_FRAMES + 3
    engine.add("s", {"audio": _frames(burst), "sample_rate": RATE}, {}, streaming=True)
    heard, dropped = [], 0.0
    for k in range(steps):
        engine.feed("s", {"audio": _frames(1, burst + k), "sample_rate": RATE}, last=False)  # one frame a tick
        out = engine.step()[0].payload
        heard.append(round(float(out["audio"][0]) * 1000))
        dropped += out["dropped_input_s"]
    cut = round(dropped / FRAME_S)
    assert heard == sorted(heard) and heard[-1] == steps - 1 + cut  # what was cut is what was not heard
    assert len(engine.sessions["s"].buffer) // FRAME <= JITTER_FRAMES, f"still {burst - cut} frames behind"
    engine.abort("s")


def test_late_steps_are_one_warning_a_while_not_one_each() -> None:
    """An overloaded box is late every frame: one warning line a frame (12 a second) drowned the log."""
    from structlog.testing import capture_logs

    engine = _engine()
    engine.add("s", {"audio": _frames(4), "sample_rate": RATE}, {}, streaming=True)
    engine.adapter.delay_s = 1.5 * FRAME_S
    with capture_logs() as logged:
        skipped = sum(engine.step()[0].payload["late"] for _ in range(3))
    warned = [e for e in logged if e["event"] == "duplex.late_frame"]
    assert len(warned) == 1 and warned[0]["late_steps"] == 1 and skipped >= 3, warned
    engine.abort("s")
