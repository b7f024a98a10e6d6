"""The worker's I/O thread: it alone owns the DEALER socket, relays frames and sends heartbeats.

The stepping thread (the worker loop) never touches the bus socket. It talks to
the I/O thread over an inproc PAIR (each end owned by one thread, as ZeroMQ
sockets are not thread-safe): frames it sends are forwarded to the orchestrator
as they come, frames from the orchestrator wait on the PAIR until the stepping
thread drains them between steps. Heartbeats leave from the I/O thread on
their interval whatever the stepping thread is doing, so a step that runs for
minutes never makes the worker look dead; each carries the stepping thread's
progress (steps done, how long the current one has run) so the supervisor can
still tell a stuck step from a long one.

A message is relayed whole: its body and the array frames after it (bus.codec.to_wire),
sent and received without copies.

At each heartbeat the I/O thread also asks `should_stop` (the main process is
gone, or a SIGTERM whose SystemExit was swallowed set the stop flag); if so it
hands the stepping thread a Shutdown, as the orchestrator would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import attach_frames, to_wire
from omni_actors.bus.sockets import CurveKeys, WorkerSocket

log = logs.get(__name__)

_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_CLOSE = b""
"""Sent by the stepping thread on the PAIR: forward what is queued, then end the I/O thread."""
IO_JOIN_TIMEOUT_S = 5.0
"""Longest wait at close for the I/O thread to forward the last frames and end."""


def idle_heartbeat() -> m.Heartbeat:
    """The heartbeat before the worker loop runs (the engine is still loading)."""
    return m.Heartbeat(busy=0)


class WorkerIO:
    """The stepping thread's end of the bus (`send`, `recv_nowait`, `wait`), relayed by an I/O thread.

    `heartbeat` is called on the I/O thread at each beat; it must only read plain attributes.
    """

    def __init__(
        self,
        endpoint: str,
        identity: bytes,
        heartbeat_interval_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        keys: CurveKeys | None = None,
    ) -> None:
        self.heartbeat: Callable[[], m.Heartbeat] = idle_heartbeat
        self.heartbeat_interval_s = heartbeat_interval_s
        self.should_stop = should_stop
        self.undecodable = 0
        self._bus = WorkerSocket(endpoint, identity, keys)
        ctx = self._bus.ctx
        address = f"inproc://worker-io-{identity.decode(errors='replace')}"
        self._io_end = ctx.socket(zmq.PAIR)  # owned by the I/O thread
        self._io_end.setsockopt(zmq.LINGER, 0)
        self._io_end.bind(address)
        self._step_end = ctx.socket(zmq.PAIR)  # owned by the stepping thread
        self._step_end.setsockopt(zmq.LINGER, 0)
        self._step_end.connect(address)
        self._poller = zmq.Poller()
        self._poller.register(self._step_end, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name="worker-io", daemon=True)
        self._thread.start()

    # ---- the stepping thread's side -------------------------------------------------

    def send(self, msgs: list[m.Message]) -> None:
        if not msgs:
            return
        msgs, arrays = to_wire(msgs)
        body = m.encode_many(msgs)
        if not arrays:
            self._step_end.send(body, copy=False)
            return
        self._step_end.send(body, _SNDMORE, copy=False)
        for i, buf in enumerate(arrays):
            self._step_end.send(buf, 0 if i == len(arrays) - 1 else _SNDMORE, copy=False)

    def recv_nowait(self) -> list[m.Message]:
        """Every message already relayed, without blocking (a frame that cannot be decoded is skipped)."""
        out: list[m.Message] = []
        while True:
            try:
                parts = self._step_end.recv_multipart(_NOBLOCK, copy=False)
            except zmq.Again:
                return out
            body = parts[0]
            try:
                items = m.unbatch(m.decode(body.buffer))
                if len(parts) > 1:
                    attach_frames(items, [p.buffer for p in parts[1:]])
                out.extend(items)
            except Exception as err:  # a frame from a peer of another version, or corrupt
                self.undecodable += 1
                if self.undecodable == 1:
                    log.error("bus.undecodable", peer="orchestrator", bytes=len(body.buffer), error=repr(err))

    def wait(self, timeout_s: float | None) -> bool:
        """Block until a message is waiting or the timeout passes (None: no timeout)."""
        ms = None if timeout_s is None else int(timeout_s * 1000)
        return bool(self._poller.poll(ms))

    def close(self) -> None:
        """Forward what was sent, end the I/O thread, close every socket."""
        if self._thread.is_alive():
            try:
                self._step_end.send(_CLOSE)
            except zmq.ZMQError:
                pass
            self._thread.join(IO_JOIN_TIMEOUT_S)
        self._step_end.close(0)
        if not self._thread.is_alive():
            # (a thread still alive owns its sockets; the process exit ends them)
            self._io_end.close(0)
            self._bus.close()

    # ---- the I/O thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._relay()
        except Exception as err:  # the thread boundary: a dead I/O thread must not leave a silent worker
            log.error("worker.io_failed", error=repr(err))
            try:
                self._io_end.send(m.encode(m.Shutdown()))
            except zmq.ZMQError:
                pass

    def _relay(self) -> None:
        dealer, inner = self._bus.sock, self._io_end
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(inner, zmq.POLLIN)
        interval = self.heartbeat_interval_s
        next_beat = time.monotonic()  # the first at once: a sign of life before the engine loads
        stop_sent = False
        inward = outward = False  # in the middle of a multipart message (its frames come together)
        while True:
            timeout_ms = max(0, int((next_beat - time.monotonic()) * 1000))
            ready = dict(poller.poll(timeout_ms))
            if inner in ready:
                while True:
                    try:
                        frame = inner.recv(_NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if len(frame) == 0 and not outward:
                        return  # _CLOSE: everything sent before it has been forwarded
                    outward = frame.more
                    dealer.send(frame, _SNDMORE if outward else 0, copy=False)
            if dealer in ready:
                while True:
                    try:
                        frame = dealer.recv(_NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    inward = frame.more
                    inner.send(frame, _SNDMORE if inward else 0, copy=False)
            now = time.monotonic()
            if now >= next_beat:
                if not stop_sent and self.should_stop():
                    stop_sent = True
                    inner.send(m.encode(m.Shutdown()))
                dealer.send(m.encode(self.heartbeat()))
                next_beat = now + interval
