"""Bus sockets: the orchestrator's ROUTER on the event loop, a worker's blocking DEALER.

The ROUTER is a plain (not zmq.asyncio) socket: the loop watches its file
descriptor and each wake-up drains every pending frame with non-blocking
calls, which costs a fraction of zmq.asyncio's per-message overhead. ZeroMQ's
descriptor is edge-triggered, so after every send we look again for input.

A message is `[body, array frames...]` (bus.codec.to_wire). Over `tcp://` the
bus is authenticated and encrypted with CURVE: the orchestrator's `BusAuth`
holds the server key pair and the public keys of the workers it started (a ZAP
handler refuses every other peer), and hands each worker its `CurveKeys`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq

from omni_actors.bus import messages as m
from omni_actors.bus.codec import attach_frames, to_wire
from omni_actors.bus.shm import SegmentCache
from omni_actors.settings import settings

_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
# (plain ints: pyzmq's enum flags cost more than the socket calls on the hot path)

SEND_HWM = 0
"""No high-water mark: admission control bounds the traffic, not dropped frames."""


def recv_parts(sock: zmq.Socket) -> list[zmq.Frame]:
    """One waiting multipart message, its frames uncopied (zmq.Again when none waits): pyzmq's
    recv_multipart does the same with enum flags, ~3 us more a message."""
    parts = [sock.recv(_NOBLOCK, copy=False)]
    while parts[-1].more:
        parts.append(sock.recv(_NOBLOCK, copy=False))
    return parts

TCP_IO_THREADS = max(1, min(4, (os.cpu_count() or 1) // 4))
"""I/O threads of the orchestrator's context when its bus is tcp:// + CURVE. libzmq encrypts and
decrypts each connection on the one I/O thread it was given, so with one thread every remote
worker's traffic shares one core; with more, connections spread over them (one each, up to this)."""


def is_ipv6(endpoint: str) -> bool:
    """A `tcp://[...]:port` endpoint (an IPv6 address): its socket needs ZeroMQ's IPV6 option, else
    binding or connecting fails ("No such device")."""
    return endpoint.startswith("tcp://[")


