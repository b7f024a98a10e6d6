"""The orchestrator's ROUTER keeps serving a worker identity that reconnects after a death."""

from __future__ import annotations

import time

import zmq

from omni_actors.bus import messages as m
from omni_actors.bus.sockets import AsyncRouter, RuntimeDir, WorkerSocket

SETTLE_S = 0.3
"""Time the new peer gets to connect and send while the router makes no zmq call."""


def test_a_reconnecting_identity_is_heard_even_before_the_old_pipe_is_retired() -> None:
    runtime = RuntimeDir()
    ctx = zmq.Context()
    got: list[tuple[bytes, m.Message]] = []
    router = AsyncRouter(ctx, runtime.endpoint("bus"), lambda ident, msg: got.append((ident, msg)))
    try:
        old = WorkerSocket(router.endpoint, b"s1r0")
        old.send([m.Ready(1, 0, 111)])
        assert router.sock.poll(5000)
        router._on_readable()
        assert [msg.pid for _, msg in got] == [111]
        old.sock.close(0)  # the worker dies; the router is busy and makes no zmq call...
        old.ctx.term()
        new = WorkerSocket(router.endpoint, b"s1r0")  # ...while its replacement connects
        new.send([m.Ready(1, 0, 222)])
        time.sleep(SETTLE_S)
        assert router.sock.poll(5000), "the replacement's Ready was dropped"
        router._on_readable()
        assert got[-1] == (b"s1r0", m.Ready(1, 0, 222))
        new.close()
    finally:
        router.close()
        ctx.term()
        runtime.close()
