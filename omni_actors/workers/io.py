"""The worker's bus: the stepping thread's DEALER, and a heartbeat thread with a DEALER of its own.

The stepping thread (the worker loop) sends and receives on its own DEALER
directly: a request's messages cross no thread on their way in or out. (Until
2026-12-03 an I/O thread owned the one socket and relayed every frame to the
stepping thread over an inproc PAIR: two thread hand-offs per message, ~150 us
added to a stage hop on a 2-core box; docs/benchmarks.md, "Worker I/O thread".)

Heartbeats leave from a second thread, on a second DEALER whose identity is
the worker's plus HEARTBEAT_SUFFIX (the orchestrator files them under the
worker), on their interval whatever the stepping thread is doing, so a step
that runs for minutes never makes the worker look dead; each carries the
stepping thread's progress (steps done, how long the current one has run) so
the supervisor can still tell a stuck step from a long one.

A message is whole: its body and the array frames after it (bus.codec.to_wire),
sent and received without copies.

At each heartbeat the heartbeat thread also asks `should_stop` (the main process
is gone, or a SIGTERM whose SystemExit was swallowed set the stop flag); if so it
hands the stepping thread a Shutdown, as the orchestrator would, over an inproc
PAIR the stepping thread watches beside its DEALER.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from omni_actors import logs
from omni_actors.bus import messages as m
from omni_actors.bus.codec import attach_frames
from omni_actors.bus.sockets import CurveKeys, WorkerSocket, recv_parts
from omni_actors.workers.spec import HEARTBEAT_SUFFIX

log = logs.get(__name__)

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_CLOSE = b""
"""Sent by the stepping thread on the PAIR: end the heartbeat thread."""
IO_JOIN_TIMEOUT_S = 5.0
"""Longest wait at close for the heartbeat thread to end."""


def idle_heartbeat() -> m.Heartbeat:
    """The heartbeat before the worker loop runs (the engine is still loading)."""
    return m.Heartbeat(busy=0)


class WorkerIO:
    """The stepping thread's end of the bus (`send`, `recv_nowait`, `wait`); heartbeats from a thread.

    `heartbeat` is called on the heartbeat thread at each beat; it must only read plain attributes.
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
        self._bus = WorkerSocket(endpoint, identity, keys)  # the stepping thread's
        self._beats = WorkerSocket(endpoint, identity + HEARTBEAT_SUFFIX, keys)  # the heartbeat thread's
        ctx = self._bus.ctx
        address = f"inproc://worker-ctl-{identity.decode(errors='replace')}"
        self._beat_end = ctx.socket(zmq.PAIR)  # owned by the heartbeat thread
        self._beat_end.setsockopt(zmq.LINGER, 0)
        self._beat_end.bind(address)
        self._step_end = ctx.socket(zmq.PAIR)  # owned by the stepping thread
        self._step_end.setsockopt(zmq.LINGER, 0)
        self._step_end.connect(address)
        self._poller = zmq.Poller()
        self._poller.register(self._bus.sock, zmq.POLLIN)
        self._poller.register(self._step_end, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)
        self._thread.start()

    # ---- the stepping thread's side -------------------------------------------------

    def send(self, msgs: list[m.Message]) -> None:
        self._bus.send(msgs)

    def recv_nowait(self) -> list[m.Message]:
        """Every message already waiting, without blocking (a frame that cannot be decoded is skipped)."""
        out = self._drain(self._step_end)  # a Shutdown from the heartbeat thread
        out.extend(self._drain(self._bus.sock))
        return out

    def _drain(self, sock: zmq.Socket) -> list[m.Message]:
        out: list[m.Message] = []
        # Asked before each receive: ending the drain on zmq.Again cost two raised exceptions a
        # turn (~7 us each, with the error's message looked up), a tenth of a worker's turn.
        while sock.getsockopt(_EVENTS) & _POLLIN:
            try:
                parts = recv_parts(sock)
            except zmq.Again:
                break
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
        return out

    def wait(self, timeout_s: float | None) -> bool:
        """Block until a message is waiting or the timeout passes (None: no timeout)."""
        ms = None if timeout_s is None else int(timeout_s * 1000)
        return bool(self._poller.poll(ms))

    def close(self) -> None:
        """End the heartbeat thread, then close every socket (what was sent still leaves: linger)."""
        if self._thread.is_alive():
            try:
                self._step_end.send(_CLOSE)
            except zmq.ZMQError:
                pass
            self._thread.join(IO_JOIN_TIMEOUT_S)
        self._step_end.close(0)
        if self._thread.is_alive():
            # a thread still alive owns its sockets (the process exit ends them), and the context
            # holds its PAIR: terminating the context would wait for it
            self._bus.sock.close()
            return
        self._beat_end.close(0)
        self._beats.close()
        self._bus.close()

    # ---- the heartbeat thread --------------------------------------------------------

    def _run(self) -> None:
        try:
            self._beat()
        except Exception as err:  # the thread boundary: a dead heartbeat thread must not leave a silent worker
            log.error("worker.heartbeat_failed", error=repr(err))
            try:
                self._beat_end.send(m.encode(m.Shutdown()))
            except zmq.ZMQError:
                pass

    def _beat(self) -> None:
        ctl, beats = self._beat_end, self._beats.sock
        poller = zmq.Poller()
        poller.register(ctl, zmq.POLLIN)
        interval = self.heartbeat_interval_s
        next_beat = time.monotonic()  # the first at once: a sign of life before the engine loads
        stop_sent = False
        while True:
            timeout_ms = max(0, int((next_beat - time.monotonic()) * 1000))
            if poller.poll(timeout_ms):
                return  # _CLOSE: the stepping thread is closing
            now = time.monotonic()
            if now >= next_beat:
                if not stop_sent and self.should_stop():
                    stop_sent = True
                    ctl.send(m.encode(m.Shutdown()))
                beats.send(m.encode(self.heartbeat()))
                next_beat = now + interval
