"""The ray backend's bus: a CURVE `tcp://` ROUTER for workers on other nodes, a plain `ipc://` one for
workers on the orchestrator's own node, behind the one interface the orchestrator uses (AsyncRouter's).

A worker on this node keeps what the local backend gives it: an ipc socket in the run's private (0700)
directory, no encryption, arrays in shared memory. Which socket a worker is on is learnt from the first
message it sends (its Ready); replies go back the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq

from omni_actors.bus import messages as m
from omni_actors.bus.shm import SegmentCache
from omni_actors.bus.sockets import AsyncRouter, BusAuth


def _summed(name: str) -> property:
    """A counter of both ROUTERs together (the orchestrator's statistics read them)."""
    return property(lambda self: getattr(self.remote, name) + getattr(self.local, name))


class RouterPair:
    """`remote` (tcp + CURVE) and `local` (ipc) ROUTERs; see the module docstring."""

    def __init__(
        self,
        ctx: zmq.Context,
        remote_endpoint: str,
        local_endpoint: str,
        on_message: Callable[[bytes, m.Message], None],
        on_unsendable: Callable[[bytes, m.Message, Exception], None] | None,
        on_undecodable: Callable[[bytes, bytes, Exception], None] | None,
        auth: BusAuth,
        segments: SegmentCache | None = None,
    ) -> None:
        self._on_message = on_message
        self.local_peers: set[bytes] = set()
        """Workers that spoke on the ipc socket (and are answered there)."""
        self.remote = AsyncRouter(ctx, remote_endpoint, on_message, on_unsendable, on_undecodable,
                                  auth=auth, segments=segments)
        try:
            self.local = AsyncRouter(ctx, local_endpoint, self._from_local, on_unsendable, on_undecodable,
                                     segments=segments)
        except zmq.ZMQError:
            self.remote.close()
            raise
        self.endpoint = self.remote.endpoint
        self.local_endpoint = self.local.endpoint
        self.frames_peers = self.remote.frames_peers
        """Peers whose arrays go as frames: only ever remote ones."""

    def _from_local(self, identity: bytes, msg: m.Message) -> None:
        self.local_peers.add(identity)
        self._on_message(identity, msg)

    def start(self) -> None:
        self.remote.start()
        self.local.start()

    def send_nowait(self, identity: bytes, msg: m.Message) -> None:
        (self.local if identity in self.local_peers else self.remote).send_nowait(identity, msg)

    def flush(self) -> None:
        self.remote.flush()
        self.local.flush()

    def forget(self, identity: bytes) -> None:
        """A worker is gone (identities are never reused)."""
        self.frames_peers.discard(identity)
        self.local_peers.discard(identity)

    def close(self) -> None:
        self.local.close()
        self.remote.close()

    messages_in = _summed("messages_in")
    messages_out = _summed("messages_out")
    frames_in = _summed("frames_in")
    frames_out = _summed("frames_out")
    wakeups = _summed("wakeups")
    frames_undecodable = _summed("frames_undecodable")


Bus = AsyncRouter | RouterPair
"""What the orchestrator sends and receives through: one ROUTER, or the ray backend's pair."""
