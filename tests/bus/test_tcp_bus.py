"""The tcp bus: CURVE keys from BusAuth, arrays as frames per peer, and what a refused peer sees."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from omni_actors.bus import messages as m
from omni_actors.bus.codec import (
    FRAME_CHUNK_BYTES,
    INLINE_MAX_BYTES,
    PayloadCodec,
    attach_frames,
    leases_of,
    to_wire,
)
from omni_actors.bus.shm import Arena, SegmentCache
from omni_actors.bus.sockets import AsyncRouter, BusAuth, WorkerSocket
from tests.conftest import shm_files

WAIT_MS = 5000
"""Longest wait for a message that must arrive."""
REFUSED_WAIT_MS = 1000
"""How long a refused peer waits for its handshake verdict."""


class Bus:
    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.auth = BusAuth(self.ctx)
        self.segments = SegmentCache()
        self.got: list[tuple[bytes, m.Message]] = []
        self.unsendable: list[tuple[m.Message, Exception]] = []
        self.router = AsyncRouter(self.ctx, "tcp://127.0.0.1:0", lambda i, msg: self.got.append((i, msg)),
                                  lambda i, msg, err: self.unsendable.append((msg, err)),
                                  auth=self.auth, segments=self.segments)

    def receive(self) -> tuple[bytes, m.Message]:
        assert self.router.sock.poll(WAIT_MS)
        self.router._on_readable()
        return self.got.pop(0)

    def close(self) -> None:
        self.router.close()
        self.segments.close()
        self.auth.close()
        self.ctx.term()


@pytest.fixture
def bus() -> Iterator[Bus]:
    b = Bus()
    yield b
    b.close()


def test_arrays_cross_as_frames_and_shared_memory_only_to_peers_that_map_it(bus: Bus) -> None:
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    arena = Arena(prefix)
    orch = PayloadCodec("orch", arena, bus.segments)
    remote = WorkerSocket(bus.router.endpoint, b"s0r0g0", bus.auth.issue())
    local = WorkerSocket(bus.router.endpoint, b"s1r0g0", bus.auth.issue())
    try:
        # A worker without an arena (another node): its big array leaves as a frame of its own.
        big = np.arange(INLINE_MAX_BYTES, dtype=np.float32).reshape(4, -1)
        out = PayloadCodec("s0r0g0", None, SegmentCache()).encode({"x": big, "small": np.ones(3)})
        remote.send([m.StageOutput("r", 0, out)])
        ident, msg = bus.receive()
        assert ident == b"s0r0g0" and isinstance(msg, m.StageOutput)
        assert isinstance(msg.payload.arrays["x"].inline, memoryview)  # the received frame, not a copy
        np.testing.assert_array_equal(orch.decode(msg.payload)["x"], big)

        # The orchestrator's leased array: a frames peer gets its bytes (and still gives the lease back),
        # a peer on this node gets the shared-memory reference.
        local.send([m.Ready(1, 0, 1)])  # (a ROUTER can send only to a peer it has heard)
        assert bus.receive() == (b"s1r0g0", m.Ready(1, 0, 1))
        data = np.arange(INLINE_MAX_BYTES, dtype=np.int64)
        payload = orch.encode({"data": data})
        assert payload.arrays["data"].segment
        bus.router.frames_peers.add(b"s0r0g0")
        for ident in (b"s0r0g0", b"s1r0g0"):
            bus.router.send_nowait(ident, m.Feed("r", 0, payload))
            bus.router.send_nowait(ident, m.Feed("r", 0, msg.payload))  # forwarded from the remote worker
        bus.router.flush()
        assert payload.arrays["data"].segment  # what was sent is not changed
        for sock, frames in ((remote, True), (local, False)):
            assert sock.wait(WAIT_MS / 1000)
            feeds = sock.recv_nowait()
            while len(feeds) < 2 and sock.wait(WAIT_MS / 1000):
                feeds += sock.recv_nowait()
            first, second = feeds
            ref = first.payload.arrays["data"]
            assert (ref.inline is not None) is frames and bool(ref.segment) is not frames
            assert leases_of(first.payload) == leases_of(payload)
            consumer = PayloadCodec("c", None, SegmentCache())
            np.testing.assert_array_equal(consumer.decode(first.payload)["data"], data)
            np.testing.assert_array_equal(consumer.decode(second.payload)["x"], big)
            consumer.segments.close()
    finally:
        remote.close()
        local.close()
        arena.close()
    assert shm_files(prefix) == []


def test_an_array_larger_than_a_frame_crosses_in_chunks_and_is_reassembled_exactly(bus: Bus) -> None:
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    arena = Arena(prefix)
    orch = PayloadCodec("orch", arena, bus.segments)
    remote = WorkerSocket(bus.router.endpoint, b"s0r0g0", bus.auth.issue())
    rng = np.random.default_rng(0)
    up = rng.standard_normal((3 * FRAME_CHUNK_BYTES + 12_345) // 8)  # not a whole number of frames
    down = rng.integers(0, 1 << 30, (2 * FRAME_CHUNK_BYTES) // 4, dtype=np.int32)  # exactly two
    try:
        out = PayloadCodec("s0r0g0", None, SegmentCache()).encode({"up": up, "small": np.ones(3)})
        wire, frames = to_wire([m.StageOutput("r", 0, out)])
        assert wire[0].payload.arrays["up"].frames == len(frames) == 4  # zero-copy views of `up`
        assert all(np.shares_memory(np.frombuffer(f, np.uint8), up) for f in frames)
        remote.send([m.StageOutput("r", 0, out)])
        ident, msg = bus.receive()
        assert ident == b"s0r0g0" and isinstance(msg, m.StageOutput)
        got = orch.decode(msg.payload)
        np.testing.assert_array_equal(got["up"], up)
        assert got["up"].dtype == up.dtype and not got["up"].flags.writeable  # like a single received frame
        np.testing.assert_array_equal(got["small"], np.ones(3))

        # The orchestrator's leased array to a frames peer: read out of shared memory in chunks.
        bus.router.frames_peers.add(b"s0r0g0")
        payload = orch.encode({"down": down})
        bus.router.send_nowait(b"s0r0g0", m.Feed("r", 0, payload))
        bus.router.send_nowait(b"s0r0g0", m.Feed("r2", 0, msg.payload))  # forwarded as it came
        bus.router.flush()
        feeds: list[m.Message] = []
        while len(feeds) < 2 and remote.wait(WAIT_MS / 1000):
            feeds += remote.recv_nowait()
        consumer = PayloadCodec("c", None, SegmentCache())
        np.testing.assert_array_equal(consumer.decode(feeds[0].payload)["down"], down)
        np.testing.assert_array_equal(consumer.decode(feeds[1].payload)["up"], up)
        assert leases_of(feeds[0].payload) == leases_of(payload)
    finally:
        remote.close()
        arena.close()
    assert shm_files(prefix) == []


def test_frames_that_do_not_add_up_to_the_array_are_refused() -> None:
    big = np.arange(FRAME_CHUNK_BYTES // 2, dtype=np.int32)  # two frames
    wire, frames = to_wire([m.StageOutput("r", 0, PayloadCodec("p", None, SegmentCache()).encode({"x": big}))])
    for bad in (frames[:1], [frames[0], frames[1][:-4]]):
        with pytest.raises(ValueError, match=r"frames 1\.\.2"):
            attach_frames([m.decode(m.encode(wire[0]))], list(bad))
    good = [m.decode(m.encode(wire[0]))]
    attach_frames(good, [memoryview(bytes(f)) for f in frames])
    np.testing.assert_array_equal(np.frombuffer(good[0].payload.arrays["x"].inline, np.int32), big)


def _handshake(endpoint: str, keys: tuple[str, str, str] | None, pid: int) -> list[int]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (k.encode() for k in keys)
    mon = sock.get_monitor_socket()
    events = []
    try:
        sock.connect(endpoint)
        sock.send(m.encode(m.Ready(0, 0, pid)), zmq.NOBLOCK)
        while mon.poll(REFUSED_WAIT_MS):
            event = recv_monitor_message(mon)["event"]
            events.append(event)
            if event in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                break
        return events
    finally:
        sock.disable_monitor()
        mon.close(0)
        sock.close(0)
        ctx.term()


def test_only_issued_unrevoked_keys_open_the_bus(bus: Bus) -> None:
    keys = bus.auth.issue()
    good = _handshake(bus.router.endpoint, (keys.server_key, keys.public_key, keys.secret_key), 1)
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED in good
    bus.auth.revoke(keys)
    revoked = _handshake(bus.router.endpoint, (keys.server_key, keys.public_key, keys.secret_key), 2)
    assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in revoked and zmq.EVENT_HANDSHAKE_SUCCEEDED not in revoked
    plain = _handshake(bus.router.endpoint, None, 2)
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in plain
    assert keys.secret_key not in repr(keys)
    bus.router._on_readable()
    assert m.Ready(0, 0, 2) not in [msg for _, msg in bus.got]  # refused peers are never heard


def test_an_array_whose_shared_memory_is_gone_fails_its_message_only(bus: Bus) -> None:
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    arena = Arena(prefix)
    orch = PayloadCodec("orch", arena, bus.segments)
    remote = WorkerSocket(bus.router.endpoint, b"s0r0g0", bus.auth.issue())
    try:
        remote.send([m.Ready(0, 0, 1)])
        bus.receive()
        bus.router.frames_peers.add(b"s0r0g0")
        gone = orch.encode({"x": np.zeros(INLINE_MAX_BYTES + 1, np.uint8)})
        arena.close()  # (as when its producer died and its segments were removed)
        bus.router.send_nowait(b"s0r0g0", m.Feed("a", 0, gone))
        bus.router.send_nowait(b"s0r0g0", m.Feed("b", 0, m.Payload(data={"n": 1})))
        bus.router.flush()
        assert [msg.request_id for msg, _ in bus.unsendable] == ["a"]
        assert remote.wait(WAIT_MS / 1000)
        assert [msg.request_id for msg in remote.recv_nowait()] == ["b"]
    finally:
        remote.close()
        arena.close()


def test_an_ipv6_bus_binds_and_a_worker_connects_to_it() -> None:
    """`cluster.bus_host: "::"` (or an IPv6 address): ZeroMQ binds and connects to `tcp://[...]` only
    with its IPV6 option, which both ends set from the endpoint."""
    ctx = zmq.Context()
    auth = BusAuth(ctx)
    got: list[tuple[bytes, m.Message]] = []
    router = AsyncRouter(ctx, "tcp://[::1]:0", lambda i, msg: got.append((i, msg)), auth=auth)
    worker = WorkerSocket(router.endpoint, b"s0r0g0", auth.issue())
    try:
        assert router.endpoint.startswith("tcp://[::1]:")
        worker.send([m.Ready(0, 0, 1)])
        assert router.sock.poll(WAIT_MS)
        router._on_readable()
        assert got == [(b"s0r0g0", m.Ready(0, 0, 1))]
    finally:
        worker.close()
        router.close()
        auth.close()
        ctx.term()


async def test_a_router_closed_in_the_loop_turn_it_started_leaves_no_failing_callback() -> None:
    """A start that fails right after the bus is up (a replica's options Ray refuses, an MPS daemon
    that is not there) closes the router before its first look at the socket has run."""
    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    ctx = zmq.Context()
    try:
        router = AsyncRouter(ctx, "tcp://127.0.0.1:0", lambda i, msg: None)
        router.start()
        router.close()
        await asyncio.sleep(0)  # (the look start() scheduled runs now)
    finally:
        loop.set_exception_handler(None)
        ctx.term()
    assert [c.get("exception") for c in errors] == []
