"""The orchestrator's ROUTER hears a restarted worker while its dead predecessor's pipe lingers."""

from __future__ import annotations

import time

import zmq

from omni_actors.bus import messages as m
from omni_actors.bus.sockets import AsyncRouter, RuntimeDir, WorkerSocket
from omni_actors.workers.spec import identity_of

SETTLE_S = 0.3
"""Time the new peer gets to connect and send while the router makes no zmq call."""


def test_a_restarted_worker_is_heard_even_before_the_old_pipe_is_retired() -> None:
    runtime = RuntimeDir()
    ctx = zmq.Context()
    got: list[tuple[bytes, m.Message]] = []
    router = AsyncRouter(ctx, runtime.endpoint("bus"), lambda ident, msg: got.append((ident, msg)))
    try:
        for generation in range(0, 10, 2):  # the same race five times, a new generation each time
            first = identity_of(1, 0, generation).encode()
            second = identity_of(1, 0, generation + 1).encode()
            old = WorkerSocket(router.endpoint, first)
            old.send([m.Ready(1, 0, 111)])
            assert router.sock.poll(5000)
            router._on_readable()
            assert got[-1] == (first, m.Ready(1, 0, 111))
            old.sock.close(0)  # the worker dies; the router is busy and makes no zmq call...
            old.ctx.term()
            new = WorkerSocket(router.endpoint, second)  # ...while its replacement connects
            new.send([m.Ready(1, 0, 222)])
            time.sleep(SETTLE_S)
            assert router.sock.poll(5000), "the replacement's Ready was dropped"
            router._on_readable()
            assert got[-1] == (second, m.Ready(1, 0, 222))
            new.close()
    finally:
        router.close()
        ctx.term()
        runtime.close()
