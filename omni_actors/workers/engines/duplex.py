"""The full-duplex stage engine: every live session steps one audio frame per tick, all in one batch.

A session is one streaming request: `add` claims one of the adapter's slots
(its batch rows; `max_num_seqs` of them), `feed` appends the user's audio to
the session's input buffer (`clear` empties it first; a new `temperature` retunes its slot), `abort` frees the slot. The engine owns the frame
clock: ticks every frame (80 ms for Moshi) while any session is live; until the
next tick the worker waits on its socket (`gather_s`), so what comes before a
tick is in its frame, then `step` steps every slot at once:

- a session takes one frame from its input buffer, or a frame of silence when
  less than a frame is buffered (a client that stops sending is not waited for);
  the buffer keeps at most MAX_INPUT_S of audio, dropping the oldest;
- a step that ends after the next tick is late: the ticks it overran are skipped,
  not made up (no frame is queued behind another), and so is the user audio of
  those ticks, beyond JITTER_FRAMES still buffered; so is a standing backlog (more than
  JITTER_FRAMES buffered at every tick of BACKLOG_WINDOW_FRAMES: a client's burst after
  a stall would keep it that far behind for good); each output says how many
  (`late`), with the step's compute time (`frame_ms`), how far past its tick it
  started (`start_lag_ms`), the user audio dropped since the last output
  (`dropped_input_s`) and, for a frame of the user's audio, the time from its last
  sample's arrival to this output (`input_to_output_ms`);
- each session gets one output per step: the model's frame of audio (float32
  at `sample_rate`) and its text piece.

At load the engine times a step of every slot; past `frame_budget` of a frame
(FRAME_BUDGET), the adapter is resized to the slots that fit, and the slots kept
are the engine's capacity (told in Ready: the realtime route's session limit).

Model-specific work (loading, slots' state, the batched frame step) is a
`DuplexAdapter` named by engine_extras["adapter"]. Rows of free slots are
stepped too: every step has the same shapes, so a session's numbers do not
depend on which other sessions are live.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors import logs
from omni_actors.workers.engine import TORCH_PRELOAD, EngineContext, EngineOutput, StageEngine

log = logs.get(__name__)

MAX_INPUT_S = 2.0
"""Most user audio a session buffers ahead of the frame clock; older audio is dropped."""
JITTER_FRAMES = 2
"""User audio frames a session may keep buffered across a skipped tick; past that, the frames of the
ticks the engine skipped are dropped with them (input skips ahead as output does)."""
BACKLOG_WINDOW_FRAMES = 25
"""Ticks (2 s of Moshi's) over which a session's input buffer is watched: one that held more than
JITTER_FRAMES frames at every tick of them carries standing latency (a client's burst after a network stall,
then real time: a frame taken per tick never drains it), and is cut to JITTER_FRAMES, the oldest dropped."""
FRAME_BUDGET = 0.75
"""Default share of a frame that a step of every slot may take at load (engine_extras["frame_budget"]; 0 or
null: no sizing). A full batch over it is sized down to the slots that fit: the session limit drops
rather than every session running late."""
WARMUP_STEPS = 3
"""Full-batch steps timed at load (after one untimed step); their median is the frame time sized to."""
LATE_LOG_EVERY_S = 5.0
"""Seconds between `duplex.late_frame` warnings: an overloaded box skips ticks every frame, and one line each
would be 12 a second; each line counts the skipped ticks and late steps since the last (/metrics has them all)."""


@dataclass
class SlotOutput:
    audio: np.ndarray
    """One frame of the model's audio, float32 at the adapter's sample_rate."""
    text: str


class DuplexAdapter(abc.ABC):
    """Model-specific half of DuplexEngine; `step` runs every slot (live or not) by one frame."""

    slots: int
    sample_rate: int
    frame_samples: int

    @abc.abstractmethod
    def start(self, slot: int, params: dict[str, Any]) -> None:
        """Give `slot` a fresh session (params: the request's merged with the deploy's, with an int `seed`;
        a realtime session adds `temperature`, `voice` and `instructions`)."""

    @abc.abstractmethod
    def stop(self, slot: int) -> None:
        """Forget `slot`'s session."""

    @abc.abstractmethod
    def step(self, frames: np.ndarray) -> list[SlotOutput]:
        """frames [slots, frame_samples] float32 user audio -> one SlotOutput per slot."""

    def retune(self, slot: int, temperature: float) -> bool:
        """The live session in `slot` samples at `temperature` from its next frame (a realtime
        session.update); False when this adapter takes no temperature (it is then ignored)."""
        return False

    def resize(self, slots: int) -> bool:
        """Hold `slots` slots from now on (fewer than now; no session is live); False when this adapter
        cannot (the engine then keeps the slots it has)."""
        return False


@dataclass
class _Session:
    slot: int
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    frames: int = 0
    dropped: int = 0
    """Samples of user audio dropped (past MAX_INPUT_S, or with skipped ticks)."""
    reported: int = 0
    ending: bool = False
    arrivals: deque[tuple[int, float]] = field(default_factory=deque)
    """(samples appended so far, when) per append still in the buffer: when a frame's last sample came."""
    taken: int = 0
    """Samples taken from the buffer (or dropped) so far."""
    low: int = 0
    """Fewest frames buffered at a tick of this backlog window."""
    watched: int = 0
    """Ticks of this backlog window so far."""

    def watch(self, n: int) -> None:
        """A tick: note the frames buffered; at the window's end, cut a standing backlog to JITTER_FRAMES."""
        level = len(self.buffer) // n
        self.low = level if self.watched == 0 else min(self.low, level)
        self.watched += 1
        if self.watched == BACKLOG_WINDOW_FRAMES:
            self.watched = 0
            self.skip(self.low - JITTER_FRAMES, n)

    def skip(self, frames: int, n: int) -> None:
        """Drop the oldest `frames` frames of buffered input (the ticks they were for were skipped)."""
        if frames > 0:
            self.dropped += frames * n
            self.taken += frames * n
            self.buffer = self.buffer[frames * n:]

    def clear(self) -> None:
        """Drop the buffered input unheard (the client's input_audio_buffer.clear): it is neither
        stepped nor counted as dropped."""
        self.taken += len(self.buffer)
        self.buffer = self.buffer[:0]
        self.arrivals.clear()

    def take(self, n: int) -> float | None:
        """Take one frame from the buffer; return when its last sample arrived."""
        self.taken += n
        self.buffer = self.buffer[n:]
        while self.arrivals and self.arrivals[0][0] < self.taken:
            self.arrivals.popleft()
        return self.arrivals[0][1] if self.arrivals else None


class DuplexEngine(StageEngine):
    ZYGOTE_PRELOAD = TORCH_PRELOAD

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.adapter: DuplexAdapter = self.make_adapter()
        a = self.adapter
        self.frame_s = a.frame_samples / a.sample_rate
        frame_ms = self._fit_budget(ctx.engine_extras.get("frame_budget", FRAME_BUDGET))
        self.capacity = a.slots
        self.max_input = int(MAX_INPUT_S * a.sample_rate)
        self.sessions: dict[str, _Session] = {}
        self.free = list(range(a.slots))[::-1]
        self._next_tick: float | None = None
        self._late_ticks = self._late_steps = 0  # skipped and late since the last warning
        self._late_logged = -LATE_LOG_EVERY_S
        self._clock = threading.Event()  # never set: waiting on it until the next tick is the frame clock
        self._silence = np.zeros((a.slots, a.frame_samples), np.float32)
        log.info("duplex.ready", slots=a.slots, frame_ms=round(self.frame_s * 1000, 1),
                 warmup_frame_ms=round(frame_ms, 1))
        if frame_ms > self.frame_s * 1000:  # every step runs every slot: each session would be late
            log.warning("duplex.over_budget", slots=a.slots, warmup_frame_ms=round(frame_ms, 1),
                        frame_ms=round(self.frame_s * 1000, 1),
                        hint="a frame of all slots takes longer than a frame lasts: lower the stage's "
                             "max_num_seqs (slots), or give it a faster device")

    def _warm_frame_ms(self) -> float:
        """Median compute time of a step of every slot (silence in; the slots are stopped after)."""
        a = self.adapter
        silence = np.zeros((a.slots, a.frame_samples), np.float32)
        a.step(silence)  # warm up kernels and allocations (and capture a graph) with a full batch
        times = []
        for _ in range(WARMUP_STEPS):
            t0 = time.monotonic()
            a.step(silence)
            times.append((time.monotonic() - t0) * 1000)
        for s in range(a.slots):
            a.stop(s)
        return float(np.median(times))

    def _log_late(self, missed: int, now: float) -> None:
        self._late_ticks += missed
        self._late_steps += 1
        if now - self._late_logged >= LATE_LOG_EVERY_S:
            log.warning("duplex.late_frame", skipped=self._late_ticks, late_steps=self._late_steps,
                        sessions=len(self.sessions))
            self._late_ticks = self._late_steps = 0
            self._late_logged = now

    def _fit_budget(self, budget: Any) -> float:
        """Lower the adapter's slots until a step of all of them takes at most `budget` of a frame;
        the frame time of the slots kept."""
        a = self.adapter
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float) or budget < 0):
            raise ValueError(f"engine_extras.frame_budget: {budget!r}; a share of the frame (0.75 is 60 ms of "
                             "80), 0 or null for none")
        frame_ms = self._warm_frame_ms()
        limit_ms = float(budget or 0) * self.frame_s * 1000
        while limit_ms > 0 and frame_ms > limit_ms and a.slots > 1:
            slots = max(1, min(a.slots - 1, int(a.slots * limit_ms / frame_ms)))
            was, was_ms = a.slots, frame_ms
            if not a.resize(slots):
                break
            frame_ms = self._warm_frame_ms()
            log.warning("duplex.slots_lowered", slots=a.slots, was=was, was_frame_ms=round(was_ms, 1),
                        frame_ms=round(frame_ms, 1), frame_budget_ms=round(limit_ms, 1),
                        hint="the session limit follows the slots kept; engine_extras.frame_budget: 0 keeps "
                             "max_num_seqs whatever a frame takes")
        return frame_ms

    # ---- sessions ----

    def add(self, request_id: str, inputs: dict[str, Any], params: dict[str, Any], streaming: bool = False) -> None:
        if not self.free:
            raise ValueError(f"session_limit_reached: all {self.adapter.slots} duplex session slots are busy")
        p = self.merged_sampling(params)
        seed = p.get("seed")
        p["seed"] = int(seed) if seed is not None else int.from_bytes(os.urandom(4), "little")
        audio = self._audio(inputs)
        slot = self.free.pop()
        self.adapter.start(slot, p)
        session = self.sessions[request_id] = _Session(slot)
        self._append(session, audio)
        session.ending = not streaming
        if self._next_tick is None:
            self._next_tick = time.monotonic()

    def feed(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        session = self.sessions.get(request_id)
        if session is None:
            return
        if inputs.get("clear"):  # before this feed's audio: that came after the clear
            session.clear()
        self._append(session, self._audio(inputs))
        if (temperature := inputs.get("temperature")) is not None:
            self.adapter.retune(session.slot, float(temperature))
        session.ending = session.ending or last

    def abort(self, request_id: str) -> None:
        session = self.sessions.pop(request_id, None)
        if session is not None:
            self._release(session)

    def _release(self, session: _Session) -> None:
        self.adapter.stop(session.slot)
        self.free.append(session.slot)
        if not self.sessions:
            self._next_tick = None

    def _audio(self, inputs: dict[str, Any]) -> np.ndarray | None:
        audio = inputs.get("audio")
        if audio is None:
            return None
        rate = int(inputs.get("sample_rate", self.adapter.sample_rate))
        if rate != self.adapter.sample_rate:
            raise ValueError(f"audio: sample_rate {rate} Hz; this model takes {self.adapter.sample_rate} Hz")
        x = np.asarray(audio)
        if x.dtype == np.int16:
            return x.astype(np.float32) / 32768.0
        return x.astype(np.float32, copy=False).reshape(-1)

    def _append(self, session: _Session, audio: np.ndarray | None) -> None:
        if audio is None or not len(audio):
            return
        buf = np.concatenate([session.buffer, audio])
        session.arrivals.append((session.taken + len(buf), time.monotonic()))
        if len(buf) > self.max_input:
            drop = len(buf) - self.max_input
            session.dropped += drop
            session.taken += drop
            buf = buf[drop:]
        session.buffer = buf

    # ---- the frame clock ----

    def has_work(self) -> bool:
        return bool(self.sessions)

    def gather_s(self, now: float) -> float:
        """Until the next tick: the worker waits for it on its socket, so the audio, clears and aborts that
        come before the tick are in its frame (`step` waiting for it would read them only after that frame,
        a frame late, and time their frames from then)."""
        return 0.0 if self._next_tick is None else max(0.0, self._next_tick - now)

    def step(self) -> list[EngineOutput]:
        assert self._next_tick is not None
        wait = self._next_tick - time.monotonic()
        if wait > 0:
            self._clock.wait(wait)
        tick = self._next_tick
        n = self.adapter.frame_samples
        frames = self._silence.copy()
        arrived: dict[int, float | None] = {}
        for session in self.sessions.values():
            session.watch(n)
            if len(session.buffer) >= n:
                frames[session.slot] = session.buffer[:n]
                arrived[session.slot] = session.take(n)
        started = time.monotonic()
        outs = self.adapter.step(frames)
        done = time.monotonic()
        missed = int((done - tick) // self.frame_s)  # ticks that passed while this step ran
        self._next_tick = tick + (missed + 1) * self.frame_s
        if missed:
            self._log_late(missed, done)
            for session in self.sessions.values():
                session.skip(min(missed, len(session.buffer) // n - JITTER_FRAMES), n)
        frame_ms = (done - started) * 1000
        lag_ms = (started - tick) * 1000
        results = []
        for rid, session in list(self.sessions.items()):
            out = outs[session.slot]
            payload = {"audio": out.audio, "sample_rate": self.adapter.sample_rate, "text": out.text,
                       "frame": session.frames, "frame_ms": frame_ms, "start_lag_ms": lag_ms, "late": missed,
                       "dropped_input_s": (session.dropped - session.reported) / self.adapter.sample_rate}
            session.reported = session.dropped
            when = arrived.get(session.slot)
            if when is not None:  # a frame of the user's audio (not silence): its last sample to this output
                payload["input_to_output_ms"] = (done - when) * 1000
            session.frames += 1
            results.append(EngineOutput(rid, payload, finished=session.ending))
            if session.ending:
                del self.sessions[rid]
                self._release(session)
        return results