def tcp_host(host: str) -> str:
    """`host` as it goes in a tcp:// endpoint (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class RuntimeDir:
    """A private (0700) directory for ipc endpoints, removed by `close`.

    It names its owner (OWNER_FILE: this process's pid), so a later run can remove the
    directory of one that was killed (orchestrator.supervisor.sweep_stale_runtime_dirs).
    """

    PREFIX = "omni-run-"
    OWNER_FILE = "main.pid"

    def __init__(self) -> None:
        settings().runtime_parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=self.PREFIX, dir=settings().runtime_parent))
        self.path.chmod(0o700)
        (self.path / self.OWNER_FILE).write_text(str(os.getpid()))

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class CurveKeys(msgspec.Struct, frozen=True):
    """One worker's CURVE keys (Z85 text): the bus's public key, and its own pair."""

    server_key: str
    public_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print a secret
        return f"CurveKeys(public_key={self.public_key!r})"


def read_curve_keys() -> CurveKeys:
    """A worker's keys, one JSON line on its stdin (not its command line: that is world-readable)."""
    return msgspec.json.decode(sys.stdin.buffer.readline(), type=CurveKeys)


class BusAuth:
    """The bus's CURVE server key pair and the public keys allowed to connect (a ZAP handler).

    Start it on the router's context before the router binds; `issue()` makes a worker's
    key pair and allows it, `revoke()` forgets it (a gone worker's keys open nothing).
    """

    def __init__(self, ctx: zmq.Context) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = zmq.curve_keypair()
        self.public_key, self._secret = public.decode(), secret.decode()
        self._allowed: set[bytes] = set()
        self._thread = ThreadAuthenticator(ctx, log=_quiet_log())
        self._thread.start()
        self._thread.configure_curve_callback("*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: is this client public key (Z85) one of ours?"""
        return key in self._allowed

    def issue(self) -> CurveKeys:
        public, secret = zmq.curve_keypair()
        self._allowed.add(public)
        return CurveKeys(self.public_key, public.decode(), secret.decode())

    def revoke(self, keys: CurveKeys) -> None:
        self._allowed.discard(keys.public_key.encode())

    def serve(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self._secret.encode()
        sock.curve_publickey = self.public_key.encode()
        sock.curve_server = True

    def close(self) -> None:
        self._allowed.clear()
        self._thread.stop()


def _quiet_log() -> Any:
    import logging

    log = logging.getLogger("omni_actors.bus.zap")
    log.setLevel(logging.WARNING)  # (pyzmq logs every allowed and refused key at debug)
    return log


class AsyncRouter:
    """ROUTER socket driven by the event loop; `on_message(identity, msg)` per message.

    A message that cannot be sent (a value msgspec refuses, an array whose shared memory
    is gone) is handed to `on_unsendable(identity, msg, error)` and the rest still goes out.
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
        auth: BusAuth | None = None,
        segments: SegmentCache | None = None,
    ) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        if auth is not None:
            auth.serve(self.sock)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self.sock.setsockopt(zmq.RCVHWM, SEND_HWM)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Workers never reuse an identity (a restart is a new generation, named so): a ROUTER
        # rejects, or under load even with handover (libzmq #2892) drops, a newcomer whose
        # identity a dead peer's pipe still holds. Handover stays on for outside peers that do.
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.IPV6, is_ipv6(endpoint))
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
        self._segments = segments
        self.frames_peers: set[bytes] = set()
        """Peers that cannot map this node's shared memory: their arrays go as frames."""
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
        sock = self.sock
        if sock.closed:  # (a look scheduled by start or flush, run after a close in the same loop turn)
            return
        self.wakeups += 1
        while sock.getsockopt(_EVENTS) & _POLLIN:
            try:
                parts = recv_parts(sock)
            except zmq.Again:
                break
            if len(parts) < 2:
                continue  # malformed frame count: ignore
            self.frames_in += 1
            identity = parts[0].bytes
            try:
                items = m.unbatch(m.decode(parts[1].buffer))
                if len(parts) > 2:
                    attach_frames(items, [p.buffer for p in parts[2:]])
            except Exception as err:
                self.frames_undecodable += 1
                if self._on_undecodable is not None:
                    self._on_undecodable(identity, parts[1].bytes, err)
                continue
            for item in items:
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
            frames_peer = identity in self.frames_peers
            try:
                msgs, arrays = to_wire(msgs, frames_peer, self._segments)
                frame = m.encode_many(msgs)
            except Exception:
                prepared = self._prepare_sendable(identity, msgs, frames_peer)
                if prepared is None:
                    continue
                msgs, arrays, frame = prepared
            try:
                if arrays:
                    self.sock.send(identity, _NOBLOCK | _SNDMORE)
                    self.sock.send(frame, _NOBLOCK | _SNDMORE)
                    _send_frames(self.sock, arrays, _NOBLOCK)
                else:
                    self.sock.send(identity, _NOBLOCK | _SNDMORE)
                    self.sock.send(frame, _NOBLOCK)
            except zmq.ZMQError:
                continue  # the peer is gone (ROUTER_MANDATORY); its death is handled elsewhere
            self.frames_out += 1
            self.messages_out += len(msgs)
        # Edge-triggered fd: a send may have consumed the readiness edge.
        if self._loop is not None and self.sock.getsockopt(_EVENTS) & _POLLIN:
            self._loop.call_soon(self._on_readable)

    def _prepare_sendable(
        self, identity: bytes, msgs: list[m.Message], frames_peer: bool
    ) -> tuple[list[m.Message], list[Any], bytes] | None:
        """`msgs` less those that cannot be sent (a value msgspec refuses, an array whose shared
        memory is gone), each reported; None if none can."""
        good = []
        for msg in msgs:
            try:
                m.encode_many(to_wire([msg], frames_peer, self._segments)[0])
            except Exception as err:
                if self._on_unsendable is not None:
                    self._on_unsendable(identity, msg, err)
                continue
            good.append(msg)
        if not good:
            return None
        wire, arrays = to_wire(good, frames_peer, self._segments)
        return wire, arrays, m.encode_many(wire)

    def forget(self, identity: bytes) -> None:
        """A worker is gone (identities are never reused)."""
        self.frames_peers.discard(identity)

    def close(self) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
            except (ValueError, zmq.ZMQError):
                pass
        self.sock.close(0)


def _send_frames(sock: zmq.Socket, frames: list[Any], flags: int) -> None:
    """The array frames of one message, each sent without a copy (the last one ends the message)."""
    last = len(frames) - 1
    for i, buf in enumerate(frames):
        sock.send(buf, flags if i == last else flags | _SNDMORE, copy=False)


class WorkerSocket:
    """A worker's DEALER with a fixed identity; blocking calls, used from one thread.

    With `keys` it is a CURVE client (a tcp:// bus); arrays go as frames of their own (to_wire).
    """

    def __init__(self, endpoint: str, identity: bytes, keys: CurveKeys | None = None) -> None:
        self.ctx = zmq.Context(1)
        self.sock = self.ctx.socket(zmq.DEALER)
        if keys is not None:
            self.sock.curve_serverkey = keys.server_key.encode()
            self.sock.curve_publickey = keys.public_key.encode()
            self.sock.curve_secretkey = keys.secret_key.encode()
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.IPV6, is_ipv6(endpoint))
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self.sock.setsockopt(zmq.RCVHWM, SEND_HWM)
        self.sock.connect(endpoint)
        self._poller = zmq.Poller()
        self._poller.register(self.sock, zmq.POLLIN)

    def send(self, msgs: list[m.Message]) -> None:
        if not msgs:
            return
        msgs, arrays = to_wire(msgs)
        body = m.encode_many(msgs)
        if arrays:
            self.sock.send(body, _SNDMORE)
            _send_frames(self.sock, arrays, 0)
        else:
            self.sock.send(body)

    def recv_nowait(self) -> list[m.Message]:
        """Every message already waiting, without blocking."""
        out: list[m.Message] = []
        while True:
            try:
                parts = recv_parts(self.sock)
            except zmq.Again:
                return out
            items = m.unbatch(m.decode(parts[0].buffer))
            if len(parts) > 1:
                attach_frames(items, [p.buffer for p in parts[1:]])
            out.extend(items)

    def wait(self, timeout_s: float) -> bool:
        """Block until a message arrives or the timeout passes; True if one is waiting."""
        return bool(self._poller.poll(int(timeout_s * 1000)))

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()
