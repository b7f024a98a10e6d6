"""Bus sockets: the orchestrator's ROUTER on the event loop, a worker's blocking DEALER.

The ROUTER is a plain (not zmq.asyncio) socket: the loop watches its file
descriptor and each wake-up drains every pending frame with non-blocking
calls, which costs a fraction of zmq.asyncio's per-message overhead. ZeroMQ's
descriptor is edge-triggered, so after every send we look again for input.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import zmq

from omni_actors.bus import messages as m
from omni_actors.settings import SETTINGS

_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
# (plain ints: pyzmq's enum flags cost more than the socket calls on the hot path)

SEND_HWM = 0
"""No high-water mark: admission control bounds the traffic, not dropped frames."""


class RuntimeDir:
    """A private (0700) directory for ipc endpoints, removed by `close`.

    It names its owner (OWNER_FILE: this process's pid), so a later run can remove the
    directory of one that was killed (orchestrator.supervisor.sweep_stale_runtime_dirs).
    """

    PREFIX = "omni-run-"
    OWNER_FILE = "main.pid"

    def __init__(self) -> None:
        SETTINGS.runtime_parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=self.PREFIX, dir=SETTINGS.runtime_parent))
        self.path.chmod(0o700)
        (self.path / self.OWNER_FILE).write_text(str(os.getpid()))

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class AsyncRouter:
    """ROUTER socket driven by the event loop; `on_message(identity, msg)` per message.

    A message that cannot be encoded (a value msgspec refuses) is handed to
    `on_unsendable(identity, msg, error)` and the rest of its frame still goes out.
    A frame that cannot be decoded is counted (`frames_undecodable`) and handed to
    `on_undecodable(identity, body, error)`.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        on_message: Callable[[bytes, m.Message], None],
        on_unsendable: Callable[[bytes, m.Message, Exception], None] | None = None,
        on_undecodable: Callable[[bytes, bytes, Exception], None] | None = None,
    ) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self.sock.setsockopt(zmq.RCVHWM, SEND_HWM)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Workers never reuse an identity (a restart is a new generation, named so): a ROUTER
        # rejects, or under load even with handover (libzmq #2892) drops, a newcomer whose
        # identity a dead peer's pipe still holds. Handover stays on for outside peers that do.
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            if endpoint.endswith(":0") and endpoint.startswith("tcp://"):
                port = self.sock.bind_to_random_port(endpoint.rsplit(":", 1)[0])
                endpoint = f"{endpoint.rsplit(':', 1)[0]}:{port}"
            else:
                self.sock.bind(endpoint)
        except zmq.ZMQError:
            self.sock.close(0)  # else the context's term() would wait for it forever
            raise
        self.endpoint = endpoint
        self._on_message = on_message
        self._on_unsendable = on_unsendable
        self._on_undecodable = on_undecodable
        self.frames_undecodable = 0
        self._outbox: dict[bytes, list[m.Message]] = {}
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.frames_in = 0
        self.frames_out = 0
        self.messages_in = 0
        self.messages_out = 0
        self.wakeups = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._on_readable)
        self._loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        self.wakeups += 1
        sock = self.sock
        while sock.getsockopt(_EVENTS) & _POLLIN:
            try:
                identity, body = sock.recv_multipart(_NOBLOCK, copy=True)
            except zmq.Again:
                break
            except ValueError:
                continue  # malformed frame count: ignore
            self.frames_in += 1
            try:
                msg = m.decode(body)
            except Exception as err:
                self.frames_undecodable += 1
                if self._on_undecodable is not None:
                    self._on_undecodable(identity, body, err)
                continue
            for item in m.unbatch(msg):
                self.messages_in += 1
                self._on_message(identity, item)
        if self._outbox:
            self.flush()  # answer in this loop turn rather than the next

    def send_nowait(self, identity: bytes, msg: m.Message) -> None:
        """Queue a message; all queued messages leave together at the end of this loop turn."""
        box = self._outbox.get(identity)
        if box is None:
            self._outbox[identity] = [msg]
        else:
            box.append(msg)
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        for identity, msgs in outbox.items():
            try:
                frame = m.encode_many(msgs)
            except Exception:
                frame = self._encode_sendable(identity, msgs)
                if frame is None:
                    continue
            try:
                self.sock.send_multipart([identity, frame], _NOBLOCK)
            except zmq.ZMQError:
                continue  # the peer is gone (ROUTER_MANDATORY); its death is handled elsewhere
            self.frames_out += 1
            self.messages_out += len(msgs)
        # Edge-triggered fd: a send may have consumed the readiness edge.
        if self._loop is not None and self.sock.getsockopt(_EVENTS) & _POLLIN:
            self._loop.call_soon(self._on_readable)

    def _encode_sendable(self, identity: bytes, msgs: list[m.Message]) -> bytes | None:
        """The frame of `msgs` less those that cannot be encoded (each reported); None if none can."""
        good = []
        for msg in msgs:
            try:
                m.encode_many([msg])
            except Exception as err:
                if self._on_unsendable is not None:
                    self._on_unsendable(identity, msg, err)
                continue
            good.append(msg)
        return m.encode_many(good) if good else None

    def close(self) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
            except (ValueError, zmq.ZMQError):
                pass
        self.sock.close(0)


class WorkerSocket:
    """A worker's DEALER with a fixed identity; blocking calls, used from one thread."""

    def __init__(self, endpoint: str, identity: bytes) -> None:
        self.ctx = zmq.Context(1)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self.sock.setsockopt(zmq.RCVHWM, SEND_HWM)
        self.sock.connect(endpoint)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)

    def send(self, msgs: list[m.Message]) -> None:
        if msgs:
            self.sock.send(m.encode_many(msgs))

    def recv_nowait(self) -> list[m.Message]:
        """Every message already waiting, without blocking."""
        out: list[m.Message] = []
        while True:
            try:
                body = self.sock.recv(_NOBLOCK, copy=True)
            except zmq.Again:
                return out
            out.extend(m.unbatch(m.decode(body)))

    def wait(self, timeout_s: float) -> bool:
        """Block until a message arrives or the timeout passes; True if one is waiting."""
        return bool(self._poller.poll(int(timeout_s * 1000)))

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
